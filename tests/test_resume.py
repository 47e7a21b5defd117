"""Crash and resume: kill the ServerApp mid-unlearning, re-run, same models."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from history.files import read_arrays
from runstore.catalog import RunLog

pytestmark = pytest.mark.subprocess  # each test kills and restarts a run

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


def start_child(config, script=CHILD):
    """The in-process ServerApp of ``config`` in a process of its own (output piped)."""
    script = script.format(root=str(ROOT), tests=str(ROOT / "tests"))
    return subprocess.Popen([sys.executable, "-c", script, json.dumps(config)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def finished(proc):
    """(exit status, output) of a child started by :func:`start_child`."""
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def run_child(config, kill_on=None):
    proc = start_child(config)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if kill_on and kill_on in line:
            proc.send_signal(signal.SIGKILL)  # the ServerApp process dies here
            break
    proc.wait(timeout=600)
    return proc.returncode, "".join(lines)


def models(path):
    return read_arrays(path)


def test_killed_unlearning_resumes_to_the_same_models(tmp_path, shared_data):
    from conftest import TINY

    config = {**TINY, "data-dir": str(shared_data), "results-dir": str(tmp_path),
              "frameworks": "SE,FR", "forget-clients": "2", "mia": False}
    # the reference: an uninterrupted run with the same seeds, beside the others
    whole = start_child({**config, "run-name": "whole"})
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
    # 3. the uninterrupted run ended with the same models
    code, out = finished(whole)
    assert code == 0, out[-3000:]
    for name in ("SE", "FR"):
        a, b = models(run / "models" / f"{name}.npz"), models(
            tmp_path / "whole" / "models" / f"{name}.npz")
        assert a.keys() == b.keys()
        assert all(a[k].tobytes() == b[k].tobytes() for k in a), name


def test_killed_learning_goes_on_after_its_last_round(tmp_path, shared_data):
    from conftest import TINY

    config = {**TINY, "num-rounds": 3, "data-dir": str(shared_data),
              "results-dir": str(tmp_path), "frameworks": "SE,FR",
              "forget-clients": "2", "mia": False}
    whole = start_child({**config, "run-name": "whole"})
    code, out = run_child({**config, "run-name": "crash"}, kill_on="sharded round 2/3")
    assert code == -signal.SIGKILL, out[-2000:]
    code, out = run_child({**config, "run-name": "crash"})
    assert code == 0, out[-3000:]
    # the checkpoint of round 1 or 2 (the kill races the second one): not from W^0
    assert ("resumed: sharded learning goes on after round 2" in out
            or "resumed: sharded learning goes on after round 1" in out), out[-3000:]
    assert "sharded round 1/3" not in out.split("resumed: sharded learning")[1]
    code, whole_out = finished(whole)
    assert code == 0, whole_out[-3000:]
    mine, theirs = (json.loads((tmp_path / n / "summary.json").read_text())["learning"]
                    for n in ("crash", "whole"))
    assert [r["round"] for r in mine["rounds"]] == [1, 2, 3]
    assert mine["client_epochs"] == theirs["client_epochs"]
    assert mine["accuracy"] == theirs["accuracy"]
    for name in ("SE", "FR"):  # the same models as a run never killed
        a, b = models(tmp_path / "crash" / "models" / f"{name}.npz"), models(
            tmp_path / "whole" / "models" / f"{name}.npz")
        assert all(a[k].tobytes() == b[k].tobytes() for k in a), name


def _settings(config, run_name):
    """What the ServerApp records (:func:`server_app.stored.run_settings`)."""
    from server_app.config import RunConfig
    from server_app.stored import run_settings

    cfg = RunConfig.from_run_config({**config, "run-name": run_name})
    return run_settings(cfg, cfg.data.data_dir)


STAGED_CHILD = CHILD.replace("set_task_identity()\n", textwrap.dedent("""\
    set_task_identity()
    from cli.forget import submit
    from server_app.stages import pipeline
    real = pipeline.run_stage
    def run_stage(run, member):  # the request arrives while stage 3 learns
        if len(run.members) == 2:  # the client: from the test, once it knows it
            submit(config["run-name"], sys.stdin.readline().strip(),
                   config["results-dir"])
        return real(run, member)
    pipeline.run_stage = run_stage
"""))


def test_killed_staged_run_resumes_at_its_stage_and_keeps_late_requests(
        tmp_path, shared_data):
    """Killed in stage 3, a request recorded while it was down: handled once, and
    the models are those of a run that was never killed."""
    from conftest import TINY

    from cli.forget import submit
    from runstore.inbox import RequestInbox

    config = {**TINY, "num-clients": 12, "num-stages": 3, "joins-per-stage": 2,
              "leaves-per-stage": 1, "requests-per-stage": 1, "frameworks": "SE,FR",
              "mia": False, "data-dir": str(shared_data), "results-dir": str(tmp_path)}
    # the reference (its request arrives while stage 3 learns), beside the others
    whole = start_child({**config, "run-name": "whole"}, STAGED_CHILD)
    code, out = run_child({**config, "run-name": "crash"}, kill_on="stage 3 learn round 5")
    assert code == -signal.SIGKILL, out[-2000:]
    run = tmp_path / "crash"
    log = RunLog(run / "run.sqlite", _settings(config, "crash"))
    stage2 = log.done("stage:2")
    assert stage2 is not None and log.done("stage:3") is None
    log.close()
    client = next(p for p in stage2["present_clients"] if p not in stage2["forgotten"])
    rid = submit("crash", str(client), str(tmp_path))  # while the ServerApp is down
    whole.stdin.write(f"{client}\n")  # the same request, in the reference run
    whole.stdin.flush()
    code, out = run_child({**config, "run-name": "crash"})
    assert code == 0, out[-3000:]
    assert "stage 1 already done" in out and "stage 2 already done" in out
    summary = json.loads((run / "summary.json").read_text())
    assert rid in summary["stages"][2]["requests"]
    inbox = RequestInbox(run / "run.sqlite")
    assert [r.state for r in inbox.all()] == ["done"] * 4
    inbox.close()
    # the same requests, never killed: the same models and receipts
    code, out = finished(whole)
    assert code == 0, out[-3000:]
    for name in ("stage3", "stage3-FR"):
        a, b = models(run / "models" / f"{name}.npz"), models(
            tmp_path / "whole" / "models" / f"{name}.npz")
        assert a.keys() == b.keys()
        assert all(a[k].tobytes() == b[k].tobytes() for k in a), name
    receipts = [sorted((f / "receipts").glob("*.json")) for f in (run, tmp_path / "whole")]
    fields = [[{k: json.loads(p.read_text())[k] for k in ("clients", "stage", "status")}
               for p in found] for found in receipts]
    assert len(fields[0]) == 4
    assert sorted(map(str, fields[0])) == sorted(map(str, fields[1]))
