"""Run the ServerApp in-process (experiments.grid.InProcessGrid) with a preset.

usage: python docs/results/verification/run_inprocess.py PRESET OUT_DIR [k=v ...]
Values are TOML literals (e.g. seed=1 backdoor-fraction=0.0). Prints the path
of summary.json. The same app and ClientApp as ``flwr run``, without Ray.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib
from flwr.app import Context, RecordDict

from client_app.app import app as client_app
from experiments.grid import InProcessGrid, set_task_identity
from server_app.app import main
from task.config import fused_run_config


def run(preset: str, out: str, pairs: list[str]) -> Path:
    """Run ``presets/PRESET.toml`` with ``pairs`` on top; results under ``out``."""
    root = Path(__file__).resolve().parents[3]
    overrides = tomllib.loads((root / "presets" / f"{preset}.toml").read_text())
    overrides.update(tomllib.loads("\n".join(pairs)))
    name = re.sub(r"[^A-Za-z0-9._-]", "", "-".join([preset, *pairs]))[:100]
    config = fused_run_config({**overrides, "results-dir": out, "run-name": name})
    set_task_identity()
    grid = InProcessGrid(client_app, int(config["num-clients"]), config, ())
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))
    return Path(out) / name / "summary.json"


if __name__ == "__main__":
    print(run(sys.argv[1], sys.argv[2], sys.argv[3:]))
