#!/usr/bin/env bash
# Sharding Eraser on Flower's deployment engine, all on this machine (127.0.0.1):
# the same as `./simulate.sh deploy`, without the .venv set-up.
#
#   scripts/deploy.sh [N] [--preset NAME] [--run-config "k=v ..."]... [--keep]
#
# See `scripts/deploy.sh --help` (cli/deploy.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ ! -x "$ROOT/.venv/bin/flower-superlink" ]; then
    echo "no $ROOT/.venv with Flower: run ./simulate.sh once to create it" >&2
    exit 2
fi
export PATH="$ROOT/.venv/bin:$PATH"
export SE_CLI_PROG="${SE_CLI_PROG:-./simulate.sh}"
exec "$ROOT/.venv/bin/python" -m cli deploy "$@"
