#!/usr/bin/env bash
# The confirming runs of issue 42's rule (docs/DESIGN.md, "Choosing SE's schedule"):
# the candidates the rule chose on the tuning files (SE-norefill, SER-f1), beside
# FR, SISA and the shipped SE, on the CIFAR-10 and Tiny Shakespeare cells, seeds 0-2.
# Resumable: a file that already exists is not run again.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for seed in 0 1 2; do
    for cell in concurrent-cifar10-even-concurrent-k4 concurrent-shakespeare-even-concurrent-k4 \
                concurrent-cifar10-adapt-concurrent-k4; do
        file="docs/results/wall/explore-$cell-s$seed.json"
        [ -f "$file" ] || .venv/bin/python docs/results/wall/explore.py "$seed" "$cell" \
            SE-norefill,SER-f1
    done
done
