#!/bin/bash
# The two paper-preset runs behind docs/RESULTS.md "Paper preset on MNIST", one
# after the other, with the machine's used memory sampled every 5 s (free -m).
# Usage: bash docs/results/paper-preset/run.sh [LOGDIR]   (from the project root)
# Then: python docs/results/paper-preset/table.py
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/results/paper-preset
logs=${1:-$here}   # times.log, mem.log (side_jobs.log: add other work by hand)
mkdir -p "$logs"
free -m | awk '/Mem:/{print "idle", $3}' > "$logs/mem.log"
( while true; do free -m | awk -v t="$(date +%s)" '/Mem:/{print t, $3}'; sleep 5; done ) \
    >> "$logs/mem.log" &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
: > "$logs/times.log"
for spec in "iid|run-name='paper-mnist-iid'" \
            "noniid|partition='noniid' run-name='paper-mnist-noniid'"; do
  name=${spec%%|*}
  echo "start $name $(date +%s)" >> "$logs/times.log"
  ./simulate.sh --preset paper --run-config "${spec#*|}" > "$logs/$name.log" 2>&1
  echo "end $name $(date +%s)" >> "$logs/times.log"
  mkdir -p "$here/$name"
  cp "results/paper-mnist-$name/summary.json" "$here/$name/summary.json"
done
.venv/bin/python "$here/machine.py" "$logs" > "$here/machine.json"
