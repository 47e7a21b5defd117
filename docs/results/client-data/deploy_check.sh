#!/usr/bin/env bash
# Each client with only its own data, on Flower's own processes (docs/DEPLOY.md):
# `client-data` writes 2 client folders, a flower-superlink and 2 flower-supernodes
# (each given --node-config "client-data=..." and no SE_DATA_DIR) learn 2 rounds and
# forget 10 records of client 1 with `flwr run . loc`; then the same settings run in
# process with the partition cut from the whole dataset. The model files must match.
#
#   docs/results/client-data/deploy_check.sh [WORK_DIR]     (default /tmp/client-data-check)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
WORK="${1:-/tmp/client-data-check}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export PATH="$(dirname "$PY"):$PATH" FLWR_HOME="$WORK/home" FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
DATA="${SE_DATA_DIR:-$ROOT/../shared/data}"
PORT=19093
RUN="num-clients=2 num-shards=1 clients-per-round=2 num-rounds=2 local-epochs=1 \
client-samples=64 test-samples=200 frameworks='SE' mia=false forget-clients='' \
forget-records='1:0-9'"
rm -rf "$WORK" && mkdir -p "$FLWR_HOME"
printf '[superlink]\ndefault = "loc"\n[superlink.loc]\naddress = "127.0.0.1:%s"\ninsecure = true\n' \
    "$PORT" > "$FLWR_HOME/config.toml"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
cd "$ROOT"
SE_DATA_DIR="$DATA" "$PY" -m cli client-data --out "$WORK/clients" --run-config "$RUN"
SE_DATA_DIR="$DATA" flower-superlink --insecure --host 127.0.0.1 --port $PORT \
    > "$WORK/superlink.log" 2>&1 & pids+=($!)
sleep 4
for i in 0 1; do
    env -u SE_DATA_DIR flower-supernode --insecure --superlink 127.0.0.1:$PORT \
        --port $((PORT + 100 + i)) --node-config \
        "partition-id=$i num-partitions=2 client-data=\"$WORK/clients/client-$i\"" \
        > "$WORK/supernode$i.log" 2>&1 & pids+=($!)
done
sleep 5
timeout 600 flwr run . loc --stream --run-config \
    "$RUN results-dir='$WORK/results' run-name='own'" > "$WORK/flwr-run.log" 2>&1
grep -E "client data:|sharded round|SE request|summary:" "$WORK/flwr-run.log" \
    | sed 's/.*INFO[^:]*: *//'
SE_DATA_DIR="$DATA" "$PY" - "$WORK" "$RUN" <<'PY' 2>/dev/null
import sys
from cli.config import parse_item
from experiments.grid import run_in_process, set_task_identity
set_task_identity()
run_in_process({**parse_item(sys.argv[2]), "results-dir": f"{sys.argv[1]}/results",
                "run-name": "cut"})
PY
cd "$WORK/results" && sha256sum own/models/*.npz cut/models/*.npz
for f in v1 SE; do
    cmp -s "own/models/$f.npz" "cut/models/$f.npz" && echo "$f.npz: identical" \
        || { echo "$f.npz: DIFFERENT"; exit 1; }
done
