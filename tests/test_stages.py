"""Staged runs: churn, the request inbox, receipts, SE across stages, FR over stages."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from cli.forget import submit
from cli.receipts import main_receipts
from history import HistoryStore
from history.files import read_arrays
from runstore.inbox import RequestInbox
from server_app.admission import lineage_shards
from server_app.app import main
from server_app.config import ConfigError, RunConfig
from server_app.rounds.learning import Continuation, run_learning
from server_app.rounds.loop import RoundLoop, RoundPlan
from server_app.run.context import initial_model, train_config
from server_app.run.plan import plan_run
from server_app.stages import pipeline
from server_app.stages.churn import Churn, Membership
from server_app.stages.learn import first_round, stage_strategy
from server_app.stages.state import RunState
from task.config import fused_run_config
from tests.conftest import TINY

STAGED = {**TINY, "num-clients": 12, "num-stages": 3, "joins-per-stage": 2,
          "leaves-per-stage": 1, "requests-per-stage": 1, "frameworks": "SE,FR",
          "mia": False, "seed": 1}


def test_lineage_shards_keep_the_first_split_and_add_joiners_by_id():
    shards = lineage_shards(12, 8, 2, seed=0)
    assert sorted(p for s in shards for p in s) == list(range(12))
    assert all(p % 2 == s for s, pids in enumerate(shards) for p in pids if p >= 8)
    assert [sorted(p for p in s if p < 8) for s in shards] == \
        [sorted(p for p in s if p < 8) for s in lineage_shards(12, 8, 2, seed=0)]


def test_churn_joins_next_ids_leaves_keep_a_client_per_shard_and_is_seeded():
    shards = lineage_shards(14, 6, 3, seed=1)
    churn = Churn(shards, 6, joins=4, leaves=5, seed=1)
    first = churn.first()
    second = churn.advance(first, forgotten={0})
    assert first.present == list(range(6))
    assert second.joined == [6, 7, 8, 9]
    assert 0 not in second.present and 0 not in second.left
    shard_of = {p: s for s, pids in enumerate(shards) for p in pids}
    staying = [p for p in first.present if p != 0 and p not in second.left]
    assert {shard_of[p] for p in staying} == {shard_of[p] for p in first.present if p}
    assert second.warnings  # 5 leaves would empty a shard: fewer left, said so
    again = Churn(shards, 6, joins=4, leaves=5, seed=1).advance(first, forgotten={0})
    assert again == second


@pytest.mark.parametrize("overrides, key", [
    ({"num-stages": 0}, "num-stages"),
    ({"joins-per-stage": 2}, "joins-per-stage"),  # needs num-stages > 1
    ({"num-stages": 3, "frameworks": "SE,FE"}, "frameworks"),
    ({"num-stages": 3, "frameworks": "FR"}, "frameworks"),
    ({"num-stages": 3, "frameworks": "SE", "storage": "coded"}, "storage"),
    ({"num-stages": 3, "frameworks": "SE", "forget-clients": "3"}, "forget-clients"),
    ({"num-stages": 3, "frameworks": "SE", "joins-per-stage": 4}, "joins-per-stage"),
    ({"num-stages": 2, "frameworks": "SE", "requests-per-stage": -1},
     "requests-per-stage"),
])
def test_bad_stage_settings_are_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        RunConfig.from_run_config({**TINY, **overrides})


def _start(tmp_path, shared_data, make_grid, overrides, name):
    config = fused_run_config({**STAGED, "results-dir": str(tmp_path), "run-name": name,
                               "data-dir": str(shared_data), **overrides})
    grid = make_grid(int(config["num-clients"]), config)
    return config, grid


def _run(config, grid):
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))


def _first_rounds(store: HistoryStore, shard: int) -> dict[int, int]:
    first: dict[int, int] = {}
    for rnd in store.rounds(shard):
        for pid, _ in store.participants(shard, rnd):
            first.setdefault(pid, rnd)
    return first


@pytest.fixture(scope="module")
def staged_run(tmp_path_factory, shared_data):
    """A seeded 3-stage run; a command request in stage 3 for a client of stage 1.

    The client first trained in stage 1 (rounds 1-2), before any client of its
    shard forgotten earlier, so SE's replay must start at its first round (2 with
    seed 1). Every read of a stored update is logged.
    """
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity

    set_task_identity()
    tmp = tmp_path_factory.mktemp("staged")
    config = fused_run_config({**STAGED, "results-dir": str(tmp), "run-name": "s",
                               "data-dir": str(shared_data)})
    grid = InProcessGrid(client_app, 12, config)
    reads, chosen = [], {}
    real_update, real_stage = HistoryStore.update, pipeline.run_stage

    def update(self, shard, rnd, pid):
        reads.append((pid, chosen.get("claimed", False)))
        return real_update(self, shard, rnd, pid)

    def run_stage(run, member):
        if len(run.members) == 2:  # stage 3 is next: the request arrives during it
            chosen.update(_choose(run))
            submit("s", str(chosen["client"]), str(tmp))
            chosen["claimed"] = True
        return real_stage(run, member)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HistoryStore, "update", update)
        mp.setattr(pipeline, "run_stage", run_stage)
        _run(config, grid)
    summary = json.loads((tmp / "s" / "summary.json").read_text())
    return tmp / "s", summary, reads, chosen, config


def _choose(staged: RunState) -> dict:
    """A present client that first trained in stage 1, before any forgotten client
    of its shard; the latest such first round (2 if there is one)."""
    fits = []
    for shard, pids in enumerate(staged.federation.shards):
        first = _first_rounds(staged.store, shard)
        earliest = min((first[p] for p in staged.forgotten if p in first), default=99)
        present = set(staged.members[-1].present) - staged.forgotten
        fits += [(first[p], p, shard) for p in pids
                 if p in present and first.get(p, 99) <= min(2, earliest)]
    assert fits, "no client fits; change the test's seed"
    rnd, pid, shard = max(fits)
    return {"client": pid, "shard": shard, "first": rnd}


def test_every_request_gets_a_receipt_and_every_stage_a_summary(staged_run, capsys):
    folder, summary, _, chosen, _ = staged_run
    receipts = sorted((folder / "receipts").glob("*.json"))
    assert len(receipts) == 4  # 3 seeded (one a stage) + 1 from the command
    assert [e["stage"] for e in summary["stages"]] == [1, 2, 3]
    assert [len(e["requests"]) for e in summary["stages"]] == [1, 1, 2]
    assert summary["stages"][1]["joined"] == [8, 9]
    assert summary["stages"][2]["joined"] == [10, 11]
    assert all(len(e["left"]) == 1 for e in summary["stages"][1:])
    for path in receipts:
        receipt = json.loads(path.read_text())
        assert receipt["status"] == "done"
        assert set(receipt["cost"]) == {"SE", "FR"}
        assert receipt["models_sha256"]["before"] != receipt["models_sha256"]["after"]
        kept = receipt["erased"]  # a boundary erases nothing: what it keeps
        assert kept["counts"] == {"updates": 0} and kept["updates"] == []
        assert kept["kept"]["updates"] >= 0 and "erases nothing" in kept["note"]
    forgotten = [p for e in summary["stages"] for p in e["forgotten"]]
    assert chosen["client"] in summary["stages"][2]["forgotten"]
    assert len(set(forgotten)) == 4
    costs = [json.loads(p.read_text())["cost"] for p in receipts]
    for name in ("SE", "FR"):  # the run's totals are the receipts' sums
        assert summary["frameworks"][name]["client_rounds"] == sum(
            c[name]["client_rounds"] for c in costs)
    assert main_receipts(["--run", "s", "--results-dir", str(folder.parent)], "x") == 0
    assert capsys.readouterr().out.count("  done     stage") == 4


def test_forgotten_clients_updates_are_never_read_after_the_request(staged_run):
    _, _, reads, chosen, _ = staged_run
    after = [pid for pid, claimed in reads if claimed]
    assert after, "SE read no stored update after the request"
    assert chosen["client"] not in after


def test_se_replays_only_its_shard_from_its_first_round_in_stage_1(staged_run):
    folder, _, _, chosen, _ = staged_run
    receipt = next(json.loads(p.read_text()) for p in (folder / "receipts").glob("*")
                   if json.loads(p.read_text())["clients"] == [chosen["client"]])
    assert receipt["stage"] == 3 and receipt["source"] == "command"
    assert receipt["shards_retrained"] == [chosen["shard"]]
    replay = receipt["replay"]["shards"]
    assert list(replay) == [str(chosen["shard"])]
    assert chosen["first"] == 2  # stage 1 is rounds 1-2: round 1 is not replayed
    assert replay[str(chosen["shard"])]["start_round"] == chosen["first"]
    assert replay[str(chosen["shard"])]["rounds_replayed"] == 7 - chosen["first"]
    assert receipt["erased"]["kept"]["updates"] >= 1  # its rounds, still stored
    # SE asks clients in at most its replayed rounds (the preparation round only
    # the forgotten client's substitute); FR asks clients in every round
    cost = receipt["cost"]
    assert 1 <= cost["SE"]["client_rounds"] <= replay[str(chosen["shard"])][
        "rounds_replayed"] < cost["FR"]["client_rounds"]
    digests = receipt["models_sha256"]
    for s, (old, new) in enumerate(zip(digests["before"]["shards"],
                                       digests["after"]["shards"], strict=True)):
        assert (old == new) == (s != chosen["shard"])


def test_fedretrain_over_stages_equals_a_run_without_the_forgotten_clients(
        staged_run, shared_data, tmp_path):
    """Bit for bit: FR's models = learning the same stages with F never present."""
    from client_app.app import app as client_app
    from experiments.grid import NODE_ID_BASE, InProcessGrid

    folder, summary, _, _, config = staged_run
    cfg = RunConfig.from_run_config(config)
    forgotten = {p for e in summary["stages"] for p in e["forgotten"]}
    assert len(forgotten) == 4
    data = read_arrays(folder / "models" / "stage3-FR.npz")
    grid = InProcessGrid(client_app, 12, config)  # a fresh federation
    node_of = {p: NODE_ID_BASE + p for p in range(12)}
    _, baseline = plan_run(cfg).with_nodes(node_of, {}).federations()
    store = HistoryStore.create(tmp_path / "h", baseline.shard_of)
    models = [initial_model(cfg, 10)] * len(baseline.shards)
    for entry in summary["stages"]:
        member = Membership(entry["stage"], [p for p in entry["present_clients"]
                                             if p not in forgotten])
        models = run_learning(
            RoundLoop(grid), stage_strategy(cfg, baseline.shards, member.present,
                                            baseline.node_of),
            baseline, models, RoundPlan(cfg.training.num_rounds,
                                        train_config(cfg, str(shared_data)), "learn"),
            store, continuation=Continuation(first_round(cfg, entry["stage"]))).models
    for s, record in enumerate(models):
        for key, array in record.items():
            assert np.array_equal(array.numpy(), data[f"shard{s}/{key}"]), key


def test_forget_command_refuses_bad_requests_and_records_nothing(staged_run, tmp_path):
    folder, summary, _, chosen, _ = staged_run
    gone = summary["stages"][0]["forgotten"][0]  # a finished run takes requests later
    with pytest.raises(ConfigError, match=f"\\[{gone}\\] are already forgotten"):
        submit("s", str(gone), str(folder.parent))
    with pytest.raises(ConfigError, match="no run of that name"):
        submit("nope", "3", str(folder.parent))
    live = tmp_path / "live"
    live.mkdir()
    inbox = RequestInbox(live / "run.sqlite")
    with inbox._conn:
        inbox.set_meta("settings", json.dumps({"num-stages": 3, "num-clients": 12}))
    first = inbox.submit([5]).id
    for clients, message in [("12", "unknown client"), ("5", "already forgotten or "
                             "requested: 5 \\(r0001\\)"), ("a,b", "partition ids"),
                             ("3,3", "each id once"), ("", "partition ids")]:
        with pytest.raises(ConfigError, match=message):
            submit("live", clients, str(tmp_path))
    assert [r.id for r in inbox.all()] == [first]
    with inbox._conn:
        inbox.set_meta("settings", json.dumps({"num-stages": 1, "num-clients": 12}))
    with pytest.raises(ConfigError, match="num-stages = 1"):
        submit("live", "4", str(tmp_path))


def test_forget_command_line_exits_2_with_one_line(tmp_path, capsys):
    from cli.main import main as cli_main

    assert cli_main(["forget", "--run", "nope", "--clients", "1", "--results-dir",
                     str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no run of that name" in err
