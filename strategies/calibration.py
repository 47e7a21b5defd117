"""The arithmetic of calibrated retraining (numpy in, numpy out).

Models and updates are dicts of layer name -> ndarray, with the same keys: float32
parameters, and any buffers a model holds (e.g. BatchNorm's running statistics and
its int64 ``num_batches_tracked``). Updates are float32; a model keeps its dtypes
(integer layers rounded).

- Preparation, paper eq. 2: W'^1 = W^0 + sum_m n_m U_m^1 / sum_m n_m over the
  retained participants of round 1 (:func:`weighted_step`).
- Calibration, paper eq. 3 (FedEraser's rule, Liu et al., IWQoS 2021, eq. 6):
  per layer l, U~_m[l] = ||U_m[l]|| * U^_m[l] / ||U^_m[l]||: the new direction of
  the retained client's retrained update U^ with the magnitude of its stored
  update U of the same round (:func:`calibrate`); then
  W'^g = W'^(g-1) + sum_m n_m U~_m / sum_m n_m (:func:`weighted_step`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

Arrays = Mapping[str, np.ndarray]


def _check_keys(a: Arrays, b: Arrays, what: str) -> None:
    if list(a) != list(b):
        raise ValueError(f"{what}: layer names differ: {list(a)} vs {list(b)}")
    for key in a:
        if np.shape(a[key]) != np.shape(b[key]):
            raise ValueError(f"{what}: layer {key!r} has shape {np.shape(a[key])} "
                             f"vs {np.shape(b[key])}")


def calibrate(stored: Arrays, retrained: Arrays) -> dict[str, np.ndarray]:
    """Layer-wise calibration U~ = ||U|| * U^ / ||U^|| (Frobenius norm per layer).

    Parameters
    ----------
    stored : Mapping[str, ndarray]
        U, the client's update of this round from the original training.
    retrained : Mapping[str, ndarray]
        U^, the same client's update when retraining from the unlearned model.

    Returns
    -------
    dict[str, ndarray]
        float32, same keys and shapes. A layer whose U^ has zero norm (no
        direction) gives a zero layer rather than NaN.

    Raises
    ------
    ValueError
        Different layer names or shapes.
    """
    _check_keys(stored, retrained, "calibrate")
    out = {}
    for key, new in retrained.items():
        new = np.asarray(new, dtype=np.float64)
        norm_new = float(np.linalg.norm(new))
        norm_old = float(np.linalg.norm(np.asarray(stored[key], dtype=np.float64)))
        if norm_new == 0.0 or not np.isfinite(norm_new):
            out[key] = np.zeros(new.shape, dtype=np.float32)
        else:
            out[key] = (new * (norm_old / norm_new)).astype(np.float32)
    return out


def weighted_step(base: Arrays, updates: Sequence[Arrays], weights: Sequence[float]
                  ) -> dict[str, np.ndarray]:
    """W + sum_m w_m U_m / sum_m w_m (FedAvg of updates applied to ``base``).

    Parameters
    ----------
    base : Mapping[str, ndarray]
        The current model W.
    updates : Sequence[Mapping[str, ndarray]]
        One update per client, same layers as ``base``.
    weights : Sequence[float]
        Example counts n_m (> 0).

    Returns
    -------
    dict[str, ndarray]
        In the dtypes of ``base`` (floating layers cast, integer layers such as
        ``num_batches_tracked`` rounded). With no updates, a copy of ``base`` (a
        skipped round).

    Raises
    ------
    ValueError
        Length mismatch, a non-positive weight, or mismatched layers.
    """
    if len(updates) != len(weights):
        raise ValueError(f"{len(updates)} updates but {len(weights)} weights")
    if any(not w > 0 for w in weights):
        raise ValueError(f"weights must be positive example counts, got {list(weights)}")
    total = float(sum(weights))
    out = {k: np.asarray(v, dtype=np.float64).copy() for k, v in base.items()}
    for update, weight in zip(updates, weights, strict=True):
        _check_keys(base, update, "weighted_step")
        for key in out:
            out[key] += (weight / total) * np.asarray(update[key], dtype=np.float64)
    return {k: _as_dtype(v, np.asarray(base[k]).dtype) for k, v in out.items()}


def _as_dtype(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` (float64) in ``dtype``: floats cast, integers rounded first."""
    if np.issubdtype(dtype, np.inexact):
        return values.astype(dtype)
    return np.rint(values).astype(dtype)


def difference(model: Arrays, base: Arrays) -> dict[str, np.ndarray]:
    """The update ``model - base`` per layer (float32)."""
    _check_keys(base, model, "difference")
    return {k: (np.asarray(model[k], np.float32) - np.asarray(base[k], np.float32))
            for k in base}


def calibration_plan(rounds: Sequence[int], interval: int) -> list[int]:
    """Stored rounds used by calibrated retraining: 1, 1 + dt, 1 + 2 dt, ...

    FedEraser calibrates every ``interval`` (dt) rounds; round 1 is the
    preparation round (eq. 2). Raises ValueError for ``interval < 1``.
    """
    if interval < 1:
        raise ValueError(f"calibration-interval = {interval} is not allowed: >= 1")
    return [r for r in rounds if (r - 1) % interval == 0]


def final_exact_rounds(trains: Sequence[bool], final: int) -> set[int]:
    """Which server rounds of a replay are its ``final`` exact rounds (SE's default 1).

    Parameters
    ----------
    trains : sequence of bool
        Per server round k = 1, 2, ... of the plan: whether its stored round has a
        retained participant (a round without one is skipped, so it cannot be the
        exact round).
    final : int
        How many exact rounds at the end (>= 0).

    Returns
    -------
    set of int
        The last ``final`` server rounds k > 1 that train: round 1 is the
        preparation (eq. 2), never an exact round.
    """
    training = [k for k, has in enumerate(trains, start=1) if has and k > 1]
    return set(training[len(training) - final:]) if final > 0 else set()


def refill_slots(participants: Iterable[int], members: Iterable[int],
                 forget: Iterable[int], seed: Sequence[int]) -> list[int]:
    """Retained shard members who take the forgotten participants' slots of a round.

    Replaying a stored round without its forgotten participants trains the shard
    on fewer client updates than learning did (and than FedRetrain, which samples
    each round from the retained clients only). Refilling gives each forgotten
    participant's slot to a retained member of the shard who did not take part in
    that round, drawn uniformly without replacement, as the learning sampler
    would have drawn from the retained clients.

    Parameters
    ----------
    participants : Iterable[int]
        Partition ids of the stored round's participants.
    members : Iterable[int]
        Partition ids of the shard.
    forget : Iterable[int]
        Partition ids forgotten so far.
    seed : sequence of int (each >= 0)
        Seeds the draw (e.g. run seed, shard, stored round): reproducible.

    Returns
    -------
    list of int
        Sorted substitutes, one per forgotten participant (fewer when the shard
        has too few retained members left out of the round); [] when no
        participant is forgotten.
    """
    participants, forget = set(participants), set(forget)
    lost = len(participants & forget)
    pool = sorted(set(members) - forget - participants)
    take = min(lost, len(pool))
    if not take:
        return []
    chosen = np.random.default_rng(list(seed)).choice(pool, size=take, replace=False)
    return sorted(int(p) for p in chosen)


def refill_pool(members: Sequence[int], present: Callable[[int], Collection[int]] | None
                ) -> Sequence[int] | Callable[[int], list[int]]:
    """The members a shard may refill from: all, or per stored round those present.

    ``present`` (staged runs) maps a stored round to the clients taking part in
    its stage; a client that had not joined yet, or had left, is never drawn.
    """
    if present is None:
        return members

    def pool(rnd: int) -> list[int]:
        here = set(present(rnd))
        return [p for p in members if p in here]

    return pool


def plan_substitutes(history, shard: int, plan: Sequence[int],
                     members: Sequence[int] | Callable[[int], Iterable[int]] | None,
                     forget: Iterable[int], seed: int) -> dict[int, list[int]]:
    """Stored round -> its substitutes (:func:`refill_slots`), for a replay's plan.

    ``members`` as :func:`refill_pool` returns it (None: no refill, {}); each
    round's draw is seeded by (``seed``, ``shard``, round).
    """
    if members is None:
        return {}
    return {r: refill_slots([p for p, _ in history.participants(shard, r)],
                            members(r) if callable(members) else members,
                            forget, (seed, shard, r)) for r in plan}


def first_participation(history, shard: int, clients: Iterable[int]
                        ) -> int | None:
    """The first stored round of ``shard`` in which one of ``clients`` took part.

    Parameters
    ----------
    history : strategies.unlearning.HistoryReader
        The shard's stored history (``rounds``, ``participants``).
    shard : int
        Which shard.
    clients : Iterable[int]
        Partition ids.

    Returns
    -------
    int or None
        The round (>= 1), or None when none of ``clients`` ever trained there:
        the shard's models never depended on them.
    """
    clients = frozenset(clients)
    for rnd in history.rounds(shard):
        if any(p in clients for p, _ in history.participants(shard, rnd)):
            return rnd
    return None
