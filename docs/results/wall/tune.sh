#!/usr/bin/env bash
# The tuning runs of issue 42's rule (docs/DESIGN.md, "Choosing SE's schedule"):
# every candidate of explore.py on the three tuning cells, seeds 0-2, one run at a
# time. Resumable: a file that already holds every candidate is not run again.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for cell in single-mnist-noniid-s0 concurrent-fmnist-even-concurrent-k4-with-SE-R-FRec \
            concurrent-fmnist-adapt-concurrent-k4-with-SE-R-FRec; do
    for seed in 0 1 2; do
        file="docs/results/wall/explore-$cell-s$seed.json"
        if [ -f "$file" ] && .venv/bin/python - "$file" <<'PY'
import json, sys
sys.path.insert(0, "docs/results/wall")
from explore import VARIANTS
data = json.load(open(sys.argv[1]))
sys.exit(0 if set(VARIANTS) <= set(data["frameworks"]) else 1)
PY
        then continue; fi
        .venv/bin/python docs/results/wall/explore.py "$seed" "$cell"
    done
done
