"""Stored state is checked before any engine starts (issue 29 item 3).

One run folder is made once with the real ServerApp on the in-process grid and
left as a killed run leaves it (no summary.json); each test damages a copy the
way a disk, an operator or a backup restore would, then starts the command
(``run`` or ``deploy``, with a fake ``flwr`` on PATH that records being called;
in this process, and once as ``python -m cli``). Each damage is one line on
stderr naming the file, exit status 2, no engine, and not one byte changed in
the run folder; the intact folder passes.
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
from server_app.run.stored import StoredStateError
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
    """The command in this process: (exit status, stderr, fake flwr's record)."""
    path = tmp_path / "run.toml"
    path.write_text(config.to_toml(items or stored[0]))
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
        status = cli_main([*command, "--run-config", str(path)])
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
             "holds a run with other settings (['lr'])", items={**stored[0], "lr": 0.01})
    with sqlite3.connect(run_folder / "run.sqlite") as conn:
        conn.execute("UPDATE stages SET result='{\"x\": 1}' WHERE name='unlearn:SE'")
    _refused(["run"], stored, tmp_path, capsys, run_folder,
             "the stored result of stage 'unlearn:SE' is damaged")


def test_the_serverapp_check_is_a_config_error_naming_the_file(stored, run_folder):
    (run_folder / "models" / "SE.npz").unlink()
    with pytest.raises(ConfigError, match="SE.npz: cannot be read"):
        prepare(fused_run_config(stored[0]))
