"""The round loop that learning and every unlearning framework run through.

One round: the strategy configures its messages, the grid delivers them, replies
are screened (:mod:`server_app.rounds.screening`), the strategy aggregates the accepted
ones, and the round's outcome goes to each observer once: the history recorder
(learning), the cost meter (modelled times from the run's cost model,
:mod:`server_app.rounds.costs`, beside the measured seconds; client-epochs) and
the evaluator. The shard models stay packed in one ``ArrayRecord``
between rounds; each round unpacks them once for the observers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from server_app.rounds.costs import CostModel
from server_app.rounds.screening import MAX_TRAIN_SECONDS, FaultLog, ReplyLimits, screen
from strategies.sharded import ShardedStrategy, pack_shards, shard_prefix, unpack_shards

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
    metrics : MetricRecord or None
        What the strategy's aggregation returned (``shard<s>/clients``: updates
        a shard combined, where its strategy says).
    sent_by_shard : list[int]
        Models sent to each shard's clients (empty: not split by shard).
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
    metrics: MetricRecord | None = None
    sent_by_shard: list[int] = field(default_factory=list)

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
    """Costs of a run of rounds: modelled times, measured seconds, client-epochs.

    Modelled times come from :attr:`costs` (:class:`server_app.rounds.costs.CostModel`:
    samples, epochs, bytes and sizes priced by the run's device profile), so they
    are the same whatever the machine's load; measured seconds are this
    machine's clock, kept beside them.

    Attributes
    ----------
    costs : CostModel
        The run's prices (default: transfers only, every compute price 0).
    partition_of : Mapping[int, int]
        Node id -> partition id (a client's straggler draw; a node not listed
        is drawn by its node id).
    compute_s : float
        Measured on this machine: clients' training seconds plus the server's
        configure / aggregate seconds.
    server_s : float
        The server's part of ``compute_s`` (measured).
    measured_train_s : float
        The clients' part of ``compute_s``: their replies' ``train-seconds``.
    measured_wall_s : float
        :meth:`round_wall_s`'s critical path with measured seconds instead of
        modelled ones (the slowest reply's ``train-seconds`` + its modelled
        transfers + the server's measured seconds), summed over rounds: what
        ``modelled_wall_s`` was before the cost model, on this machine.
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
        Clients' measured training seconds per shard.
    contacted : list[int]
        Node ids messaged, in order (for isolation checks).
    warnings : list[str]
        Every round's warnings (:attr:`RoundOutcome.warnings`).
    accepted : int
        Client replies accepted (screened and aggregated) over all rounds.
    wall_s : float
        Wall seconds, set by whoever drives the rounds (measured).
    modelled_wall_s : float
        Modelled wall time of a real federation (:meth:`round_wall_s`, summed
        over rounds): clients train in parallel, shards in parallel, each
        participant on its own link.
    wall_parts : dict[str, float]
        ``modelled_wall_s`` split along each round's critical path, in seconds:
        ``client_training_s`` and ``transfer_s`` of the slowest participant,
        ``server_configure_s`` (models sent) and ``server_aggregate_s`` (updates
        combined: aggregation, calibration, estimation); a coded retrieval adds
        ``retrieval_s``. The parts sum to ``modelled_wall_s``.
    """

    costs: CostModel = field(default_factory=CostModel)
    partition_of: Mapping[int, int] = field(default_factory=dict)
    compute_s: float = 0.0
    server_s: float = 0.0
    measured_train_s: float = 0.0
    measured_wall_s: float = 0.0
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
        """Add the round's modelled parts, sent models, accepted replies, seconds."""
        parts = self.round_parts(outcome)
        self.modelled_wall_s += sum(parts.values())
        for key, seconds in parts.items():
            self.wall_parts[key] += seconds
        self.measured_wall_s += self._measured_wall_s(outcome)
        for message in outcome.messages:
            self.contacted.append(message.metadata.dst_node_id)
            self._transfer(message.content["arrays"])
        for s, replies in enumerate(outcome.by_shard):
            for reply in replies:
                self.accepted += 1
                metrics = reply.content["metrics"]
                seconds = float(metrics["train-seconds"])
                self.compute_s += seconds
                self.measured_train_s += seconds
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

        ``max over accepted replies m of (down_m + train_m + up_m)`` + the
        slowest shard server's configure seconds + the slowest shard server's
        aggregate seconds (:meth:`round_parts`), where ``train_m`` is
        :meth:`CostModel.train_s` of m's samples (``num-examples``) and local
        epochs (``local-epochs``), ``down_m`` / ``up_m`` the modelled transfers
        of the model sent to m and of m's reply. Clients of a shard train in
        parallel and shards (each its own server) run in parallel. A round that
        contacts no client (SE's preparation without refilled slots) costs its
        server work only; clients that did not answer are not waited for.
        """
        return sum(self.round_parts(outcome).values())

    def round_parts(self, outcome: RoundOutcome) -> dict[str, float]:
        """The round's modelled seconds by :data:`WALL_PARTS` key (no retrieval)."""
        train, up, down = self._critical_path(outcome)
        params = _parameters(outcome)
        sent = outcome.sent_by_shard or [len(outcome.messages)]
        combined = [_updates_combined(outcome, s) for s in range(len(outcome.by_shard))]
        return {"client_training_s": train, "transfer_s": up + down,
                "server_configure_s": max((self.costs.configure_s(n, params)
                                           for n in sent), default=0.0),
                "server_aggregate_s": max((self.costs.aggregate_s(n, params)
                                           for n in combined), default=0.0)}

    def _paths(self, outcome: RoundOutcome):
        """(modelled training, measured training, upload, download) of each reply."""
        sent = {m.metadata.dst_node_id: m for m in outcome.messages}
        for replies in outcome.by_shard:
            for reply in replies:
                node = reply.metadata.src_node_id
                message = sent.get(node)
                metrics = reply.content["metrics"]
                down = self.costs.transfer_s(message.content["arrays"].count_bytes()) \
                    if message is not None else 0.0
                modelled = self.costs.train_s(
                    self.partition_of.get(node, node),
                    float(metrics.get("num-examples", 0)),
                    float(metrics.get("local-epochs", 0.0)), _fisher_samples(message))
                yield (modelled, float(metrics["train-seconds"]),
                       self.costs.transfer_s(reply.content["arrays"].count_bytes()), down)

    def _critical_path(self, outcome: RoundOutcome) -> tuple[float, float, float]:
        """(training, upload, download) modelled seconds of the slowest participant."""
        slowest, longest = (0.0, 0.0, 0.0), 0.0
        for train, _, up, down in self._paths(outcome):
            if train + up + down > longest:
                slowest, longest = (train, up, down), train + up + down
        return slowest

    def _measured_wall_s(self, outcome: RoundOutcome) -> float:
        """The round's critical path with measured training and server seconds."""
        return outcome.server_s + max((measured + up + down for _, measured, up, down
                                       in self._paths(outcome)), default=0.0)

    def _transfer(self, arrays: ArrayRecord) -> None:
        self.transfers += 1
        self.comm_time_s += self.costs.transfer_s(arrays.count_bytes())


def _parameters(outcome: RoundOutcome) -> int:
    """Parameters of one shard's model (the model before the round, else one sent)."""
    record = outcome.before[0] if outcome.before else (
        outcome.messages[0].content["arrays"] if outcome.messages else None)
    if record is None:
        return 0
    return sum(int(math.prod(array.shape)) for array in record.values())


def _updates_combined(outcome: RoundOutcome, shard: int) -> int:
    """Updates shard ``shard``'s server combined this round.

    A strategy that reads stored updates reports how many it combined as its
    ``clients`` metric (SE, FE: the stored and retrained updates; SE-R, FRec:
    the estimated and exact ones); otherwise the shard's accepted replies.
    """
    reported = outcome.metrics.get(f"{shard_prefix(shard)}clients") \
        if outcome.metrics else None
    if isinstance(reported, (int, float)) and not isinstance(reported, bool) \
            and math.isfinite(reported) and reported >= 0:
        return int(reported)
    return len(outcome.by_shard[shard])


def _fisher_samples(message: Message | None) -> int:
    """Per-sample gradients of a Fisher estimate the message asks for (0: none)."""
    if message is None or "config" not in message.content:
        return 0
    config = message.content["config"]
    if config.get("precondition") != "fisher":
        return 0
    return int(config.get("fisher-samples", 0))


@dataclass(frozen=True)
class RoundPlan:
    """The training rounds a stage runs through :meth:`RoundLoop.run`.

    Attributes
    ----------
    num_rounds : int
        Rounds to run (0: none).
    config : ConfigRecord
        Sent with every training message (a fresh copy each round): lr,
        local-epochs, batch-size ...
    label : str
        The stage's name in the log lines and the fault log (``stage``).
    """

    num_rounds: int
    config: ConfigRecord
    label: str = "round"


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
    costs : CostModel
        The run's prices of modelled time (:class:`CostMeter`; default:
        transfers only at 100 Mbit/s, for tests of the loop).
    """

    grid: Grid
    timeout: float | None = None
    faults: FaultLog = field(default_factory=FaultLog)
    partition_of: Mapping[int, int] = field(default_factory=dict)
    samples: Mapping[int, int] = field(default_factory=dict)
    costs: CostModel = field(default_factory=CostModel)

    def meter(self) -> CostMeter:
        """A fresh :class:`CostMeter` with the run's prices and node map."""
        return CostMeter(self.costs, self.partition_of)

    def run(self, strategy: ShardedStrategy, initial: Sequence[ArrayRecord],
            plan: RoundPlan, *, first_round: int = 1,
            observers: Sequence[RoundObserver] = (), max_update: float | None = None,
            meter: CostMeter | None = None) -> tuple[list[ArrayRecord], CostMeter]:
        """Run the rounds of ``plan`` with ``strategy``; return shard models and costs.

        Parameters
        ----------
        strategy : ShardedStrategy
            Learning (one stock strategy per shard) or an unlearning framework.
        initial : Sequence[ArrayRecord]
            Each shard's model before the first round.
        plan : RoundPlan
            How many rounds, the ``config`` of their training messages, their label.
        first_round : int
            Number of the first round (a later stage of a staged run goes on from
            the rounds before it: sampling, client seeds and the history use it).
        observers : Sequence[RoundObserver]
            Told about each round, in order, once it is aggregated, after ``meter``.
        max_update : float, optional
            Bounds a reply's update (the store's fixed-point range; None: unbounded).
        meter : CostMeter, optional
            The first observer (default: a fresh :meth:`meter`); its ``wall_s`` is
            set to the wall seconds of these rounds.

        Returns
        -------
        tuple[list[ArrayRecord], CostMeter]
            Each shard's model after the last round, and ``meter``.
        """
        limits = ReplyLimits(self.samples, self.timeout or MAX_TRAIN_SECONDS, max_update)
        meter = meter if meter is not None else self.meter()
        observers = [meter, *observers]
        label, grid, faults = plan.label, self.grid, self.faults
        t_start = time.perf_counter()
        arrays = pack_shards(initial)
        models = list(initial)
        for rnd in range(first_round, first_round + plan.num_rounds):
            started = time.perf_counter()
            messages = list(strategy.configure_train(
                rnd, arrays, ConfigRecord(dict(plan.config)), grid))
            server_s = time.perf_counter() - started
            seen = len(faults.entries)
            replies = grid.send_and_receive(messages, timeout=self.timeout) \
                if messages else []
            accepted = screen(replies, messages, label, rnd, faults, self.partition_of,
                              limits)
            _log_faults(faults.entries[seen:], label, rnd)
            warnings = shard_warnings(strategy, messages, accepted,
                                      faults.entries[seen:], label, rnd)
            for warning in warnings:
                log(WARNING, "%s", warning)
            t0 = time.perf_counter()
            aggregated, metrics = strategy.aggregate_train(rnd, accepted)
            aggregate_s = time.perf_counter() - t0
            server_s += aggregate_s
            if aggregated is not None:
                arrays = aggregated
            new = unpack_shards(arrays, strategy.num_shards)
            outcome = RoundOutcome(rnd, messages, strategy.route_replies(accepted),
                                   models, new, server_s, started, warnings,
                                   aggregate_s, metrics,
                                   _sent_by_shard(strategy, messages))
            for observer in observers:
                observer.on_round(outcome)
            models = new
        meter.wall_s = time.perf_counter() - t_start
        return models, meter


def _sent_by_shard(strategy: ShardedStrategy, messages: Sequence[Message]) -> list[int]:
    """Models sent to each shard's nodes this round."""
    sent = [0] * strategy.num_shards
    shard_of = getattr(strategy, "node_shard", {})
    for message in messages:
        sent[shard_of.get(message.metadata.dst_node_id, 0)] += 1
    return sent


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
