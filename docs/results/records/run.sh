#!/usr/bin/env bash
# The records and class results (issue 45), one run at a time: for each seed (SEEDS,
# default 0 1 2) --preset verify-records and --preset memorize-records in process
# (docs/results/verification/run_inprocess.py; each summary.json copied here with the
# commit and command that made it), then class_level.py. The tables after:
# `python -m experiments.erasure_tables --write`. A file that exists is not run again.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=. SE_DATA_DIR="${SE_DATA_DIR:-$(cd .. && pwd)/shared/data}"
out=$(mktemp -d)
for seed in ${SEEDS:-0 1 2}; do
    for preset in verify-records memorize-records; do
        file="docs/results/records/$preset-seed$seed.json"
        [ -f "$file" ] && continue
        summary=$(.venv/bin/python docs/results/verification/run_inprocess.py \
            "$preset" "$out" "seed=$seed" | tail -1)
        .venv/bin/python - "$summary" "$file" "$preset" "$seed" <<'PY'
import json, subprocess, sys
summary, file, preset, seed = sys.argv[1:]
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()
data = {"commit": commit, "command": "docs/results/verification/run_inprocess.py "
        f"{preset} OUT seed={seed}", **json.load(open(summary))}
open(file, "w").write(json.dumps(data, indent=1) + "\n")
PY
    done
    [ -f "docs/results/records/class-level-s$seed.json" ] || \
        .venv/bin/python docs/results/records/class_level.py "$seed"
done
rm -rf "$out"
