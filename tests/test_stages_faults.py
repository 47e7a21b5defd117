"""Staged runs under a careless operator: bad keys, bad commands, damaged files.

Each test is one kind of fault: the stage keys (refused before any engine), the
``forget`` / ``receipts`` commands on a damaged, locked or half-made run catalog
or receipt (one line, exit status 2, nothing recorded), two ``forget`` commands
at once (each client named once, ids unique), FR over stages after every client
of a shard in an earlier stage was forgotten, a damaged receipt file during the
run, and a run whose every request was refused or came too late.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sqlite3
import time

import pytest
from flwr.app import Context, RecordDict

from cli.forget import submit
from cli.main import main as cli_main
from cli.report import render
from runstore.inbox import RequestInbox
from server_app.app import main
from server_app.config import ConfigError
from server_app.preflight import validate_run_config
from server_app.stages import boundary, pipeline
from server_app.stages.learn import stage_strategy
from strategies.unlearning import FrozenShard
from task.config import fused_run_config
from tests.conftest import TINY

STAGED = {**TINY, "num-stages": 3, "frameworks": "SE,FR", "mia": False}
SMALL = {**TINY, "num-clients": 6, "clients-per-round": 2, "num-stages": 2,
         "joins-per-stage": 2, "num-rounds": 1, "frameworks": "SE,FR", "mia": False,
         "seed": 1}


@pytest.mark.parametrize("overrides, key", [
    ({"requests-per-stage": 8}, "requests-per-stage"),  # stage 1 cannot draw 8
    ({"requests-per-stage": 1, "clients-per-request": 4}, "clients-per-request"),
    # stage 1 has 2 clients in 2 shards: no shard can give one and keep one
    ({"requests-per-stage": 1, "joins-per-stage": 3}, "num-shards"),
    ({"baseline-shards": 4, "joins-per-stage": 3}, "joins-per-stage"),
    ({"baseline-shards": 4, "joins-per-stage": 2, "requests-per-stage": 1},
     "baseline-shards"),  # stage 1's seeded request would empty an FR shard
    ({"num-stages": 2.5}, "num-stages"),
    ({"leaves-per-stage": True}, "leaves-per-stage"),
    ({"requests-per-stage": float("nan")}, "requests-per-stage"),
])
def test_stage_keys_that_cannot_work_are_refused_before_any_engine(overrides, key):
    with pytest.raises(ConfigError, match=f"'{key}'") as err:
        validate_run_config({**STAGED, **overrides}, files=False)
    assert "\n" not in str(err.value)


def test_staged_run_is_not_checked_against_the_one_stage_request_keys():
    """num-requests (1 by default) is not a staged key: one client per shard is fine."""
    cfg = validate_run_config({**STAGED, "num-shards": 8, "clients-per-round": 8},
                              files=False)
    assert cfg.stages.num_stages == 3 and cfg.training.num_shards == cfg.data.num_clients


def _catalog(root, name, settings=True):
    folder = root / name
    folder.mkdir()
    inbox = RequestInbox(folder / "run.sqlite")
    if settings:
        with inbox._conn:
            inbox.set_meta("settings", json.dumps({"num-stages": 3, "num-clients": 12}))
    inbox.close()
    return folder


def _one_line(capsys, argv) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err
    return err


def test_forget_and_receipts_on_a_damaged_or_unset_catalog_give_one_line(
        tmp_path, capsys):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "run.sqlite").write_bytes(b"not sqlite at all " * 64)
    for command in (["forget", "--clients", "1"], ["receipts"]):
        err = _one_line(capsys, [command[0], "--run", "junk", *command[1:],
                                 "--results-dir", str(tmp_path)])
        assert "run.sqlite" in err and "not a database" in err
    _catalog(tmp_path, "starting", settings=False)
    err = _one_line(capsys, ["forget", "--run", "starting", "--clients", "1",
                             "--results-dir", str(tmp_path)])
    assert "has not recorded its settings yet" in err
    for name in ("..", "/tmp", "", "a/../b", "a b"):
        assert "is not a run name" in _one_line(
            capsys, ["forget", "--run", name, "--clients", "1", "--results-dir",
                     str(tmp_path)])


def test_forget_on_a_locked_catalog_says_so_and_records_nothing(tmp_path, monkeypatch):
    folder = _catalog(tmp_path, "live")
    real = RequestInbox.__init__

    def quick(self, path):  # wait 0.2 s for the lock, not 30 s
        real(self, path)
        self._conn.execute("PRAGMA busy_timeout = 200")

    monkeypatch.setattr(RequestInbox, "__init__", quick)
    holder = sqlite3.connect(folder / "run.sqlite")
    holder.execute("BEGIN IMMEDIATE")  # the ServerApp in the middle of a write
    try:
        with pytest.raises(ConfigError, match="locked by another process"):
            submit("live", "3", str(tmp_path))
    finally:
        holder.rollback()
        holder.close()
    inbox = RequestInbox(folder / "run.sqlite")
    assert inbox.all() == []
    inbox.close()


@pytest.mark.parametrize("text", ["{oops", "[1, 2]", '{"request_id": "r0001"}'])
def test_receipts_command_names_a_damaged_receipt_in_one_line(tmp_path, capsys, text):
    folder = _catalog(tmp_path, "live")
    (folder / "receipts").mkdir()
    (folder / "receipts" / "r0001.json").write_text(text)
    err = _one_line(capsys, ["receipts", "--run", "live", "--results-dir",
                             str(tmp_path)])
    assert "r0001.json" in err


def _submit_many(root: str, clients: list[int], barrier, out) -> None:
    real = RequestInbox.all

    def slow(self):  # widen the gap between reading the requests and writing one
        found = real(self)
        time.sleep(0.05)
        return found

    RequestInbox.all = slow  # in this child process only
    barrier.wait()
    for p in clients:
        try:
            out.put((p, submit("live", str(p), root)))
        except ConfigError:
            out.put((p, None))


def test_two_forget_commands_at_once_name_each_client_once(tmp_path):
    """Two processes submit the same clients at the same time: one request each."""
    folder = _catalog(tmp_path, "live")
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(2), context.Queue()
    clients = list(range(6))
    procs = [context.Process(target=_submit_many, args=(str(tmp_path), clients,
                                                        barrier, out))
             for _ in range(2)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=60) for _ in range(2 * len(clients))]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    ids = [rid for _, rid in results if rid is not None]
    assert len(ids) == len(clients) == len(set(ids))
    inbox = RequestInbox(folder / "run.sqlite")
    named = sorted(p for r in inbox.all() for p in r.clients)
    inbox.close()
    assert named == clients


def test_stage_strategy_keeps_a_shard_without_present_clients_only_when_asked():
    from server_app.config import RunConfig

    cfg = RunConfig.from_run_config(SMALL)
    shards, node_of = [[0, 1], [2, 3]], {p: 100 + p for p in range(4)}
    with pytest.raises(ValueError, match="shard 0 has no client"):
        stage_strategy(cfg, shards, [2, 3], node_of)
    kept = stage_strategy(cfg, shards, [2, 3], node_of, keep_empty=True)
    assert isinstance(kept.shard_strategies[0], FrozenShard)
    assert kept.shard_nodes == [[], [102, 103]]


def _damage_a_receipt(folder):
    (folder / "receipts" / "r0001.json").write_text("{oops")


def _run_small(tmp_path, shared_data, overrides, plan, late=(),
               damage=_damage_a_receipt):
    """A 2-stage run; ``plan[t]``: forget commands sent while stage t learns,
    ``late``: sent after the last boundary; ``damage(run folder)`` before stage 2.
    Returns the run folder and summary."""
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity

    set_task_identity()
    config = fused_run_config({**SMALL, **overrides, "results-dir": str(tmp_path),
                               "run-name": "r", "data-dir": str(shared_data)})
    folder = tmp_path / "r"
    real_stage, real_claim = pipeline.run_stage, boundary.claim

    def run_stage(run, member):
        stage = len(run.members) + 1
        if stage == 2:  # an operator damages the receipts while the run lives
            damage(folder)
        for clients in plan.get(stage, ()):
            submit("r", clients, str(tmp_path))
        return real_stage(run, member)

    def claim(run, member, entry):
        claimed = real_claim(run, member, entry)
        if member.stage == run.ctx.cfg.stages.num_stages:
            for clients in late:
                submit("r", clients, str(tmp_path))
        return claimed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "run_stage", run_stage)
        mp.setattr(boundary, "claim", claim)
        main(InProcessGrid(client_app, 6, config),
             Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                     run_config=config))
    text = (folder / "summary.json").read_text()
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    return folder, summary


def test_fr_over_stages_after_a_stage_lost_every_client_of_a_shard(
        tmp_path, shared_data):
    """Stage 1's clients 0-3 are all forgotten by stage 2 (joiners 4, 5 remain): FR
    retrains stage 1 with its shards empty, keeping W^0 there; no crash. A receipt
    damaged during the run is rewritten from the catalog."""
    folder, summary = _run_small(tmp_path, shared_data, {"baseline-shards": 2},
                                 {1: ["0"], 2: ["1,2,3"]})
    assert [e["forgotten"] for e in summary["stages"]] == [[0], [1, 2, 3]]
    receipts = [json.loads((folder / "receipts" / f"r000{i}.json").read_text())
                for i in (1, 2)]
    assert [r["status"] for r in receipts] == ["done", "done"]
    assert all(set(r["cost"]) == {"SE", "FR"} for r in receipts)
    assert set(summary["frameworks"]) == {"SE", "FR"}


def test_a_receipts_folder_that_cannot_be_written_is_a_warning_not_a_crash(
        tmp_path, shared_data):
    """The receipts folder replaced by a file during stage 1: the run finishes, says
    so, and builds summary.json from the receipts kept in run.sqlite."""
    def replace_by_a_file(folder):
        shutil.rmtree(folder / "receipts")
        (folder / "receipts").write_text("not a folder")

    _, summary = _run_small(tmp_path, shared_data, {"frameworks": "SE"},
                            {1: ["0"], 2: ["1"]}, damage=replace_by_a_file)
    assert [e["forgotten"] for e in summary["stages"]] == [[0], [1]]
    assert any("receipt of request r0002 not written" in w for w in summary["warnings"])
    assert summary["unlearning"]["requests"] == [[0], [1]]
    assert summary["frameworks"]["SE"]["accuracy"] is not None


def test_run_whose_requests_were_all_refused_or_late_reports_it(
        tmp_path, shared_data, capsys):
    """A client not joined yet, a request emptying every shard, one after the last
    boundary: refused receipts, warnings, no frameworks block, the report renders."""
    folder, summary = _run_small(tmp_path, shared_data, {"frameworks": "SE"},
                                 {1: ["5", "0,1,2,3"]}, late=["4"])
    assert "frameworks" not in summary or not summary["frameworks"]
    reasons = [n["reason"] for n in summary["unlearning"]["noops"]]
    assert "have not joined by stage 1" in reasons[0]
    assert "would keep no present client" in reasons[1]
    assert any("r0003" in w and "after the last stage boundary" in w
               for w in summary["warnings"])
    assert "stages (accuracy" in render(summary)
    assert cli_main(["receipts", "--run", "r", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("refused") == 2 and "r0003" in out
    assert "--pending` carries it out" in out
    assert sorted(p.name for p in (folder / "receipts").iterdir()) == \
        ["r0001.json", "r0002.json"]


def test_a_stages_seeded_requests_are_recorded_all_or_none(tmp_path):
    """A fault between two requests of one batch (here: the second names a client
    the first took) leaves none of them, so a resumed stage draws them again."""
    inbox = RequestInbox(_catalog(tmp_path, "live") / "run.sqlite")
    with pytest.raises(ValueError, match=r"already forgotten or requested: 1 \(r0001\)"):
        inbox.submit_all([[1], [2, 1]], "planned", stage=1)
    assert inbox.all() == []
    done = inbox.submit_all([[1], [2]], "planned", stage=1)
    assert [(r.id, r.clients, r.state) for r in done] == [
        ("r0001", [1], "claimed"), ("r0002", [2], "claimed")]
    inbox.close()


def test_a_command_arriving_between_the_seeded_draw_and_its_record_is_no_crash(
        tmp_path, monkeypatch):
    """The command names the client just drawn: both are recorded and taken at this
    boundary; the first handled forgets the client, the other is refused."""
    from types import SimpleNamespace

    from server_app.admission import lineage_shards
    from server_app.config import RunConfig
    from server_app.stages.churn import Churn, Membership

    cfg = RunConfig.from_run_config({**SMALL, "requests-per-stage": 1})
    folder = _catalog(tmp_path, "live")
    shards = lineage_shards(6, 4, 2, seed=1)
    churn = Churn(shards, 4, 2, 0, seed=1)
    real = Churn.requests

    def draw_then_command(self, *args, **kw):
        drawn = real(self, *args, **kw)
        submit("live", str(drawn[0][0]), str(tmp_path))  # lands in between
        return drawn

    monkeypatch.setattr(Churn, "requests", draw_then_command)
    run = SimpleNamespace(ctx=SimpleNamespace(cfg=cfg), churn=churn, forgotten=set(),
                          inbox=RequestInbox(folder / "run.sqlite"),
                          federation=SimpleNamespace(shards=shards),
                          baseline=SimpleNamespace(shards=[sorted(range(6))]))
    member = Membership(1, [0, 1, 2, 3])
    claimed = boundary.claim(run, member, SimpleNamespace(warnings=[]))
    assert [r.source for r in claimed] == ["command", "planned"]
    assert claimed[0].clients == claimed[1].clients
    assert boundary.refusal(run, member, claimed[0]) is None
    run.forgotten |= set(claimed[0].clients)
    assert "already forgotten" in boundary.refusal(run, member, claimed[1])
    run.inbox.close()
