import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from strategies import IsolationError, ShardedStrategy, make_stock_strategy
from strategies.sharded import ShardGrid, pack_shards, unpack_shards


def record(value):
    return ArrayRecord({"w": Array(np.full((2, 2), value, np.float32)),
                        "b": Array(np.full((3,), value, np.float32))})


def test_pack_unpack_round_trip():
    packed = pack_shards([record(1.0), record(2.0)])
    assert sorted(packed) == ["shard0/b", "shard0/w", "shard1/b", "shard1/w"]
    a, b = unpack_shards(packed, 2)
    assert float(b["w"].numpy()[0, 0]) == 2.0 and list(a) == ["w", "b"]
    with pytest.raises(IsolationError):
        unpack_shards(packed, 1)


def test_shard_grid_refuses_other_shards(make_grid):
    grid = make_grid(4, {})
    view = ShardGrid(grid, 0, [1000, 1001])
    assert view.get_node_ids() == [1000, 1001]
    message = Message(RecordDict(), dst_node_id=1002, message_type="query.discover")
    with pytest.raises(IsolationError, match="node 1002"):
        view.send_and_receive([message])
    assert grid.sent == []


class Rogue(FedAvg):
    """A strategy that tries to message a node outside its shard."""

    def configure_train(self, server_round, arrays, config, grid):
        return [Message(RecordDict({"arrays": arrays, "config": config}),
                        dst_node_id=1003, message_type="train")]


def test_strategy_addressing_another_shard_is_stopped(make_grid):
    grid = make_grid(4, {})
    sharded = ShardedStrategy([Rogue(), FedAvg()], [[1000, 1001], [1002, 1003]])
    with pytest.raises(IsolationError, match="outside its shard"):
        sharded.configure_train(1, pack_shards([record(0), record(0)]), ConfigRecord(),
                                grid)


def test_each_shard_trains_only_its_nodes_and_leaves_others_bit_identical(
        make_grid, shared_data):
    config = {"dataset": "mnist", "num-clients": 6, "client-samples": 32,
              "data-dir": str(shared_data)}
    grid = make_grid(6, config)
    shards = [[1000, 1001, 1002], [1003, 1004, 1005]]
    strategies = [make_stock_strategy("FedAvg", 2, 3) for _ in shards]
    sharded = ShardedStrategy(strategies, shards, seed=0)
    import torch

    from task.builtin import build_model
    torch.manual_seed(0)
    w0 = ArrayRecord(build_model("mnist", 10).state_dict())
    torch.manual_seed(1)
    w1 = ArrayRecord(build_model("mnist", 10).state_dict())
    train_config = ConfigRecord({"lr": 0.1, "local-epochs": 1, "batch-size": 16})
    messages = sharded.configure_train(1, pack_shards([w0, w1]), train_config, grid)
    per_shard = [[m for m in messages if m.metadata.dst_node_id in s] for s in shards]
    assert len(per_shard[0]) == 2 and len(per_shard[1]) == 2
    # each shard's message carries its own model
    for s, model in enumerate([w0, w1]):
        for m in per_shard[s]:
            assert (m.content["arrays"]["conv1.weight"].numpy().tobytes()
                    == model["conv1.weight"].numpy().tobytes())
    # deliver shard 0's replies only: shard 1 must keep its model bit for bit
    replies = grid.send_and_receive(per_shard[0])
    assert {dst for dst, _ in grid.sent} <= set(shards[0])
    new, _ = sharded.aggregate_train(1, replies)
    new0, new1 = unpack_shards(new, 2)
    for key in w1:
        assert new1[key].numpy().tobytes() == w1[key].numpy().tobytes()
    assert any(new0[k].numpy().tobytes() != w0[k].numpy().tobytes() for k in w0)


def test_reply_from_unknown_node_is_rejected():
    sharded = ShardedStrategy([FedAvg(), FedAvg()], [[1], [2]])

    sent = Message(RecordDict(), dst_node_id=7, message_type="train")
    reply = Message(RecordDict(), reply_to=sent)  # src is node 7
    with pytest.raises(IsolationError, match="in no shard"):
        sharded.route_replies([reply])


def test_shared_instances_and_overlaps_are_refused():
    strategy = FedAvg()
    with pytest.raises(ValueError, match="own strategy instance"):
        ShardedStrategy([strategy, strategy], [[1], [2]])
    with pytest.raises(ValueError, match="in shards 0 and 1"):
        ShardedStrategy([FedAvg(), FedAvg()], [[1], [1]])


@pytest.mark.parametrize("name", ["FedAvg", "FedProx", "FedAdam", "FedMedian"])
def test_stock_strategies_by_name(name):
    strategy = make_stock_strategy(name, 5, 25)
    assert type(strategy).__name__ == name
    assert strategy.min_train_nodes == 5
    with pytest.raises(ValueError, match="not a Flower strategy"):
        make_stock_strategy("Nope", 5, 25)


def test_in_process_grid_push_and_pull(make_grid, shared_data):
    grid = make_grid(2, {"data-dir": str(shared_data)})
    message = Message(RecordDict(), dst_node_id=1001, message_type="query.discover")
    ids = list(grid.push_messages([message]))
    replies = list(grid.pull_messages(ids))
    assert [int(r.content["info"]["partition-id"]) for r in replies] == [1]
    assert list(grid.pull_messages(ids)) == []  # each reply is pulled once


class _NodeList:
    """The one Grid verb the stock strategies' sampling needs."""

    def __init__(self, node_ids):
        self.node_ids = list(node_ids)

    def get_node_ids(self):
        return list(self.node_ids)


@pytest.fixture
def flower_lines():
    """Flower's log records (level, text) while the test runs."""
    import logging

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append((record.levelno, record.getMessage()))

    lines: list[tuple[int, str]] = []
    handler, logger = Keep(logging.DEBUG), logging.getLogger("flwr")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def _one_round(sharded, shards):
    """configure_train, one reply per message, aggregate_train; the packed model."""
    from flwr.app import MetricRecord

    models = pack_shards([record(float(s)) for s in range(len(shards))])
    sent = sharded.configure_train(1, models, ConfigRecord(), _NodeList(sum(shards, [])))
    replies = [Message(RecordDict({"arrays": m.content["arrays"], "metrics":
                                   MetricRecord({"num-examples": 1})}), reply_to=m)
               for m in sent]
    new, _ = sharded.aggregate_train(1, replies)
    return new


@pytest.mark.parametrize("verbose", [None, "0", "1"])
def test_flower_per_shard_lines_quiet_by_default_and_named_when_verbose(
        verbose, flower_lines, monkeypatch):
    import logging

    if verbose is None:
        monkeypatch.delenv("SE_VERBOSE", raising=False)
    else:
        monkeypatch.setenv("SE_VERBOSE", verbose)
    shards = [[1000, 1001, 1002], [1003, 1004, 1005]]
    sharded = ShardedStrategy([make_stock_strategy("FedAvg", 2, 3) for _ in shards],
                              shards)
    new = _one_round(sharded, shards)
    assert sorted(unpack_shards(new, 2)[1]) == ["b", "w"]  # it still learned
    flower = [text for level, text in flower_lines
              if level == logging.INFO and re.search(r"(configure|aggregate)_train:", text)]
    if verbose != "1":
        assert flower == []
    else:  # Flower's own lines back, each naming its shard
        assert flower == ["shard 0: configure_train: Sampled 2 nodes (out of 3)",
                          "shard 1: configure_train: Sampled 2 nodes (out of 3)",
                          "shard 0: aggregate_train: Received 2 results and 0 failures",
                          "shard 1: aggregate_train: Received 2 results and 0 failures"]
    # the filter is gone after each call: Flower's lines outside a shard pass as they are
    logging.getLogger("flwr").info("configure_train: outside")
    assert flower_lines[-1] == (logging.INFO, "configure_train: outside")
