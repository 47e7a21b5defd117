"""Stock Flower strategies as shard aggregators: dtypes, defaults, warnings, learning."""

import inspect
import math
import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import strategy as flwr_strategies
from flwr.serverapp.strategy import FedAvg

from cli.report import render
from history.store import HistoryStore
from server_app.config import ConfigError, RunConfig
from server_app.config.training import SHARD_STRATEGIES
from server_app.rounds.federation import assign_shards
from server_app.rounds.learning import LearningStalledError
from strategies import ShardedStrategy, make_stock_strategy
from strategies.factory import SERVER_DEFAULTS, server_settings
from strategies.sharded import keep_dtypes, pack_shards, unpack_shards

FAST = {"frameworks": "none", "mia": False, "clients-per-round": 8}


def model(value=0.0, dtype=np.float32):
    return ArrayRecord({"w": Array(np.full((2, 3), value, dtype)),
                        "steps": Array(np.array([4], np.int64))})


def replies_to(messages, value):
    """One well-formed float32 training reply per message."""
    return [Message(RecordDict({"arrays": model(value),
                                "metrics": MetricRecord({"num-examples": 10})}),
                    reply_to=m) for m in messages]


class Float64Strategy(FedAvg):
    """Aggregates like FedAvg, then returns float64 arrays (as Flower's FedAdam)."""

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        return ArrayRecord({k: Array(v.numpy().astype(np.float64) + 0.5)
                            for k, v in arrays.items()}), metrics


def test_keep_dtypes_casts_back_and_rounds_integers():
    new = ArrayRecord({"w": Array(np.full((2, 3), 1.25, np.float64)),
                       "steps": Array(np.array([4.6]))})
    out = keep_dtypes(new, model())
    assert list(out) == ["w", "steps"]
    assert out["w"].numpy().dtype == np.float32 and out["w"].numpy()[0, 0] == 1.25
    assert out["steps"].numpy().dtype == np.int64 and out["steps"].numpy()[0] == 5
    same = model(2.0)
    assert keep_dtypes(same, model()) is same  # nothing to cast: no copy


def test_sharded_strategy_keeps_each_shard_models_dtypes(make_grid):
    grid = make_grid(4, {})
    sharded = ShardedStrategy([Float64Strategy(min_train_nodes=2, min_available_nodes=2,
                                               fraction_evaluate=0.0) for _ in range(2)],
                              [[1000, 1001], [1002, 1003]])
    messages = sharded.configure_train(1, pack_shards([model(), model()]),
                                       ConfigRecord(), grid)
    packed, _ = sharded.aggregate_train(1, replies_to(messages, 1.0))
    for shard in unpack_shards(packed, 2):
        assert shard["w"].numpy().dtype == np.float32
        assert shard["steps"].numpy().dtype == np.int64
        assert float(shard["w"].numpy()[0, 0]) == 1.5  # the strategy's values kept


@pytest.mark.parametrize("name", ["FedMedian", "FedTrimmedAvg"])
def test_strategies_that_pop_arrays_leave_the_replies_whole(make_grid, name):
    # Flower's FedMedian / FedTrimmedAvg pop every array out of the replies
    grid = make_grid(4, {})
    sharded = ShardedStrategy([make_stock_strategy(name, 2, 2) for _ in range(2)],
                              [[1000, 1001], [1002, 1003]])
    messages = sharded.configure_train(1, pack_shards([model(), model()]),
                                       ConfigRecord(), grid)
    replies = replies_to(messages, 3.0)
    packed, _ = sharded.aggregate_train(1, replies)
    assert all(list(r.content["arrays"]) == ["w", "steps"] for r in replies)
    assert all(float(s["w"].numpy()[0, 0]) == 3.0 for s in unpack_shards(packed, 2))


def flower_default(name, argument):
    cls = getattr(flwr_strategies, name)
    return inspect.signature(cls.__init__).parameters[argument].default


# Where our default is not Flower's, and why (docs/CONFIG.md: "Shard strategies").
DEVIATIONS = {
    ("FedAvgM", "server_momentum"): 0.9,  # Hsu et al. 2019; Flower's 0.0 = FedAvg
    ("FedAdagrad", "server_lr"): 0.01,  # Flower's 0.1 stays at chance on MNIST
}


@pytest.mark.parametrize("name", sorted(SERVER_DEFAULTS))
def test_server_defaults_are_flowers_except_the_documented_ones(name):
    strategy = make_stock_strategy(name, 2, 4)
    for option, value in SERVER_DEFAULTS[name].items():
        argument = {"server_lr": "eta", "server_momentum": "server_momentum"}[option]
        if name == "FedAvgM" and option == "server_lr":
            argument = "server_learning_rate"
        assert getattr(strategy, argument) == value
        assert value == DEVIATIONS.get((name, option), flower_default(name, argument))


def test_fedavgm_uses_server_momentum_by_default_and_overrides_apply():
    fedavgm = make_stock_strategy("FedAvgM", 2, 4)
    assert fedavgm.server_opt and fedavgm.server_momentum == 0.9
    assert fedavgm.server_learning_rate == 1.0
    tuned = make_stock_strategy("FedAvgM", 2, 4, server_lr=0.5, server_momentum=0.0)
    assert (tuned.server_learning_rate, tuned.server_momentum) == (0.5, 0.0)
    assert make_stock_strategy("FedAdam", 2, 4, server_lr=0.003).eta == 0.003
    assert server_settings("FedAvg") == {}
    with pytest.raises(ValueError, match="FedAvg, which has no such setting"):
        make_stock_strategy("FedAvg", 2, 4, server_lr=0.5)
    with pytest.raises(ValueError, match=r"server_momentum = 1\.0 .* \[0, 1\)"):
        make_stock_strategy("FedAvgM", 2, 4, server_momentum=1.0)


def test_run_config_sentinels_mean_the_strategys_own_defaults():
    cfg = RunConfig.from_run_config({"shard-strategy": "FedAvgM"})
    assert cfg.training.shard_strategy_options["server_lr"] is None
    assert cfg.training.shard_strategy_options["server_momentum"] is None
    cfg = RunConfig.from_run_config({"shard-strategy": "FedAvgM", "server-lr": 0.3,
                                     "server-momentum": 0.0})
    assert cfg.training.shard_strategy_options["server_lr"] == 0.3
    assert cfg.training.shard_strategy_options["server_momentum"] == 0.0


@pytest.mark.parametrize("overrides, key, words", [
    ({"server-lr": -0.1}, "server-lr", "0 (the shard strategy's own default) or a"),
    ({"server-lr": math.nan}, "server-lr", "a finite number"),
    ({"server-lr": math.inf}, "server-lr", "a finite number"),
    ({"server-momentum": 1.0, "shard-strategy": "FedAvgM"}, "server-momentum",
     "-1 (the shard strategy's own default) or a number in [0, 1)"),
    ({"server-momentum": -0.5, "shard-strategy": "FedAvgM"}, "server-momentum",
     "[0, 1)"),
    ({"server-momentum": math.nan, "shard-strategy": "FedAvgM"}, "server-momentum",
     "a finite number"),
    ({"server-lr": 0.5}, "server-lr", "shard-strategy FedAvg, which has no such"),
    ({"server-momentum": 0.5, "shard-strategy": "FedAdam"}, "server-momentum",
     "applies to FedAvgM"),
])
def test_bad_server_settings_name_key_value_and_allowed(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config(overrides)
    message = str(err.value)
    assert f"'{key}'" in message and repr(overrides[key]) in message
    assert words in message and "\n" not in message


@pytest.mark.parametrize("name", SHARD_STRATEGIES)
def test_every_shard_strategy_learns(run_server, tmp_path, name):
    summary, _ = run_server({**FAST, "num-rounds": 3, "shard-strategy": name})
    rounds = summary["learning"]["rounds"]
    accuracy = [r["accuracy"] for r in rounds]
    assert [r["participants"] for r in rounds] == [8, 8, 8], accuracy
    assert accuracy[2] >= accuracy[0] + 0.1 and accuracy[2] > 0.45, accuracy
    assert summary["warnings"] == [] and summary["faults"]["counts"] == {}
    assert summary["shard_strategy"] == {"name": name, **SERVER_DEFAULTS.get(name, {})}
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    for s in range(2):
        assert {v.dtype for v in store.shard_model(s, 3).values()} == {np.dtype("float32")}


def reject_all(reply):
    """A hostile client: answers in float64 (screening rejects the reply)."""
    arrays = ArrayRecord({k: Array(v.numpy().astype(np.float64))
                          for k, v in reply.content["arrays"].items()})
    sent = Message(RecordDict(), dst_node_id=reply.metadata.src_node_id,
                   message_type=reply.metadata.message_type)
    return Message(RecordDict({"arrays": arrays, "metrics": reply.content["metrics"]}),
                   reply_to=sent)


def test_a_shard_without_accepted_replies_is_a_warning(run_server):
    shard0 = assign_shards(8, 2, 0)[0]
    summary, _ = run_server({**FAST, "num-rounds": 2},
                            tamper={1000 + p: reject_all for p in shard0})
    rounds = summary["learning"]["rounds"]
    assert [r["participants"] for r in rounds] == [4, 4]
    for rnd, entry in enumerate(rounds, 1):
        assert entry["warnings"] == [f"sharded round {rnd}: shard 0 accepted no reply "
                                     "(4 asked: 4 rejected, 0 without answer); no "
                                     "client update of the shard was aggregated"]
    never = "sharded: shard 0's model never changed in 2 round(s); it is the initial model"
    assert summary["learning"]["warnings"][-1] == never
    assert summary["warnings"] == summary["learning"]["warnings"]
    assert len(summary["warnings"]) == 3
    assert "WARNINGS (3):" in render(summary) and never in render(summary)


def test_learning_that_moves_no_model_fails(run_server, tmp_path):
    with pytest.raises(LearningStalledError,
                       match=r"moved no shard model in 2 round\(s\): no client reply "
                             r"was accepted \(16 rejected, 0 without answer; first"):
        run_server({**FAST, "num-rounds": 2},
                   tamper={1000 + p: reject_all for p in range(8)})
    assert not (tmp_path / "t" / "summary.json").exists()


def test_unlearning_rounds_without_accepted_replies_are_warnings(run_server):
    # every client trains every round, so each calibration round asks the shard's 3
    # retained clients: lose round 2's replies, keep round 3's (an unlearning request
    # that accepts no reply at all fails the run: test_faults.py)
    lost = {"n": 0}

    def lose_unlearning(reply):
        if reply.metadata.message_type == "train.unlearn" and lost["n"] < 3:
            lost["n"] += 1
            return None
        return reply

    summary, _ = run_server({**FAST, "frameworks": "SE", "forget-clients": "3",
                             "num-rounds": 3},
                            tamper={1000 + p: lose_unlearning for p in range(8)})
    shard = next(s for s, pids in enumerate(summary["shards"]) if 3 in pids)
    se = summary["frameworks"]["SE"]
    # round 1 prepares from storage (no message); calibration rounds ask clients
    assert se["warnings"] and all(
        re.fullmatch(rf"SE request 0 round \d: shard {shard} accepted no reply \((\d) "
                     r"asked: 0 rejected, \1 without answer\); no client update of "
                     r"the shard was aggregated", w) for w in se["warnings"])
    assert se["requests"][0]["warnings"] == se["warnings"]
    assert summary["warnings"] == se["warnings"]


def test_a_stage_whose_accepted_updates_change_nothing_says_so():
    """A learning rate too small for float32 (``lr = 1e-300``): replies were accepted,
    so the error must not say none was (found by a hostile review)."""
    from server_app.rounds.learning import stalled_message
    from server_app.rounds.screening import FaultLog

    line = stalled_message("sharded", 2, FaultLog(), accepted=16)
    assert "the 16 accepted client updates left every model as it was" in line
    assert "no client reply was accepted" not in line
    assert "no client reply was accepted (0 rejected" in stalled_message(
        "sharded", 2, FaultLog())
