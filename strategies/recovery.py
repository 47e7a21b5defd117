"""Server-side recovery from the stored history: FedRecover, and SE-R inside a shard.

FedRecover (Cao et al., "FedRecover: Recovering from Poisoning Attacks in
Federated Learning using Historical Information", IEEE S&P 2023) replays the
learning rounds without the forgotten clients, but the server *estimates* most
retained clients' updates instead of asking for them. With W the original
model of a round, U_i a client's stored update from it and W' the recovered
model, the update client i would send from W' is, to first order,

    U'_i = U_i - B_i (W' - W)                                        (Alg. 1)

where B_i approximates the client's (learning-rate-scaled) Hessian. B_i is an
L-BFGS approximation (compact form, Byrd, Nocedal and Schnabel 1994, eq. 2.17)
built from pairs (s, y) = (W' - W, -(U'_i - U_i)) observed in *exact* rounds,
where the client really trains from W': warm-up rounds at the start, every
T_c-th round (correction) and final tuning rounds at the end. In every other
round no client is contacted.

Here an update is the change a client's local training made (``W_after -
W_before``, the history's U), so y = -(U' - U) is the gradient difference up to
the learning rate and the number of steps, and B approximates that scaled
Hessian. An exact round sends ordinary ``train`` messages with the learning
round's number, so a client trains with the seed (data order) it had in that
round of learning: were W' = W, it would send back U exactly.

:class:`RecoveredShard` recovers one shard; :class:`ShardRecovery` (SE-R) does so
for the impacted shards of Sharding Eraser's federation and freezes the others
bit for bit; :class:`FedRecover` (FRec) is the one-shard, unsharded baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.calibration import difference, first_participation, weighted_step
from strategies.sharded import ShardedStrategy, to_numpy, to_record
from strategies.unlearning import FrozenShard, HistoryReader

TRAIN_MESSAGE = "train"


def lbfgs_product(pairs: Sequence[tuple[np.ndarray, np.ndarray]], v: np.ndarray
                  ) -> np.ndarray:
    """B v for the L-BFGS Hessian approximation B of ``pairs`` (compact form).

    ``B = sigma I - [sigma S, Y] M^-1 [sigma S^T; Y^T]`` with
    ``M = [[sigma S^T S, L], [L^T, -D]]``, ``S^T Y = L + D + U`` (strictly lower,
    diagonal, strictly upper) and ``sigma = y^T y / s^T y`` of the newest pair
    (Byrd, Nocedal and Schnabel 1994, eq. 2.17; FedRecover Alg. 2). Pairs that
    break the curvature condition ``s^T y > 0`` are left out (B would not be
    positive definite); with none left, B = 0 (the stored update is used as is).

    Parameters
    ----------
    pairs : Sequence[tuple[ndarray, ndarray]]
        (s, y), oldest first, each float64 of shape (d,).
    v : ndarray
        float64, shape (d,).

    Returns
    -------
    ndarray
        float64, shape (d,).
    """
    good = [(s, y) for s, y in pairs if float(s @ y) > 1e-12 * float(s @ s)]
    if not good:
        return np.zeros_like(v)
    s_mat = np.stack([s for s, _ in good], axis=1)  # S, (d, m)
    y_mat = np.stack([y for _, y in good], axis=1)  # Y, (d, m)
    s_new, y_new = good[-1]
    sigma = float(y_new @ y_new) / float(s_new @ y_new)
    sy = s_mat.T @ y_mat
    lower = np.tril(sy, -1)
    middle = np.block([[sigma * (s_mat.T @ s_mat), lower],
                       [lower.T, -np.diag(np.diag(sy))]])
    rhs = np.concatenate([sigma * (s_mat.T @ v), y_mat.T @ v])
    coef = np.linalg.lstsq(middle, rhs, rcond=None)[0]
    m = s_mat.shape[1]
    return sigma * v - (sigma * (s_mat @ coef[:m]) + y_mat @ coef[m:])


class RecoveredShard(Strategy):
    """FedRecover on one shard's stored history (server-estimated updates).

    Server round k recovers stored round ``plan[k - 1]`` = t. The original model
    W^(t-1) of the shard is rebuilt from its stored record (W^(p-1) given, then
    each round's FedAvg of every stored participant, the forgotten included); the
    recovered W'^(t-1) is the model the round loop hands in. Round kinds:

    - k = 1, preparation: W' = W there, so U'_i = U_i: the retained
      participants' stored updates, no client contacted (as SE's eq. 2);
    - exact (``warmup`` rounds after the first, every ``correction``-th round
      after them, the last ``final`` rounds): the retained participants train
      from W'^(t-1) as they did in learning round t; each reply gives client i a
      pair (W' - W, -(U'_i - U_i)), at most ``memory`` kept per client;
    - estimated (the rest): U'_i = U_i - B_i (W' - W) (:func:`lbfgs_product`),
      B_i from client i's pairs, or from the shard's latest ``memory`` pairs
      (the participants' mean) while client i has none.

    W'^t = W'^(t-1) + sum n_i U'_i / sum n_i over the retained participants.

    Parameters
    ----------
    history : HistoryReader
        The shard's stored history; also ``shard_model`` for W^(p-1).
    shard : int
        Which shard of ``history``.
    forget : Iterable[int]
        Partition ids forgotten so far.
    node_of : Mapping[int, int]
        partition id -> Flower node id.
    start_model : Mapping[str, ndarray]
        W^(p-1), the original model before the first recovered round.
    warmup, correction, final, memory : int
        T_w >= 0, T_c >= 1 (0: no correction rounds), T_f >= 0, s >= 1.
    from_first_participation : bool
        Recover from the first round a forgotten client took part in (SE's rule,
        default); False: from round 1 (FedRecover's own rule).

    Raises
    ------
    ValueError
        A setting out of range.
    """

    def __init__(self, history: HistoryReader, shard: int, forget: Iterable[int],
                 node_of: Mapping[int, int], start_model: Mapping[str, np.ndarray],
                 warmup: int = 2, correction: int = 4, final: int = 1, memory: int = 2,
                 from_first_participation: bool = True) -> None:
        for name, value, low in (("warmup", warmup, 0), ("correction", correction, 0),
                                 ("final", final, 0), ("memory", memory, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"recovery {name} = {value!r} must be an int >= {low}")
        self.history, self.shard = history, shard
        self.forget = frozenset(forget)
        self.node_of = dict(node_of)
        self.warmup, self.correction, self.final, self.memory = \
            warmup, correction, final, memory
        rounds = list(history.rounds(shard))
        first = first_participation(history, shard, self.forget)
        start = (first if from_first_participation else 1) if first is not None else None
        self.plan = [r for r in rounds if start is not None and r >= start]
        self.start_round = self.plan[0] if self.plan else None
        self._original = {k: np.asarray(v) for k, v in start_model.items()}
        self._pairs: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._shared: list[tuple[np.ndarray, np.ndarray]] = []
        self._base: dict[str, np.ndarray] | None = None
        self._expected: dict[int, tuple[int, int]] = {}
        self.exact_rounds: list[int] = []

    @property
    def num_rounds(self) -> int:
        """Server rounds: one per stored round from the start round on."""
        return len(self.plan)

    def is_exact(self, server_round: int) -> bool:
        """Whether server round k asks the retained participants to train."""
        k, n = server_round, len(self.plan)
        if k <= 1 or k > n:
            return False
        if k <= 1 + self.warmup or k > n - self.final:
            return True
        return self.correction > 0 and (k - 1 - self.warmup) % self.correction == 0

    def retained(self, rnd: int) -> list[tuple[int, int]]:
        """(partition id, n) of stored round ``rnd``'s participants not forgotten."""
        return [(p, n) for p, n in self.history.participants(self.shard, rnd)
                if p not in self.forget]

    def replay_report(self) -> dict:
        """``start_round``, ``rounds_replayed`` and ``exact_rounds`` (client work)."""
        return {"start_round": self.start_round, "rounds_replayed": len(self.plan),
                "exact_rounds": sum(self.is_exact(k)
                                    for k in range(1, len(self.plan) + 1))}

    def configure_train(self, server_round: int, arrays: ArrayRecord,
                        config: ConfigRecord, grid: Grid) -> list[Message]:
        """``train`` messages in an exact round; none otherwise."""
        self._base = to_numpy(arrays)
        self._expected = {}
        if not self.is_exact(server_round):
            return []
        rnd = self.plan[server_round - 1]
        config = ConfigRecord(dict(config))
        config["server-round"] = rnd  # learning's seed for round rnd
        content = RecordDict({"arrays": arrays, "config": config})
        messages = []
        for pid, n in self.retained(rnd):
            self._expected[self.node_of[pid]] = (pid, n)
            messages.append(Message(content, dst_node_id=self.node_of[pid],
                                    message_type=TRAIN_MESSAGE))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """W'^t from the exact and estimated updates; W^t advanced alongside."""
        if self._base is None:
            raise RuntimeError("aggregate_train called before configure_train")
        if server_round > len(self.plan):
            return None, None
        rnd = self.plan[server_round - 1]
        everyone = self.history.participants(self.shard, rnd)
        stored = {p: self.history.update(self.shard, rnd, p) for p, _ in everyone}
        shift = _flat(difference(self._base, self._original))
        exact = self._exact_updates(replies, stored, shift)
        if exact:
            self.exact_rounds.append(rnd)
        updates, weights = [], []
        for pid, n in self.retained(rnd):
            updates.append(exact[pid] if pid in exact else
                           self._estimate(pid, stored[pid], shift, server_round))
            weights.append(n)
        self._original = weighted_step(self._original, [stored[p] for p, _ in everyone],
                                       [n for _, n in everyone])
        if not updates:
            return None, None
        new = weighted_step(self._base, updates, weights)
        return to_record(new), MetricRecord({"clients": len(updates),
                                             "exact": len(exact)})

    def _exact_updates(self, replies: Iterable[Message], stored: dict, shift: np.ndarray
                       ) -> dict[int, dict]:
        """Client updates of the replies; each gives its client (and the shard) a pair."""
        exact, ys = {}, []
        for reply in replies:
            if reply.has_error() or reply.metadata.src_node_id not in self._expected:
                continue
            pid, _ = self._expected[reply.metadata.src_node_id]
            exact[pid] = difference(to_numpy(reply.content["arrays"]), self._base)
            y = -(_flat(exact[pid]) - _flat(stored[pid]))
            self._pairs[pid] = [*self._pairs.get(pid, []), (shift, y)][-self.memory:]
            ys.append(y)
        if ys and shift.any():
            self._shared = [*self._shared, (shift, np.mean(ys, axis=0))][-self.memory:]
        return exact

    def _estimate(self, pid: int, stored: Mapping[str, np.ndarray], shift: np.ndarray,
                  server_round: int) -> dict[str, np.ndarray]:
        """U'_i = U_i - B_i (W' - W) (the stored update itself in round 1)."""
        if server_round == 1 or not shift.any():
            return dict(stored)
        correction = lbfgs_product(self._pairs.get(pid) or self._shared, shift)
        return _unflat(_flat(stored) - correction, stored)

    def configure_evaluate(self, server_round, arrays, config, grid):
        """No federated evaluation while unlearning."""
        return []

    def aggregate_evaluate(self, server_round, replies):
        """No federated evaluation while unlearning."""
        return None

    def summary(self) -> None:
        """Nothing to log beyond the plan."""


def _flat(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """The floating layers of ``arrays`` as one float64 vector (sorted keys)."""
    return np.concatenate([np.ravel(np.asarray(arrays[k], np.float64))
                           for k in sorted(arrays)
                           if np.issubdtype(np.asarray(arrays[k]).dtype, np.inexact)]
                          or [np.zeros(0)])


def _unflat(vector: np.ndarray, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``vector`` cut back into ``like``'s floating layers; other layers copied."""
    out, at = {}, 0
    for key in sorted(like):
        value = np.asarray(like[key])
        if np.issubdtype(value.dtype, np.inexact):
            out[key] = vector[at:at + value.size].reshape(value.shape).astype(value.dtype)
            at += value.size
        else:
            out[key] = value.copy()
    return {k: out[k] for k in like}


class ShardRecovery(ShardedStrategy):
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
    settings : dict
        ``warmup``, ``correction``, ``final``, ``memory``, and
        ``from_first_participation`` for :class:`RecoveredShard`.

    Raises
    ------
    ValueError
        As :class:`RecoveredShard`, or a shard that would lose every client.
    """

    def __init__(self, history: HistoryReader, forget: Iterable[int],
                 shards: Sequence[Sequence[int]], node_of: Mapping[int, int],
                 start_models: Mapping[int, Mapping[str, np.ndarray]],
                 impacted: Iterable[int], **settings) -> None:
        forget = frozenset(forget)
        for s, pids in enumerate(shards):
            if set(pids) <= forget:
                raise ValueError(f"forgetting {sorted(forget)} would empty shard {s}")
        self.impacted = sorted(set(impacted))
        subs: list[Strategy] = [
            RecoveredShard(history, s, forget, node_of, start_models[s], **settings)
            if s in self.impacted else FrozenShard() for s in range(len(shards))]
        super().__init__(subs, [[node_of[p] for p in pids] for pids in shards],
                         seed=None)

    @property
    def num_rounds(self) -> int:
        """Server rounds: the longest plan of an impacted shard."""
        return max((getattr(s, "num_rounds", 0) for s in self.shard_strategies),
                   default=0)

    def replay_report(self) -> dict[int, dict]:
        """Impacted shard -> :meth:`RecoveredShard.replay_report`."""
        return {s: self.shard_strategies[s].replay_report() for s in self.impacted}


class FedRecover(ShardRecovery):
    """FRec: FedRecover on the unsharded federation, from round 1 (Cao et al., 2023).

    Same parameters as :class:`ShardRecovery`, with ``shards`` one list of every
    client and ``history`` the unsharded federation's own store.
    """
