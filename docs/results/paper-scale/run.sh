#!/usr/bin/env bash
# The paper-scale single-request cells (issue 44, item 2), seed 0, one file each
# (run.py). Usage: [PARTITION=iid] run.sh [DATASET...] (default: fmnist shakespeare
# cifar10; PARTITION: noniid, the default, or iid).
# Resumable: a file that exists is not run again; a killed cell resumes from its run
# folder (run.py: learning after its last finished round, then the frameworks not
# done yet).
# Two cores: run two at once, one thread each (`OMP_NUM_THREADS=1 run.sh fmnist &
# OMP_NUM_THREADS=1 run.sh shakespeare`). Measured on the 2-core AMD EPYC beside other
# jobs: MNIST and Fashion-MNIST about 65-70 min a cell; Tiny Shakespeare 81 min
# (learning 32 min, FR's 6,000 client-epochs 31 min); CIFAR-10's learning rounds
# 94-170 s each (learning alone over an hour), then FR 48 min, SISA 9, SE 5,
# SE-paper 3 and SE-R 7 (its run folder's summary.json, retrain_wall_s): it goes on
# over sessions, each start resuming the run folder where the last one was killed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for dataset in "${@:-fmnist shakespeare cifar10}"; do
    for d in $dataset; do
        [ -f "docs/results/paper-scale/explore-paper-$d-${PARTITION:-noniid}-s0.json" ] && continue
        .venv/bin/python docs/results/paper-scale/run.py "$d" 0 "${PARTITION:-noniid}"
    done
done
