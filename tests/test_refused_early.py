"""Nothing refused late (#51): one check of a request before it is recorded, exit 2.

Every kind of records or class request the ServerApp would refuse is refused by
``forget`` before it is recorded and before any engine starts; a client's pending
requests give one replay; expected failures end in one line; a receipt whose file
cannot be written is still listed.
"""

from __future__ import annotations

import errno
import json
import shutil
import sqlite3

import numpy as np
import pytest

from runstore.inbox import Request, RequestInbox
from server_app.admission import Holdings, erasure_refusal
from server_app.config import ConfigError
from server_app.stages.erasures import honoured_by, merged_order
from server_app.unlearning.erasure import Erasure
from tests.test_nothing_half_done import (  # noqa: F401  (fixtures)
    NAME,
    _forget,
    _states,
    _where,
    engine,
    finished,
    run,
)


# ---- the one check, on made-up holdings (fast) --------------------------------------
class _Task:
    """A task's data as the check reads it: classes and labels."""

    def __init__(self, labels, classes=True):
        self.train_y = np.asarray(labels)
        self.has_classes, self.num_classes = classes, 3


def _holdings(classes=True) -> Holdings:
    rows = [np.arange(0, 4), np.arange(4, 8), np.arange(8, 10)]
    labels = [0, 1, 2, 0, 1, 1, 1, 2, 2, 2]  # client 2 holds only label 2
    return Holdings("toy", {p: len(r) for p, r in enumerate(rows)},
                    lambda: (_Task(labels, classes), rows))


EVERYONE = Erasure(clients=(0, 1, 2))


@pytest.mark.parametrize("records, labels, before, forgotten, joined, words", [
    ({0: [4]}, [], EVERYONE, (), None, ("records", "client 0 holds 4 records (ids 0..3); "
                                        "4 is not one")),
    ({0: [1, 99]}, [], EVERYONE, (), None, ("records", "99 is not one")),
    ({5: [0]}, [], EVERYONE, (), None, ("records", "client 5 holds no partition")),
    ({0: [0, 1, 2, 3]}, [], EVERYONE, (), None, ("records", "would keep no record")),
    ({0: [2, 3]}, [], Erasure({0: (0, 1)}, (), (0, 1, 2)), (), None,
     ("records", "would keep no record")),  # with what an earlier request erased
    ({0: [1]}, [], Erasure({0: (1,)}, (), (0, 1, 2)), (), None,
     ("records", "erased already")),
    ({1: [0]}, [], EVERYONE, (1,), None, ("records", "forgotten already")),
    ({2: [0]}, [], EVERYONE, (), 2, ("records", "have not joined yet")),
    ({}, [3], EVERYONE, (), None, ("labels", "label(s) [3] are not classes 0..2")),
    ({}, [2], EVERYONE, (), None, ("labels", "client 2 would keep no record")),
    ({}, [1], Erasure({}, (1,), (0, 1, 2)), (), None, ("labels", "erased already")),
])
def test_every_kind_of_refusal_comes_from_one_check(records, labels, before, forgotten,
                                                     joined, words):
    what, reason = erasure_refusal(records, labels, _holdings(), before, forgotten,
                                   joined)
    assert (what, words[1] in reason) == (words[0], True), reason
    assert "\n" not in reason


def test_a_class_request_on_a_task_without_classes_is_refused():
    what, reason = erasure_refusal({}, [0], _holdings(classes=False), EVERYONE)
    assert what == "labels" and "not class labels" in reason


def test_what_can_be_erased_is_not_refused_and_needs_no_data_for_records():
    def no_data():
        raise AssertionError("a records request reads the sizes only")

    held = Holdings("toy", {0: 4, 1: 4}, no_data)
    assert erasure_refusal({0: [0, 3]}, [], held, Erasure(clients=(0, 1))) is None
    assert erasure_refusal({}, [0], _holdings(), EVERYONE) is None


def _request(rid, clients=(), records=None, state="pending") -> Request:
    erasure = None if records is None else {
        "records": {str(p): ids for p, ids in records.items()}, "labels": []}
    return Request(rid, list(clients), "command", 0.0, state, None, erasure)


def test_a_client_request_goes_before_the_records_requests_it_subsumes():
    recs3, recs5 = _request("r1", records={3: [0]}), _request("r2", records={5: [1]})
    client3, labels = _request("r3", clients=[3, 4]), _request("r4")
    assert [r.id for r in merged_order([recs3, recs5, client3, labels])] == \
        ["r2", "r3", "r1", "r4"]
    both = _request("r5", records={3: [0], 6: [0]})  # client 6 stays: not subsumed
    assert [r.id for r in merged_order([both, client3])] == ["r5", "r3"]
    done3 = _request("r3", clients=[3, 4], state="done")
    assert honoured_by(recs3, [recs3, done3]) == [done3]
    assert honoured_by(both, [both, done3]) == []
    assert honoured_by(recs3, [recs3, _request("r3", clients=[3])]) == []  # pending


# ---- a finished run: forget refuses before recording, exit 2 -----------------------
@pytest.mark.inprocess
@pytest.mark.parametrize("argv, words", [
    (("--clients", "1", "--records", "100-104"), ("--records '100-104'",
                                                   "holds 64 records (ids 0..63)",
                                                   "104 is not one")),
    (("--clients", "1", "--records", "5,63,150"), ("150 is not one",)),
    (("--clients", "1", "--records", "0-63"), ("would keep no record",)),
    (("--labels", "10"), ("--labels '10'", "label(s) [10] are not classes 0..9")),
])
def test_impossible_ids_or_labels_are_refused_before_recording(run, tmp_path, capsys,  # noqa: F811
                                                                argv, words):
    from tests.test_later import _forget_command

    line = _forget_command([*_where(run), *argv], run, tmp_path, capsys)
    assert "nothing was recorded" in line and "Traceback" not in line
    for word in words:
        assert word in line, line


@pytest.mark.inprocess
def test_records_all_erased_already_are_refused_before_recording(run, tmp_path, capsys):  # noqa: F811
    from cli.forget import submit_records
    from tests.test_later import _forget_command

    submit_records(NAME, "1", "0-9", str(run.parent))  # pending: carried out first
    line = _forget_command([*_where(run), "--clients", "1", "--records", "3-5"], run,
                           tmp_path, capsys)
    assert "erased already" in line, line


@pytest.mark.inprocess
def test_a_records_request_for_a_client_a_pending_request_forgets_is_refused(
        run, tmp_path, capsys):  # noqa: F811
    from cli.forget import submit
    from tests.test_later import _forget_command

    rid = submit(NAME, "1", str(run.parent))
    line = _forget_command([*_where(run), "--clients", "1", "--records", "0-3"], run,
                           tmp_path, capsys)
    assert f"to be forgotten by request {rid}" in line, line


@pytest.mark.inprocess
def test_a_text_task_takes_no_class_request_before_recording(tmp_path, make_grid,
                                                             shared_data, capsys):
    from tests.test_later import _config, _forget_command, _run

    learned = _config(tmp_path, shared_data, "text", frameworks="none",
                      dataset="shakespeare", **{"num-clients": 6, "client-samples": 24,
                                                "test-samples": 40})
    _run(make_grid, learned)
    line = _forget_command([*_where(tmp_path / "text"), "--labels", "1"],
                           tmp_path / "text", tmp_path, capsys)
    assert "targets are not class labels" in line, line


# ---- a client's pending requests: one replay ----------------------------------------
@pytest.mark.inprocess
def test_a_client_request_subsumes_its_pending_records_request(run, engine, capsys):  # noqa: F811
    from cli.forget import submit, submit_records

    recs = submit_records(NAME, "3", "0-9", str(run.parent))
    client = submit(NAME, "3", str(run.parent))
    status, out, err = _forget(run, capsys, "--pending")
    assert status == 0, out + err
    assert _states(run) == {recs: "done", client: "done"}
    inbox = RequestInbox(run / "run.sqlite")
    try:
        versions = inbox.versions()
        receipts = {r["request_id"]: r for r in inbox.receipts()}
    finally:
        inbox.close()
    assert [v.version for v in versions] == [1, 2]  # one replay, one version
    assert versions[-1].requests == [client] and versions[-1].forgotten == [3]
    assert receipts[recs]["honoured_by"]["requests"] == [client]
    assert receipts[recs]["honoured_by"]["version"] == 2
    assert f"client(s) [3] forgotten by {client} (model version v2)" in out


@pytest.mark.inprocess
def test_a_finished_run_that_lost_its_summary_is_not_learned_again(run, engine, capsys):  # noqa: F811
    """Found by a hostile review: after a later request, a run whose summary.json was
    removed was started again as a resume and stopped inside the engine (exit 3, "no
    model of shard 1 at round 2"); its catalog says it finished: refused before."""
    from cli.forget import submit
    from server_app.config import RunConfig
    from server_app.stored import check_run_folder, run_settings

    submit(NAME, "3", str(run.parent))
    status, out, err = _forget(run, capsys, "--pending")
    assert status == 0, out + err
    (run / "summary.json").unlink()
    with sqlite3.connect(run / "run.sqlite") as conn:
        (text,) = conn.execute("SELECT value FROM settings WHERE key='settings'").fetchone()
    conn.close()
    settings = json.loads(text)
    cfg = RunConfig.from_run_config(settings)
    with pytest.raises(ConfigError, match="summary.json is missing, but the run "
                       "finished: 1 request.*v2.*restore the file"):
        check_run_folder(cfg, run_settings(cfg, settings["data-dir"]))


# ---- a receipt whose file cannot be written ------------------------------------------
@pytest.mark.inprocess
def test_a_receipt_whose_file_cannot_be_written_is_listed_and_written_later(
        run, engine, capsys):  # noqa: F811
    from cli.main import main as cli_main

    shutil.rmtree(run / "receipts", ignore_errors=True)
    (run / "receipts").write_text("not a folder")  # every receipt file fails
    status, out, err = _forget(run, capsys, "--clients", "3")
    assert status == 1, out + err  # done, but not all of it on disk: not 0
    assert "receipt of r0001 not written" in err and "run.sqlite" in err, err
    assert _states(run) == {"r0001": "done"}
    capsys.readouterr()
    assert cli_main(["receipts", *_where(run)]) == 0
    shown = capsys.readouterr().out
    assert "r0001  done" in shown and "its file is missing" in shown, shown
    (run / "receipts").unlink()  # the folder can be written again
    assert cli_main(["receipts", *_where(run)]) == 0
    shown = capsys.readouterr().out
    assert "r0001  done" in shown and "missing" not in shown, shown
    written = json.loads((run / "receipts" / "r0001.json").read_text())
    assert written["status"] == "done" and written["version"]["after"] == 2


def test_a_full_disk_while_filing_a_receipt_exits_5(tmp_path, monkeypatch, capsys):
    import cli.later
    from runstore import receipts

    folder = tmp_path / "run"
    folder.mkdir()
    inbox = RequestInbox(folder / "run.sqlite")
    rid = inbox.submit([3]).id
    receipt = {"request_id": rid, "clients": [3], "status": "done", "stage": None}
    inbox.finish(rid, "done", receipt=receipt)
    inbox.close()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(receipts, "write_receipt", full)
    assert cli.later._report(folder, [rid], {rid}, (tmp_path / "log", 0)) == 5
    assert "receipt of r0001 not written" in capsys.readouterr().err


# ---- expected failures reach the boundary -----------------------------------------
def test_every_expected_failure_has_its_one_line_and_status():
    from history import StoreError
    from runstore.catalog import SettingsMismatchError
    from server_app.failures import expected, one_line
    from server_app.rounds.learning import LearningStalledError
    from server_app.unlearning.driver import UnlearningDivergedError, UnlearningStalledError

    for err in (LearningStalledError("learning learned nothing: 2 rounds"),
                UnlearningStalledError("SE request 0 accepted no reply"),
                UnlearningDivergedError("SE request 0: NaN in shard 1"),
                SettingsMismatchError("r holds a run with other settings (['lr'])")):
        assert expected(err) == (1, str(err)), err
    from server_app.rounds.federation import DiscoveryError

    status, line = expected(DiscoveryError("0 of 8 clients answered discovery"))
    assert status == 1 and line.startswith("0 of 8 clients answered discovery (")
    assert "round-timeout" in line  # a federation that is not there is not a bug
    try:  # a full disk wrapped in another error is still the disk's status
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as disk:
            raise StoreError("history cannot be written") from disk
    except StoreError as err:
        assert expected(err)[0] == 5
    lines = []
    with pytest.raises(KeyError), one_line(lines.append):  # a bug: still one line
        raise KeyError("x")
    assert lines == ["ServerApp stopped (exit 1): unexpected KeyError: 'x' (a bug: its "
                     "traceback is in the run's log)"]


@pytest.mark.inprocess
def test_a_diverging_learning_run_ends_in_one_line(tmp_path, make_grid, shared_data,
                                                   caplog):
    from server_app.rounds.learning import LearningStalledError
    from tests.test_later import _config, _run

    config = _config(tmp_path, shared_data, "lr10", frameworks="none", lr=10.0,
                     momentum=0.9, **{"num-rounds": 2, "local-epochs": 3})
    with caplog.at_level("INFO", logger="flwr"), pytest.raises(LearningStalledError):
        _run(make_grid, config)
    marked = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("ServerApp stopped")]
    assert len(marked) == 1 and marked[0].startswith("ServerApp stopped (exit 1): "), \
        marked
    assert not (tmp_path / "lr10" / "summary.json").exists()


def test_a_refused_request_after_recording_is_not_exit_0(tmp_path, capsys):
    """A request the ServerApp refused (recorded before the checks, or raced)."""
    import cli.later

    folder = tmp_path / "run"
    folder.mkdir()
    inbox = RequestInbox(folder / "run.sqlite")
    rid = inbox.submit([3]).id
    receipt = {"request_id": rid, "clients": [3], "status": "refused", "stage": None,
               "reason": "client(s) [3] are already forgotten"}
    inbox.finish(rid, "refused", receipt["reason"], receipt)
    inbox.close()
    (folder / "receipts").mkdir()
    assert cli.later._report(folder, [rid], {rid}, (tmp_path / "log", 0)) == 2
    assert "refused: r0001: client(s) [3] are already forgotten" in \
        capsys.readouterr().err



@pytest.mark.inprocess
def test_a_full_disk_before_recording_is_exit_5_and_records_nothing(run, monkeypatch,  # noqa: F811
                                                                    capsys):
    from cli.main import main as cli_main

    def full(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(RequestInbox, "_insert", full)
    capsys.readouterr()
    status = cli_main(["forget", *_where(run), "--clients", "3", "--record-only"])
    err = capsys.readouterr().err
    assert status == 5 and len(err.strip().splitlines()) == 1, err
    assert "disk is full" in err and "Traceback" not in err
    monkeypatch.undo()
    assert _states(run) == {}


# ---- found by an attack on the new surfaces ---------------------------------------
@pytest.mark.inprocess
def test_a_copied_run_folder_takes_no_request(run, tmp_path, capsys):  # noqa: F811
    """A copy would send its request to the run its catalog names: refused."""
    from tests.test_later import _forget_command

    copy = run.parent / "copy"
    shutil.copytree(run, copy)
    line = _forget_command([*_where(copy), "--clients", "3", "--record-only"], copy,
                           tmp_path, capsys)
    assert f"records run-name {NAME!r}" in line and "copied or renamed" in line, line


def test_records_a_labels_request_erases_already_are_refused():
    before = Erasure({}, (1,), (0, 1, 2))  # label 1 erased: client 0's id 1 with it
    what, reason = erasure_refusal({0: [1]}, [], _holdings(), before)
    assert (what, "erased already" in reason) == ("records", True), reason
    assert erasure_refusal({0: [0, 1]}, [], _holdings(), before) is None  # id 0: new


@pytest.mark.inprocess
def test_forget_run_is_refused_by_the_run_command_before_any_engine(capsys):
    from cli.main import main as cli_main

    capsys.readouterr()
    assert cli_main(["--run-config", "forget-run='a1'"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "forget --run a1 --pending" in err[0], err


@pytest.mark.inprocess
def test_a_garbled_engine_entry_is_one_line(run, capsys):  # noqa: F811
    from cli.main import main as cli_main

    with sqlite3.connect(run / "run.sqlite") as conn:
        conn.execute("INSERT OR REPLACE INTO settings VALUES ('engine', 'garbage')")
    conn.close()
    for argv in (["show", *_where(run)], ["forget", *_where(run), "--clients", "3",
                                          "--record-only"]):
        capsys.readouterr()
        assert cli_main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "'engine' entry" in err[0], err
    assert _states(run) == {}


@pytest.mark.inprocess
def test_a_receipt_file_edited_by_hand_is_flagged(run, engine, capsys):  # noqa: F811
    from cli.main import main as cli_main

    assert _forget(run, capsys, "--clients", "3")[0] == 0
    path = run / "receipts" / "r0001.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "clients": [4]}))
    capsys.readouterr()
    assert cli_main(["receipts", *_where(run)]) == 1
    shown = capsys.readouterr().out
    assert "clients [3]" in shown and "NOT VERIFIED: its file" in shown, shown
