"""Federated partitions of labelled samples (image tasks): ``iid`` and ``noniid``.

Paper, Section "Experiments":

- ``iid``: equal random parts;
- ``noniid``: equal parts in which a fraction ``primary_fraction`` (80%) of
  each client's samples come from one *primary* class
  (:func:`partition_indices`, sizes from :func:`noniid_client_size`).

The text task has no labels to skew: :func:`task.text.partition_text` splits
its blocks into contiguous ranges under the same scheme names.
"""

from __future__ import annotations

import logging

import numpy as np

from task.config import is_int

log = logging.getLogger(__name__)

OWN_SCHEMES = ("iid", "noniid")
"""The schemes split here; the others of :data:`task.config.PARTITIONS` are Flower
Datasets' partitioners (:mod:`task.partitioners`)."""


def partition_indices(labels: np.ndarray, num_clients: int, scheme: str, seed: int,
                      primary_fraction: float = 0.8) -> list[np.ndarray]:
    """Split labelled samples over clients (image tasks).

    ``iid``: a seeded permutation cut into ``C`` equal parts of ``N // C``
    samples (the last ``N mod C`` samples of the permutation are unused).

    ``noniid`` (paper: "80% of each client's samples from one primary
    class"): every client gets the same number ``size`` of samples, of which
    ``round(primary_fraction * size)`` come from its primary class and the rest
    from the other classes.  Primary classes are spread evenly: each class is
    primary for ``C // K`` or ``C // K + 1`` clients (``K`` classes; the extra
    slots go to the largest classes, ties broken by the seed), assigned to
    clients in seeded random order.  The non-primary samples are a seeded
    random draw from what is left of the other classes.  ``size`` is
    ``N // C`` where the classes can supply it, else the largest size they can
    (:func:`noniid_client_size`; e.g. MNIST with 8 clients: not 7500 because class
    8 has only 5851 samples for its primary client: 7314); so any ``C`` works, and
    where ``N // C`` is feasible the partition is the one of earlier versions.

    For the text task, use :func:`task.text.partition_text`, which
    splits training blocks (no labels) into contiguous ranges instead.

    Parameters
    ----------
    labels : np.ndarray
        Integer class labels, shape (N,).
    num_clients : int
        Number of clients ``C`` >= 1.
    scheme : {"iid", "noniid"}
        Partition scheme.
    seed : int
        Seed; same arguments, same partition.
    primary_fraction : float
        Fraction of a ``noniid`` client's samples from its primary class, in [0, 1].

    Returns
    -------
    list of np.ndarray
        ``C`` sorted int64 index arrays of equal length, pairwise disjoint.

    Raises
    ------
    ValueError
        If ``scheme`` is unknown, ``num_clients`` < 1 or > N, ``primary_fraction``
        is outside [0, 1], or the ``noniid`` split is infeasible even with one
        sample per client (a class has fewer samples than primary clients).
    """
    labels = np.asarray(labels).reshape(-1)
    n = len(labels)
    if scheme not in OWN_SCHEMES:
        raise ValueError(f"partition={scheme!r} is not one of {OWN_SCHEMES} (the "
                         "others: task.partitioners.label_partition)")
    if not is_int(num_clients) or not 1 <= num_clients <= n:
        raise ValueError(f"num-clients={num_clients!r} must be an integer in [1, {n}]")
    if not 0.0 <= primary_fraction <= 1.0:
        raise ValueError(f"primary_fraction={primary_fraction!r} must be in [0, 1]")
    rng = np.random.default_rng(seed)
    size = n // num_clients
    if scheme == "iid":
        perm = rng.permutation(n)[: size * num_clients].reshape(num_clients, size)
        return [np.sort(row).astype(np.int64) for row in perm]
    return _noniid(labels, num_clients, size, primary_fraction, rng)


def _noniid_sizes(counts: np.ndarray, slots: np.ndarray, num_clients: int,
                  size: int, primary_fraction: float) -> np.ndarray:
    """Candidate client sizes ``size, size - 1, ..., 1`` that the classes can supply.

    Size ``s`` (``p = round(f s)`` primary and ``o = s - p`` other samples a
    client) is feasible when every class c holds its primaries,
    ``slots[c] p <= counts[c]``, and the leftovers can fill every client's
    other samples without giving a client its own class:
    ``sum_c min(counts[c] - slots[c] p, (C - slots[c]) o) >= C o``.
    Returns the feasible sizes, largest first (int64, possibly empty).
    """
    sizes = np.arange(size, 0, -1, dtype=np.int64)
    n_p = np.rint(primary_fraction * sizes.astype(np.float64)).astype(np.int64)
    n_o = sizes - n_p
    left = counts[None, :] - slots[None, :] * n_p[:, None]
    cap = (num_clients - slots[None, :]) * n_o[:, None]
    supply = np.minimum(left, cap).sum(axis=1)
    ok = (left >= 0).all(axis=1) & (supply >= num_clients * n_o)
    return sizes[ok]


def _primary_slots(counts: np.ndarray, num_clients: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Primary clients per class: C // K each, the extra ones to the largest classes."""
    k = len(counts)
    slots = np.full(k, num_clients // k)
    tiebreak = rng.permutation(k)
    extra = np.lexsort((tiebreak, -counts))[: num_clients % k]
    slots[extra] += 1
    return slots


def noniid_client_size(labels: np.ndarray, num_clients: int, seed: int,
                       primary_fraction: float = 0.8) -> int:
    """Samples per client of the ``noniid`` partition (see :func:`partition_indices`).

    ``N // C`` where the classes can supply it, else the largest size they can.

    Parameters
    ----------
    labels : np.ndarray
        Integer class labels, shape (N,), at least 2 classes.
    num_clients : int
        ``C``, 1 <= C <= N.
    seed : int
        The partition seed (it breaks ties between equally large classes).
    primary_fraction : float
        Fraction of a client's samples from its primary class, in [0, 1].

    Returns
    -------
    int
        Samples per client (>= 1).

    Raises
    ------
    ValueError
        Fewer than 2 classes, or no size >= 1 is feasible (naming ``num-clients``).
    """
    labels = np.asarray(labels).reshape(-1)
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise ValueError("partition='noniid' needs at least 2 classes; got "
                         f"{len(classes)}")
    slots = _primary_slots(counts, num_clients, np.random.default_rng(seed))
    return _feasible_size(classes, counts, slots, num_clients, len(labels) // num_clients,
                          primary_fraction)


def _feasible_size(classes: np.ndarray, counts: np.ndarray, slots: np.ndarray,
                   num_clients: int, size: int, primary_fraction: float) -> int:
    feasible = _noniid_sizes(counts, slots, num_clients, size, primary_fraction)
    if len(feasible) == 0:
        c = int(np.argmax(slots - counts))
        raise ValueError(
            f"num-clients={num_clients} with partition='noniid' is infeasible: class "
            f"{classes[c]} has {counts[c]} samples for {slots[c]} primary clients; "
            "use fewer clients")
    if feasible[0] < size:
        log.debug("noniid: %d samples per client instead of N // C = %d (class "
                  "supply)", feasible[0], size)
    return int(feasible[0])


def _capped_pool(pool_idx: np.ndarray, pool_cls: np.ndarray, cap: np.ndarray,
                 need: int) -> np.ndarray:
    """The first ``need`` of the shuffled pool, taking at most ``cap[c]`` of class c.

    Equals ``pool_idx[:need]`` whenever no class exceeds its cap there.
    """
    rank = np.empty(len(pool_idx), dtype=np.int64)
    for c in range(len(cap)):
        where = pool_cls == c
        rank[where] = np.arange(int(where.sum()))
    return pool_idx[rank < cap[pool_cls]][:need]


def _noniid(labels: np.ndarray, num_clients: int, size: int, primary_fraction: float,
            rng: np.random.Generator) -> list[np.ndarray]:
    classes, counts = np.unique(labels, return_counts=True)
    k = len(classes)
    if k < 2:
        raise ValueError(f"partition='noniid' needs at least 2 classes; got {k}")
    # Spread primary classes evenly; extra slots go to the largest classes.
    slots = _primary_slots(counts, num_clients, rng)
    size = _feasible_size(classes, counts, slots, num_clients, size, primary_fraction)
    n_primary = int(round(primary_fraction * size))
    n_other = size - n_primary
    # Class (as a position in `classes`) of each client's primary samples.
    primary = rng.permutation(np.repeat(np.arange(k), slots))
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    parts: list[np.ndarray] = [np.empty(0, np.int64)] * num_clients
    pool = []
    for c in range(k):
        owners = np.flatnonzero(primary == c)
        for j, client in enumerate(owners):
            parts[client] = by_class[c][j * n_primary : (j + 1) * n_primary]
        pool.append(by_class[c][len(owners) * n_primary :])
    pool_idx = rng.permutation(np.concatenate(pool))
    # Others: a random draw of the pool, then swaps repair clashes with primaries.
    label_pos = np.searchsorted(classes, labels)
    # The pool exceeds the need by N - C * size samples: keep the head of the
    # shuffled pool, but at most (C - slots[c]) * n_other of class c (more could
    # not all be placed outside class c's primary clients; the size was chosen
    # so that the capped pool still fills every client).
    pool_idx = _capped_pool(pool_idx, label_pos[pool_idx],
                            (num_clients - slots) * n_other, num_clients * n_other)
    pool_cls = label_pos[pool_idx]
    other = pool_idx.reshape(num_clients, n_other)
    other_cls = pool_cls.reshape(num_clients, n_other)
    owner_cls = np.broadcast_to(primary[:, None], other.shape)
    clashes = np.argwhere(other_cls == owner_cls)
    for a, b in clashes:
        if other_cls[a, b] != primary[a]:
            continue  # fixed by an earlier swap
        bad = primary[a]
        valid = (other_cls != bad) & (primary[:, None] != bad)
        cand = np.flatnonzero(valid)
        if len(cand) == 0:
            raise ValueError(
                f"num-clients={num_clients} with primary_fraction={primary_fraction}"
                f" is infeasible: too few samples outside class {classes[bad]}"
            )
        # Prefer a slot that itself clashes: one swap fixes both.
        double = cand[other_cls.flat[cand] == primary[cand // n_other]]
        pick = rng.choice(double if len(double) else cand)
        c_row, c_col = divmod(int(pick), n_other)
        other[a, b], other[c_row, c_col] = other[c_row, c_col], other[a, b]
        other_cls[a, b], other_cls[c_row, c_col] = other_cls[c_row, c_col], bad
    return [np.sort(np.concatenate([parts[i], other[i]])).astype(np.int64)
            for i in range(num_clients)]
