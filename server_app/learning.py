"""The learning stage: G rounds of a (sharded) strategy, recording the history.

Each round the strategy configures its messages, the grid delivers them, the
strategy aggregates the replies, and every participant's update
U_m^g = w_m^g - W_s^(g-1) plus the new shard model W_s^g go to the history store
(paper Sec. 3.2: the server keeps the intermediate parameters). The store is a
recorder: :class:`server_app.history.HistoryStore` writes every blob, while
:class:`server_app.coded_history.CodedRecorder` (``storage = "coded"``) codes each
round into client slices at ``end_round`` and keeps only metadata.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from server_app.federation import Federation
from server_app.history import HistoryStore

if TYPE_CHECKING:
    from server_app.coded_history import CodedRecorder
from server_app.screening import MAX_TRAIN_SECONDS, FaultLog, ReplyLimits, screen
from strategies.sharded import ShardedStrategy, pack_shards, to_numpy, unpack_shards


@dataclass
class LearningResult:
    """The outcome of a learning stage.

    Attributes
    ----------
    models : list[ArrayRecord]
        Final model of each shard.
    rounds : list[dict]
        Per round: ``round``, ``seconds`` (wall), ``compute_s`` (sum of clients'
        training seconds), ``accuracy``, ``loss`` (ensemble), participants.
    wall_time_s : float
        Wall seconds of the whole stage.
    compute_s : float
        Sum of all clients' training seconds.
    client_epochs : float
        Sum over participants of local epochs performed.
    """

    models: list[ArrayRecord]
    rounds: list[dict] = field(default_factory=list)
    wall_time_s: float = 0.0
    compute_s: float = 0.0
    client_epochs: float = 0.0


def record_round(store: HistoryStore, strategy: ShardedStrategy, federation: Federation,
                 rnd: int, previous: list[ArrayRecord], new: list[ArrayRecord],
                 replies) -> tuple[float, float, int]:
    """Store round ``rnd``'s participant updates and shard models.

    Returns
    -------
    (compute_s, client_epochs, participants) : tuple[float, float, int]
    """
    partition_of = federation.partition_of
    compute, epochs, count = 0.0, 0.0, 0
    for s, shard_replies in enumerate(strategy.route_replies(replies)):
        before = to_numpy(previous[s])
        for reply in shard_replies:
            if reply.has_error():
                continue
            metrics = reply.content["metrics"]
            model = to_numpy(reply.content["arrays"])
            update = {k: model[k] - before[k] for k in before}
            store.put_update(s, rnd, partition_of[reply.metadata.src_node_id], update,
                             int(metrics["num-examples"]),
                             float(metrics["train-seconds"]))
            compute += float(metrics["train-seconds"])
            epochs += float(metrics.get("local-epochs", 0.0))
            count += 1
        store.put_shard_model(s, rnd, to_numpy(new[s]))
    return compute, epochs, count


def run_learning(
    grid: Grid,
    strategy: ShardedStrategy,
    federation: Federation,
    initial: list[ArrayRecord],
    num_rounds: int,
    train_config: ConfigRecord,
    store: HistoryStore | CodedRecorder,
    evaluate: Callable[[list[ArrayRecord]], dict] | None = None,
    timeout: float | None = None,
    label: str = "learn",
    faults: FaultLog | None = None,
) -> LearningResult:
    """Run ``num_rounds`` rounds of ``strategy`` and record the history.

    Parameters
    ----------
    grid : Grid
        Flower grid (or a test double).
    strategy : ShardedStrategy
        One aggregator per shard of ``federation``.
    federation : Federation
        Node ids and shards.
    initial : list[ArrayRecord]
        W_s^0 of each shard (stored as round 0).
    num_rounds : int
        G.
    train_config : ConfigRecord
        Sent with every training message (lr, local-epochs, batch-size ...).
    store : HistoryStore or CodedRecorder
        Receives W^0, the updates and the shard models, then ``end_round(rnd,
        grid)`` after each round (round 0: W^0); not marked complete here.
    evaluate : callable, optional
        Called with the shard models after each round; its ``accuracy`` and
        ``loss`` are logged.
    timeout : float, optional
        Seconds to wait for a round's replies.
    label : str
        Prefix of the progress lines.
    faults : FaultLog, optional
        Receives rejected replies and dropouts (they are left out of aggregation).
        Replies are screened (:func:`server_app.screening.screen`) against the
        model and config sent, ``federation.samples``, ``timeout`` and the
        store's ``max_update`` (coded storage's quantisation range), if any.
    """
    faults = faults if faults is not None else FaultLog()
    limits = ReplyLimits(federation.samples, timeout or MAX_TRAIN_SECONDS,
                         getattr(store, "max_update", None))
    t_start = time.perf_counter()
    models = list(initial)
    for s, arrays in enumerate(models):
        store.put_shard_model(s, 0, to_numpy(arrays))
    store.end_round(0, grid)
    result = LearningResult(models=models)
    for rnd in range(1, num_rounds + 1):
        t0 = time.perf_counter()
        packed = pack_shards(models)
        config = ConfigRecord(dict(train_config))
        messages = strategy.configure_train(rnd, packed, config, grid)
        before = len(faults.entries)
        replies = screen(grid.send_and_receive(messages, timeout=timeout), messages,
                         label, rnd, faults, federation.partition_of, limits)
        for fault in faults.entries[before:]:
            log(WARNING, "%s round %d: partition %s (node %d) %s: %s", label, rnd,
                fault["partition"], fault["node"], fault["kind"], fault["reason"])
        aggregated, _ = strategy.aggregate_train(rnd, replies)
        new = unpack_shards(aggregated, strategy.num_shards)
        compute, epochs, count = record_round(store, strategy, federation, rnd,
                                              models, new, replies)
        store.end_round(rnd, grid)
        models = new
        entry = {"round": rnd, "participants": count, "compute_s": compute,
                 "client_epochs": epochs}
        if evaluate is not None:
            entry.update(evaluate(models))
        entry["seconds"] = time.perf_counter() - t0
        result.rounds.append(entry)
        result.compute_s += compute
        result.client_epochs += epochs
        log(INFO, "%s round %d/%d: accuracy %s, loss %s, %d clients, %.1f s", label,
                 rnd, num_rounds, _fmt(entry.get("accuracy")), _fmt(entry.get("loss")),
                 count, entry["seconds"])
    result.models = models
    result.wall_time_s = time.perf_counter() - t_start
    return result


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"
