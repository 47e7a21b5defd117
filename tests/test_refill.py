"""SE's ``method.se.replay-refill``: forgotten participants' slots go to retained
shard members (SE-R's ``method.se-r.refill`` the same)."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from server_app.config import ConfigError
from strategies.calibration import refill_slots
from strategies.sharded import to_record
from strategies.unlearning import CalibratedRetraining, ReplaySchedule


def test_refill_takes_one_retained_outsider_per_forgotten_participant():
    got = refill_slots([0, 1, 2], range(10), {1, 5}, (0, 0, 1))
    assert len(got) == 1 and got[0] not in {0, 1, 2, 5} and 0 <= got[0] < 10
    assert refill_slots([0, 1, 2], range(10), {1, 5}, (0, 0, 1)) == got  # seeded
    assert refill_slots([0, 2], range(10), {1, 5}, (0, 0, 1)) == []  # none forgotten
    assert refill_slots([0, 1, 2], [0, 1, 2, 3], {1, 2}, (0, 0, 1)) == [3]  # pool of 1


def test_refill_draws_differ_between_rounds():
    draws = {tuple(refill_slots([0, 1], range(40), {1}, (0, 0, g))) for g in range(20)}
    assert len(draws) > 5


@settings(max_examples=200, deadline=None)
@given(members=st.sets(st.integers(0, 30), min_size=1, max_size=20),
       data=st.data())
def test_refill_never_picks_a_forgotten_client_or_a_participant(members, data):
    participants = data.draw(st.sets(st.sampled_from(sorted(members))))
    forget = data.draw(st.sets(st.integers(0, 30)))
    got = refill_slots(participants, members, forget, (3, 1, 2))
    pool = members - forget - participants
    assert set(got) <= pool and len(set(got)) == len(got)
    assert len(got) == min(len(participants & forget), len(pool))


class _Rounds:
    """Two stored rounds of one shard: (0, 10), (1, 10), (2, 20) trained in each."""

    def rounds(self, shard):
        return [1, 2]

    def participants(self, shard, rnd):
        return [(0, 10), (1, 10), (2, 20)]

    def update(self, shard, rnd, pid):
        return {"w": np.full(3, 1 + pid, np.float32)}


NODES = {p: 100 + p for p in range(5)}


def _reply(message, value, examples):
    metrics = {} if examples is None else {"num-examples": examples}
    content = RecordDict({"arrays": to_record({"w": np.full(3, value, np.float32)}),
                          "metrics": MetricRecord(metrics)})
    return Message(content, reply_to=message)


def _strategy(members=(0, 1, 2, 3, 4), forget=(1,)):
    schedule = ReplaySchedule(from_first_participation=False, final=0, exact_epochs=2.0,
                              refill=members is not None, refill_seed=7)
    return CalibratedRetraining(_Rounds(), 0, set(forget), NODES, 1.0, schedule,
                                members=members or ())


def test_round_one_asks_only_the_substitute_and_weights_it_by_its_examples():
    strategy = _strategy()
    sub = strategy.substitutes[1]
    assert len(sub) == 1 and sub[0] in (3, 4)
    base = to_record({"w": np.zeros(3, np.float32)})
    sent = strategy.configure_train(1, base, ConfigRecord({}), None)
    assert [m.metadata.dst_node_id for m in sent] == [NODES[sub[0]]]
    assert sent[0].content["config"]["local-epochs"] == 2.0  # L, not L / r
    arrays, metrics = strategy.aggregate_train(1, [_reply(sent[0], 5.0, 30)])
    # eq. 2 for the retained 0 (U = 1, n = 10) and 2 (U = 3, n = 20), plus the
    # substitute's own update 5 with its 30 examples
    want = (10 * 1 + 20 * 3 + 30 * 5) / 60
    np.testing.assert_allclose(arrays["w"].numpy(), want, rtol=1e-6)
    assert metrics["clients"] == 3


def test_later_round_calibrates_the_retained_but_not_the_substitute():
    strategy = _strategy()
    base = to_record({"w": np.zeros(3, np.float32)})
    sent = strategy.configure_train(2, base, ConfigRecord({}), None)
    epochs = {m.metadata.dst_node_id - 100: m.content["config"]["local-epochs"]
              for m in sent}
    sub = strategy.substitutes[2][0]
    assert epochs == {0: 1.0, 2: 1.0, sub: 2.0}
    assert NODES[1] not in {m.metadata.dst_node_id for m in sent}
    replies = [_reply(m, 1.0, 30) for m in sent]
    arrays, _ = strategy.aggregate_train(2, replies)
    # retained: direction 1 rescaled to the stored norm (1 + pid) per element
    want = (10 * 1 + 20 * 3 + 30 * 1) / 60
    np.testing.assert_allclose(arrays["w"].numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("examples", [None, 0, -5, 2.5, 1e300, float("inf"),
                                      float("nan")])
def test_a_substitute_without_a_positive_example_count_is_dropped(examples):
    strategy = _strategy()
    base = to_record({"w": np.zeros(3, np.float32)})
    sent = strategy.configure_train(1, base, ConfigRecord({}), None)
    arrays, _ = strategy.aggregate_train(1, [_reply(sent[0], 5.0, examples)])
    np.testing.assert_allclose(arrays["w"].numpy(), (10 * 1 + 20 * 3) / 30, rtol=1e-6)


def test_a_round_of_forgotten_participants_is_refilled_not_skipped():
    strategy = _strategy(forget=(0, 1, 2))
    assert sorted(strategy.substitutes[2]) == [3, 4]
    sent = strategy.configure_train(2, to_record({"w": np.zeros(3, np.float32)}),
                                    ConfigRecord({}), None)
    assert sorted(m.metadata.dst_node_id for m in sent) == [103, 104]
    assert strategy.skipped_rounds == []
    assert strategy.replay_report()["refilled_slots"] == 4


def test_without_members_the_replay_is_the_papers():
    strategy = _strategy(members=None)
    assert strategy.substitutes == {}
    assert strategy.replay_report()["refilled_slots"] == 0
    sent = strategy.configure_train(1, to_record({"w": np.zeros(3, np.float32)}),
                                    ConfigRecord({}), None)
    assert sent == []


def test_bad_replay_refill_is_refused_before_any_engine():
    from conftest import TINY

    from server_app.preflight import validate_run_config

    with pytest.raises(ConfigError, match="'method.se.replay-refill'"):
        validate_run_config({**TINY, "method.se.replay-refill": 2}, files=False)


def test_se_run_with_refill_trains_substitutes_and_never_the_forgotten(run_server):
    plain, _ = run_server({"forget-clients": "3", "num-rounds": 2, "frameworks": "SE",
                           "method.se.replay-refill": False}, run_name="plain")
    summary, grid = run_server({"forget-clients": "3", "num-rounds": 2,
                                "frameworks": "SE"})  # the default refills
    se, before = summary["frameworks"]["SE"], plain["frameworks"]["SE"]
    refilled = se["replay"]["refilled_slots"]
    assert refilled >= 1 and plain["frameworks"]["SE"]["replay"]["refilled_slots"] == 0
    # each substitute trains L = 1 epoch on top of the paper's replay
    assert se["client_epochs"] == pytest.approx(before["client_epochs"] + refilled)
    unlearn_dsts = [dst for dst, kind in grid.sent if kind == "train.unlearn"]
    assert 1003 not in unlearn_dsts
    assert np.isfinite(se["accuracy"])


def _recovery(members=(0, 1, 2, 3, 4)):
    from strategies.recovery import RecoveredShard

    schedule = ReplaySchedule(warmup=0, correction=0, final=0,
                              from_first_participation=False,
                              refill=members is not None, refill_seed=7)
    return RecoveredShard(_Rounds(), 0, {1}, NODES, {"w": np.zeros(3, np.float32)},
                          schedule, members=members or ())


def test_se_r_substitute_trains_in_every_round_and_adds_no_lbfgs_pair():
    shard = _recovery()
    replay = shard.replay
    base = to_record({"w": np.zeros(3, np.float32)})
    for k in (1, 2):
        sent = shard.configure_train(k, base, ConfigRecord({}), None)
        (sub,) = replay.substitutes[k]
        # every round is estimated (no warm-up, correction or final): only the
        # substitute trains, with the learning round's seed
        assert [m.metadata.dst_node_id for m in sent] == [NODES[sub]]
        assert sent[0].content["config"]["server-round"] == k
        arrays, _ = shard.aggregate_train(k, [_reply(sent[0], 5.0, 30)])
        assert replay._shared == []  # no pair from a substitute
        base = arrays
    # round 1: W' = W, so U' = U for 0 (1, n = 10) and 2 (3, n = 20), plus the
    # substitute's 5 - 0 with its 30 examples; round 2: the estimates are the
    # stored U again (no pair to estimate with), the substitute's is 5 - W'^1
    first = (10 * 1 + 20 * 3 + 30 * 5) / 60
    want = first + (10 * 1 + 20 * 3 + 30 * (5 - first)) / 60
    np.testing.assert_allclose(base["w"].numpy(), want, rtol=1e-6)
    assert shard.replay_report()["refilled_slots"] == 2


def test_se_r_substitute_without_a_sample_count_is_left_out():
    shard = _recovery()
    base = to_record({"w": np.zeros(3, np.float32)})
    sent = shard.configure_train(1, base, ConfigRecord({}), None)
    arrays, _ = shard.aggregate_train(1, [_reply(sent[0], 5.0, None)])
    np.testing.assert_allclose(arrays["w"].numpy(), (10 * 1 + 20 * 3) / 30, rtol=1e-6)


def test_se_r_run_with_refill_trains_substitutes_frec_keeps_its_rule(run_server):
    summary, _ = run_server({"forget-clients": "3", "num-rounds": 2,
                             "frameworks": "SE-R,FRec", "method.se-r.refill": True})
    se_r, frec = summary["frameworks"]["SE-R"], summary["frameworks"]["FRec"]

    def refilled(framework):
        return sum(shard["refilled_slots"] for request in framework["requests"]
                   for shard in request["replay"]["shards"].values())

    assert refilled(se_r) >= 1
    assert refilled(frec) == 0  # FedRecover's published rule
    assert np.isfinite(se_r["accuracy"])


def test_staged_refill_draws_only_clients_present_in_the_rounds_stage():
    """``present``: round 1's stage has clients 0-2 only, round 2's also 3 and 4."""
    from strategies.calibration import refill_pool

    def present(rnd):
        return {0, 1, 2} if rnd == 1 else {0, 1, 3, 4}

    pool = refill_pool([0, 1, 2, 3, 4], present)
    assert pool(1) == [0, 1, 2] and pool(2) == [0, 1, 3, 4]
    assert refill_pool([0, 1], None) == [0, 1]
    strategy = CalibratedRetraining(_Rounds(), 0, {1}, NODES, 1.0, ReplaySchedule(
        from_first_participation=False, refill=True, refill_seed=7, present=present),
        members=[0, 1, 2, 3, 4])
    assert strategy.substitutes[1] == []  # nobody present sat round 1 out
    assert strategy.substitutes[2][0] in (3, 4)


def test_staged_run_present_at_maps_rounds_to_their_stage():
    from types import SimpleNamespace

    from server_app.stages.churn import Membership
    from server_app.stages.state import RunState

    run = SimpleNamespace(ctx=SimpleNamespace(cfg=SimpleNamespace(
        training=SimpleNamespace(num_rounds=3))),
        members=[Membership(1, [0, 1]), Membership(2, [0, 2])])
    at = RunState.present_at.__get__(run)
    assert [at(r) for r in (1, 3, 4, 6, 7)] == [{0, 1}, {0, 1}, {0, 2}, {0, 2}, set()]


def test_paper_preset_keeps_the_papers_replay_and_the_default_refills():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    paper = tomllib.loads((root / "presets" / "paper.toml").read_text())
    assert paper["method"]["se"]["replay-refill"] is False
    assert paper["method"]["se-r"]["refill"] is False
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["flwr"][
        "app"]["config"]["method"]
    assert config["se"]["replay-refill"] is True and config["se-r"]["refill"] is True


def test_fe_keeps_federasers_rule_whatever_the_refill_keys(run_server):
    runs = [run_server({"forget-clients": "3", "num-rounds": 2, "frameworks": "FE",
                        "method.se.replay-refill": on, "method.se-r.refill": on},
                       run_name=f"fe{on}")[0]
            for on in (False, True)]
    off, on = (r["frameworks"]["FE"] for r in runs)
    # a refilled FE would train substitutes: more client-epochs, another model
    assert (on["accuracy"], on["loss"], on["client_epochs"]) == (
        off["accuracy"], off["loss"], off["client_epochs"])


# ---- a client drawn into an earlier retraining is forgotten from that shard ------------
class _Learned(_Rounds):
    """Shard 0 = clients 0-4 and shard 1 = clients 5-9; in learning clients 0-2 and 5-7
    trained in both rounds, 3, 4, 8 and 9 never did."""

    def participants(self, shard, rnd):
        return [(p + 5 * shard, 10) for p in (0, 1, 2)]

    def shard_model(self, shard, rnd):
        return {"w": np.zeros(3, np.float32)}


def _series_stage(refill: bool = True):
    from flwr.app import ConfigRecord

    from server_app.config import RunConfig
    from server_app.rounds.federation import Federation
    from server_app.unlearning.frameworks import Stage
    from strategies.sharded import to_record
    from task.config import fused_run_config
    from tests.conftest import TINY

    cfg = RunConfig.from_run_config(fused_run_config({
        **TINY, "num-clients": 10, "num-shards": 2, "clients-per-round": 6,
        "num-rounds": 2, "method.se.replay-refill": refill,
        "method.se-r.refill": refill}))
    federation = Federation({p: 100 + p for p in range(10)},
                            [list(range(5)), list(range(5, 10))])
    models = [to_record(_Learned().shard_model(s, 2)) for s in (0, 1)]
    return Stage(cfg, federation, federation, _Learned(), None, models, models[0],
                 ConfigRecord({}))


@pytest.mark.parametrize("name, redrawn", [
    ("SE", True), ("SE-R", True), ("SISA", True),  # slots refilled / clients resampled
    ("SE", False), ("SE-R", False),  # the paper's replay: only the stored participants
])
def test_a_client_an_earlier_request_drew_into_a_shard_is_forgotten_there(name, redrawn):
    """Found by a hostile review: request 1 forgets client 0 and SE's replay of shard 0
    gives its slots to clients that never trained (3 or 4); a later request for such a
    client kept shard 0 as it was, still holding what that client taught it."""
    from server_app.unlearning.frameworks import build_framework

    stage = _series_stage(refill=redrawn)
    first = build_framework(name, stage, {0}, batch=[0])
    assert first.impacted == [0]
    if name == "SE" and redrawn:  # the slots of client 0 went to 3 or 4
        replay = first.strategy.shard_strategies[0]
        drawn = {p for r in replay.plan for p in replay.substitutes.get(r, ())}
        assert drawn and drawn <= {3, 4}, replay.substitutes
    later = build_framework(name, stage, {0, 4}, batch=[4])
    assert later.impacted == ([0] if redrawn or name == "SISA" else [])
    untouched = build_framework(name, stage, {0, 9}, batch=[9])  # shard 1: never redone
    assert untouched.impacted == []
