"""Run the ServerApp in-process (experiments.grid.InProcessGrid) with a preset.

usage: python docs/results/verification/run_inprocess.py PRESET OUT_DIR [k=v ...] [--into F]
Values are TOML literals (e.g. seed=1 backdoor-fraction=0.0); ``--into F`` also
copies the summary to F (a committed results file). Prints the path
of summary.json, to which it adds the commit and the code fingerprints
(:func:`experiments.time_saved.fingerprint`, and ``audit_fingerprint`` with the
audits' code) the run was made with. The same app
and ClientApp as ``flwr run``, without Ray.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import tomllib
from flwr.app import Context, RecordDict
from flwr.common.config import flatten_dict

from cli.config import preset_values
from client_app.app import app as client_app
from experiments.grid import InProcessGrid, set_task_identity
from experiments.time_saved import audit_fingerprint, fingerprint
from server_app.app import main
from task.config import fused_run_config


def run(preset: str, out: str, pairs: list[str]) -> Path:
    """Run ``presets/PRESET.toml`` with ``pairs`` on top; results under ``out``."""
    root = Path(__file__).resolve().parents[3]
    overrides = preset_values(preset)
    overrides.update(flatten_dict(tomllib.loads("\n".join(pairs))))
    name = re.sub(r"[^A-Za-z0-9._-]", "", "-".join([preset, *pairs]))[:100]
    config = fused_run_config({**overrides, "results-dir": out, "run-name": name})
    set_task_identity()
    grid = InProcessGrid(client_app, int(config["num-clients"]), config, ())
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))
    summary = Path(out) / name / "summary.json"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, text=True,
                            capture_output=True, check=False).stdout.strip()
    made = json.loads(summary.read_text())
    summary.write_text(json.dumps({**made, "commit": commit, "fingerprint": fingerprint(),
                                   "audit_fingerprint": audit_fingerprint()}, indent=1))
    return summary


if __name__ == "__main__":
    args = sys.argv[1:]
    into = Path(args.pop(args.index("--into") + 1)) if "--into" in args else None
    args = [a for a in args if a != "--into"]
    made = run(args[0], args[1], args[2:])
    if into is not None:
        into.write_text(made.read_text())
    print(into or made)
