#!/usr/bin/env bash
# Sharding Eraser on Flower: set up, run, test.
#
#   ./simulate.sh                          learn with the defaults (pyproject.toml)
#   ./simulate.sh --preset paper           a named preset (presets/<name>.toml)
#   ./simulate.sh --run-config "dataset='fmnist' num-rounds=5"   override keys
#   ./simulate.sh test [--fast] [pytest args]   run the test suite (--fast: fast tier)
#   ./simulate.sh deploy [N] [--preset NAME] [--run-config "..."]   real SuperLink
#                                          + N SuperNodes on 127.0.0.1
#   ./simulate.sh experiments NAME [--suite quick|trained|paper]  single, concurrent,
#                                          storage or all: runs, figures, report.md
#   ./simulate.sh experiments pareto       redraw docs/figures/pareto_*.png from files
#
# On a fresh clone it creates .venv and installs the project, then hands over to
# the Python command line (`python -m cli`, cli/): run-config merging and checks,
# `flwr run .` in Flower's simulation engine with one SuperNode per client, and
# the stop of every process the run started (also on Ctrl-C and SIGTERM).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# paths the user types (--out, --run-config FILE, --results-dir, PYTHONPATH, ...) are
# theirs: the command goes back to this folder (cli/main.py) after the install below
export SE_CALLER_DIR="${SE_CALLER_DIR:-$PWD}"
if [ -n "${PYTHONPATH:-}" ]; then  # a plug-in's folder, relative to the caller's
    abs=""
    IFS=: read -ra entries <<< "$PYTHONPATH"
    for entry in "${entries[@]}"; do
        case "$entry" in /*|"") ;; *) entry="$SE_CALLER_DIR/$entry" ;; esac
        abs="${abs:+$abs:}$entry"
    done
    export PYTHONPATH="$abs"
fi
cd "$ROOT"
VENV="$ROOT/.venv"

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV" >&2
    python3 -m venv "$VENV"
fi
if [ ! -f "$VENV/.installed" ] || [ pyproject.toml -nt "$VENV/.installed" ]; then
    echo "installing the project into $VENV (torch 2.14.1 from this machine's disk)" >&2
    # No pip cache: torch's CUDA build and its libraries take about 5.5 GB in the venv,
    # and a cached copy of their wheels would take as much again on a small disk.
    "$VENV/bin/python" -m pip install -q --no-cache-dir --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q --no-cache-dir -e ".[dev]" >&2
    # numba compiles the coding kernels on first use (15-20 s): once here, not in a run
    "$VENV/bin/python" -m coding.warmup >&2
    touch "$VENV/.installed"
fi

export PATH="$VENV/bin:$PATH"
export SE_CLI_PROG="${SE_CLI_PROG:-./simulate.sh}"
if [ "${1:-}" = experiments ]; then  # a program above the app (experiments/run.py)
    shift
    exec "$VENV/bin/python" -m experiments.run "$@"
fi
exec "$VENV/bin/python" -m cli "$@"
