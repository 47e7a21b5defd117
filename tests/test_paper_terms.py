"""Issue 14: modelled wall time, rounds to target, SE replay from the first round a
forgotten client took part."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from history.comm import transfer_seconds
from history.files import read_arrays
from history.store import HistoryStore
from server_app.config.profile import TaskCost
from server_app.rounds.costs import CostModel
from server_app.rounds.loop import CostMeter, RoundOutcome
from server_app.unlearning.frameworks import rebuild_shard_model
from server_app.unlearning.target import TargetWatch
from strategies.calibration import weighted_step
from strategies.unlearning import CalibratedRetraining, ReplaySchedule, first_participation

W = {"w": np.zeros(1000, np.float32)}


def _arrays():
    return ArrayRecord({k: Array(v) for k, v in W.items()})


def _sent(node):
    return Message(RecordDict({"arrays": _arrays(), "config": ConfigRecord({})}),
                   dst_node_id=node, message_type="train")


def _reply(sent, seconds):
    """A reply that trained ``10 x seconds`` samples for one epoch in ``seconds``."""
    reply = Message(RecordDict({"arrays": _arrays(), "metrics": MetricRecord(
        {"train-seconds": seconds, "local-epochs": 1.0,
         "num-examples": int(round(10 * seconds))})}), reply_to=sent)
    reply.metadata.__dict__["_src_node_id"] = sent.metadata.dst_node_id
    return reply


# 0.1 s a sample: each reply's modelled training equals its measured seconds
COSTS = CostModel(TaskCost(0.1, 0.0), link_rate_mbps=10.0, configure_s_per_param=1e-6,
                  aggregate_s_per_param=2e-6)


def test_modelled_wall_is_the_slowest_participant_plus_its_transfers():
    sent = [_sent(n) for n in (1, 2, 3)]
    by_shard = [[_reply(sent[0], 1.0), _reply(sent[1], 3.0)], [_reply(sent[2], 2.0)]]
    assert [r.metadata.src_node_id for s in by_shard for r in s] == [1, 2, 3]
    meter = CostMeter(COSTS)
    models = [_arrays(), _arrays()]
    meter.on_round(RoundOutcome(1, sent, by_shard, models, models, 0.5, 0.0,
                                sent_by_shard=[2, 1]))
    meter.on_round(RoundOutcome(2, [], [[], []], models, models, 0.25, 0.0))  # preparation
    one = transfer_seconds(_arrays().count_bytes(), 10.0)
    server = 2 * 1000 * 1e-6 + 2 * 1000 * 2e-6  # shard 0: 2 models sent, 2 combined
    assert meter.modelled_wall_s == pytest.approx(3.0 + 2 * one + server)
    # the measured seconds, beside it: the server's clock instead of its sizes
    assert meter.measured_wall_s == pytest.approx(0.5 + 3.0 + 2 * one + 0.25)
    assert meter.compute_s == pytest.approx(6.0 + 0.75)  # the sum, for contrast
    assert meter.measured_train_s == pytest.approx(6.0)


def test_modelled_wall_splits_along_the_critical_path():
    """Issue 42, item 2: training, transfers, configure and aggregate seconds."""
    sent = [_sent(n) for n in (1, 2, 3)]
    by_shard = [[_reply(sent[0], 1.0), _reply(sent[1], 3.0)], [_reply(sent[2], 2.0)]]
    meter = CostMeter(COSTS)
    models = [_arrays(), _arrays()]
    meter.on_round(RoundOutcome(1, sent, by_shard, models, models, 0.5, 0.0,
                                aggregate_s=0.2, sent_by_shard=[2, 1]))
    # SE's preparation: no message; shard 1 combined 3 stored updates
    meter.on_round(RoundOutcome(2, [], [[], []], models, models, 0.25, 0.0,
                                aggregate_s=0.05,
                                metrics=MetricRecord({"shard1/clients": 3})))
    one = transfer_seconds(_arrays().count_bytes(), 10.0)
    assert meter.wall_parts == pytest.approx({
        "client_training_s": 3.0, "transfer_s": 2 * one,
        "server_configure_s": 2 * 1000 * 1e-6,
        "server_aggregate_s": (2 + 3) * 1000 * 2e-6, "retrieval_s": 0.0})
    assert sum(meter.wall_parts.values()) == pytest.approx(meter.modelled_wall_s)


def test_target_watch_notes_the_first_round_at_or_below_the_target():
    losses = iter([3.0, 2.0, 1.0])
    meter = CostMeter()
    calls = []

    def evaluate(models):
        calls.append(models)
        return {"loss": next(losses)}

    watch = TargetWatch(evaluate, 2.0, meter)
    for rnd in (1, 2, 3):
        meter.compute_s += 10.0
        watch.on_round(RoundOutcome(rnd, [], [], [], [], 0.0, 0.0))
    got = watch.result()
    assert got["reached"] and got["round"] == 2 and got["compute_s"] == 20.0
    assert got["losses"] == [3.0, 2.0] and len(calls) == 2  # stops evaluating
    with pytest.raises(ValueError, match="finite"):
        TargetWatch(evaluate, float("nan"), meter)


class FakeHistory:
    """Rounds 1..4 of one shard; participants (pid, n) per round."""

    ROUNDS = {1: [(0, 10), (1, 10)], 2: [(1, 10), (2, 10)], 3: [(2, 10), (3, 10)],
              4: [(0, 10), (3, 10)]}

    def participants(self, shard, rnd):
        return self.ROUNDS[rnd]

    def rounds(self, shard):
        return sorted(self.ROUNDS)

    def update(self, shard, rnd, pid):
        return {"w": np.full(2, float(pid), np.float32)}


@pytest.mark.parametrize(("forget", "interval", "g0", "start", "plan", "saved"), [
    ({0}, 1, 1, 1, [1, 2, 3, 4], 0),    # trained in round 1: replay as before
    ({3}, 1, 3, 3, [3, 4], 3),          # first in round 3: rounds 1-2 kept
    ({3}, 2, 3, 3, [3], 1),             # interval 2: plan 1, 3; from 3
    ({2}, 2, 2, 1, [1, 3], 0),          # interval 2, g0 = 2: from plan round 1
    ({5}, 1, None, None, [], 6),        # never trained: nothing to redo
])
def test_replay_starts_at_the_first_round_a_forgotten_client_took_part(
        forget, interval, g0, start, plan, saved):
    history = FakeHistory()
    node_of = {p: 100 + p for p in range(6)}
    retraining = CalibratedRetraining(history, 0, forget, node_of, 1.0,
                                      ReplaySchedule(interval))
    assert first_participation(history, 0, forget) == g0
    assert retraining.plan == plan and retraining.num_rounds == len(plan)
    report = retraining.replay_report()
    assert report["start_round"] == start and report["rounds_replayed"] == len(plan)
    assert report["retrain_messages_saved"] == saved
    from_one = CalibratedRetraining(history, 0, forget, node_of, 1.0, ReplaySchedule(
        interval, from_first_participation=False))
    assert from_one.plan == from_one.full_plan
    assert len(from_one.plan) == report["rounds_from_round1"]


def _participation(store, shards):
    """pid -> first round it trained (None: never), over every shard."""
    first = {}
    for s, pids in enumerate(shards):
        for p in pids:
            first[p] = first_participation(store, s, {p})
    return first


def test_se_skips_rounds_before_the_first_participation_and_never_trained(
        run_server, tmp_path):
    """Forgetting a never-sampled client changes nothing; one first sampled in
    round 2 replays round 2 only, from the stored W^1, by preparation."""
    summary, _ = run_server({"frameworks": "none", "mia": False},  # learning only
                            run_name="probe")
    store = HistoryStore.open(tmp_path / "probe" / "history" / "sharded")
    first = _participation(store, summary["shards"])
    # FedAvg shard models are rebuilt exactly from the record (coded storage)
    for s in range(len(summary["shards"])):
        rebuilt, stored = rebuild_shard_model(store, s, 1), store.shard_model(s, 1)
        for k, v in stored.items():
            np.testing.assert_allclose(rebuilt[k], v, atol=1e-6)
    never = [p for p, g in first.items() if g is None]
    late = [p for p, g in first.items() if g == 2]
    assert never and late, first  # the seeded sampling has both (8 clients, 2 rounds)
    summary, grid = run_server({"forget-clients": str(never[0]), "frameworks": "SE",
                                "mia": False}, run_name="never")
    se = summary["frameworks"]["SE"]
    assert se["rounds_replayed"] == 0 and se["client_epochs"] == 0
    assert se["replay"]["unchanged_shards"] and se["requests"][0]["impacted_shards"] == []
    assert se["accuracy"] == pytest.approx(summary["learning"]["accuracy"])
    summary, grid = run_server({"forget-clients": str(late[0]), "frameworks": "SE",
                                "mia": False, "method.se.replay-refill": False},
                               run_name="late")  # the paper's replay
    se = summary["frameworks"]["SE"]
    assert se["rounds_replayed"] == 1 and se["replay"]["rounds_from_round1"] == 2
    assert se["client_epochs"] == 0  # round 2 by preparation: W^1 + retained updates
    s = next(i for i, pids in enumerate(summary["shards"]) if late[0] in pids)
    store = HistoryStore.open(tmp_path / "late" / "history" / "sharded")
    kept = [(p, n) for p, n in store.participants(s, 2) if p != late[0]]
    want = weighted_step(store.shard_model(s, 1), [store.update(s, 2, p) for p, _ in kept],
                         [n for _, n in kept])
    saved = read_arrays(tmp_path / "late" / "models" / "SE.npz")
    for k, v in want.items():
        np.testing.assert_array_equal(saved[f"shard{s}/{k}"], v)


def test_fr_rr_report_rounds_to_the_original_loss(run_server):
    summary, _ = run_server({"forget-clients": "3", "frameworks": "FR,RR",
                             "mia": False})
    for name in ("FR", "RR"):
        result = summary["frameworks"][name]
        target = result["to_target"]
        assert target["target_loss"] == pytest.approx(summary["learning"]["loss"])
        crossed = [i + 1 for i, x in enumerate(target["losses"])
                   if x <= target["target_loss"]]
        assert target["reached"] == bool(crossed)
        if crossed:
            assert result["rounds_to_target"] == crossed[0]
            assert target["compute_s"] <= result["retrain_compute_s"]
        else:
            assert "rounds_to_target" not in result
        assert 0 < result["modelled_wall_s"]
    assert summary["data"]["dataset"] == "mnist" and summary["data"]["files"]


@pytest.mark.parametrize("storage", ["uncoded", "coded"])
def test_storage_per_shard_server_and_over_the_system(run_server, storage):
    """The paper's count: a shard server keeps W^0 and its shard's updates."""
    summary, _ = run_server({"forget-clients": "3", "frameworks": "SE,FE", "mia": False,
                             "storage": storage, "blocks-per-shard": 2})
    st, model = summary["storage"], summary["storage"]["model_bytes"]
    assert model > 0 and model % 4 == 0  # float32 parameters
    # TINY: 2 rounds, 4 clients a round; SE: 2 shards of 2 clients a round
    assert st["FE"]["per_server_bytes"] == st["FE"]["system_bytes"] == model * (1 + 8)
    assert st["SE_uncoded"]["per_shard_bytes"] == [model * (1 + 4)] * 2
    assert st["SE_uncoded"]["system_bytes"] == model * 10
    assert st["SE_uncoded"]["per_server_bytes"] < st["FE"]["per_server_bytes"]
    assert st["SE_uncoded"]["stored_models_bytes"] == model * 2 * 2
    if storage == "coded":
        coded = st["SE_coded"]
        assert coded["per_server_bytes"] == coded["server_bytes"] / 2
        assert coded["system_bytes"] == coded["server_bytes"] + \
            coded["client_bytes"]["total"]


def test_data_provenance_names_files_format_and_checksums(shared_data, tmp_path,
                                                          monkeypatch):
    from task import provenance
    from task.builtin import data_provenance

    monkeypatch.setenv("SE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(provenance, "_MEMO", {})
    sums = {}
    listed = shared_data / "SHA256SUMS"
    if listed.is_file():
        for line in listed.read_text().splitlines():
            digest, name = line.split(maxsplit=1)
            sums[name.strip()] = digest
    got = data_provenance("mnist", shared_data)
    assert [f["path"] for f in got["files"]] == sorted(
        f"MNIST/raw/{n}" for n in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
                                   "train-images-idx3-ubyte", "train-labels-idx1-ubyte"))
    for f in got["files"]:
        if f["path"] in sums:
            assert f["sha256"] == sums[f["path"]]
    assert "IDX" in got["format"] and len(got["sha256"]) == 64
    assert (tmp_path / "provenance.json").is_file()  # hashed once, cached
    assert data_provenance("mnist", shared_data) == got
    if (shared_data / "cifar10-jpeg").is_dir() and \
            not (shared_data / "cifar-10-batches-py").is_dir():
        assert "not comparable" in data_provenance("cifar10", shared_data)["format"]


@pytest.mark.parametrize(("clients", "shards", "k"), [(100, 4, 1), (100, 4, 4),
                                                      (100, 4, 8), (8, 2, 2)])
def test_impacted_shards_over_seeded_uniform_draws_match_the_paper(clients, shards, k):
    from server_app.rounds.federation import assign_shards
    from server_app.unlearning.requests import expected_impacted, simulated_impacted

    got = simulated_impacted(assign_shards(clients, shards, 0), k, draws=4000)
    paper = expected_impacted(shards, k)
    # distinct clients drawn without replacement: at least the paper's, close to it
    # for large shards (C / S = 25), visibly above for tiny ones (C / S = 4)
    assert got >= paper - 0.05
    if clients // shards >= 25:
        assert got == pytest.approx(paper, abs=0.1)
    with pytest.raises(ValueError, match="num-requests"):
        simulated_impacted(assign_shards(clients, shards, 0), clients + 1)


def test_the_uncoded_store_keeps_only_models_a_replay_can_start_from(run_server, tmp_path):
    """After learning, every single-client request still starts from a stored model,
    and the models no replay can start from are gone (issue 14, item 7)."""
    from history import HistoryStore
    from server_app.unlearning.builtin.sharding_eraser import start_model as _start_model
    from strategies.unlearning import first_participation

    summary, _ = run_server({"num-rounds": 4, "frameworks": "none", "mia": False})
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    kept = {s: [r for (r,) in store._conn.execute(
        "SELECT round FROM shard_models WHERE shard=?", (s,))] for s in range(2)}
    assert sum(len(k) for k in kept.values()) < 2 * 5  # W^0..W^4 for 2 shards before
    for s in range(2):
        for client in summary["shards"][s]:
            g0 = first_participation(store, s, {client})
            if g0 is not None:
                model, source = _start_model(store, s, g0, "FedAvg")
                assert model is not None and source == f"stored W^{g0 - 1}"
