"""The round loop that learning and every unlearning framework run through.

One round: the strategy configures its messages, the grid delivers them, replies
are screened (:mod:`server_app.rounds.screening`), the strategy aggregates the accepted
ones, and the round's outcome goes to each observer once: the history recorder
(learning), the cost meter (compute seconds, client-epochs, modelled transfer
time) and the evaluator. The shard models stay packed in one ``ArrayRecord``
between rounds; each round unpacks them once for the observers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.supercore import log

from history.comm import transfer_seconds
from server_app.rounds.screening import MAX_TRAIN_SECONDS, FaultLog, ReplyLimits, screen
from strategies.sharded import ShardedStrategy, pack_shards, unpack_shards

WALL_PARTS = ("client_training_s", "transfer_s", "server_configure_s",
              "server_aggregate_s", "retrieval_s")
"""The parts of a modelled wall time (:attr:`CostMeter.wall_parts`)."""


@dataclass
class RoundOutcome:
    """What one round did, as its observers see it.

    Attributes
    ----------
    rnd : int
        Server round, from 1.
    messages : list[Message]
        The training messages sent.
    by_shard : list[list[Message]]
        The accepted replies of each shard, in shard node order.
    before, after : list[ArrayRecord]
        Each shard's model at the start of the round and after aggregation.
    server_s : float
        Seconds the server spent configuring and aggregating.
    started : float
        ``time.perf_counter()`` at the start of the round.
    warnings : list[str]
        One per shard that asked clients but accepted no reply (its model is
        unchanged), see :func:`shard_warnings`.
    aggregate_s : float
        The part of ``server_s`` spent aggregating (SE: calibrating); the rest
        was spent configuring (sampling, SE: reading the stored history).
    """

    rnd: int
    messages: list[Message]
    by_shard: list[list[Message]]
    before: list[ArrayRecord]
    after: list[ArrayRecord]
    server_s: float
    started: float
    warnings: list[str] = field(default_factory=list)
    aggregate_s: float = 0.0

    @property
    def participants(self) -> int:
        """Accepted replies over all shards."""
        return sum(len(replies) for replies in self.by_shard)


class RoundObserver(Protocol):
    """Anything told about each round once it is aggregated."""

    def on_round(self, outcome: RoundOutcome) -> None:
        """Take note of ``outcome`` (record, count, evaluate, log)."""


@dataclass
class CostMeter:
    """Costs of a run of rounds: compute, client-epochs and modelled transfers.

    Attributes
    ----------
    link_rate_mbps : float
        Link rate of the communication model (:func:`history.comm.transfer_seconds`).
    compute_s : float
        Clients' training seconds plus the server's configure / aggregate seconds.
    server_s : float
        The server's part of ``compute_s``.
    client_epochs : float
        Local epochs reported by the accepted replies.
    transfers : int
        Models sent plus models received.
    comm_time_s : float
        Modelled seconds of those transfers, one after another on the server's link.
    rounds : int
        Rounds seen.
    client_rounds : int
        Rounds that messaged at least one client (the others ran on the server
        alone: SE's preparation round, SE-R's estimated rounds, unless a
        ``replay-refill`` / ``recovery-refill`` substitute trains there).
    shard_compute_s : dict[int, float]
        Clients' training seconds per shard.
    contacted : list[int]
        Node ids messaged, in order (for isolation checks).
    warnings : list[str]
        Every round's warnings (:attr:`RoundOutcome.warnings`).
    accepted : int
        Client replies accepted (screened and aggregated) over all rounds.
    wall_s : float
        Wall seconds, set by whoever drives the rounds.
    modelled_wall_s : float
        Modelled wall time of a real federation (:meth:`round_wall_s`, summed
        over rounds): clients train in parallel, shards in parallel, each
        participant on its own link.
    wall_parts : dict[str, float]
        ``modelled_wall_s`` split along each round's critical path, in seconds:
        ``client_training_s`` and ``transfer_s`` of the slowest participant,
        ``server_configure_s`` (sampling, reading stored history) and
        ``server_aggregate_s`` (aggregation, calibration); a coded retrieval
        adds ``retrieval_s``. The parts sum to ``modelled_wall_s``.
    """

    link_rate_mbps: float = 100.0
    compute_s: float = 0.0
    server_s: float = 0.0
    client_epochs: float = 0.0
    transfers: int = 0
    comm_time_s: float = 0.0
    rounds: int = 0
    client_rounds: int = 0
    shard_compute_s: dict[int, float] = field(default_factory=dict)
    contacted: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    accepted: int = 0
    wall_s: float = 0.0
    modelled_wall_s: float = 0.0
    wall_parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        WALL_PARTS, 0.0))

    def on_round(self, outcome: RoundOutcome) -> None:
        """Add the round's sent models, accepted replies and server seconds."""
        self.modelled_wall_s += self.round_wall_s(outcome)
        train, up, down = self._critical_path(outcome)
        for key, seconds in (("client_training_s", train), ("transfer_s", up + down),
                             ("server_configure_s", outcome.server_s - outcome.aggregate_s),
                             ("server_aggregate_s", outcome.aggregate_s)):
            self.wall_parts[key] += seconds
        for message in outcome.messages:
            self.contacted.append(message.metadata.dst_node_id)
            self._transfer(message.content["arrays"])
        for s, replies in enumerate(outcome.by_shard):
            for reply in replies:
                self.accepted += 1
                metrics = reply.content["metrics"]
                seconds = float(metrics["train-seconds"])
                self.compute_s += seconds
                self.shard_compute_s[s] = self.shard_compute_s.get(s, 0.0) + seconds
                self.client_epochs += float(metrics.get("local-epochs", 0.0))
                self._transfer(reply.content["arrays"])
        self.server_s += outcome.server_s
        self.compute_s += outcome.server_s
        self.warnings += outcome.warnings
        self.rounds += 1
        self.client_rounds += bool(outcome.messages)

    def round_wall_s(self, outcome: RoundOutcome) -> float:
        """Modelled wall seconds of one round in a real federation.

        ``server_s + max over accepted replies m of (down_m + train_m + up_m)``,
        where ``train_m`` is the reply's ``train-seconds``, ``down_m`` the
        modelled transfer (:func:`history.comm.transfer_seconds`) of the model
        sent to m and ``up_m`` that of m's reply. Clients of a shard train in
        parallel and shards run in parallel, so the round lasts as long as its
        slowest participant, plus the server's measured configure / aggregate
        seconds. A round that contacts no client (SE's preparation without
        refilled slots) costs its
        server seconds only; clients that did not answer are not waited for
        (the timeout is not counted).
        """
        train, up, down = self._critical_path(outcome)
        return outcome.server_s + (train + up + down)

    def _critical_path(self, outcome: RoundOutcome) -> tuple[float, float, float]:
        """(training, upload, download) seconds of the slowest accepted participant."""
        sent = {m.metadata.dst_node_id: m.content["arrays"].count_bytes()
                for m in outcome.messages}
        slowest, longest = (0.0, 0.0, 0.0), 0.0
        for replies in outcome.by_shard:
            for reply in replies:
                down = sent.get(reply.metadata.src_node_id, 0)
                path = (float(reply.content["metrics"]["train-seconds"]),
                        transfer_seconds(reply.content["arrays"].count_bytes(),
                                         self.link_rate_mbps),
                        transfer_seconds(down, self.link_rate_mbps) if down else 0.0)
                if path[0] + path[1] + path[2] > longest:
                    slowest, longest = path, path[0] + path[1] + path[2]
        return slowest

    def _transfer(self, arrays: ArrayRecord) -> None:
        self.transfers += 1
        self.comm_time_s += transfer_seconds(arrays.count_bytes(), self.link_rate_mbps)


@dataclass
class RoundLoop:
    """The run's one round loop: its grid, reply bounds, timeout and fault log.

    Built once per run; learning, every unlearning framework and every stage run
    their rounds through :meth:`run`, so all of them screen replies against the
    same bounds and record faults in the same log.

    Attributes
    ----------
    grid : Grid
        Flower grid (or the in-process one).
    timeout : float
        Seconds to wait for a round's replies (also the most training seconds a
        reply may claim).
    faults : FaultLog
        Receives rejected replies and dropouts (left out of aggregation).
    partition_of : Mapping[int, int]
        Node id -> partition id (readable fault entries).
    samples : Mapping[int, int]
        Partition id -> samples the client holds (bounds ``num-examples``).
    link_rate_mbps : float
        Link rate of the communication model (:class:`CostMeter`).
    """

    grid: Grid
    timeout: float | None = None
    faults: FaultLog = field(default_factory=FaultLog)
    partition_of: Mapping[int, int] = field(default_factory=dict)
    samples: Mapping[int, int] = field(default_factory=dict)
    link_rate_mbps: float = 100.0

    def run(self, strategy: ShardedStrategy, initial: Sequence[ArrayRecord],
            num_rounds: int, config: ConfigRecord, *, label: str = "round",
            observers: Sequence[RoundObserver] = (), first_round: int = 1,
            max_update: float | None = None, meter: CostMeter | None = None
            ) -> tuple[list[ArrayRecord], CostMeter]:
        """Run ``num_rounds`` rounds of ``strategy``; return shard models and costs.

        ``meter`` (default: a fresh :class:`CostMeter`) is the first observer, then
        ``observers``; its ``wall_s`` is set to the wall seconds of these rounds.
        ``max_update`` bounds a reply's update (the store's fixed-point range;
        None: unbounded). See :func:`run_rounds` for the other parameters.
        """
        limits = ReplyLimits(self.samples, self.timeout or MAX_TRAIN_SECONDS, max_update)
        meter = meter if meter is not None else CostMeter(self.link_rate_mbps)
        t_start = time.perf_counter()
        models = run_rounds(self.grid, strategy, initial, num_rounds, config,
                            timeout=self.timeout, faults=self.faults, label=label,
                            partition_of=self.partition_of, limits=limits,
                            observers=[meter, *observers], first_round=first_round)
        meter.wall_s = time.perf_counter() - t_start
        return models, meter


def run_rounds(grid: Grid, strategy: ShardedStrategy, initial: Sequence[ArrayRecord],
               num_rounds: int, config: ConfigRecord, *, timeout: float | None = None,
               faults: FaultLog | None = None, label: str = "round",
               partition_of: Mapping[int, int] | None = None,
               limits: ReplyLimits | None = None,
               observers: Sequence[RoundObserver] = (),
               first_round: int = 1) -> list[ArrayRecord]:
    """Run ``num_rounds`` training rounds of ``strategy``; return the shard models.

    Parameters
    ----------
    grid : Grid
        Flower grid (or the in-process one).
    strategy : ShardedStrategy
        Learning (one stock strategy per shard) or an unlearning framework.
    initial : Sequence[ArrayRecord]
        Each shard's model before round 1.
    num_rounds : int
        Rounds to run.
    config : ConfigRecord
        Sent with every training message (a fresh copy each round).
    timeout : float, optional
        Seconds to wait for a round's replies.
    faults : FaultLog, optional
        Receives rejected replies and dropouts; they are left out of aggregation.
    label : str
        Stage name in the fault log and the log lines.
    partition_of : Mapping[int, int], optional
        Node id -> partition id, for readable fault entries.
    limits : ReplyLimits, optional
        Bounds of a reply's numbers (samples held, seconds, update size).
    observers : Sequence[RoundObserver]
        Told about each round, in order, once it is aggregated.
    first_round : int
        Number of the first round (a later stage of a staged run goes on from
        the rounds before it: sampling, client seeds and the history use it).

    Returns
    -------
    list[ArrayRecord]
        Each shard's model after the last round.
    """
    faults = faults if faults is not None else FaultLog()
    arrays = pack_shards(initial)
    models = list(initial)
    for rnd in range(first_round, first_round + num_rounds):
        started = time.perf_counter()
        messages = list(strategy.configure_train(rnd, arrays, ConfigRecord(dict(config)),
                                                 grid))
        server_s = time.perf_counter() - started
        seen = len(faults.entries)
        replies = grid.send_and_receive(messages, timeout=timeout) if messages else []
        accepted = screen(replies, messages, label, rnd, faults, partition_of, limits)
        _log_faults(faults.entries[seen:], label, rnd)
        warnings = shard_warnings(strategy, messages, accepted, faults.entries[seen:],
                                  label, rnd)
        for warning in warnings:
            log(WARNING, "%s", warning)
        t0 = time.perf_counter()
        aggregated, _ = strategy.aggregate_train(rnd, accepted)
        aggregate_s = time.perf_counter() - t0
        server_s += aggregate_s
        if aggregated is not None:
            arrays = aggregated
        new = unpack_shards(arrays, strategy.num_shards)
        outcome = RoundOutcome(rnd, messages, strategy.route_replies(accepted), models,
                               new, server_s, started, warnings, aggregate_s)
        for observer in observers:
            observer.on_round(outcome)
        models = new
    return models


def shard_warnings(strategy: ShardedStrategy, messages: Sequence[Message],
                   accepted: Sequence[Message], new_faults: Sequence[dict], label: str,
                   rnd: int) -> list[str]:
    """One warning per shard that asked clients but accepted no reply this round.

    Parameters
    ----------
    strategy : ShardedStrategy
        Maps nodes to shards.
    messages, accepted : Sequence[Message]
        What was sent, and the replies that passed screening.
    new_faults : Sequence[dict]
        This round's :class:`server_app.rounds.screening.FaultLog` entries (their
        ``node`` and ``kind`` say why each reply is missing).
    label, rnd : str, int
        Stage and round, for the text.

    Returns
    -------
    list[str]
        E.g. ``"sharded round 2: shard 1 accepted no reply (2 asked: 2 rejected,
        0 without answer); no client update of the shard was aggregated"``.
    """
    out = []
    for shard, asked in strategy.unanswered_shards(messages, accepted).items():
        kinds = [f["kind"] for f in new_faults
                 if strategy.node_shard.get(f["node"]) == shard]
        dropouts = kinds.count("dropout")
        out.append(f"{label} round {rnd}: shard {shard} accepted no reply ({asked} "
                   f"asked: {len(kinds) - dropouts} rejected, {dropouts} without "
                   "answer); no client update of the shard was aggregated")
    return out


def _log_faults(entries: Sequence[dict], label: str, rnd: int) -> None:
    for fault in entries:
        log(WARNING, "%s round %d: partition %s (node %d) %s: %s", label, rnd,
            fault["partition"], fault["node"], fault["kind"], fault["reason"])
