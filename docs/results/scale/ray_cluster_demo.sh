#!/usr/bin/env bash
# A two-node Ray cluster on one machine (head + worker, one CPU each), a simulation
# attached to it through RAY_ADDRESS, and evidence of where the ClientApps ran.
# Usage (project root, venv active): bash docs/results/scale/ray_cluster_demo.sh OUT_DIR
set -euo pipefail
out=${1:?output folder}
mkdir -p "$out"
port=${RAY_DEMO_PORT:-6390}
export SE_DATA_DIR=${SE_DATA_DIR:-$PWD/../shared/data} FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# Both nodes run under `ray start --block`, each in a process group of its own
# (set -m), so stopping those groups stops this cluster only (`ray stop` would
# stop every Ray process of the user on the machine, other people's included).
set -m
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    sleep 5
    for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    echo "stopped the process groups of ray start --block: ${pids[*]}" > "$out/ray_stop.txt"
}
trap cleanup EXIT
started() { for _ in $(seq 90); do grep -q "Ray runtime started" "$1" && return 0; sleep 1; done; return 1; }
ray start --head --port "$port" --num-cpus=1 --include-dashboard=false \
    --disable-usage-stats --block > "$out/ray_start_head.txt" 2>&1 &
pids+=($!)
started "$out/ray_start_head.txt"
ray start --address "127.0.0.1:$port" --num-cpus=1 --block > "$out/ray_start_worker.txt" 2>&1 &
pids+=($!)
started "$out/ray_start_worker.txt"
python - "$port" > "$out/cluster_nodes.txt" <<'EOF'
import sys, ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR")
for node in ray.nodes():
    print(node["NodeID"], node["RayletSocketName"], "CPU", node["Resources"].get("CPU"),
          "alive" if node["Alive"] else "dead")
print("cluster CPUs:", ray.cluster_resources().get("CPU"))
EOF
# Every second: each Ray worker process with the raylet (node) it belongs to.
( while sleep 1; do
    for raylet in $(pgrep -f "raylet/raylet" || true); do
      sock=$(tr '\0' ' ' < /proc/$raylet/cmdline | grep -o -- "--raylet_socket_name=[^ ]*" | cut -d= -f2)
      for w in $(pgrep -P "$raylet" || true); do
        title=$(tr '\0' ' ' < /proc/$w/cmdline 2>/dev/null | cut -c1-60)
        echo "$(date +%T) raylet=$sock pid=$w $title"
      done
    done
  done ) > "$out/workers_by_node.txt" 2>&1 &
sampler=$!
start=$(date +%s)
RAY_ADDRESS="127.0.0.1:$port" python -m cli run --run-config \
    "num-clients=8 num-shards=2 clients-per-round=4 num-rounds=2 local-epochs=1 \
     client-samples=64 test-samples=500 frameworks='SE' mia=false" > "$out/run.log" 2>&1
echo "wall $(( $(date +%s) - start )) s" >> "$out/run.log"
kill "$sampler"
session=$(awk 'NR==1{print $2}' "$out/cluster_nodes.txt" | sed 's#/sockets/.*##')
grep "ClientAppActor" "$out/workers_by_node.txt" | grep -F "$session" | awk '{print $2}' \
    | sort | uniq -c > "$out/client_actors_per_node.txt"
