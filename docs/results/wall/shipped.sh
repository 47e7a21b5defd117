#!/usr/bin/env bash
# Every framework with the shipped defaults, one cell per dataset, seeds 0-2 (issue 42,
# item 4): FR, SISA, SE, SE-R, FE, RR, FRec and the paper's SE (SE-paper: no exact final
# round, no refilled slot), each forgetting from the same learned shards.
# Writes docs/results/wall/shipped/explore-<cell>-s<seed>.json; the figures
# (docs/figures/pareto_<dataset>.png) draw them beside the schedule files.
# Usage: shipped.sh [QUEUE COUNT]: run every COUNT-th missing run from the QUEUE-th
# (two queues share two cores: `shipped.sh 0 2 & shipped.sh 1 2`). Resumable: a file
# that exists is not run again.
set -euo pipefail
cd "$(dirname "$0")/../../.."
queue=${1:-0}; count=${2:-1}; k=0
for seed in 0 1 2; do
    for cell in concurrent-shakespeare-even-concurrent-k4 single-mnist-noniid-s0 \
                concurrent-fmnist-even-concurrent-k4-with-SE-R-FRec \
                concurrent-cifar10-even-concurrent-k4; do
        k=$((k + 1))
        [ $(((k - 1) % count)) -eq "$queue" ] || continue
        [ -f "docs/results/wall/shipped/explore-$cell-s$seed.json" ] && continue
        .venv/bin/python docs/results/wall/explore.py "$seed" "$cell" \
            SE-R,FE,RR,FRec,SE-paper shipped
    done
done
