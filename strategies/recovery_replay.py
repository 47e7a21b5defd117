"""FedRecover's recovery of one shard from its stored history, without messages.

FedRecover (Cao et al., "FedRecover: Recovering from Poisoning Attacks in
Federated Learning using Historical Information", IEEE S&P 2023) replays the
learning rounds without the forgotten clients, but the server *estimates* most
retained clients' updates instead of asking for them. With W the original
model of a round, U_i a client's stored update from it and W' the recovered
model, the update client i would send from W' is, to first order,

    U'_i = U_i - B_i (W' - W)                                        (Alg. 1)

where B_i approximates the client's (learning-rate-scaled) Hessian: an L-BFGS
approximation (compact form, Byrd, Nocedal and Schnabel 1994, eq. 2.17) built
from pairs (s, y) = (W' - W, -(U' - U)) observed in *exact* rounds,
where the client really trains from W': warm-up rounds at the start, every
T_c-th round (correction) and final tuning rounds at the end. In every other
round no retained participant is contacted (SE-R's ``recovery-refill`` substitutes,
which have no stored update to estimate from, train in every round they fill).

Here an update is the change a client's local training made (``W_after -
W_before``, the history's U), so y = -(U' - U) is the gradient difference up to
the learning rate and the number of steps, and B approximates that scaled
Hessian. A client asked to train does so with the seed (data order) it had in
that learning round: were W' = W, it would send back U exactly. On the paper
preset the estimate measured no closer than U itself
(``docs/results/recovery/estimator.py``).

:class:`RecoveryReplay` is this algorithm on one shard; :mod:`strategies.recovery`
runs it as Flower strategies (SE-R and FRec), which U-LiRA's references run too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from strategies.calibration import (
    difference,
    final_exact_rounds,
    first_participation,
    plan_substitutes,
    weighted_step,
)
from strategies.lbfgs import flat, lbfgs_product, unflat
from strategies.replay import HistoryReader, ReplaySchedule


class RecoveryReplay:
    """FedRecover on one shard's stored history, without messages (the algorithm).

    Server round k recovers stored round ``plan[k - 1]`` = t. The original model
    W^(t-1) of the shard is rebuilt from its stored record (W^(p-1) given, then
    each round's FedAvg of every stored participant, the forgotten included); the
    recovered W'^(t-1) is the model the round loop hands in. Round kinds:

    - k = 1, preparation: W' = W there, so U'_i = U_i: the retained
      participants' stored updates, none of them contacted (as SE's eq. 2);
    - exact (``warmup`` rounds after the first, every ``correction``-th round
      after them, the last ``final`` rounds that have a retained participant):
      the retained participants train from W'^(t-1) as they did in learning
      round t; the round gives the shard a pair (W' - W, the participants' mean
      of -(U'_i - U_i)), the latest
      ``memory`` kept;
    - estimated (the rest): U'_i = U_i - B (W' - W) (:func:`lbfgs_product`), one
      B for the shard's clients. FedRecover keeps pairs per client; here one
      client's pairs from one or two rounds gave estimates of |U' - U| 2 to 50
      times the true one (20 MNIST clients, 2 local epochs), the participants'
      mean far fewer, and memory is ``memory`` vectors a shard, not a client.
      An abnormal estimate
      (``threshold``) is replaced by the client's exact update, as FedRecover's
      abnormality fixing does (Sec. 4.3), so a poor Hessian model costs client
      work, never a diverged model.

    W'^t = W'^(t-1) + sum n_i U'_i / sum n_i over the retained participants.

    With ``refill`` (``recovery-refill``), each forgotten participant's slot of a
    recovered round goes to a retained member of the shard who did not take part
    (:func:`strategies.calibration.refill_slots`); a substitute always trains (it
    has no stored update to estimate from), also in round 1, is weighted by its
    reported sample count and adds no L-BFGS pair.

    Parameters
    ----------
    history : HistoryReader
        The shard's stored history; also ``shard_model`` for W^(p-1).
    shard : int
        Which shard of ``history``.
    forget : Iterable[int]
        Partition ids forgotten so far.
    start_model : Mapping[str, ndarray]
        W^(p-1), the original model before the first recovered round.
    schedule : ReplaySchedule
        FedRecover's ``warmup``, ``correction``, ``final``, ``memory`` and
        ``threshold`` (T_w, T_c, T_f, s, tau), ``from_first_participation``
        (SE's rule, default; False: from round 1, FedRecover's own rule), and
        ``refill`` with ``refill_seed`` and ``present`` (default no refill,
        FedRecover's rule).
    members : Sequence[int]
        Partition ids of the shard, which ``schedule.refill`` draws substitutes
        from (:meth:`strategies.replay.ReplaySchedule.pool`); out-of-range
        settings are refused when the schedule is made.

    Use: per server round k, :meth:`begin` (W'^(k-1) in, the retained participants
    to train out), then :meth:`finish` with their updates. :class:`RecoveredShard`
    drives it with Flower messages.
    """

    def __init__(self, history: HistoryReader, shard: int, forget: Iterable[int],
                 start_model: Mapping[str, np.ndarray],
                 schedule: ReplaySchedule = ReplaySchedule(), *,
                 members: Sequence[int] = ()) -> None:
        self.threshold = float(schedule.threshold)
        self.history, self.shard = history, shard
        self.forget = frozenset(forget)
        self.warmup, self.correction, self.final, self.memory = (
            schedule.warmup, schedule.correction, schedule.final, schedule.memory)
        rounds = list(history.rounds(shard))
        first = first_participation(history, shard, self.forget)
        start = ((first if schedule.from_first_participation else 1)
                 if first is not None else None)
        self.plan = [r for r in rounds if start is not None and r >= start]
        self.start_round = self.plan[0] if self.plan else None
        self.substitutes = plan_substitutes(history, shard, self.plan,
                                            schedule.pool(members), self.forget,
                                            schedule.refill_seed)
        self._final_rounds = final_exact_rounds(  # a skipped round is never one
            [bool(self.retained(r) or self.substitutes.get(r)) for r in self.plan],
            self.final)
        self._original = {k: np.asarray(v) for k, v in start_model.items()}
        self._shared: list[tuple[np.ndarray, np.ndarray]] = []
        self._base: dict[str, np.ndarray] | None = None
        self._estimates: dict[int, dict] = {}
        self._stored: dict[int, dict] = {}
        self._shift = np.zeros(0)

    @property
    def num_rounds(self) -> int:
        """Server rounds: one per stored round from the start round on."""
        return len(self.plan)

    def is_exact(self, server_round: int) -> bool:
        """Whether server round k asks the retained participants to train."""
        k, n = server_round, len(self.plan)
        if k <= 1 or k > n:
            return False
        if k <= 1 + self.warmup or k in self._final_rounds:
            return True
        return self.correction > 0 and (k - 1 - self.warmup) % self.correction == 0

    def retained(self, rnd: int) -> list[tuple[int, int]]:
        """(partition id, n) of stored round ``rnd``'s participants not forgotten."""
        return [(p, n) for p, n in self.history.participants(self.shard, rnd)
                if p not in self.forget]

    def replay_report(self) -> dict:
        """What the recovery of this shard will replay.

        ``start_round``, ``rounds_replayed``, ``exact_rounds_planned`` (warm-up,
        correction, final; abnormal estimates may add client work in others) and
        ``refilled_slots`` (substitutes over the plan).
        """
        return {"start_round": self.start_round, "rounds_replayed": len(self.plan),
                "exact_rounds_planned": sum(self.is_exact(k)
                                            for k in range(1, len(self.plan) + 1)),
                "refilled_slots": sum(map(len, self.substitutes.values()))}

    def begin(self, server_round: int, base: Mapping[str, np.ndarray]
              ) -> list[tuple[int, int | None]]:
        """Start server round k from W'^(k-1) = ``base``: who must train.

        In an exact round every retained participant; in an estimated round only
        those whose estimate is abnormal (FedRecover's abnormality fixing):
        ``||U' - U|| > threshold * ||U||``, a correction larger than the
        learning-time update allows, which the L-BFGS model cannot be trusted for.
        They train from ``base`` as in stored round :meth:`stored_round` (k).
        With refill, the round's substitutes too.

        Returns
        -------
        list of (partition id, n)
            n None for a substitute (its count comes with its update); [] outside
            1..``num_rounds``.
        """
        self._base = {k: np.asarray(v) for k, v in base.items()}
        self._estimates, self._stored = {}, {}
        if not 1 <= server_round <= len(self.plan):
            return []
        rnd = self.plan[server_round - 1]
        everyone = self.history.participants(self.shard, rnd)
        self._stored = {p: self.history.update(self.shard, rnd, p) for p, _ in everyone}
        self._shift = flat(difference(self._base, self._original))
        substitutes = [(p, None) for p in self.substitutes.get(rnd, [])]
        if self.is_exact(server_round):
            return [*self.retained(rnd), *substitutes]
        ask: list[tuple[int, int | None]] = list(substitutes)
        for pid, n in self.retained(rnd):
            estimate = self._estimate(pid, self._stored[pid], self._shift, server_round)
            if self._abnormal(estimate, self._stored[pid]):
                ask.append((pid, n))
            else:
                self._estimates[pid] = estimate
        return ask

    def stored_round(self, server_round: int) -> int:
        """The stored (learning) round that server round k recovers."""
        return self.plan[server_round - 1]

    @property
    def estimates(self) -> dict[int, dict[str, np.ndarray]]:
        """Partition id -> U' = U - B (W' - W) of the round begun last.

        The participants whose estimate passed the abnormality check (the
        estimator's audit, ``docs/results/recovery/estimator.py``); empty in an
        exact round; in round 1 the stored updates themselves.
        """
        return {pid: {k: np.array(v) for k, v in u.items()}
                for pid, u in self._estimates.items()}

    @property
    def base(self) -> dict[str, np.ndarray] | None:
        """W'^(k-1) of the round begun last (None before :meth:`begin`)."""
        return self._base

    def finish(self, server_round: int, exact: Mapping[int, Mapping[str, np.ndarray]],
               sizes: Mapping[int, float] | None = None) -> dict[str, np.ndarray] | None:
        """W'^k from the clients' updates ``exact`` and the estimates; W^k advanced.

        Parameters
        ----------
        server_round : int
            k, as given to :meth:`begin`.
        exact : Mapping[int, Mapping[str, ndarray]]
            Partition id -> U' = w - W'^(k-1) of the clients that trained (a
            client asked but missing gets its estimate or, abnormal, its stored
            update: the model stays finite).
        sizes : Mapping[int, float], optional
            Substitute -> its sample count (> 0); a substitute missing from
            ``exact`` or ``sizes`` is left out.

        Returns
        -------
        dict or None
            W'^k (layer name -> ndarray), None when the round has no retained
            participant.

        Raises
        ------
        RuntimeError
            Called before :meth:`begin`.
        """
        if self._base is None:
            raise RuntimeError("finish called before begin")
        if server_round > len(self.plan):
            return None
        rnd = self.plan[server_round - 1]
        exact = {pid: dict(u) for pid, u in exact.items()}
        ys = [-(flat(u) - flat(self._stored[pid])) for pid, u in exact.items()
              if pid in self._stored]
        if ys and self._shift.any():
            self._shared = [*self._shared,
                            (self._shift, np.mean(ys, axis=0))][-self.memory:]
        updates, weights = [], []
        for pid, n in self.retained(rnd):
            update = exact.get(pid) or self._estimates.get(pid)
            if update is None:
                estimate = self._estimate(pid, self._stored[pid], self._shift,
                                          server_round)
                update = self._stored[pid] if self._abnormal(
                    estimate, self._stored[pid]) else estimate
            updates.append(update)
            weights.append(n)
        for pid in self.substitutes.get(rnd, []):
            if pid in exact and (sizes or {}).get(pid):
                updates.append(exact[pid])
                weights.append(sizes[pid])
        everyone = self.history.participants(self.shard, rnd)
        self._original = weighted_step(self._original,
                                       [self._stored[p] for p, _ in everyone],
                                       [n for _, n in everyone])
        return weighted_step(self._base, updates, weights) if updates else None

    def _abnormal(self, estimate: Mapping[str, np.ndarray],
                  stored: Mapping[str, np.ndarray]) -> bool:
        """Whether the estimate moved further from ``stored`` than the threshold allows."""
        base = flat(stored)
        return bool(np.linalg.norm(flat(estimate) - base)
                    > self.threshold * np.linalg.norm(base))

    def _estimate(self, pid: int, stored: Mapping[str, np.ndarray], shift: np.ndarray,
                  server_round: int) -> dict[str, np.ndarray]:
        """U'_i = U_i - B (W' - W) (the stored update itself while W' = W)."""
        if server_round == 1 or not shift.any():
            return dict(stored)
        correction = lbfgs_product(self._shared, shift)
        return unflat(flat(stored) - correction, stored)
