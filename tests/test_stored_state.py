"""Stored state is checked before any engine starts (issue 29 item 3).

One run folder is made once with the real ServerApp on the in-process grid and
left as a killed run leaves it (no summary.json); each test damages a copy the
way a disk, an operator or a backup restore would, then starts the command
(``run`` or ``deploy``, with a fake ``flwr`` on PATH that records being called;
in this process, and once as ``python -m cli``). Each damage is one line on
stderr naming the file, exit status 2, no engine, and not one byte changed in
the run folder; the intact folder passes. A finished coded run whose node folder
is deleted is refused the same way by ``forget`` (a later request) and by the
ServerApp, until ``--lost-nodes`` accepts the folder as lost.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import sys
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from cli import config
from cli.main import main as cli_main
from server_app.app import prepare
from server_app.config import ConfigError
from server_app.stored import StoredStateError
from task.config import fused_run_config
from tests.conftest import TINY
from tests.test_cli import _cli

RUN = "r"


@pytest.fixture(scope="module")
def stored(tmp_path_factory, shared_data):
    """(overrides, results dir, pristine copy): a one-stage run killed before its end."""
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity
    from server_app.app import main

    set_task_identity()  # module scope: before the autouse fixture
    base = tmp_path_factory.mktemp("stored")
    overrides = {**TINY, "num-rounds": 1, "test-samples": 100, "frameworks": "SE",
                 "forget-clients": "2", "mia": False,
                 "data-dir": str(shared_data), "results-dir": str(base / "results"),
                 "run-name": RUN}
    run_config = fused_run_config(overrides)
    grid = InProcessGrid(client_app, TINY["num-clients"], run_config)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=run_config))
    folder = base / "results" / RUN
    (folder / "summary.json").unlink()  # as if killed right before writing it
    shutil.copytree(folder, base / "pristine")
    return overrides, base / "results", base / "pristine"


@pytest.fixture
def run_folder(stored):
    """The stored run, restored to its pristine state for each test."""
    overrides, results, pristine = stored
    folder = results / RUN
    shutil.rmtree(folder)
    shutil.copytree(pristine, folder)
    return folder


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(folder.rglob("*"))}


def _fake_flwr(tmp_path: Path) -> Path:
    """A ``flwr`` that records its call (its file) and writes nothing."""
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    record = tmp_path / "flwr-called"
    (fake / "flwr").write_text(f'#!/bin/sh\necho "$@" >> "{record}"\n')
    (fake / "flwr").chmod(0o755)
    return record


def _start(command: list[str], stored, tmp_path, capsys, items: dict | None = None):
    """``command`` with the run's run.toml: (exit status, stderr, fake flwr's record)."""
    path = tmp_path / "run.toml"
    path.write_text(config.to_toml(items or stored[0]))
    return _command([*command, "--run-config", str(path)], tmp_path, capsys)


def _command(argv: list[str], tmp_path, capsys):
    """``argv`` in this process: (exit status, stderr, fake flwr's record)."""
    record = _fake_flwr(tmp_path)
    environ = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT,
                                                 signal.SIGHUP)}
    os.environ.update({
        "PATH": os.pathsep.join([str(record.parent / "fakebin"),
                                 str(Path(sys.executable).parent), os.environ["PATH"]]),
        "SE_RESULTS_DIR": str(tmp_path / "results"),
        "FLWR_HOME": str(tmp_path / "flwr_home"), "SE_DEPLOY_DIR": str(tmp_path / "d")})
    capsys.readouterr()
    try:
        status = cli_main(argv)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return status, capsys.readouterr().err, record


def _refused(command, stored, tmp_path, capsys, folder, *words, items=None):
    before = _snapshot(folder)
    status, err, record = _start(command, stored, tmp_path, capsys, items)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    assert not record.exists()  # no engine was started
    assert _snapshot(folder) == before  # nothing changed on disk
    assert not (tmp_path / "d").exists()  # deploy: no folder for its processes
    return lines[0]


def test_the_intact_folder_resumes_and_its_log_is_in_the_run_folder(
        stored, run_folder, tmp_path, capsys):
    status, err, record = _start(["run"], stored, tmp_path, capsys)
    assert record.exists(), err[-2000:]  # every check passed: flwr was started
    assert status == 1  # the fake flwr wrote no summary.json
    logs = list((run_folder / "logs").glob("run-*.log"))
    assert len(logs) == 1 and str(logs[0]) in err
    assert not list((tmp_path / "results").iterdir())  # not the project's results/


def test_a_truncated_catalog_is_refused_by_run_and_deploy(
        stored, run_folder, tmp_path, capsys):
    catalog = run_folder / "run.sqlite"
    os.truncate(catalog, catalog.stat().st_size // 2)
    words = (f"run catalog {catalog} cannot be read: database disk image is malformed; "
             "restore or remove it",)
    _refused(["deploy", "8"], stored, tmp_path, capsys, run_folder, *words)
    # the real command line: one line on stderr, exit status 2, no engine
    before = _snapshot(run_folder)
    items = tmp_path / "run.toml"
    (tmp_path / "sub").mkdir()
    proc, record = _cli(["run", "--run-config", str(items)], tmp_path / "sub")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert words[0] in proc.stderr and not record.exists()
    assert _snapshot(run_folder) == before
    # the ServerApp makes the same check first, before it opens the folder
    with pytest.raises(StoredStateError, match="database disk image is malformed"):
        prepare(fused_run_config(stored[0]))


def test_a_swapped_models_file_is_refused(stored, run_folder, tmp_path, capsys):
    models = run_folder / "models" / "SE.npz"
    blob = next((run_folder / "history" / "sharded" / "blobs").glob("model_s0_*.npz"))
    shutil.copyfile(blob, models)  # another valid model file in its place
    _refused(["run"], stored, tmp_path, capsys, run_folder,
             f"{models} is not the file this run saved", "restore it or remove")


def test_a_deleted_history_folder_is_refused(stored, run_folder, tmp_path, capsys):
    shutil.rmtree(run_folder / "history" / "sharded")
    _refused(["deploy", "8"], stored, tmp_path, capsys, run_folder,
             f"no history store at {run_folder / 'history' / 'sharded'}",
             "records its learning as done")


def test_a_garbled_history_blob_is_refused(stored, run_folder, tmp_path, capsys):
    blob = sorted((run_folder / "history" / "sharded" / "blobs").glob("update_*"))[0]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    _refused(["run"], stored, tmp_path, capsys, run_folder,
             f"{blob.name}: checksum mismatch", "restore it or remove")


def test_other_settings_and_edited_results_are_refused(
        stored, run_folder, tmp_path, capsys):
    _refused(["run"], stored, tmp_path, capsys, run_folder,
             "holds a run with other settings (['lr'];", items={**stored[0], "lr": 0.01})
    with sqlite3.connect(run_folder / "run.sqlite") as conn:
        conn.execute("UPDATE stages SET result='{\"x\": 1}' WHERE name='unlearn:SE'")
    _refused(["run"], stored, tmp_path, capsys, run_folder,
             "the stored result of stage 'unlearn:SE' is damaged")


def test_the_serverapp_check_is_a_config_error_naming_the_file(stored, run_folder):
    (run_folder / "models" / "SE.npz").unlink()
    with pytest.raises(ConfigError, match="SE.npz: cannot be read"):
        prepare(fused_run_config(stored[0]))


# ---- a later request on a finished coded run: its clients' node folders ---------
@pytest.fixture
def coded_run(tmp_path, shared_data):
    """(run config, run folder): a finished coded run, node folders in the run folder.

    As ``./simulate.sh`` makes one: ``node-dirs = <run folder>/nodes``, so a
    simulated client p keeps its slices in ``<run folder>/nodes/<p>``.
    """
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid
    from server_app.app import main

    folder = tmp_path / "results" / "c"
    run_config = fused_run_config({
        **TINY, "num-rounds": 1, "test-samples": 100, "frameworks": "none",
        "mia": False, "storage": "coded", "blocks-per-shard": 2,
        "node-dirs": str(folder / "nodes"), "data-dir": str(shared_data),
        "results-dir": str(folder.parent), "run-name": "c"})
    main(InProcessGrid(client_app, TINY["num-clients"], run_config),
         Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                 run_config=run_config))
    assert (folder / "summary.json").is_file()
    return run_config, folder


def test_a_deleted_node_folder_is_refused_before_a_later_request(
        coded_run, tmp_path, capsys):
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid
    from runstore.inbox import RequestInbox
    from server_app.app import main

    run_config, folder = coded_run
    assert sorted(int(p.name) for p in (folder / "nodes").iterdir()) == list(range(8))
    node = folder / "nodes" / "5"
    shutil.rmtree(node)
    forget = ["forget", "--run", "c", "--clients", "3", "--results-dir",
              str(folder.parent)]
    before = _snapshot(folder)
    status, err, record = _command(forget, tmp_path, capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err[-2000:]
    assert f"node folder(s) {node} of coded run 'c' are missing" in lines[0]
    assert "restore them" in lines[0] and "--lost-nodes 5" in lines[0]
    assert not record.exists()  # no engine was started
    assert _snapshot(folder) == before  # not even the request was recorded
    # the ServerApp makes the same check before it opens the folder
    with pytest.raises(StoredStateError, match=f"node folder\\(s\\) {node} "):
        prepare({**run_config, "later-requests": True})
    assert _snapshot(folder) == before
    # --lost-nodes names only missing node folders
    status, err, record = _command([*forget, "--lost-nodes", "4"], tmp_path, capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and not record.exists(), err[-2000:]
    assert "--lost-nodes '4': the node folder(s) of client(s) [4] are there" in lines[0]
    assert "name only missing ones: [5]" in lines[0]
    assert _snapshot(folder) == before
    # a request only recorded is checked the same way; an empty --lost-nodes is no id
    for argv, words in (([*forget, "--record-only"], "--lost-nodes 5"),
                        ([*forget, "--lost-nodes", ""], "comma-separated partition ids")):
        status, err, record = _command(argv, tmp_path, capsys)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and not record.exists(), err[-2000:]
        assert words in lines[0]
        assert _snapshot(folder) == before
    # a dangling link where the folder was is not a folder to make again
    node.symlink_to(tmp_path / "gone")
    status, err, record = _command([*forget, "--lost-nodes", "5"], tmp_path, capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and not record.exists(), err[-2000:]
    assert f"{node} is not a folder; move it away first" in lines[0]
    node.unlink()
    # accepted as lost: made again, empty, the request recorded, the engine started
    status, err, record = _command([*forget, "--lost-nodes", "5"], tmp_path, capsys)
    assert record.exists() and status == 1, err[-2000:]  # the fake flwr did nothing
    assert f"node folder {node} accepted as lost" in err
    assert node.is_dir() and not any(node.iterdir())
    # the engine's part, in process: client 5's slices are erasures, the request done
    main(InProcessGrid(client_app, TINY["num-clients"], run_config),
         Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                 run_config={**run_config, "later-requests": True}))
    inbox = RequestInbox(folder / "run.sqlite")
    (receipt,) = inbox.receipts()
    v1, v2 = inbox.versions()
    inbox.close()
    assert receipt["status"] == "done" and v2.forgotten == [3] and v2.requests == [
        receipt["request_id"]]
    # the re-coded rounds' new parts reached every holder but the lost one
    erased = receipt["erased"]
    assert erased["rounds_recoded"] and erased["stale"] == [
        [s, g, 5] for s, g in erased["rounds_recoded"]]
    assert not any(node.iterdir())  # nothing written into the lost node's folder


@pytest.fixture(scope="module")
def _finished_once(tmp_path_factory, shared_data):
    """A pristine finished uncoded run (model version v1, its history), made once."""
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity
    from server_app.app import main

    set_task_identity()  # module scope: before the autouse fixture
    results = tmp_path_factory.mktemp("finished") / "results"
    run_config = fused_run_config({
        **TINY, "num-rounds": 1, "test-samples": 100, "frameworks": "none",
        "mia": False, "data-dir": str(shared_data), "results-dir": str(results),
        "run-name": "f"})
    main(InProcessGrid(client_app, TINY["num-clients"], run_config),
         Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                 run_config=run_config))
    assert (results / "f" / "summary.json").is_file()
    return results / "f"


@pytest.fixture
def stored_finished(_finished_once, tmp_path):
    """A copy of the finished run, for one test to damage."""
    folder = tmp_path / "results" / "f"
    shutil.copytree(_finished_once, folder)
    return folder


def test_a_later_request_reads_the_finished_run_back_first(stored_finished, tmp_path,
                                                            capsys):
    """A garbled history blob of a finished run: `forget` refuses in one line before
    it records the request or starts an engine, as `run` does for a resume."""
    folder = stored_finished
    blob = next((folder / "history" / "sharded" / "blobs").glob("update_*"))
    blob.write_bytes(b"garbage" + blob.read_bytes()[7:])
    before = _snapshot(folder)
    for argv in (["--clients", "3"], ["--clients", "3", "--record-only"]):
        status, err, record = _command(["forget", "--run", folder.name, *argv,
                                        "--results-dir", str(folder.parent)],
                                       tmp_path, capsys)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and not record.exists(), err[-2000:]
        assert blob.name in lines[0] and "restore it" in lines[0], lines[0]
        assert _snapshot(folder) == before


def test_export_never_writes_over_a_runs_files(stored_finished, tmp_path, capsys):
    """--out as a link to a stored model, a folder, a path in the results folder or
    one that cannot be written: one line each, nothing written."""
    folder = stored_finished
    before = _snapshot(folder)
    link = tmp_path / "evil.pt"
    link.symlink_to(folder / "models" / "v1.npz")
    (tmp_path / "d.safetensors").mkdir()
    for out, words in ((link, "is a symbolic link"),
                       (tmp_path / "d.safetensors", "is a folder"),
                       (folder / "models" / "v1.pt", "lies inside the run folder"),
                       (folder / "x.safetensors", "where a run keeps its files"),
                       (Path("/proc/1/nope.pt"), "cannot be written")):
        status, err, _ = _command(["export", "--run", folder.name, "--out", str(out),
                                   "--results-dir", str(folder.parent)], tmp_path, capsys)
        err = err.strip().splitlines()
        assert status == 2 and len(err) == 1 and words in err[0], err
        assert _snapshot(folder) == before
