"""Crash and resume: kill the ServerApp mid-unlearning, re-run, same models."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from server_app.runlog import RunLog

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from conftest import InProcessGrid
    from flwr.app import Context, RecordDict
    from experiments.grid import set_task_identity
    from client_app.app import app as client_app
    from server_app.app import main
    set_task_identity()
    config = json.loads(sys.argv[1])
    grid = InProcessGrid(client_app, config["num-clients"], config)
    main(grid, Context(run_id=1, node_id=0, node_config={{}}, state=RecordDict(),
                       run_config=config))
""")


def run_child(config, kill_on=None):
    script = CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"))
    proc = subprocess.Popen([sys.executable, "-c", script, json.dumps(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if kill_on and kill_on in line:
            proc.send_signal(signal.SIGKILL)  # the ServerApp process dies here
            break
    proc.wait(timeout=600)
    return proc.returncode, "".join(lines)


def models(path):
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


def test_killed_unlearning_resumes_to_the_same_models(tmp_path, shared_data):
    from conftest import TINY

    config = {**TINY, "data-dir": str(shared_data), "results-dir": str(tmp_path),
              "frameworks": "SE,FR,FE", "forget-clients": "2", "mia": False}
    # 1. killed right after SE finished, while FR runs
    code, out = run_child({**config, "run-name": "crash"}, kill_on="SE done: models saved")
    assert code == -signal.SIGKILL, out[-2000:]
    run = tmp_path / "crash"
    assert not (run / "summary.json").exists()
    log = RunLog(run / "run.sqlite", {**_settings(config, "crash")})
    assert [s for _, _, s in log.requests()] == ["in_progress"]
    assert log.done("unlearn:SE") is not None and log.done("unlearn:FR") is None
    log.close()
    # 2. the same command again resumes and finishes
    code, out = run_child({**config, "run-name": "crash"})
    assert code == 0, out[-3000:]
    assert "(resumed)" in out and "SE already done" in out
    assert "SE request 0" not in out  # SE was not applied twice
    summary = json.loads((run / "summary.json").read_text())
    assert summary["unlearning"]["requests"] == [[2]]
    log = RunLog(run / "run.sqlite", _settings(config, "crash"))
    assert [s for _, _, s in log.requests()] == ["done"]
    # 3. an uninterrupted run with the same seeds ends with the same models
    code, out = run_child({**config, "run-name": "whole"})
    assert code == 0, out[-3000:]
    for name in ("SE", "FR", "FE"):
        a, b = models(run / "models" / f"{name}.npz"), models(
            tmp_path / "whole" / "models" / f"{name}.npz")
        assert a.keys() == b.keys()
        assert all(a[k].tobytes() == b[k].tobytes() for k in a), name


def _settings(config, run_name):
    from server_app.config import RunConfig

    return RunConfig.from_run_config({**config, "run-name": run_name}).as_dict()
