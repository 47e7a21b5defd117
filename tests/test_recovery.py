"""Server-side recovery: the L-BFGS product, SE-R inside a shard, FRec unsharded."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from history import HistoryStore
from history.files import read_arrays
from server_app.config import ConfigError
from server_app.preflight import validate_run_config
from strategies.lbfgs import lbfgs_product
from strategies.recovery import RecoveredShard
from strategies.replay import ReplaySchedule
from tests.conftest import TINY

# FedRecover's lean schedule, for SE-R and FRec alike (each reads its own keys)
RECOVERY_LEAN = {f"method.{m}.{k}": v for m in ("se-r", "frec")
                 for k, v in (("warmup", 1), ("correction", 0), ("final", 1))}


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), d=st.integers(2, 12))
def test_lbfgs_is_exact_on_the_pairs_it_was_given(seed, d):
    """B s_i = y_i for the newest pair (the secant equation) on a quadratic."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    hessian = a @ a.T + d * np.eye(d)  # positive definite
    pairs = [(s, hessian @ s) for s in rng.normal(size=(min(3, d), d))]
    s_new, y_new = pairs[-1]
    np.testing.assert_allclose(lbfgs_product(pairs, s_new), y_new, rtol=1e-6, atol=1e-8)


def test_lbfgs_with_the_whole_space_is_the_hessian():
    rng = np.random.default_rng(0)
    hessian = np.diag([1.0, 2.0, 3.0, 4.0])
    pairs = [(s, hessian @ s) for s in np.eye(4)]
    v = rng.normal(size=4)
    np.testing.assert_allclose(lbfgs_product(pairs, v), hessian @ v, rtol=1e-8)


def test_lbfgs_leaves_out_pairs_against_the_curvature_condition():
    v = np.ones(3)
    assert not lbfgs_product([], v).any()
    assert not lbfgs_product([(np.ones(3), -np.ones(3))], v).any()  # s.y < 0


class History:
    """Two rounds of one shard: clients 0, 1, 2 each round."""

    def __init__(self):
        self.updates = {(g, p): {"w": np.full(3, g + p, np.float32)}
                        for g in (1, 2, 3, 4) for p in (0, 1, 2)}

    def rounds(self, shard):
        return [1, 2, 3, 4]

    def participants(self, shard, rnd):
        return [(0, 10), (1, 10), (2, 20)]

    def update(self, shard, rnd, pid):
        return self.updates[(rnd, pid)]


@pytest.mark.parametrize("warmup, correction, final, exact", [
    (2, 4, 1, [2, 3, 4]), (0, 0, 0, []), (1, 2, 0, [2, 4]), (0, 0, 1, [4])])
def test_exact_rounds_are_warmup_correction_and_final(warmup, correction, final, exact):
    shard = RecoveredShard(History(), 0, {1}, {0: 100, 1: 101, 2: 102},
                           {"w": np.zeros(3, np.float32)}, ReplaySchedule(
                               from_first_participation=False, final=final,
                               warmup=warmup, correction=correction))
    assert shard.num_rounds == 4
    assert [k for k in range(1, 5) if shard.replay.is_exact(k)] == exact
    assert shard.replay_report()["exact_rounds_planned"] == len(exact)


def test_bad_recovery_settings_are_refused():
    with pytest.raises(ValueError, match="memory = 0 must be an int >= 1"):
        RecoveredShard(History(), 0, {1}, {}, {"w": np.zeros(3)},
                       ReplaySchedule(memory=0))


@pytest.mark.inprocess
def test_se_r_and_frec_recover_with_fewer_client_rounds(run_server, tmp_path):
    summary, grid = run_server({"forget-clients": "3", "num-rounds": 4,
                                "frameworks": "SE,SE-R,FRec,FR", "mia": False,
                                **RECOVERY_LEAN,
                                "method.se.replay-refill": False})  # round 1 asks no client
    frameworks = summary["frameworks"]
    assert set(frameworks) == {"SE", "SE-R", "FRec", "FR"}
    for name in ("SE-R", "FRec"):
        assert 0.0 <= frameworks[name]["accuracy"] <= 1.0 and \
            np.isfinite(frameworks[name]["loss"])
    # SE-R: client work only in its exact rounds, so less than SE's calibration
    assert frameworks["SE-R"]["client_epochs"] < frameworks["FR"]["client_epochs"]
    assert frameworks["FRec"]["client_epochs"] < frameworks["FR"]["client_epochs"]
    # rounds with client work (measured): FR all 4; FRec from round 1, whose round 1
    # and estimated round 3 run on the server (3 only if an estimate is abnormal)
    assert frameworks["FR"]["client_rounds"] == 4
    assert 2 <= frameworks["FRec"]["client_rounds"] <= 3
    assert 1 <= frameworks["SE"]["client_rounds"] <= frameworks["SE"]["rounds_replayed"] - 1
    for block in frameworks.values():
        assert block["client_rounds"] == sum(r["client_rounds"] for r in block["requests"])
    # the shards without the forgotten client stay bit for bit
    shards = summary["shards"]
    impacted = next(s for s, pids in enumerate(shards) if 3 in pids)
    run = tmp_path / "t"
    recovered = read_arrays(run / "models" / "SE-R.npz")
    learned = HistoryStore.open(run / "history" / "sharded")
    last = max(learned.rounds(0))
    for s in range(len(shards)):
        stored = learned.shard_model(s, last)
        same = all(recovered[f"shard{s}/{k}"].tobytes() == v.tobytes()
                   for k, v in stored.items())
        assert same == (s != impacted), s


def test_exact_rounds_message_the_retained_clients_only_as_in_learning():
    from flwr.app import ConfigRecord

    from strategies.sharded import to_record

    shard = RecoveredShard(History(), 0, {1}, {0: 100, 1: 101, 2: 102},
                           {"w": np.zeros(3, np.float32)}, ReplaySchedule(
                               from_first_participation=False, warmup=2, correction=0))
    arrays = to_record({"w": np.zeros(3, np.float32)})
    assert shard.configure_train(1, arrays, ConfigRecord({}), None) == []
    messages = shard.configure_train(2, arrays, ConfigRecord({"server-round": 9}), None)
    assert sorted(m.metadata.dst_node_id for m in messages) == [100, 102]
    assert {m.metadata.message_type for m in messages} == {"train"}
    # learning's seed: the stored round's number, not the server round's
    assert {m.content["config"]["server-round"] for m in messages} == {2}


def test_an_abnormal_estimate_asks_the_client_to_train_instead():
    """FedRecover's abnormality fixing: a wild Hessian model costs work, not the model."""
    from flwr.app import ConfigRecord

    from strategies.sharded import to_record

    shard = RecoveredShard(History(), 0, {1}, {0: 100, 1: 101, 2: 102},
                           {"w": np.zeros(3, np.float32)}, ReplaySchedule(
                               from_first_participation=False, warmup=0, correction=0,
                               threshold=0.5))
    moved = to_record({"w": np.ones(3, np.float32)})  # W' - W = (1, 1, 1)
    shard.replay._shared = [(np.ones(3), 0.01 * np.ones(3))]  # B = 0.01 I: small
    assert shard.configure_train(2, moved, ConfigRecord({}), None) == []
    shard.replay._shared = [(np.ones(3), 100 * np.ones(3))]  # B = 100 I: |U' - U| >> |U|
    asked = shard.configure_train(2, moved, ConfigRecord({}), None)
    assert sorted(m.metadata.dst_node_id for m in asked) == [100, 102]
    # without replies the round keeps the stored updates, never the wild estimate
    arrays, _ = shard.aggregate_train(2, [])
    stored = History().updates
    want = np.ones(3) + (10 * stored[(2, 0)]["w"] + 20 * stored[(2, 2)]["w"]) / 30
    np.testing.assert_allclose(arrays["w"].numpy(), want, rtol=1e-6)


def test_estimates_are_the_updates_the_round_used_without_training():
    """U' = U - B (W' - W) per retained client; none for a client asked to train."""
    from strategies.recovery_replay import RecoveryReplay

    replay = RecoveryReplay(History(), 0, {1}, {"w": np.zeros(3, np.float32)},
                            ReplaySchedule(from_first_participation=False, warmup=0,
                                           correction=0, threshold=0.5))
    replay._shared = [(np.ones(3), 0.01 * np.ones(3))]  # B = 0.01 I
    assert replay.begin(2, {"w": np.ones(3, np.float32)}) == []
    stored = History().updates
    got = replay.estimates
    assert sorted(got) == [0, 2]
    for pid in (0, 2):
        np.testing.assert_allclose(got[pid]["w"], stored[(2, pid)]["w"] - 0.01, rtol=1e-6)
    got[0]["w"][:] = 99  # a copy: the round's own estimate is unchanged
    assert replay.estimates[0]["w"][0] != 99
    replay._shared = [(np.ones(3), 100 * np.ones(3))]  # abnormal: both asked to train
    assert [p for p, _ in replay.begin(2, {"w": np.ones(3, np.float32)})] == [0, 2]
    assert replay.estimates == {}


class _LastAllForgotten(History):
    """Round 4 holds client 1 alone."""

    def participants(self, shard, rnd):
        return [(1, 10)] if rnd == 4 else super().participants(shard, rnd)


def test_a_skipped_last_round_moves_the_final_exact_round_back():
    """As SE's: the final round is the last that trains (a skipped one cannot be)."""
    shard = RecoveredShard(_LastAllForgotten(), 0, {1}, {0: 100, 1: 101, 2: 102},
                           {"w": np.zeros(3, np.float32)}, ReplaySchedule(
                               from_first_participation=False, warmup=0, correction=0,
                               final=1))
    assert [k for k in range(1, 5) if shard.replay.is_exact(k)] == [3]


def test_se_r_in_a_later_request_starts_before_every_forgotten_clients_first_round(
        run_server, tmp_path, shared_data):
    """Sequential requests: request 2 replays from where request 1's client first
    trained, so it must start from the stored model before that round too."""
    from conftest import TINY
    from flwr.app import ConfigRecord

    from server_app.config import RunConfig
    from server_app.rounds.federation import Federation
    from server_app.unlearning.frameworks import (
        Stage,
        build_framework,
        rebuild_shard_model,
    )
    from strategies.calibration import first_participation
    from strategies.sharded import to_record
    from task.config import fused_run_config

    summary, _ = run_server({"frameworks": "none", "num-rounds": 3})
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    shards = summary["shards"]
    pairs = [(s, a, b) for s, pids in enumerate(shards) for a in pids for b in pids
             if first_participation(store, s, {a}) == 1
             and (first_participation(store, s, {b}) or 0) > 1]
    assert pairs, "the seeded run has a client first trained in round 1 and a later one"
    s, early, late = pairs[0]
    cfg = RunConfig.from_run_config(fused_run_config(
        {**TINY, "num-rounds": 3, "data-dir": str(shared_data)}))
    federation = Federation({p: 1000 + p for p in range(8)}, shards)
    models = [to_record(store.shard_model(i, 3)) for i in range(len(shards))]
    stage = Stage(cfg, federation, federation, store,
                  None, models, models[0], ConfigRecord({}))
    framework = build_framework("SE-R", stage, {early, late}, batch=[late])
    start = rebuild_shard_model(store, s, 0)  # W^0: before the early client's round 1
    got = framework.initial[s].to_numpy_ndarrays()
    assert all(np.allclose(g, w) for g, w in zip(got, start.values(), strict=True))


def test_se_r_schedule_drops_warm_up_and_correction_with_stored_estimates():
    from server_app.config import RunConfig

    cfg = RunConfig.from_run_config({**TINY, "method.se-r.estimates": "stored"})
    frec = cfg.method_settings("FRec").schedule()
    assert frec == {"warmup": 2, "correction": 4, "final": 1, "memory": 2,
                    "threshold": 1.0}
    assert cfg.method_settings("SE-R").schedule() == {**frec, "warmup": 0,
                                                      "correction": 0}
    lbfgs = cfg.replace(**{"method.se-r.estimates": "lbfgs"})
    assert lbfgs.method_settings("SE-R").schedule() == frec


def test_a_bad_recovery_setting_is_refused_before_any_engine():
    with pytest.raises(ConfigError, match="'method.se-r.estimates' = 'adam'.*stored"):
        validate_run_config({**TINY, "method.se-r.estimates": "adam"})
    with pytest.raises(ConfigError, match="'method.frec.memory' = 0.*\\[1, 1000\\]"):
        validate_run_config({**TINY, "method.frec.memory": 0})
    with pytest.raises(ConfigError, match="'recovery-warmup' = 1.*renamed: set "
                       "method.se-r.warmup and method.frec.warmup"):
        validate_run_config({**TINY, "recovery-warmup": 1})


@pytest.mark.inprocess
def test_stored_estimates_change_se_r_and_leave_frec_fedrecover(run_server):
    """SE-R with ``method.se-r.estimates = stored`` asks clients only in its final
    exact round; FRec in the same run keeps FedRecover's warm-up (issue 42's schedule)."""
    settings = {"forget-clients": "3", "num-rounds": 4, "frameworks": "SE-R,FRec",
                "mia": False, **RECOVERY_LEAN, "method.se-r.refill": False}
    lean, _ = run_server({**settings, "method.se-r.estimates": "stored"}, run_name="lean")
    full, _ = run_server({**settings, "method.se-r.estimates": "lbfgs"}, run_name="full")
    # FRec is the same run either way: the key is SE-R's only
    assert lean["frameworks"]["FRec"]["accuracy"] == full["frameworks"]["FRec"]["accuracy"]
    assert lean["frameworks"]["FRec"]["client_rounds"] == \
        full["frameworks"]["FRec"]["client_rounds"] >= 2  # warm-up and final
    # SE-R: the warm-up round goes, the final exact one stays
    assert lean["frameworks"]["SE-R"]["client_rounds"] == 1
    assert full["frameworks"]["SE-R"]["client_rounds"] >= 2
