"""SE / FE / FR / RR through the real ServerApp and ClientApp on an in-process grid."""

import numpy as np
import pytest

from history import StoreError
from history.files import read_arrays
from history.store import HistoryStore
from server_app.config import ConfigError
from strategies.sharded import to_record
from strategies.unlearning import CalibratedRetraining, ReplaySchedule, ShardingEraser


def load_models(path):
    return read_arrays(path)


def test_se_isolation_and_all_frameworks(run_server, tmp_path):
    summary, grid = run_server({"forget-clients": "3", "num-rounds": 2})
    shards = summary["shards"]
    impacted = next(s for s, pids in enumerate(shards) if 3 in pids)
    assert summary["unlearning"]["requests"] == [[3]]
    frameworks = summary["frameworks"]
    assert set(frameworks) == {"SE", "FR", "FE", "RR", "SISA"}  # the defaults
    for name, result in frameworks.items():
        for key in ("accuracy", "loss", "retrain_compute_s", "retrain_wall_s",
                    "client_epochs", "comm_time_s", "server_storage_bytes"):
            assert np.isfinite(result[key]), (name, key)
    assert frameworks["FE"]["client_epochs"] < frameworks["FR"]["client_epochs"]
    # unimpacted shards are bit-identical to the learned ones
    run = tmp_path / "t"
    se = load_models(run / "models" / "SE.npz")
    learned = HistoryStore.open(run / "history" / "sharded")
    last = max(learned.rounds(0))
    # SE touches one shard of two; replayed from round 1, its round 2 is exact (the
    # default calibration-final = 2; the preparation round 1 never is): every
    # retained participant trains L = 1 epoch
    with3 = [g for g in (1, 2) if 3 in dict(learned.participants(impacted, g))]
    kept = [p for p, _ in learned.participants(impacted, 2) if p != 3]
    assert with3[:1] == [1] and kept  # the seeded run: client 3 trains in round 1
    # and the forgotten client's slots go to substitutes, who train L = 1 epoch too
    refilled = frameworks["SE"]["replay"]["refilled_slots"]
    assert frameworks["SE"]["client_epochs"] == pytest.approx(len(kept) + refilled)
    v1 = load_models(run / "models" / "v1.npz")  # the learned models
    for s in range(len(shards)):
        same = all(se[k].tobytes() == v1[k].tobytes() for k in v1
                   if k.startswith(f"shard{s}/"))
        assert same == (s != impacted)
    # the stored models client 3 shaped are erased with its updates, once read
    assert learned.shard_model(1 - impacted, last) is not None
    with pytest.raises(StoreError, match=f"no model of shard {impacted} at round 1"):
        learned.shard_model(impacted, 1)
    assert learned.shard_model(impacted, 0) is not None
    # no unlearning message ever reached the forgotten client
    node3 = 1003
    unlearn_dsts = [dst for dst, kind in grid.sent if kind == "train.unlearn"]
    assert unlearn_dsts and node3 not in unlearn_dsts


class RecordingHistory:
    """Wraps a store and records which clients' updates were read."""

    def __init__(self, store):
        self.store, self.read = store, []

    def participants(self, shard, rnd):
        return self.store.participants(shard, rnd)

    def rounds(self, shard):
        return self.store.rounds(shard)

    def update(self, shard, rnd, pid):
        self.read.append(pid)
        return self.store.update(shard, rnd, pid)


def test_se_never_reads_forgotten_updates(run_server, tmp_path):
    from flwr.app import ConfigRecord

    from server_app.rounds.loop import RoundLoop, RoundPlan

    summary, grid = run_server({"frameworks": "none", "num-rounds": 3})
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    shards = summary["shards"]
    # forget a client that took part in the stored rounds
    forget = store.participants(0, 1)[0][0]
    history = RecordingHistory(store)
    node_of = {p: 1000 + p for p in range(8)}
    strategy = ShardingEraser(history, {forget}, shards, node_of, retrain_epochs=0.5)
    assert strategy.impacted == [0]
    initial = [to_record(store.shard_model(s, 0)) for s in range(2)]
    config = ConfigRecord({"lr": 0.05, "batch-size": 16, "momentum": 0.0, "seed": 0})
    sent_before = len(grid.sent)
    models, stats = RoundLoop(grid).run(strategy, initial,
                                        RoundPlan(strategy.num_rounds, config))
    assert history.read and forget not in history.read
    assert set(history.read) <= set(shards[0])
    contacted = [dst for dst, _ in grid.sent[sent_before:]]
    assert 1000 + forget not in contacted
    assert {dst - 1000 for dst in contacted} <= set(shards[0])
    assert all(np.isfinite(v.numpy()).all() for m in models for v in m.values())


def test_round_without_retained_participants_is_skipped(run_server, tmp_path):
    summary, _ = run_server({"frameworks": "none", "num-rounds": 2})
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    everyone_in_round_2 = [p for p, _ in store.participants(0, 2)]
    strategy = CalibratedRetraining(store, 0, everyone_in_round_2, {}, 1.0)
    from flwr.app import ConfigRecord

    w = to_record(store.shard_model(0, 0))
    assert strategy.configure_train(2, w, ConfigRecord(), None) == []
    assert strategy.aggregate_train(2, []) == (None, None)
    assert strategy.skipped_rounds == [2]


def test_fr_equals_learning_without_the_forgotten_clients(run_server, tmp_path):
    from conftest import TINY

    from server_app.config import RunConfig
    from server_app.rounds.federation import Federation
    from server_app.rounds.learning import run_learning
    from server_app.rounds.loop import RoundLoop, RoundPlan
    from server_app.run.context import initial_model, train_config
    from server_app.stages.learn import stage_strategy

    summary, grid = run_server({"frameworks": "FR", "forget-clients": "5"})
    fr = load_models(tmp_path / "t" / "models" / "FR.npz")
    # a fresh learning run whose client set excludes client 5, same seed
    cfg = RunConfig.from_run_config(TINY)
    retained = [p for p in range(8) if p != 5]
    federation = Federation({p: 1000 + p for p in retained}, [retained])
    store = HistoryStore.create(tmp_path / "fresh", federation.shard_of)
    strategy = stage_strategy(cfg, federation.shards, retained, federation.node_of)
    plan = RoundPlan(cfg.training.num_rounds, train_config(cfg, summary["data_dir"]),
                     "learn")
    fresh = run_learning(RoundLoop(grid), strategy, federation,
                         [initial_model(cfg, 10)], plan, store)
    for key, value in fresh.models[0].items():
        assert fr[f"shard0/{key}"].tobytes() == value.numpy().tobytes(), key


@pytest.mark.parametrize("overrides, words", [
    ({"forget-clients": "42"}, "'forget-clients' = '42'.*0..7"),
    ({"forget-clients": "3,3"}, "'forget-clients' = '3,3'.*each id once"),
])
def test_bad_requests_fail_before_any_work(run_server, tmp_path, overrides, words):
    with pytest.raises(ConfigError, match=words):
        run_server(overrides)
    assert not (tmp_path / "t").exists()


def test_sequential_requests_retrain_only_their_own_shard(run_server):
    summary, _ = run_server({"frameworks": "SE", "num-requests": 2,
                             "request-distribution": "even",
                             "request-mode": "sequential", "mia": False})
    requests = summary["frameworks"]["SE"]["requests"]
    shard_of = {p: s for s, pids in enumerate(summary["shards"]) for p in pids}
    assert len(requests) == 2
    for request in requests:  # each request retrains the shard of its own client
        assert request["impacted_shards"] == [shard_of[request["clients"][0]]]
    assert requests[0]["impacted_shards"] != requests[1]["impacted_shards"]


def test_se_runs_under_flowers_own_strategy_start(run_server, tmp_path):
    """A user can drive SE with the stock ``Strategy.start`` loop."""
    from strategies.sharded import pack_shards, unpack_shards

    summary, grid = run_server({"frameworks": "none", "num-rounds": 2})
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    shards = summary["shards"]
    forget = store.participants(0, 1)[0][0]
    se = ShardingEraser(store, {forget}, shards, {p: 1000 + p for p in range(8)},
                        retrain_epochs=0.5,  # as the README
                        schedule=ReplaySchedule(final=2, exact_epochs=1.0))
    learned = [to_record(store.shard_model(s, 2)) for s in range(2)]
    initial = [to_record(store.shard_model(0, 0)), learned[1]]
    from flwr.app import ConfigRecord

    config = ConfigRecord({"lr": 0.05, "batch-size": 16, "momentum": 0.0, "seed": 0})
    result = se.start(grid, pack_shards(initial), num_rounds=se.num_rounds,
                      train_config=config)
    new = unpack_shards(result.arrays, 2)
    assert all(new[1][k].numpy().tobytes() == learned[1][k].numpy().tobytes()
               for k in learned[1])  # the other shard is untouched
    assert any(new[0][k].numpy().tobytes() != initial[0][k].numpy().tobytes()
               for k in initial[0])


def test_costs_of_sequential_requests_add_up_client_rounds_included():
    from server_app.rounds.loop import CostMeter
    from server_app.unlearning.driver import accumulate

    total, first, second = CostMeter(), CostMeter(), CostMeter()
    first.client_rounds, first.rounds, first.client_epochs = 3, 4, 6.0
    second.client_rounds, second.rounds, second.client_epochs = 2, 2, 1.5
    accumulate(total, first)
    accumulate(total, second)
    assert (total.client_rounds, total.client_epochs) == (5, 7.5)


class _FourRounds:
    """Four stored rounds of one shard: clients 0, 1, 2 each round, U = g + p."""

    def rounds(self, shard):
        return [1, 2, 3, 4]

    def participants(self, shard, rnd):
        return [(0, 10), (1, 10), (2, 20)]

    def update(self, shard, rnd, pid):
        return {"w": np.full(3, rnd + pid, np.float32)}


@pytest.mark.parametrize("final, exact", [(0, []), (1, [4]), (2, [3, 4]), (9, [2, 3, 4])])
def test_calibration_final_rounds_train_all_epochs_uncalibrated(final, exact):
    """``calibration-final``: the last rounds are exact; the preparation never is."""
    from flwr.app import ConfigRecord, Message, RecordDict

    strategy = CalibratedRetraining(_FourRounds(), 0, {1}, {0: 100, 2: 102}, 1.0,
                                    ReplaySchedule(from_first_participation=False,
                                                   final=final, exact_epochs=2.0))
    assert [k for k in range(1, 5) if strategy.is_exact(k)] == exact
    base = {"w": np.zeros(3, np.float32)}
    for k in (2, 3, 4):
        sent = strategy.configure_train(k, to_record(base), ConfigRecord({}), None)
        assert {m.content["config"]["local-epochs"] for m in sent} == {
            2.0 if k in exact else 1.0}
        # each client moves 1 along every weight; calibration would rescale that
        # to its stored norm (|U| = (g + p) sqrt(3)), an exact round keeps it
        replies = [Message(RecordDict({"arrays": to_record(
            {"w": np.ones(3, np.float32)})}), reply_to=m) for m in sent]
        arrays, _ = strategy.aggregate_train(k, replies)
        got = arrays["w"].numpy()
        want = np.ones(3) if k in exact else (10 * k + 20 * (k + 2)) / 30 * np.ones(3)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_shipped_defaults_make_the_last_two_replayed_rounds_exact():
    """README: by default SE's last two replayed rounds are exact, slots refilled."""
    from server_app.config import methods
    from server_app.config.run_config import RunConfig
    from task.config import fused_run_config

    settings = RunConfig.from_run_config(fused_run_config({})).method_settings(
        methods.proposed())  # pyproject.toml's values, nothing overridden
    assert (settings.calibration_final, settings.replay_refill) == (2, True)
    strategy = CalibratedRetraining(_FourRounds(), 0, {1}, {0: 100, 2: 102}, 1.0,
                                    ReplaySchedule(from_first_participation=False,
                                                   final=settings.calibration_final,
                                                   exact_epochs=2.0))
    assert [k for k in range(1, 5) if strategy.is_exact(k)] == [3, 4]


def test_bad_calibration_final_is_refused_before_any_engine():
    from conftest import TINY

    from server_app.preflight import validate_run_config

    with pytest.raises(ConfigError, match="'method.se.calibration-final' = -1"):
        validate_run_config({**TINY, "method.se.calibration-final": -1}, files=False)
    with pytest.raises(ConfigError, match="'calibration-final' = 1 .*renamed: set "
                       "method.se.calibration-final"):
        validate_run_config({**TINY, "calibration-final": 1}, files=False)


@pytest.mark.parametrize("trains, final, exact", [
    ([True, True, True, True], 1, {4}),
    ([True, True, True, False], 1, {3}),  # the last round is skipped: the one before
    ([True, False, True, False], 2, {3}),  # one round trains after the preparation
    ([True], 1, set()),  # the preparation alone asks no client
    ([True, True, True], 0, set()),  # the paper's SE
    ([True, True, True], 9, {2, 3}),
])
def test_final_exact_rounds_are_the_last_that_train(trains, final, exact):
    from strategies.calibration import final_exact_rounds

    assert final_exact_rounds(trains, final) == exact


class _LateAndLastForgotten(_FourRounds):
    """Client 1 joins in round 3; round 4 holds client 1 alone."""

    def participants(self, shard, rnd):
        return {1: [(0, 10), (2, 20)], 2: [(0, 10), (2, 20)],
                3: [(0, 10), (1, 10), (2, 20)], 4: [(1, 10)]}[rnd]


@pytest.mark.parametrize("late, interval, plan, exact", [
    (True, 1, [3, 4], []),  # from round 3: round 4 has no retained client, no exact
    (False, 1, [1, 2, 3, 4], [3]),  # from round 1: the last round that trains is 3
    (False, 2, [1, 3], [2]),  # FedEraser's dt = 2: server round 2 replays round 3
])
def test_the_exact_round_is_the_last_one_that_trains(late, interval, plan, exact):
    strategy = CalibratedRetraining(_LateAndLastForgotten(), 0, {1}, {0: 100, 2: 102},
                                    1.0, ReplaySchedule(interval, late, final=1,
                                                        exact_epochs=2.0))
    assert strategy.plan == plan
    assert [k for k in range(1, len(plan) + 1) if strategy.is_exact(k)] == exact
