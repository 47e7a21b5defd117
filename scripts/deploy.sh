#!/usr/bin/env bash
# Sharding Eraser on Flower's deployment engine, all on this machine (127.0.0.1).
#
#   scripts/deploy.sh [N] [--preset NAME] [--run-config "k=v ..."]... [--keep]
#
# Starts one flower-superlink and N flower-supernodes (default 8; SuperNode i gets
# --node-config "partition-id=i num-partitions=N node-dir=<run>/nodes/i"), adds a
# [superlink.<name>] entry for them to $FLWR_HOME/config.toml, runs
# `flwr run <app> <name> --stream` and stops every process it started (also on
# failure and Ctrl-C). Run settings: pyproject defaults < deploy defaults
# (num-clients=N, num-shards=2, clients-per-round=4, as far as N allows) < preset
# < --run-config (later wins); num-clients is always N. Prints the summary tables,
# the wall time and, last, `summary: <path>`; exits non-zero when no summary.json
# was written. The run folder (logs, SuperLink database, node dirs) is removed
# after a successful run unless --keep is given.
# Environment: SE_DEPLOY_DIR (parent of the run folder; default $TMPDIR or /tmp),
# SE_DEPLOY_TIMEOUT (seconds for the whole run; default 0 = no limit),
# SE_DEPLOY_STAGE=0 (run `flwr run .` on the working tree instead of a copy of
# the app's files), and those of simulate.sh (FLWR_HOME, SE_DATA_DIR, SE_RESULTS_DIR).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
START_NS=$(date +%s%N)

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

# --- environment: the same defaults as simulate.sh's setup_env ----------------
if [ ! -x "$VENV/bin/flower-superlink" ]; then
    echo "no $VENV with Flower: run ./simulate.sh once to create it" >&2
    exit 2
fi
case ":$PATH:" in
    *":$VENV/bin:"*) ;;
    *) export PATH="$VENV/bin:$PATH" ;;
esac
export FLWR_HOME="${FLWR_HOME:-$ROOT/.flwr_home}"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export FLWR_TELEMETRY_ENABLED=0
export FLWR_DISABLE_UPDATE_CHECK=1  # offline: no update look-up
export SE_RESULTS_DIR="${SE_RESULTS_DIR:-$ROOT/results}"
if [ -z "${SE_DATA_DIR:-}" ] && [ -d "$ROOT/../shared/data" ]; then
    SE_DATA_DIR="$(cd "$ROOT/../shared/data" && pwd)"
    export SE_DATA_DIR
fi
# Only the HTTP APIs on --host/--port: no legacy gRPC servers on fixed ports.
unset FLWR_INTERNAL_GRPC_CONTROL_API FLWR_INTERNAL_GRPC_FLEET_API
mkdir -p "$FLWR_HOME" "$SE_RESULTS_DIR"

# --- arguments -----------------------------------------------------------------
NODES=8
PRESET=""
KEEP=0
OVERRIDES=()
while [ $# -gt 0 ]; do
    case "$1" in
        [0-9]*) NODES="$1"; shift ;;
        --preset) PRESET="${2:?--preset needs a name}"; shift 2 ;;
        --run-config|-c) OVERRIDES+=("${2?--run-config needs a value}"); shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see scripts/deploy.sh --help)" >&2; exit 2 ;;
    esac
done
if ! [[ "$NODES" =~ ^[0-9]+$ ]] || [ "$NODES" -lt 1 ]; then
    echo "N must be a positive integer, got '$NODES'" >&2
    exit 2
fi
PRESET_FILE=""
if [ -n "$PRESET" ]; then
    PRESET_FILE="$ROOT/presets/$PRESET.toml"
    if [ ! -f "$PRESET_FILE" ]; then
        echo "unknown preset '$PRESET'; available:" \
            "$(cd "$ROOT/presets" && ls ./*.toml 2>/dev/null | sed 's|^\./||; s/\.toml$//' | xargs)" >&2
        exit 2
    fi
fi

# --- run folder ----------------------------------------------------------------
PARENT="${SE_DEPLOY_DIR:-${TMPDIR:-/tmp}}"
mkdir -p "$PARENT"
RUN_DIR="$(mktemp -d "$(cd "$PARENT" && pwd)/se-deploy.XXXXXX")"
case "$RUN_DIR" in
    *[[:space:]\"\'\\]*) echo "run folder '$RUN_DIR' has spaces or quotes" >&2
                         rmdir "$RUN_DIR"; exit 2 ;;
esac
mkdir -p "$RUN_DIR/logs" "$RUN_DIR/nodes"

# --- cleanup: every process started here, with all its descendants, by PID -----
PIDS=()          # processes started by this script
LINK_NAME=""     # the [superlink.<name>] entry added to $FLWR_HOME/config.toml
PORTS=()         # ports of this run (to find strays that left the process tree)
SUCCESS=0

descendants() {  # PIDs of the given processes and of all their descendants
    [ $# -gt 0 ] || return 0
    ps -e -o pid= -o ppid= | awk -v roots="$*" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2 }
        END {
            changed = 1
            while (changed) {
                changed = 0
                for (p in parent) if (!(p in keep) && (parent[p] in keep)) {
                    keep[p] = 1; changed = 1
                }
            }
            for (p in keep) print p
        }'
}

alive() {  # the given PIDs that still exist (zombies excluded)
    [ $# -gt 0 ] || return 0
    ps -o pid=,stat= -p "$(echo "$@" | tr -s ' ' ',')" 2>/dev/null \
        | awk '$2 !~ /^Z/ {print $1}'
    return 0
}

strays() {  # processes whose command line names one of this run's addresses
    local port pid
    for port in "${PORTS[@]+"${PORTS[@]}"}"; do
        for pid in $(pgrep -f -- "127\.0\.0\.1:$port( |$)" 2>/dev/null || true); do
            [ "$pid" != "$$" ] && echo "$pid"
        done
    done
    pgrep -f -- "$RUN_DIR( |/|\"|$)" 2>/dev/null | grep -vx "$$" || true
}

remove_link_entry() {
    [ -n "$LINK_NAME" ] || return 0
    python3 - "$FLWR_HOME/config.toml" "$LINK_NAME" <<'PY' || true
import fcntl, re, sys
from pathlib import Path
path, name = Path(sys.argv[1]), sys.argv[2]
with open(path.with_name(".config.toml.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    text = path.read_text() if path.exists() else ""
    block = re.compile(r"\n?# se-deploy begin %s\n.*?# se-deploy end %s\n"
                       % (re.escape(name), re.escape(name)), re.S)
    path.write_text(block.sub("\n", text, count=1).rstrip("\n") + "\n")
PY
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    local all left i
    all=$(descendants "${PIDS[@]+"${PIDS[@]}"}")
    if [ -n "$all" ]; then
        # shellcheck disable=SC2086
        kill -TERM $all 2>/dev/null
        for i in $(seq 1 25); do   # up to 5 s for a graceful exit
            left=$(alive $all)
            [ -z "$left" ] && break
            if [ -n "${SE_DEPLOY_DEBUG:-}" ]; then
                # shellcheck disable=SC2086
                ps -o pid=,stat=,etime=,args= -p "$(echo $left | tr ' ' ,)" | cut -c1-120 >&2
                echo "--" >&2
            fi
            sleep 0.2
        done
        # children spawned meanwhile, and processes that left the tree
        left=$(alive $all $(descendants $(alive $all)) $(strays) | sort -u)
        if [ -n "$left" ]; then
            echo "deploy: kill -9 $(echo $left)" >&2
            # shellcheck disable=SC2086
            kill -KILL $left 2>/dev/null
        fi
    fi
    wait 2>/dev/null
    left=$(strays | sort -u)
    if [ -n "$left" ]; then
        echo "deploy: killing leftover processes of this run: $(echo $left)" >&2
        # shellcheck disable=SC2086
        kill -KILL $left 2>/dev/null
    fi
    remove_link_entry
    if [ ${#PIDS[@]} = 0 ] || { [ "$SUCCESS" = 1 ] && [ "$KEEP" = 0 ]; }; then
        rm -rf "$RUN_DIR"  # nothing started (bad arguments), or a clean success
    else
        echo "deploy: run folder kept: $RUN_DIR (logs/)" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'echo "deploy: interrupted" >&2; exit 130' INT
trap 'echo "deploy: terminated" >&2; exit 143' TERM

# --- run config: merge, validate, write one TOML file --------------------------
# (flwr run rejects a TOML file passed together with key=value overrides.)
RUN_CONFIG="$RUN_DIR/run-config.toml"
python3 - "$NODES" "$RUN_CONFIG" "$PRESET_FILE" "${OVERRIDES[@]+"${OVERRIDES[@]}"}" <<'PY'
import json, os, sys, time
from pathlib import Path

from flwr.common.config import parse_config_args

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from server_app.config import ConfigError, RunConfig

nodes, out, preset = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
defaults = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
shards = min(2, nodes)
over = {"num-clients": nodes, "num-shards": shards,
        "clients-per-round": min(4, shards * (nodes // shards))}
if preset:
    over.update(parse_config_args([preset]))
    if over.get("num-clients", nodes) != nodes:
        print(f"deploy: preset sets num-clients={over['num-clients']}; "
              f"using num-clients={nodes} (one per SuperNode)", file=sys.stderr)
explicit = set()
for arg in sys.argv[4:]:
    given = parse_config_args([arg])
    if given.get("num-clients", nodes) != nodes:
        sys.exit(f"deploy: --run-config sets num-clients={given['num-clients']} but "
                 f"there are {nodes} SuperNodes: pass N={given['num-clients']} instead")
    over.update(given)
    explicit.update(given)
over["num-clients"] = nodes
# a preset's topology shrunk to N SuperNodes (values given with --run-config are
# left as they are: a misfit there is an error below)
shards = over.get("num-shards", defaults["num-shards"])
if "num-shards" not in explicit and isinstance(shards, int) and shards > nodes:
    print(f"deploy: num-shards {shards} -> {nodes} (N = {nodes})", file=sys.stderr)
    over["num-shards"] = shards = nodes
cpr = over.get("clients-per-round", defaults["clients-per-round"])
if "clients-per-round" not in explicit and isinstance(shards, int) and shards >= 1 \
        and isinstance(cpr, int):
    fit = max(shards, min(cpr, shards * (nodes // shards)) // shards * shards)
    if fit != cpr:
        print(f"deploy: clients-per-round {cpr} -> {fit} ({shards} shards of "
              f"{nodes // shards} clients)", file=sys.stderr)
        over["clients-per-round"] = fit
unknown = sorted(set(over) - set(defaults))
if unknown:
    sys.exit(f"deploy: unknown run-config keys: {', '.join(unknown)}")
merged = {**defaults, **over}
if not merged.get("run-name"):
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    over["run-name"] = (f"{merged['dataset']}-{merged['partition']}-deploy{nodes}-"
                        f"{stamp}-{os.getppid()}")
    merged["run-name"] = over["run-name"]
try:
    RunConfig.from_run_config(merged)
except ConfigError as err:
    sys.exit(f"deploy: {err}")


def value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


out.write_text("".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in over.items()))
print("run config: " + " ".join(f"{k}={value(v)}" for k, v in over.items()),
      file=sys.stderr)
PY

# --- ports: one for the SuperLink, one per SuperNode ---------------------------
mapfile -t PORTS < <(python3 - "$((NODES + 1))" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
    s.close()
PY
)
LINK_PORT="${PORTS[0]}"
LINK="127.0.0.1:$LINK_PORT"

wait_for_port() {  # wait_for_port PORT PID SECONDS NAME
    local i
    for i in $(seq 1 $(($3 * 5))); do
        if ! kill -0 "$2" 2>/dev/null; then
            echo "deploy: $4 exited during start-up (see $RUN_DIR/logs)" >&2
            return 1
        fi
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    echo "deploy: $4 not listening on 127.0.0.1:$1 after $3 s" >&2
    return 1
}

# --- SuperLink ------------------------------------------------------------------
# One HTTP server on --host/--port serves the Fleet, Control and Runtime APIs
# (flwr 1.42; the *-api-address flags are deprecated or rejected).
flower-superlink --insecure --host 127.0.0.1 --port "$LINK_PORT" \
    --database "$RUN_DIR/superlink.db" --disable-runtime-dependency-installation \
    >"$RUN_DIR/logs/superlink.log" 2>&1 &
LINK_PID=$!
PIDS+=("$LINK_PID")
echo "deploy: SuperLink pid $LINK_PID on $LINK; run folder $RUN_DIR" >&2
wait_for_port "$LINK_PORT" "$LINK_PID" 60 SuperLink

# --- SuperNodes -------------------------------------------------------------------
NODE_PIDS=()
for ((i = 0; i < NODES; i++)); do
    mkdir -p "$RUN_DIR/nodes/$i"
    # one BLAS/OpenMP thread per ClientApp process: N of them share these cores
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}" \
    flower-supernode --insecure --superlink "$LINK" \
        --host 127.0.0.1 --port "${PORTS[$((i + 1))]}" \
        --node-config "partition-id=$i num-partitions=$NODES node-dir=\"$RUN_DIR/nodes/$i\"" \
        >"$RUN_DIR/logs/supernode-$i.log" 2>&1 &
    PIDS+=("$!")
    NODE_PIDS+=("$!")
done
echo "deploy: $NODES SuperNodes, pids ${NODE_PIDS[*]}, ports ${PORTS[*]:1}" >&2

# --- connection entry and the run ---------------------------------------------------
LINK_NAME="se-deploy-$LINK_PORT"
python3 - "$FLWR_HOME/config.toml" "$LINK_NAME" "$LINK" <<'PY'
import fcntl, sys
from pathlib import Path
path, name, address = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(path.with_name(".config.toml.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    text = path.read_text() if path.exists() else '[superlink]\ndefault = "local"\n'
    block = (f"\n# se-deploy begin {name}\n[superlink.{name}]\n"
             f'address = "{address}"\ninsecure = true\n# se-deploy end {name}\n')
    path.write_text(text.rstrip("\n") + "\n" + block)
PY

# The app as `flwr run .` would bundle it, copied to the run folder: flwr walks
# every file under the app folder before filtering (.venv alone: about 10-15 s).
APP="$ROOT"
if [ "${SE_DEPLOY_STAGE:-1}" = 1 ] && python3 - "$RUN_DIR/app" <<'PY'
import shutil, subprocess, sys
from pathlib import Path
out = Path(sys.argv[1])
names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"],
                       check=True, capture_output=True).stdout.decode().split("\0")
keep = (".py", ".toml", ".md", ".yaml", ".yml", ".json", ".jsonl")
extra = {".gitignore", "LICENSE", "LICENSE.md", ".editorconfig"}
for name in names:
    src = Path(name)
    if name and src.is_file() and not src.is_symlink() and (
            src.suffix in keep or src.name in extra):
        (out / src.parent).mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out / src)
if not (out / "pyproject.toml").is_file():
    sys.exit(1)
PY
then
    APP="$RUN_DIR/app"
fi

LOG="$RUN_DIR/logs/flwr-run.log"
: >"$LOG"
echo "deploy: flwr run $APP $LINK_NAME --stream (log: $LOG)" >&2
( exec flwr run "$APP" "$LINK_NAME" --stream --run-config "$RUN_CONFIG" ) >>"$LOG" 2>&1 &
RUN_PID=$!
PIDS+=("$RUN_PID")
tail -n +1 -f "$LOG" &
TAIL_PID=$!
PIDS+=("$TAIL_PID")

has_summary() { grep -aqE "summary: /[^ ]+summary\.json" "$LOG"; }
TIMEOUT="${SE_DEPLOY_TIMEOUT:-0}"
REATTACH=0
while true; do
    while kill -0 "$RUN_PID" 2>/dev/null; do
        for pid in "$LINK_PID" "${NODE_PIDS[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "deploy: process $pid (SuperLink or SuperNode) died; stopping" \
                    "(see $RUN_DIR/logs)" >&2
                exit 1
            fi
        done
        elapsed=$((($(date +%s%N) - START_NS) / 1000000000))
        if [ "$TIMEOUT" -gt 0 ] && [ "$elapsed" -ge "$TIMEOUT" ]; then
            echo "deploy: no result after SE_DEPLOY_TIMEOUT=$TIMEOUT s; stopping" >&2
            exit 1
        fi
        sleep 0.5
    done
    status=0
    wait "$RUN_PID" || status=$?
    has_summary && break
    # The log stream ended without a result. If a signal from outside ended the
    # CLI while the ServerApp still runs on our SuperLink, follow the run again.
    run_id=$(grep -aoE "Successfully started run [0-9]+" "$LOG" | head -n 1 | awk '{print $4}')
    if [ "$status" -le 128 ] || [ -z "$run_id" ] || [ "$REATTACH" -ge 3 ]; then
        [ "$status" = 0 ] || echo "deploy: flwr exited with status $status" >&2
        break
    fi
    REATTACH=$((REATTACH + 1))
    echo "deploy: the log stream was killed (status $status); following run $run_id again" >&2
    ( exec flwr log "$run_id" "$LINK_NAME" --stream ) >>"$LOG" 2>&1 &
    RUN_PID=$!
    PIDS+=("$RUN_PID")
done
sleep 0.5  # let tail print the end of the log
kill "$TAIL_PID" 2>/dev/null || true

summary=$(grep -aoE "summary: /[^ ]+summary\.json" "$LOG" | tail -n 1 | cut -d' ' -f2 || true)
if [ -z "$summary" ] || [ ! -f "$summary" ]; then
    echo "the run failed: no summary.json was written (see $LOG)" >&2
    expired=$(cat "$RUN_DIR"/logs/supernode-*.log 2>/dev/null \
        | grep -c "task-token authentication failed" || true)
    if [ "${expired:-0}" -gt 0 ]; then
        echo "deploy: $expired ClientApp calls were refused with an expired task token:" \
            "ClientApp processes took longer than Flower's 30 s start window" \
            "(an overloaded machine? try fewer SuperNodes)" >&2
    fi
    exit 1
fi
SUCCESS=1
python -m server_app.report "$summary"
wall=$(python3 -c "import sys; print(f'{(int(sys.argv[2]) - int(sys.argv[1])) / 1e9:.1f}')" \
    "$START_NS" "$(date +%s%N)")
echo "deploy wall time: ${wall} s ($NODES SuperNodes, start-up to result)"
echo "summary: $summary"
