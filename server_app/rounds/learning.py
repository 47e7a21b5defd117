"""The learning stage: G rounds of a (sharded) strategy, recording the history.

Each round the strategy configures its messages, the grid delivers them, the
strategy aggregates the replies, and every participant's update
U_m^g = w_m^g - W_s^(g-1) plus the new shard model W_s^g go to the history store
(paper Sec. 3.2: the server keeps the intermediate parameters). The store is a
:class:`history.RoundRecorder`: :class:`history.store.HistoryStore` writes every
blob, while :class:`history.coded.recorder.CodedRecorder` (``storage = "coded"``)
codes each round into client slices at ``end_round`` and keeps only metadata.

A round in which a shard asked clients but accepted no reply leaves that shard's
model as it was: it is a warning (log, ``rounds[i]["warnings"]``,
``LearningResult.warnings``), and a learning stage in which no shard model ever
moved stops with :class:`LearningStalledError` instead of reporting a result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from history import RoundRecorder
from server_app.rounds.federation import Federation
from server_app.rounds.loop import CostMeter, RoundLoop, RoundOutcome, RoundPlan
from server_app.rounds.screening import FaultLog
from server_app.rounds.stopped import RunStoppedError
from strategies.sharded import ShardedStrategy, to_numpy


class LearningStalledError(RunStoppedError):
    """No shard model changed in a whole learning stage: nothing was learned."""


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
    warnings : list[str]
        Every round's warnings (also in ``rounds[i]["warnings"]``), then one per
        shard whose model never changed.
    costs : CostMeter, optional
        The rounds' costs as the round loop measured them.
    """

    models: list[ArrayRecord]
    rounds: list[dict] = field(default_factory=list)
    wall_time_s: float = 0.0
    compute_s: float = 0.0
    client_epochs: float = 0.0
    warnings: list[str] = field(default_factory=list)
    costs: CostMeter | None = None


class HistoryRecorder:
    """Round observer: store each participant's update and the new shard models.

    Every accepted reply's update U_m^g = w_m^g - W_s^(g-1) goes to the store with
    its example count and training seconds, then each shard's W_s^g; the store
    then closes the round (``end_round``: the coded recorder codes and sends it).
    """

    def __init__(self, store: RoundRecorder, federation: Federation,
                 grid: Grid) -> None:
        self.store, self.grid = store, grid
        self.partition_of = federation.partition_of

    def on_round(self, outcome: RoundOutcome) -> None:
        """Record round ``outcome.rnd``."""
        for s, replies in enumerate(outcome.by_shard):
            before = to_numpy(outcome.before[s])
            for reply in replies:
                metrics = reply.content["metrics"]
                model = to_numpy(reply.content["arrays"])
                update = {k: model[k] - before[k] for k in before}
                self.store.put_update(s, outcome.rnd,
                                      self.partition_of[reply.metadata.src_node_id],
                                      update, int(metrics["num-examples"]),
                                      float(metrics["train-seconds"]))
            self.store.put_shard_model(s, outcome.rnd, to_numpy(outcome.after[s]))
        self.store.end_round(outcome.rnd, self.grid)


class LearningCheckpoint:
    """Round observer (the last): hand what learning has done so far to ``keep``.

    After each round, once the store holds it, ``keep`` receives
    :func:`checkpoint_record`: a killed run goes on from that round
    (:func:`run_learning`'s ``resumed``) instead of learning again from W^0.
    """

    def __init__(self, keep: Callable[[dict], None], progress: LearningProgress,
                 faults: FaultLog, label: str, wall_before: float) -> None:
        self.keep, self.progress, self.faults = keep, progress, faults
        self.label, self.wall_before = label, wall_before
        self.started = time.perf_counter()

    def on_round(self, outcome: RoundOutcome) -> None:
        """Save the record of the rounds up to ``outcome.rnd``."""
        wall = self.wall_before + time.perf_counter() - self.started
        self.keep(checkpoint_record(outcome.rnd, self.progress, self.faults,
                                    self.label, wall))


def checkpoint_record(rnd: int, progress: LearningProgress, faults: FaultLog,
                      label: str, wall_s: float) -> dict:
    """JSON of a learning stage after round ``rnd``: what :func:`run_learning` resumes.

    Keys: ``round``; the result so far (``rounds``, ``compute_s``,
    ``client_epochs``, ``warnings``, ``wall_time_s`` in seconds); ``moved`` (per
    shard: did its model change yet); ``faults`` (the stage's fault-log entries).
    The shard models are not in it: the history store holds W_s^rnd.
    """
    result = progress.result
    return {"round": rnd, "rounds": result.rounds, "compute_s": result.compute_s,
            "client_epochs": result.client_epochs, "warnings": result.warnings,
            "wall_time_s": wall_s, "moved": progress.moved,
            "faults": [f for f in faults.entries if f["stage"] == label]}


class LearningProgress:
    """Round observer: evaluate, log and tabulate each learning round."""

    def __init__(self, result: LearningResult, num_rounds: int,
                 evaluate: Callable[[list[ArrayRecord]], dict] | None, label: str):
        self.result, self.num_rounds = result, num_rounds
        self.evaluate, self.label = evaluate, label
        self.moved = [False] * len(result.models)

    def on_round(self, outcome: RoundOutcome) -> None:
        """Append the round's entry to ``result.rounds`` and log it."""
        compute, epochs = 0.0, 0.0
        for replies in outcome.by_shard:
            for reply in replies:
                compute += float(reply.content["metrics"]["train-seconds"])
                epochs += float(reply.content["metrics"].get("local-epochs", 0.0))
        entry = {"round": outcome.rnd, "participants": outcome.participants,
                 "compute_s": compute, "client_epochs": epochs,
                 "warnings": outcome.warnings}
        if self.evaluate is not None:
            entry.update(self.evaluate(outcome.after))
        entry["seconds"] = time.perf_counter() - outcome.started
        self.result.rounds.append(entry)
        self.result.compute_s += compute
        self.result.client_epochs += epochs
        self.result.warnings += outcome.warnings
        self.moved = [m or moved(old, new) for m, old, new in zip(
            self.moved, outcome.before, outcome.after, strict=True)]
        log(INFO, "%s round %d/%d: accuracy %s, loss %s, %d clients, %.1f s", self.label,
            outcome.rnd, self.num_rounds, _fmt(entry.get("accuracy")),
            _fmt(entry.get("loss")), outcome.participants, entry["seconds"])


@dataclass(frozen=True)
class Continuation:
    """Where a learning's rounds go on from, and where it keeps its place.

    Attributes
    ----------
    first : int
        Number of the first round; W^0 is stored only when it is 1 (a later stage
        of a staged run goes on from the stored rounds before it).
    resumed : dict, optional
        A killed run's checkpoint to go on from: learning goes on after its
        ``round`` (:func:`run_learning`).
    checkpoint : callable, optional
        Receives a checkpoint record after each round (the run catalog), for a
        run killed later to go on from.
    """

    first: int = 1
    resumed: dict | None = None
    checkpoint: Callable[[dict], None] | None = None


def run_learning(loop: RoundLoop, strategy: ShardedStrategy, federation: Federation,
                 initial: list[ArrayRecord], plan: RoundPlan, store: RoundRecorder, *,
                 evaluate: Callable[[list[ArrayRecord]], dict] | None = None,
                 continuation: Continuation = Continuation()) -> LearningResult:
    """Run the rounds of ``plan`` with ``strategy`` through ``loop``; record the history.

    Parameters
    ----------
    loop : RoundLoop
        The run's round loop (grid, reply bounds, timeout, fault log).
    strategy : ShardedStrategy
        One aggregator per shard of ``federation``.
    federation : Federation
        Node ids and shards.
    initial : list[ArrayRecord]
        W_s^0 of each shard (stored as round 0).
    plan : RoundPlan
        G (``num_rounds``), the training messages' ``config`` (lr, local-epochs,
        batch-size ...) and the ``label``: prefix of the progress lines and the
        fault log's stage.
    store : RoundRecorder
        Receives W^0, the updates and the shard models, then ``end_round(rnd,
        grid)`` after each round (round 0: W^0); not marked complete here. Its
        ``max_update`` bounds the replies' updates.
    evaluate : callable, optional
        Called with the shard models after each round; its ``accuracy`` and
        ``loss`` are logged.
    continuation : Continuation
        ``first``: number of the first round; W^0 is stored only when it is 1 (a
        later stage of a staged run goes on from the stored rounds before it).
        ``resumed``: a killed run's :func:`checkpoint_record` of this stage:
        learning goes on after its ``round`` (``initial`` are the stored models
        of that round, ``num_rounds`` still counts every round of the stage) and
        the result, fault log and moved shards start from it. ``checkpoint``:
        receives :func:`checkpoint_record` after every round (the run catalog).

    Raises
    ------
    LearningStalledError
        No shard model changed in any round (every reply rejected or missing,
        or the accepted updates changed no weight); the store is left incomplete.
    """
    label, num_rounds, first_round = plan.label, plan.num_rounds, continuation.first
    resumed, checkpoint = continuation.resumed, continuation.checkpoint
    t_start = time.perf_counter()
    last = first_round + num_rounds - 1
    if first_round == 1 and resumed is None:
        for s, arrays in enumerate(initial):
            store.put_shard_model(s, 0, to_numpy(arrays))
        store.end_round(0, loop.grid)
    result = LearningResult(models=list(initial))
    progress = LearningProgress(result, last, evaluate, label)
    wall_before = _take_back(resumed, progress, loop.faults) if resumed else 0.0
    start = resumed["round"] + 1 if resumed else first_round
    observers = [HistoryRecorder(store, federation, loop.grid), progress]
    if checkpoint is not None:
        observers.append(LearningCheckpoint(checkpoint, progress, loop.faults, label,
                                            wall_before))
    result.models, result.costs = loop.run(strategy, initial,
                                           replace(plan, num_rounds=last - start + 1),
                                           first_round=start, observers=observers,
                                           max_update=store.max_update)
    if not any(progress.moved):
        raise LearningStalledError(stalled_message(label, num_rounds, loop.faults,
                                                   result.costs.accepted))
    for shard in (s for s, m in enumerate(progress.moved) if not m):
        result.warnings.append(f"{label}: shard {shard}'s model never changed in "
                               f"{num_rounds} round(s); it is the initial model")
        log(WARNING, "%s", result.warnings[-1])
    result.wall_time_s = wall_before + time.perf_counter() - t_start
    return result


def _take_back(record: dict, progress: LearningProgress, faults: FaultLog) -> float:
    """Start ``progress`` and ``faults`` from a checkpoint; return its wall seconds."""
    result = progress.result
    result.rounds = list(record["rounds"])
    result.compute_s, result.client_epochs = record["compute_s"], record["client_epochs"]
    result.warnings = list(record["warnings"])
    progress.moved = [bool(m) for m in record["moved"]]
    faults.entries.extend(record["faults"])
    return float(record["wall_time_s"])


def moved(before: ArrayRecord, after: ArrayRecord) -> bool:
    """Whether any array of ``after`` differs from ``before`` (values or keys)."""
    if after is before:
        return False
    if list(after) != list(before):
        return True
    return any(not np.array_equal(after[k].numpy(), before[k].numpy()) for k in after)


def stalled_message(label: str, num_rounds: int, faults: FaultLog, accepted: int = 0
                    ) -> str:
    """The one-line error of a learning stage that moved no shard model.

    ``accepted``: client replies the stage accepted (none: each was rejected or
    missing; some: their updates changed no weight).
    """
    mine = [f for f in faults.entries if f["stage"] == label]
    dropouts = sum(f["kind"] == "dropout" for f in mine)
    first = next((f for f in mine if f["kind"] != "dropout"), None)
    example = (f"; first rejection: round {first['round']}, partition "
               f"{first['partition']}: {first['reason']}" if first else "")
    why = (f"no client reply was accepted ({len(mine) - dropouts} rejected, {dropouts} "
           f"without answer{example})" if not accepted else f"the {accepted} accepted "
           "client updates left every model as it was (a learning rate too small to "
           "change its float32 weights?)")
    return (f"{label} learning moved no shard model in {num_rounds} round(s): {why}; "
            "stopped instead of reporting untrained models")


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"
