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
cleanup() { ray stop --force > "$out/ray_stop.txt" 2>&1 || true; }
trap cleanup EXIT
ray start --head --port "$port" --num-cpus=1 --include-dashboard=false \
    --disable-usage-stats > "$out/ray_start_head.txt" 2>&1
ray start --address "127.0.0.1:$port" --num-cpus=1 > "$out/ray_start_worker.txt" 2>&1
python - "$port" > "$out/cluster_nodes.txt" <<'EOF'
import sys, ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR")
for node in ray.nodes():
    print(node["NodeID"], node["NodeManagerPort"], node["Resources"].get("CPU"), node["Alive"])
print("cluster CPUs:", ray.cluster_resources().get("CPU"))
EOF
# Every second: each Ray worker process with the raylet (node) it belongs to.
( while sleep 1; do
    for raylet in $(pgrep -f "raylet/raylet" || true); do
      mport=$(tr '\0' ' ' < /proc/$raylet/cmdline | grep -o -- "--node_manager_port=[0-9]*" | cut -d= -f2)
      for w in $(pgrep -P "$raylet" || true); do
        title=$(tr '\0' ' ' < /proc/$w/cmdline 2>/dev/null | cut -c1-60)
        echo "$(date +%T) node_manager_port=$mport pid=$w $title"
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
grep "ClientAppActor" "$out/workers_by_node.txt" | awk '{print $2}' | sort | uniq -c \
    > "$out/client_actors_per_node.txt"
