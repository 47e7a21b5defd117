#!/usr/bin/env bash
# The same seeded run twice through Flower's simulation engine (Ray), then compare.
set -euo pipefail
cd "$(dirname "$0")/../../.."
CONF="num-clients=8 num-shards=2 clients-per-round=4 num-rounds=3 local-epochs=1 \
client-samples=300 test-samples=2000 frameworks='SE,FR,FE,RR' mia=false seed=7"
for name in det-a det-b; do
  rm -rf "results/$name"
  ./simulate.sh --run-config "$CONF run-name='$name' results-dir='results'" > "/tmp/$name.log" 2>&1
done
PYTHONPATH=. .venv/bin/python docs/results/determinism/compare.py results/det-a results/det-b
