"""One shard's calibrated replay (FedEraser's rule), and the frozen shard.

:class:`CalibratedRetraining` replays one shard's stored history without the
forgotten clients (paper eq. 2-3; Liu et al., IWQoS 2021, Alg. 1), with SE's exact
final rounds and refilled slots; :class:`FrozenShard` keeps a shard bit for bit.
:mod:`strategies.unlearning` puts them together per shard (SE, FE).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.calibration import (
    calibrate,
    calibration_plan,
    difference,
    final_exact_rounds,
    first_participation,
    plan_substitutes,
    refill_pool,
    weighted_step,
)
from strategies.sharded import to_numpy, to_record

UNLEARN_MESSAGE = "train.unlearn"


class HistoryReader(Protocol):
    """What calibrated retraining reads from a stored training history.

    ``history.TrainingHistory`` (the uncoded store and the coded history) has
    these verbs with the same parameters; strategies do not import ``history``.
    """

    def participants(self, shard: int, rnd: int) -> list[tuple[int, int]]:
        """(partition id, example count) of the participants of round ``rnd``."""

    def update(self, shard: int, rnd: int, partition_id: int) -> dict[str, np.ndarray]:
        """The stored update U^rnd of a client."""

    def rounds(self, shard: int) -> list[int]:
        """Stored rounds (>= 1), ascending."""


@dataclass(frozen=True)
class ReplaySchedule:
    """Which stored rounds a shard's replay redoes, which are exact, who fills a slot.

    One object for the schedule of SE and FE (:class:`CalibratedRetraining`) and
    of SE-R and FRec (:class:`strategies.recovery_replay.RecoveryReplay`); each
    reads the fields it names and ignores the others.

    Attributes
    ----------
    calibration_interval : int
        FedEraser's dt >= 1, in stored rounds (1: every stored round); calibrated
        replay only.
    from_first_participation : bool
        Start at the first stored round a forgotten (or changed) client took part
        in (SE's rule, default); False: from round 1 (FedEraser's and FedRecover's
        own rules).
    final : int
        T_f >= 0: the last ``final`` replayed rounds that have a retained
        participant are exact (their participants train and their updates are
        used as they are; the preparation round is never one).
    exact_epochs : float, optional
        Local epochs (L > 0) of an exact round and of a substitute or changed
        client; None: the replay's retraining epochs. Calibrated replay only
        (in a recovery clients train the learning's L).
    refill : bool
        Each forgotten participant's slot in a replayed round goes to a retained
        member of the shard who did not take part (``replay-refill``,
        ``recovery-refill``; :func:`strategies.calibration.refill_slots`).
    refill_seed : int
        Seeds the substitutes' draw (with the shard and the stored round).
    present : Callable[[int], Collection[int]], optional
        Staged runs: stored round -> the clients present in its stage (only they
        are drawn; :func:`strategies.calibration.refill_pool`).
    warmup, correction, memory : int
        FedRecover's T_w >= 0 exact rounds after the first, an exact round every
        T_c-th after them (T_c >= 0, 0: none), and s >= 1 L-BFGS pairs kept per
        shard; recovery only.
    threshold : float
        FedRecover's tau > 0: an estimated update with ``||U' - U|| > tau ||U||``
        is replaced by the client's exact update; recovery only.

    Raises
    ------
    ValueError
        On construction: ``calibration_interval < 1``; ``final``, ``warmup``,
        ``correction`` not an int >= 0 or ``memory`` not an int >= 1;
        ``exact_epochs`` not None and not > 0; ``threshold`` not a finite number > 0.
    """

    calibration_interval: int = 1
    from_first_participation: bool = True
    final: int = 0
    exact_epochs: float | None = None
    refill: bool = False
    refill_seed: int = 0
    present: Callable[[int], Collection[int]] | None = None
    warmup: int = 2
    correction: int = 4
    memory: int = 2
    threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.calibration_interval < 1:
            raise ValueError(f"calibration-interval = {self.calibration_interval} is "
                             "not allowed: >= 1")
        for name, low in (("final", 0), ("warmup", 0), ("correction", 0), ("memory", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"replay {name} = {value!r} must be an int >= {low}")
        if self.exact_epochs is not None and not self.exact_epochs > 0:
            raise ValueError(f"exact rounds' epochs = {self.exact_epochs!r} must be > 0")
        if not 0 < self.threshold < float("inf"):
            raise ValueError(f"recovery threshold = {self.threshold!r} must be a "
                             "number > 0")

    def pool(self, members: Sequence[int]
             ) -> Sequence[int] | Callable[[int], list[int]] | None:
        """Whom a shard of ``members`` refills from (None: no refill).

        :func:`strategies.calibration.refill_pool` of ``members`` and
        :attr:`present` when :attr:`refill` is on.
        """
        return refill_pool(members, self.present) if self.refill else None


class CalibratedRetraining(Strategy):
    """Calibrated retraining of one shard from its stored history (FedEraser).

    FedEraser's plan is 1, 1 + dt, 1 + 2 dt, ... With
    ``from_first_participation`` replay starts at :attr:`start_round` p, the last
    round of that plan at or before g0, the first stored round in which a
    forgotten client took part (p = g0 when dt = 1): the shard's rounds before
    g0 never saw a forgotten client, so the caller starts from the stored
    W^(p-1) and the plan is the rest of FedEraser's from p. A shard whose
    forgotten clients never trained has an empty plan (nothing to redo).
    Server round k replays stored round ``plan[k - 1]``:

    - k = 1, preparation (eq. 2): W'^p = W^(p-1) + sum n_m U_m^p / sum n_m over
      the retained participants of stored round p; none of them is contacted
      (they would start from W^(p-1), the model they started from in learning).
    - k > 1, calibration (eq. 3): the retained participants of stored round
      g = plan[k - 1] train ``retrain_epochs`` (L / r) local epochs from W'^(k-1)
      (``train.unlearn`` messages); each new update U^ is calibrated per layer
      with the magnitude of the same client's stored U^g; FedAvg weights n_m.

    - the last ``final`` server rounds (k > 1) that have a retained participant,
      exact: the retained participants
      train ``exact_epochs`` (L) local epochs and their new updates are
      aggregated as they are, without calibration: a final tuning on the
      retained data, as FedRecover's final rounds (0: the paper's SE).

    - with ``refill`` (``replay-refill``), each forgotten participant's slot in
      a replayed round goes to a retained member of the shard who did not take
      part (:func:`strategies.calibration.refill_slots`): the substitute trains
      ``exact_epochs`` from the round's model, uncalibrated (it has no stored
      update), weighted by the ``num-examples`` it reports; in round 1 it is
      the only client asked.

    A round with no retained participant and no substitute is skipped (the
    model is kept). The
    forgotten clients' updates are never read and they are never messaged.

    Parameters
    ----------
    history : HistoryReader
        The shard's stored history.
    shard : int
        Which shard of ``history``.
    forget : Iterable[int]
        Partition ids to forget (all requests so far: forgetting is cumulative).
    node_of : Mapping[int, int]
        partition id -> Flower node id.
    retrain_epochs : float
        Local epochs of a retraining step, L / r.
    schedule : ReplaySchedule
        FedEraser's dt (``calibration_interval``), ``from_first_participation``
        (default; False replays from round 1, when W^(g0-1) cannot be had), the
        ``final`` exact rounds and their ``exact_epochs`` (default
        ``retrain_epochs``), ``refill`` with ``refill_seed`` and ``present``.
    members : Sequence[int]
        Partition ids of the shard: with ``schedule.refill`` the forgotten
        participants' slots are refilled from them (:meth:`ReplaySchedule.pool`).
    changed : Iterable[int]
        Partition ids that stay but lost records (a records or class-level
        request): the replay starts at the first round a forgotten or changed
        client took part, and in every planned round they took part in they
        train afresh on what they keep (L epochs, their reply used as it is,
        weighted by the examples it reports, like a substitute): their stored
        updates were computed on the erased records, so none is aggregated or
        calibrated with.

    Raises
    ------
    ValueError
        ``retrain_epochs <= 0`` (the schedule's own values are checked by
        :class:`ReplaySchedule`).
    """

    def __init__(self, history: HistoryReader, shard: int, forget: Iterable[int],
                 node_of: Mapping[int, int], retrain_epochs: float,
                 schedule: ReplaySchedule = ReplaySchedule(), *,
                 members: Sequence[int] = (), changed: Iterable[int] = ()) -> None:
        if not retrain_epochs > 0:
            raise ValueError(f"retrain epochs L/r = {retrain_epochs} must be > 0")
        exact_epochs = (retrain_epochs if schedule.exact_epochs is None
                        else schedule.exact_epochs)
        self.final, self.exact_epochs = schedule.final, float(exact_epochs)
        self.history = history
        self.shard = shard
        self.forget = frozenset(forget)
        self.changed = frozenset(changed) - self.forget
        self.node_of = dict(node_of)
        self.retrain_epochs = float(retrain_epochs)
        rounds = history.rounds(shard)
        self.full_plan = calibration_plan(rounds, schedule.calibration_interval)
        first = first_participation(history, shard, self.forget | frozenset(changed))
        self.start_round: int | None = 1
        self.plan = list(self.full_plan)  # FedEraser's own rule: from round 1
        if schedule.from_first_participation:  # the last plan round at or before g0
            self.start_round = None if first is None else max(
                r for r in self.full_plan if r <= first)
            self.plan = [r for r in self.full_plan
                         if self.start_round is not None and r >= self.start_round]
        self.skipped_rounds: list[int] = []
        self.substitutes = plan_substitutes(history, shard, self.plan,
                                            schedule.pool(members), self.forget,
                                            schedule.refill_seed)
        self.exact_rounds = final_exact_rounds(
            [bool(self.retained(r) or self.substitutes.get(r)) for r in self.plan],
            schedule.final)
        self._base: dict[str, np.ndarray] | None = None
        self._expected: dict[int, tuple[int, int | None]] = {}

    @property
    def num_rounds(self) -> int:
        """Server rounds needed: one per planned stored round."""
        return len(self.plan)

    def is_exact(self, server_round: int) -> bool:
        """Whether server round k is exact: one of the last ``final`` that train.

        :func:`strategies.calibration.final_exact_rounds`; exact rounds train L
        epochs and are not calibrated.
        """
        return server_round in self.exact_rounds

    def replay_report(self) -> dict:
        """What starting at :attr:`start_round` saves against replay from round 1.

        Returns
        -------
        dict
            ``start_round`` (None: no forgotten client trained here),
            ``rounds_replayed`` (len of the plan), ``rounds_from_round1`` (of
            the plan from round 1), ``retrain_messages_saved`` (retained
            participants' retraining messages of the calibration rounds not
            replayed) and ``refilled_slots`` (substitutes over the plan).
        """
        def messages(plan: Sequence[int]) -> int:
            return sum(len(self.retained(r)) for r in plan[1:])

        return {"start_round": self.start_round if self.plan else None,
                "rounds_replayed": len(self.plan),
                "rounds_from_round1": len(self.full_plan),
                "retrain_messages_saved": messages(self.full_plan) - messages(self.plan),
                "refilled_slots": sum(len(self.substitutes.get(r, ()))
                                      for r in self.plan)}

    def retained(self, rnd: int) -> list[tuple[int, int]]:
        """(partition id, n) of stored round ``rnd``'s participants not forgotten."""
        return [(p, n) for p, n in self.history.participants(self.shard, rnd)
                if p not in self.forget]

    def configure_train(self, server_round: int, arrays: ArrayRecord,
                        config: ConfigRecord, grid: Grid) -> list[Message]:
        """Ask the planned round's retained participants (not in round 1) to retrain.

        With refill, the round's substitutes too (in round 1, only they), and
        the changed participants in every round (L epochs, uncalibrated).
        """
        self._base = to_numpy(arrays)
        self._expected = {}
        if server_round > len(self.plan):
            return []
        rnd = self.plan[server_round - 1]
        retained = self.retained(rnd)
        substitutes = self.substitutes.get(rnd, [])
        if not retained and not substitutes:
            self.skipped_rounds.append(rnd)
            return []
        epochs = (self.exact_epochs if self.is_exact(server_round)
                  else self.retrain_epochs)
        asked = [] if server_round == 1 else [(p, n, epochs) for p, n in retained
                                              if p not in self.changed]
        asked += [(p, None, self.exact_epochs) for p, _ in retained if p in self.changed]
        asked += [(p, None, self.exact_epochs) for p in substitutes]
        messages = []
        for pid, n, local_epochs in asked:
            config_k = ConfigRecord({**dict(config), "local-epochs": local_epochs,
                                     "server-round": server_round,
                                     "history-round": rnd})
            node = self.node_of[pid]
            self._expected[node] = (pid, n)
            messages.append(Message(RecordDict({"arrays": arrays, "config": config_k}),
                                    dst_node_id=node, message_type=UNLEARN_MESSAGE))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Preparation (round 1) or calibration of the replies (later rounds).

        A substitute's reply is used as it is, weighted by its ``num-examples``
        (a reply without a finite one > 0 is dropped).
        """
        if self._base is None:
            raise RuntimeError("aggregate_train called before configure_train")
        if server_round > len(self.plan):
            return None, None
        rnd = self.plan[server_round - 1]
        updates, weights = [], []
        if server_round == 1:  # eq. 2: the retained participants' stored updates
            for pid, n in self.retained(rnd):
                if pid in self.changed:  # computed on erased records: it trained
                    continue
                updates.append(self.history.update(self.shard, rnd, pid))
                weights.append(n)
        for reply in replies:
            if reply.has_error() or reply.metadata.src_node_id not in self._expected:
                continue
            pid, n = self._expected[reply.metadata.src_node_id]
            fresh = difference(to_numpy(reply.content["arrays"]), self._base)
            if n is None:  # a substitute: no stored update to calibrate with
                n = reported_examples(reply)
                if n is None:
                    continue
            elif not self.is_exact(server_round):
                fresh = calibrate(self.history.update(self.shard, rnd, pid), fresh)
            updates.append(fresh)
            weights.append(n)
        if not updates:
            return None, None
        new = weighted_step(self._base, updates, weights)
        return to_record(new), MetricRecord({"clients": len(updates)})

    def configure_evaluate(self, server_round, arrays, config, grid):
        """No federated evaluation while unlearning."""
        return []

    def aggregate_evaluate(self, server_round, replies):
        """No federated evaluation while unlearning."""
        return None

    def summary(self) -> None:
        """Nothing to log beyond the plan."""


MAX_EXAMPLES = 2**31
"""The largest ``num-examples`` a substitute's reply may weigh with."""


def reported_examples(reply: Message) -> int | None:
    """A reply's ``num-examples`` when it is a whole number in 1..MAX_EXAMPLES.

    The app's reply screening (:mod:`server_app.rounds.screening`) already caps
    the count at the samples the client holds; this guards the strategy alone.
    None (the reply is dropped) for anything else: bool, NaN, fractions, huge.
    """
    try:
        raw = reply.content["metrics"]["num-examples"]
    except (KeyError, TypeError):
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    ok = raw == raw and float(raw).is_integer() and 1 <= raw <= MAX_EXAMPLES
    return int(raw) if ok else None


class FrozenShard(Strategy):
    """A shard untouched by unlearning: sends nothing, keeps its model."""

    num_rounds = 0

    def configure_train(self, server_round, arrays, config, grid):
        """No messages."""
        return []

    def aggregate_train(self, server_round, replies):
        """Keep the model (``None``)."""
        return None, None

    def configure_evaluate(self, server_round, arrays, config, grid):
        """No messages."""
        return []

    def aggregate_evaluate(self, server_round, replies):
        """Nothing."""
        return None

    def summary(self) -> None:
        """Nothing to log."""
