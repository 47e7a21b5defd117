"""Nothing half done (#43): checks before writes, one-line failures, digests verified."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import sqlite3
import sys
import traceback

import pytest

from server_app.config import ConfigError
from server_app.config.methods import proposed
from task.config import fused_run_config

BF16 = '''
import dataclasses
import mytask

def _bf16(num_classes):
    return mytask.task.model(num_classes).to(__import__("torch").bfloat16)

bf16 = dataclasses.replace(mytask.task, model=_bf16)
'''


@pytest.fixture
def plugins(tmp_path):
    from tests.test_plugins import page_file

    for name in ("mytask.py", "mymethod.py"):
        (tmp_path / name).write_text(page_file(name))
    (tmp_path / "bf16.py").write_text(BF16)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("mytask", "mymethod", "bf16"):
        sys.modules.pop(name, None)


def _preflight_line(run: dict) -> str:
    from cli.simulation import preflight
    from tests.test_plugins import RUN

    with pytest.raises(ConfigError) as err:
        preflight(fused_run_config({**RUN, "mia": False, **run}))
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_a_bfloat16_model_is_refused_before_any_engine(plugins):
    line = _preflight_line({"task": "bf16:bf16", "frameworks": proposed()})
    assert "'task'" in line and "bfloat16" in line, line


def test_a_strategy_that_is_no_method_is_built_and_refused_before_any_engine(plugins):
    line = _preflight_line({"frameworks": f"{proposed()},strategies:ShardedStrategy"})
    assert "'frameworks'" in line and "strategies:ShardedStrategy" in line, line
    assert "cannot be built" in line, line


def test_the_documented_method_is_built_in_the_check(plugins):
    from cli.simulation import preflight
    from tests.test_plugins import RUN

    preflight(fused_run_config({**RUN, "mia": False}))  # mymethod:FineTune builds


# ---- a finished run, made once, copied for each test -------------------------------
NAME = "f"


@pytest.fixture(scope="module")
def finished(tmp_path_factory, shared_data):
    """(results dir, pristine copy, run config) of a finished one-stage run, v1 only."""
    from flwr.app import Context, RecordDict

    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity
    from server_app.app import main
    from tests.conftest import TINY

    set_task_identity()
    base = tmp_path_factory.mktemp("finished")
    config = fused_run_config({**TINY, "mia": False, "seed": 3, "frameworks": "none",
                               "data-dir": str(shared_data), "run-name": NAME,
                               "results-dir": str(base / "results")})
    main(InProcessGrid(client_app, TINY["num-clients"], config),
         Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                 run_config=config))
    shutil.copytree(base / "results" / NAME, base / "pristine")
    return base / "results", base / "pristine", config


@pytest.fixture
def run(finished):
    """The finished run's folder, pristine for each test."""
    results, pristine, _ = finished
    folder = results / NAME
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(pristine, folder)
    return folder


def _where(folder) -> list[str]:
    return ["--run", folder.name, "--results-dir", str(folder.parent)]


def _set_setting(folder, key: str, value) -> None:
    with sqlite3.connect(folder / "run.sqlite") as conn:
        (text,) = conn.execute("SELECT value FROM settings WHERE key='settings'").fetchone()
        settings = {**json.loads(text), key: value}
        conn.execute("UPDATE settings SET value=? WHERE key='settings'",
                     (json.dumps(settings, sort_keys=True),))
    conn.close()


def _refused(folder, tmp_path, capsys, *words, argv=("--clients", "3")) -> str:
    from tests.test_later import _forget_command

    line = _forget_command([*_where(folder), *argv], folder, tmp_path, capsys)
    assert "Traceback" not in line
    for word in words:
        assert word in line, line
    return line


def test_a_plugin_task_that_no_longer_imports_records_nothing(run, tmp_path, capsys):
    _set_setting(run, "task", "gone_plugin_module:task")
    _refused(run, tmp_path, capsys, "'task'", "gone_plugin_module")
    # and a retry is refused for the same reason, not as "already requested"
    _refused(run, tmp_path, capsys, "gone_plugin_module")


def test_lost_nodes_of_a_run_that_keeps_none_are_refused(run, tmp_path, capsys):
    """An uncoded run has no node folders: the refusal says so, not that the named
    folders "are there (or were never written)" (found by a hostile review)."""
    _refused(run, tmp_path, capsys, "--lost-nodes '1'", "storage = 'uncoded'",
             "keeps no node folders", argv=("--clients", "3", "--lost-nodes", "1"))


def test_a_moved_run_folder_records_nothing(run, tmp_path, capsys):
    moved = tmp_path / "elsewhere" / NAME
    moved.parent.mkdir()
    shutil.copytree(run, moved)
    _refused(moved, tmp_path, capsys, "results-dir", "moved")


def test_a_truncated_summary_is_refused_by_forget(run, tmp_path, capsys):
    text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(text[:len(text) // 2])
    _refused(run, tmp_path, capsys, "summary.json")


def _flip(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _redigest(folder) -> None:
    """v1's models file rewritten as a valid one (other arrays), its file digest edited."""
    from history.files import atomic_write_arrays, read_arrays

    path = folder / "models" / "v1.npz"
    arrays = {k: (v * 2 if v.dtype.kind == "f" else v)
              for k, v in read_arrays(path).items()}
    atomic_write_arrays(path, arrays)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with sqlite3.connect(folder / "run.sqlite") as conn:
        conn.execute("UPDATE versions SET file_sha256=? WHERE version=1", (digest,))
    conn.close()


def _models(folder, capsys) -> tuple[int, str, str]:
    from cli.models import main_models

    capsys.readouterr()
    status = main_models(_where(folder), "models")
    out = capsys.readouterr()
    return status, out.out, out.err


def test_models_verifies_each_version(run, capsys):
    status, out, _ = _models(run, capsys)
    assert status == 0 and out.strip().endswith("verified"), out
    _flip(run / "models" / "v1.npz")
    status, out, err = _models(run, capsys)
    assert status == 1 and "NOT VERIFIED" in out and "v1" in err, out + err
    assert "SHA-256 differs" in out and "Traceback" not in out + err


def test_a_redigested_version_is_named_by_models_export_and_forget(
        run, tmp_path, capsys):
    from tests.test_stored_state import _command

    _redigest(run)
    status, out, _ = _models(run, capsys)
    assert status == 1 and "NOT VERIFIED" in out and "models sha256" in out, out
    out_file = tmp_path / "v1.safetensors"
    status, err, _ = _command(["export", *_where(run), "--out", str(out_file)],
                              tmp_path, capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "models sha256" in lines[0], err
    assert not out_file.exists()
    _refused(run, tmp_path, capsys, "v1.npz", "models sha256")


def test_export_says_the_digest_it_prints_is_verified(run, tmp_path, capsys):
    from cli.models import main_export

    out = tmp_path / "v1.pt"
    assert main_export([*_where(run), "--out", str(out)], "export") == 0
    assert "verified" in capsys.readouterr().out


class _Text:
    """Bytes to ``sys.stdout`` as text (the terminal's output in these tests)."""

    def write(self, data: bytes) -> int:
        return sys.stdout.write(data.decode())

    def flush(self) -> None:
        sys.stdout.flush()


@pytest.fixture
def engine(monkeypatch, make_grid, tmp_path):
    """``launch`` as the ServerApp on the in-process grid (no Flower engine started)."""
    from flwr.app import Context, RecordDict

    import cli.simulation
    from server_app.app import main

    def launch(overrides, supernodes, log_dir, terminal, gpus=0.0):
        """As flwr: the ServerApp's log lines through ``terminal``, then its traceback."""
        grid = make_grid(int(overrides["num-clients"]), overrides)
        terminal.out = _Text()  # what the command shows, on this test's stdout
        handler = logging.Handler()
        handler.emit = lambda record: terminal.write(
            f"INFO :      {record.getMessage()}\n".encode())
        logger = logging.getLogger("flwr")
        logger.addHandler(handler)
        try:
            main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                               run_config=overrides))
        except Exception:  # flwr logs the ServerApp's exception with its traceback
            for line in traceback.format_exc().splitlines():
                terminal.write(f"{line}\n".encode())
            return tmp_path / "log.txt", 1
        finally:
            logger.removeHandler(handler)
        return tmp_path / "log.txt", 0

    monkeypatch.setattr(cli.simulation, "launch", launch)
    monkeypatch.setattr(cli.simulation, "claim_run", lambda folder: None)


def _forget(folder, capsys, *argv) -> tuple[int, str, str]:
    from cli.main import main as cli_main

    capsys.readouterr()
    status = cli_main(["forget", *_where(folder), *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def _states(folder) -> dict[str, str]:
    from runstore.inbox import RequestInbox

    inbox = RequestInbox(folder / "run.sqlite")
    try:
        return {r.id: r.state for r in inbox.all()}
    finally:
        inbox.close()


def test_a_decode_beyond_the_bound_marks_the_request_failed(run, engine, monkeypatch,
                                                            capsys):
    from history import CodedHistoryError
    from server_app.stages import later

    def beyond(*args, **kw):  # as CodedHistory says when too many slices are damaged
        raise CodedHistoryError("cannot recover round 1 of shard 0: more than "
                                "floor((m - k) / 2) = 0 wrong slices among m = 2 "
                                "(k = 2); nothing was changed")

    monkeypatch.setattr(later, "forget_with_se", beyond)
    status, out, err = _forget(run, capsys, "--clients", "3")
    assert status == 3, out + err
    assert _states(run) == {"r0001": "failed"}
    assert "failed: r0001: CodedHistoryError: cannot recover round 1" in err, err
    assert "Traceback" not in out + err
    # `receipts` shows it with its reason; --pending has nothing to retry
    from cli.main import main as cli_main

    capsys.readouterr()
    assert cli_main(["receipts", *_where(run), "--detail"]) == 0
    shown = capsys.readouterr().out
    assert "r0001  failed" in shown and "cannot recover round 1" in shown, shown
    status, out, _ = _forget(run, capsys, "--pending")
    assert status == 0 and "no pending request" in out
    # once the store is repaired, the same clients may be asked again
    monkeypatch.undo()
    status, out, err = _forget(run, capsys, "--clients", "3")
    assert status == 0, out + err
    assert _states(run) == {"r0001": "failed", "r0002": "done"}
    # receipts --detail recomputes the digests it prints
    capsys.readouterr()
    assert cli_main(["receipts", *_where(run), "--detail"]) == 0
    shown = capsys.readouterr().out
    assert "digests verified" in shown and "NOT VERIFIED" not in shown, shown
    _flip(run / "models" / "v2.npz")
    assert cli_main(["receipts", *_where(run), "--detail"]) == 1  # as `models`
    shown = capsys.readouterr().out
    assert "NOT VERIFIED" in shown and "v2.npz" in shown, shown


def test_holders_that_did_not_answer_leave_the_request_pending(run, engine,
                                                              monkeypatch, capsys):
    """Too few slices because holders were absent: a retry may work (exit 1)."""
    from history import HoldersUnreachableError
    from server_app.stages import later

    def unreachable(*args, **kw):  # as CodedHistory says when holders are silent
        raise HoldersUnreachableError("cannot recover round 1 of shard 0: 1 usable "
                                      "slices, k = 2 needed (2 absent)")

    monkeypatch.setattr(later, "forget_with_se", unreachable)
    status, out, err = _forget(run, capsys, "--clients", "3")
    assert status == 1, out + err
    assert _states(run) == {"r0001": "pending"}
    assert "r0001 not carried out: it stays pending" in err, err
    assert "Traceback" not in out + err


def test_two_forget_commands_racing_each_say_what_became_of_their_request(
        run, engine, monkeypatch, capsys):
    from runstore.lock import RunLock
    from server_app.stages import later

    real, seen = later._handle, {}

    def with_a_second_command(run_state, request, latest):
        if not seen:  # while the first command's engine works on the run
            with monkeypatch.context() as mp:  # as seen from another process
                mp.setattr(RunLock, "holder", staticmethod(lambda f: "pid 4242"))
                seen["second"] = _forget(run, capsys, "--clients", "5")
        return real(run_state, request, latest)

    monkeypatch.setattr(later, "_handle", with_a_second_command)
    status, out, err = _forget(run, capsys, "--clients", "3")
    second_status, second_out, second_err = seen["second"]
    assert "request r0002 recorded" in second_out
    assert second_status == 4 and "busy" in second_err and "r0002" in second_err, \
        second_err
    assert "Traceback" not in second_out + second_err + out + err
    # the first command carried out both, and says so for the second one
    assert status == 0, out + err
    assert _states(run) == {"r0001": "done", "r0002": "done"}
    assert "r0002  done" in out and "recorded by another command" in out, out


def test_a_full_disk_during_a_later_request_is_one_line(run, engine, monkeypatch,
                                                        capsys):
    import errno

    from server_app.stages import later

    def full(folder, number, *args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device",
                      str(folder.path / "models" / f"v{number}.npz"))

    monkeypatch.setattr(later, "make_version", full)
    status, out, err = _forget(run, capsys, "--clients", "3")
    lines = [x for x in err.strip().splitlines() if "carrying out" not in x]
    assert status == 5 and len(lines) == 1, out + err
    assert "No space left on device" in lines[0] and "v2.npz" in lines[0], lines
    assert "r0001" in lines[0] and "pending" in lines[0], lines
    assert "Traceback" not in out + err
    assert _states(run) == {"r0001": "pending"}  # a retry can work once there is room


def test_the_serverapp_marks_a_full_disk_as_one_line(tmp_path, make_grid, shared_data,
                                                     monkeypatch, caplog):
    import errno

    from flwr.app import Context, RecordDict

    from runstore.folder import RunFolder
    from server_app.app import main
    from server_app.failures import MARK
    from tests.conftest import TINY

    def full(self, summary):
        raise OSError(errno.ENOSPC, "No space left on device",
                      str(self.path / "summary.json"))

    monkeypatch.setattr(RunFolder, "finish", full)
    config = fused_run_config({**TINY, "mia": False, "frameworks": "none",
                               "data-dir": str(shared_data), "run-name": "d",
                               "results-dir": str(tmp_path)})
    with caplog.at_level(logging.INFO, logger="flwr"), pytest.raises(OSError):
        main(make_grid(TINY["num-clients"], config),
             Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                     run_config=config))
    marked = [m for m in caplog.messages if MARK.match(m)]
    assert len(marked) == 1 and "(exit 5)" in marked[0], caplog.messages[-3:]
    assert "summary.json: No space left on device" in marked[0]


def test_the_terminal_shows_the_marked_line_and_hides_the_traceback():
    import io

    from cli.terminal import TerminalFilter

    out = io.BytesIO()
    terminal = TerminalFilter(out)
    for line in (b"INFO :      round 1\n",
                 b"INFO :      ServerApp stopped (exit 5): /r/summary.json: No space\n",
                 b"ERROR :     ServerApp raised an exception\n",
                 b"Traceback (most recent call last):\n", b'  File "x.py"\n'):
        terminal.write(line)
    assert out.getvalue() == (b"INFO :      round 1\n"
                              b"INFO :      ServerApp stopped (exit 5): /r/summary.json: "
                              b"No space\n")
    assert terminal.failure == (5, "/r/summary.json: No space")


def test_run_ends_on_the_serverapps_one_line_with_its_status(tmp_path, capsys):
    from cli.simulation import _finish
    from cli.terminal import TerminalFilter

    terminal = TerminalFilter(_Text())
    terminal.write(b"INFO :      ServerApp stopped (exit 5): /r/summary.json: No space "
                   b"left on device\n")
    terminal.write(b"Traceback (most recent call last):\n")
    log = tmp_path / "run.log"
    log.write_text("")
    assert _finish(log, 1, terminal) == 5
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        f"the run failed: /r/summary.json: No space left on device (see {log})"]
    assert "Traceback" not in captured.out + captured.err


from tests.test_stored_state import coded_run  # noqa: E402,F401  (a finished coded run)


def test_lost_slices_beyond_the_code_are_refused_before_recording(coded_run, tmp_path,  # noqa: F811
                                                                  capsys):
    _, folder = coded_run
    lost = list(range(7))  # 8 holders, k = 2: one slice a round is left
    for p in lost:
        shutil.rmtree(folder / "nodes" / str(p))
    line = _refused(folder, tmp_path, capsys, "k = 2 needed", "nothing was recorded",
                    argv=("--clients", "7", "--lost-nodes", ",".join(map(str, lost))))
    assert "round 0 of shard 0 keeps 1 usable slices" in line, line


def test_deploy_ends_on_the_serverapps_one_line_with_its_status(tmp_path, monkeypatch,
                                                                capsys):
    """``deploy`` exits with the ServerApp's status too, not its own 1."""
    from cli import deploy

    def stopped(run_dir, *args):
        terminal = args[-1]
        terminal.out = io.BytesIO()  # the real one points it at the engine's output
        terminal.write(b"INFO :      ServerApp stopped (exit 5): /r/x.npz: No space "
                       b"left on device\n")
        terminal.write(b"Traceback (most recent call last):\n")
        return None

    monkeypatch.setattr(deploy.shutil, "which", lambda name: f"/bin/{name}")
    monkeypatch.setattr(deploy, "_run_dir", lambda: tmp_path)
    monkeypatch.setattr(deploy, "_deploy", stopped)
    assert deploy.main(["2", "--run-config", "num-rounds=1"]) == 5
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1] == (
        f"the run failed: /r/x.npz: No space left on device (see {tmp_path / 'logs'})")
    assert "Traceback" not in captured.out + captured.err
