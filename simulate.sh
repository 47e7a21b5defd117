#!/usr/bin/env bash
# Sharding Eraser on Flower: set up, run, test.
#
#   ./simulate.sh                          learn with the defaults (pyproject.toml)
#   ./simulate.sh --preset paper           a named preset (presets/<name>.toml)
#   ./simulate.sh --run-config "dataset='fmnist' num-rounds=5"   override keys
#   ./simulate.sh test [pytest args]       run the test suite
#   ./simulate.sh deploy [N] [--preset NAME] [--run-config "..."]   real SuperLink
#                                          + N SuperNodes on 127.0.0.1
#   ./simulate.sh experiments NAME [--preset quick|paper]   single, concurrent,
#                                          storage or all: runs, figures, report.md
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
    # flwr run starts a background SuperLink that keeps the environment of the run
    # that started it; each run has its own FLWR_HOME and ports, so this stops ours only
    pkill -f "$FLWR_HOME/local-superlink" 2>/dev/null || true
    if [ -n "${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT:-}" ]; then
        pkill -f "flwr-simulation --runtime-api-address 127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT" \
            2>/dev/null || true
    fi
}

run_simulation() {
    local preset="" supernodes="" args=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --preset) preset="$2"; shift 2 ;;
            --supernodes) supernodes="$2"; shift 2 ;;
            --run-config|-c) args+=(--run-config "$2"); shift 2 ;;
            -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
            *) echo "unknown argument: $1 (see ./simulate.sh --help)" >&2; exit 2 ;;
        esac
    done
    if [ -n "$preset" ] && [ ! -f "$ROOT/presets/$preset.toml" ]; then
        echo "unknown preset '$preset'; available: $(cd presets && ls *.toml | sed 's/.toml//' | xargs)" >&2
        exit 2
    fi
    # flwr run takes either TOML files or k=v pairs, not both: merge the preset and
    # the overrides (later wins) into one TOML file; print num-clients (default 100)
    local merged="$SE_RESULTS_DIR/.run-config-$$.toml"
    local clients
    clients=$(python3 - "$merged" "${preset:+$ROOT/presets/$preset.toml}" "${args[@]+"${args[@]}"}" <<'PY'
import json, re, sys, tomllib
out, preset, items = sys.argv[1], sys.argv[2], [a for a in sys.argv[3:] if a != "--run-config"]
values = {}
for item in ([preset] if preset else []) + items:
    if item.endswith(".toml"):
        with open(item, "rb") as f:
            values.update({k: json.dumps(v) if isinstance(v, str) else
                           str(v).lower() if isinstance(v, bool) else str(v)
                           for k, v in tomllib.load(f).items()})
    else:
        for key, value in re.findall(r"([\w-]+)\s*=\s*('[^']*'|\"[^\"]*\"|\S+)", item):
            values[key] = value
text = "".join(f"{k} = {v}\n" for k, v in values.items())
tomllib.loads(text)  # a malformed value fails here, with its line
open(out, "w").write(text)
print(tomllib.loads(text).get("num-clients", 100))
PY
)
    supernodes="${supernodes:-$clients}"
    # our own ports: a SuperLink started by another run (another FLWR_HOME) on the
    # default port would otherwise be reused, with that run's environment
    read -r FLWR_LOCAL_SUPERLINK_HTTP_API_PORT FLWR_LOCAL_CONTROL_API_PORT < <(python3 -c "
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(('127.0.0.1', 0))
print(*[s.getsockname()[1] for s in socks])")
    export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT FLWR_LOCAL_CONTROL_API_PORT
    export FLWR_HOME="$FLWR_HOME/sim-$$"  # this run's SuperLink, apps and database
    mkdir -p "$FLWR_HOME"
    trap 'stop_superlink; rm -rf "$FLWR_HOME"' EXIT
    local log="$SE_RESULTS_DIR/.run-$$.log"
    echo "flwr run . with $supernodes SuperNodes; log: $log" >&2
    flwr run . --stream --run-config "$merged" \
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

run_experiments() {
    # the paper's experiment suite (experiments/run.py): single, concurrent,
    # storage or all, with --preset quick|paper; figures and report.md at the end
    exec python -m experiments.run "$@"
}

main() {
    ensure_venv
    setup_env
    case "${1:-}" in
        test) shift; exec python -m pytest "$@" ;;
        deploy) shift; exec bash "$ROOT/scripts/deploy.sh" "$@" ;;
        experiments) shift; run_experiments "$@" ;;
        *) run_simulation "$@" ;;
    esac
}

main "$@"
