#!/usr/bin/env bash
# Sharding Eraser on Flower: set up, run, test.
#
#   ./simulate.sh                          learn with the defaults (pyproject.toml)
#   ./simulate.sh --preset paper           a named preset (presets/<name>.toml)
#   ./simulate.sh --run-config "dataset='fmnist' num-rounds=5"   override keys
#   ./simulate.sh test [pytest args]       run the test suite
#
# On a fresh clone it creates .venv and installs the project. It runs `flwr run .`
# in Flower's simulation engine with one SuperNode per client, stops the SuperLink
# it started, prints a summary table and ends with `summary: <path>`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"

ensure_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        echo "creating $VENV" >&2
        python3 -m venv "$VENV"
    fi
    if [ ! -f "$VENV/.installed" ] || [ pyproject.toml -nt "$VENV/.installed" ]; then
        echo "installing the project into $VENV (torch 2.14.1 from this machine's disk)" >&2
        "$VENV/bin/python" -m pip install -q --upgrade pip >&2
        "$VENV/bin/python" -m pip install -q -e ".[dev]" >&2
        touch "$VENV/.installed"
    fi
}

setup_env() {
    export PATH="$VENV/bin:$PATH"
    export FLWR_HOME="${FLWR_HOME:-$ROOT/.flwr_home}"
    export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
    export FLWR_TELEMETRY_ENABLED=0
    export RAY_TMPDIR="${RAY_TMPDIR:-/tmp/ray-se-$(id -u)}"
    export SE_RESULTS_DIR="${SE_RESULTS_DIR:-$ROOT/results}"
    if [ -z "${SE_DATA_DIR:-}" ] && [ -d "$ROOT/../shared/data" ]; then
        SE_DATA_DIR="$(cd "$ROOT/../shared/data" && pwd)"
        export SE_DATA_DIR
    fi
    mkdir -p "$FLWR_HOME" "$RAY_TMPDIR" "$SE_RESULTS_DIR"
}

stop_superlink() {
    # flwr run starts a background SuperLink that keeps the environment of the
    # run that started it; ours is recognised by its log path under $FLWR_HOME.
    pkill -f "$FLWR_HOME/local-superlink" 2>/dev/null || true
    pkill -f "flwr-simulation.*$FLWR_HOME" 2>/dev/null || true
}

run_simulation() {
    local preset="" supernodes="" args=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --preset) preset="$2"; shift 2 ;;
            --supernodes) supernodes="$2"; shift 2 ;;
            --run-config|-c) args+=(--run-config "$2"); shift 2 ;;
            -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
            *) echo "unknown argument: $1 (see ./simulate.sh --help)" >&2; exit 2 ;;
        esac
    done
    local configs=()
    if [ -n "$preset" ]; then
        local file="$ROOT/presets/$preset.toml"
        if [ ! -f "$file" ]; then
            echo "unknown preset '$preset'; available: $(cd presets && ls *.toml | sed 's/.toml//' | xargs)" >&2
            exit 2
        fi
        configs+=(--run-config "$file")
    fi
    configs+=("${args[@]+"${args[@]}"}")
    if [ -z "$supernodes" ]; then
        # one SuperNode per client: the last num-clients given wins, else 100
        supernodes=$(python3 - "$preset" "${args[@]+"${args[@]}"}" <<'PY'
import re, sys, pathlib
text = ""
if sys.argv[1]:
    text += pathlib.Path("presets", sys.argv[1] + ".toml").read_text()
text += " ".join(a for a in sys.argv[2:] if a != "--run-config")
hits = re.findall(r"num-clients\s*=\s*(\d+)", text)
print(hits[-1] if hits else 100)
PY
)
    fi
    stop_superlink
    trap stop_superlink EXIT
    local log="$SE_RESULTS_DIR/.last-run.log"
    echo "flwr run . with $supernodes SuperNodes; log: $log" >&2
    flwr run . --stream "${configs[@]+"${configs[@]}"}" \
        --federation-config "num-supernodes=$supernodes client-resources-num-cpus=1" \
        2>&1 | tee "$log"
    local summary
    summary=$(grep -aoE "summary: /[^ ]+summary\.json" "$log" | tail -n 1 | cut -d' ' -f2 || true)
    if [ -z "$summary" ] || [ ! -f "$summary" ]; then
        echo "the run failed: no summary.json was written (see $log)" >&2
        exit 1
    fi
    python -m server_app.report "$summary"
    echo "summary: $summary"
}

main() {
    ensure_venv
    setup_env
    case "${1:-}" in
        test) shift; exec python -m pytest "$@" ;;
        *) run_simulation "$@" ;;
    esac
}

main "$@"
