#!/usr/bin/env bash
# A seeded 3-stage MNIST run in Flower's simulation engine (Ray): joins, leaves and
# a seeded request in every stage, SE and FR. Writes results/stages-sim/.
set -euo pipefail
cd "$(dirname "$0")/../../.."
./simulate.sh --run-config "num-clients=24 num-shards=2 clients-per-round=8 num-rounds=3 \
  local-epochs=1 client-samples=300 test-samples=2000 num-stages=3 joins-per-stage=4 \
  leaves-per-stage=2 requests-per-stage=1 frameworks='SE,FR' mia=false \
  run-name='stages-sim' results-dir='results'"
