"""Server-side recovery as Flower strategies: FedRecover, and SE-R inside a shard.

The algorithm (FedRecover, Cao et al., IEEE S&P 2023: the server estimates most
retained clients' updates from the stored history with an L-BFGS Hessian model,
and clients train only in exact rounds) is
:class:`strategies.recovery_replay.RecoveryReplay`, re-exported here. An exact
round sends ordinary ``train`` messages with the learning round's number, so a
client trains with the seed (data order) it had in that round of learning: were
W' = W, it would send back U exactly.

:class:`RecoveredShard` runs it as a Flower strategy; :class:`ShardRecovery` (SE-R)
does so for the impacted shards of Sharding Eraser's federation and freezes the
others bit for bit; :class:`FedRecover` (FRec) is the one-shard, unsharded baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.calibration import difference
from strategies.recovery_replay import RecoveryReplay
from strategies.replay import (
    FrozenShard,
    HistoryReader,
    ReplaySchedule,
    reported_examples,
)
from strategies.sharded import to_numpy, to_record
from strategies.unlearning import ImpactedShards

__all__ = ["FedRecover", "RecoveredShard", "RecoveryReplay", "ShardRecovery"]

TRAIN_MESSAGE = "train"


class RecoveredShard(Strategy):
    """:class:`RecoveryReplay` of one shard, with the clients' training as messages.

    An exact round sends ordinary ``train`` messages carrying the stored round's
    number as ``server-round``, so each client trains with the seed it had in
    that learning round.

    Parameters
    ----------
    history, shard, forget, start_model, schedule, members
        As :class:`RecoveryReplay` (``schedule``: FedRecover's ``warmup``,
        ``correction``, ``final``, ``memory``, ``threshold``,
        ``from_first_participation`` and the refill).
    node_of : Mapping[int, int]
        partition id -> Flower node id.
    """

    def __init__(self, history: HistoryReader, shard: int, forget: Iterable[int],
                 node_of: Mapping[int, int], start_model: Mapping[str, np.ndarray],
                 schedule: ReplaySchedule = ReplaySchedule(), *,
                 members: Sequence[int] = ()) -> None:
        self.replay = RecoveryReplay(history, shard, forget, start_model, schedule,
                                     members=members)
        self.node_of = dict(node_of)
        self._expected: dict[int, tuple[int, int | None]] = {}

    @property
    def num_rounds(self) -> int:
        """Server rounds: one per stored round from the start round on."""
        return self.replay.num_rounds

    def replay_report(self) -> dict:
        """:meth:`RecoveryReplay.replay_report`."""
        return self.replay.replay_report()

    def configure_train(self, server_round: int, arrays: ArrayRecord,
                        config: ConfigRecord, grid: Grid) -> list[Message]:
        """``train`` messages to the clients whose update is not estimated."""
        ask = self.replay.begin(server_round, to_numpy(arrays))
        self._expected = {}
        if not ask:
            return []
        config = ConfigRecord(dict(config))
        config["server-round"] = self.replay.stored_round(server_round)  # its seed
        content = RecordDict({"arrays": arrays, "config": config})
        messages = []
        for pid, n in ask:
            self._expected[self.node_of[pid]] = (pid, n)
            messages.append(Message(content, dst_node_id=self.node_of[pid],
                                    message_type=TRAIN_MESSAGE))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """W'^t from the replies (broken or missing ones get their estimates)."""
        base = self.replay.base
        if base is None:
            raise RuntimeError("aggregate_train called before configure_train")
        exact, sizes = {}, {}
        for reply in replies:
            if reply.has_error() or reply.metadata.src_node_id not in self._expected:
                continue
            pid, n = self._expected[reply.metadata.src_node_id]
            if n is None:  # a substitute: weighted by the count it reports
                sizes[pid] = reported_examples(reply)
            exact[pid] = difference(to_numpy(reply.content["arrays"]), base)
        new = self.replay.finish(server_round, exact, sizes)
        if new is None:
            return None, None
        return to_record(new), MetricRecord({"clients": len(
            self.replay.retained(self.replay.stored_round(server_round))),
            "exact": len(exact)})

    def configure_evaluate(self, server_round, arrays, config, grid):
        """No federated evaluation while unlearning."""
        return []

    def aggregate_evaluate(self, server_round, replies):
        """No federated evaluation while unlearning."""
        return None

    def summary(self) -> None:
        """Nothing to log beyond the plan."""


class ShardRecovery(ImpactedShards):
    """SE-R: :class:`RecoveredShard` in each impacted shard; the others frozen.

    Parameters
    ----------
    history : HistoryReader
        The sharded history.
    forget : Iterable[int]
        Partition ids forgotten so far.
    shards : Sequence[Sequence[int]]
        Partition ids of each shard.
    node_of : Mapping[int, int]
        partition id -> node id.
    start_models : Mapping[int, Mapping[str, ndarray]]
        Impacted shard -> its original W^(p-1) (see :meth:`start_rounds`).
    impacted : Iterable[int]
        The shards to recover (each holds a forgotten client who trained there).
    schedule : ReplaySchedule
        FedRecover's schedule and ``from_first_participation`` for each
        :class:`RecoveredShard`; its ``refill`` refills forgotten slots from each
        impacted shard's retained members (``recovery-refill``), of those
        ``present`` in the round's stage.

    Raises
    ------
    ValueError
        A shard that would lose every client.
    """

    def __init__(self, history: HistoryReader, forget: Iterable[int],
                 shards: Sequence[Sequence[int]], node_of: Mapping[int, int],
                 start_models: Mapping[int, Mapping[str, np.ndarray]],
                 impacted: Iterable[int],
                 schedule: ReplaySchedule = ReplaySchedule()) -> None:
        forget = frozenset(forget)
        for s, pids in enumerate(shards):
            if set(pids) <= forget:
                raise ValueError(f"forgetting {sorted(forget)} would empty shard {s}")
        self.impacted = sorted(set(impacted))
        subs: list[Strategy] = [
            RecoveredShard(history, s, forget, node_of, start_models[s], schedule,
                           members=shards[s])
            if s in self.impacted else FrozenShard() for s in range(len(shards))]
        super().__init__(subs, [[node_of[p] for p in pids] for pids in shards],
                         seed=None)


class FedRecover(ShardRecovery):
    """FRec: FedRecover on the unsharded federation, from round 1 (Cao et al., 2023).

    Same parameters as :class:`ShardRecovery`, with ``shards`` one list of every
    client and ``history`` the unsharded federation's own store.
    """
