"""The samples of the shadow-model membership inference (issue 13), chosen disjoint.

Three sets, each a list of row indices into one split of the dataset:

* targets: the forgotten clients' training rows (each client's first
  ``client-samples`` rows of its partition), at most ``mia-samples`` of them;
* non-members: for each target, a distinct sample of its class that no model was
  trained on. Training rows that no client holds (the rows past each client's
  ``client-samples`` cap) where the free rows hold enough of every target class,
  so members and non-members come from the same split and distribution; else the
  second half of the test set (then members are training images and non-members
  test images, and the attack may separate the two splits rather than members);
* the shadow pool: the free training rows left after the non-members where at
  least 2 m remain (m: a shadow's "in" set), else the first half of the test set.

:func:`choose_sets` checks that the three are pairwise disjoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from audits.run import AuditedRun
from task.config import DataConfig
from task.data import partitions

#: ``verification.mia.shadow_pool`` (and ``heldout``) when from the training split.
FREE_TRAIN = "training samples no client holds"


@dataclass(frozen=True)
class MiaSets:
    """Row indices of the audit's sets (int64 numpy arrays).

    Attributes
    ----------
    target : numpy.ndarray, shape (n,)
        Training rows of the targets.
    owner : numpy.ndarray, shape (n,)
        The partition id holding each target.
    partner : numpy.ndarray, shape (n,)
        Each target's non-member: a row of ``heldout_split`` of the same class,
        or -1 where that class ran short (only with the test-set fallback).
    heldout_split, shadow_split : str
        ``"train"`` or ``"test"``: the split ``partner`` / ``shadow`` index.
    shadow : numpy.ndarray
        Rows of the shadow pool.
    heldout_source, shadow_source : str
        In words, for ``verification.mia``.
    lira_partner : numpy.ndarray, shape (n, r)
        LiRA's non-members (``mia-references``): r further rows of
        ``heldout_split`` of each target's class, in no other set; -1 where a
        class ran short. Column j over one client's targets is a pseudo-client
        of its size and classes. (n, 0) without LiRA.
    """

    target: np.ndarray
    owner: np.ndarray
    partner: np.ndarray
    heldout_split: str
    heldout_source: str
    shadow: np.ndarray
    shadow_split: str
    shadow_source: str
    lira_partner: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))


def split_rows(task, split: str, idx) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and classes of rows ``idx`` of ``split``.

    Parameters
    ----------
    task : TaskData
        The dataset.
    split : {"train", "test"}
        Which split ``idx`` indexes.
    idx : array_like, int, shape (n,)
        Row indices.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        Images (n, ...) and classes (n,).
    """
    x, y = (task.train_x, task.train_y) if split == "train" else (task.test_x, task.test_y)
    i = torch.from_numpy(np.asarray(idx, np.int64))
    return x[i], y[i]


def client_rows(data: DataConfig, seed: int, task) -> list[np.ndarray]:
    """Each client's training rows as it trains on them (``client-samples`` applied).

    ``data`` and ``seed``: the run's partition and seed; ``task``: its TaskData.
    """
    cap = data.client_samples or None
    return [p[:cap] for p in partitions(task, data.num_clients, data.partition, seed,
                                        data.partition_alpha, data.classes_per_client)]


def pair_by_class(target_labels: np.ndarray, pool_labels: np.ndarray, seed: int
                  ) -> np.ndarray:
    """For each target, a distinct pool index of its class; -1 where a class runs short.

    Parameters
    ----------
    target_labels : numpy.ndarray, int, shape (n,)
        The targets' classes.
    pool_labels : numpy.ndarray, int, shape (m,)
        The pool's classes.
    seed : int
        Seeds the draw.

    Returns
    -------
    numpy.ndarray, int64, shape (n,)
    """
    return _matched(target_labels, pool_labels, 1, np.random.default_rng(seed))[:, 0]


def match_by_class(target_labels: np.ndarray, pool_labels: np.ndarray,
                   per_target: int, seed: int) -> np.ndarray:
    """For each target, ``per_target`` distinct pool indices of its class.

    Column j holds one index for every target before column j + 1 gets any, so
    a class that runs short leaves whole trailing columns of its targets at -1.

    Parameters
    ----------
    target_labels : numpy.ndarray, int, shape (n,)
        The targets' classes.
    pool_labels : numpy.ndarray, int, shape (m,)
        The pool's classes.
    per_target : int
        r >= 0.
    seed : int
        Seeds the draw.

    Returns
    -------
    numpy.ndarray, int64, shape (n, r)
        Distinct pool indices; -1 where the pool had too few of a class.
    """
    return _matched(target_labels, pool_labels, per_target,
                    np.random.default_rng([seed, 0x11FA]))


def _matched(target_labels: np.ndarray, pool_labels: np.ndarray, per_target: int,
             rng: np.random.Generator) -> np.ndarray:
    """(n, per_target) distinct pool indices of each target's class, column by column."""
    out = np.full((len(target_labels), per_target), -1, np.int64)
    for c in np.unique(target_labels):
        mine = np.flatnonzero(target_labels == c)
        have = rng.permutation(np.flatnonzero(pool_labels == c))
        block = np.full((per_target, len(mine)), -1, np.int64)  # column-major fill
        k = min(len(have), block.size)
        block.flat[:k] = have[:k]
        out[mine] = block.T
    return out


def _lira_partners(run: AuditedRun, labels: tuple[np.ndarray, np.ndarray],
                   spare: np.ndarray, room: int) -> np.ndarray:
    """``spare`` rows matched to the targets' classes, r = ceil(mia-nonmembers / n).

    ``labels``: the targets' classes and those of the split ``spare`` indexes;
    at most ``room`` rows are taken (the shadow pool keeps the rest).
    """
    target_y, split_y = labels
    n = len(target_y)
    if not run.audit.mia_references or not n:
        return np.zeros((n, 0), np.int64)
    r = min(math.ceil(run.audit.mia_nonmembers / n), max(room, 0) // n)
    if r == 0:
        return np.zeros((n, 0), np.int64)
    match = match_by_class(target_y, split_y[spare], r, run.seed + 3)
    return np.where(match >= 0, spare[np.maximum(match, 0)], -1)


def choose_sets(run: AuditedRun, task, targets: list[int], shadow_in: int,
                records: Mapping[int, Sequence[int]] | None = None) -> MiaSets:
    """Targets of the clients ``targets``, their non-members and the shadow pool.

    Parameters
    ----------
    run : AuditedRun
        Partition, ``client-samples``, ``mia-samples`` and the seed.
    task : TaskData
        The image task.
    targets : list of int
        Forgotten partition ids whose rows are targets.
    shadow_in : int
        m, the size of a shadow's "in" set (the pool must hold 2 m).
    records : Mapping[int, Sequence[int]], optional
        A records request: client -> the record ids it erased (positions in its
        rows, :mod:`task.records`); only those rows of ``targets`` are targets.

    Raises
    ------
    RuntimeError
        If two of the sets share a row (a fault of this module, never expected).
    """
    seed, limit = run.seed, run.audit.mia_samples
    rows = client_rows(run.data, seed, task)
    mine = [rows[p] if records is None else rows[p][np.asarray(records[p], np.int64)]
            for p in targets]
    target = np.concatenate(mine or [np.zeros(0, np.int64)])
    owner = np.concatenate([np.full(len(m), p) for p, m in zip(targets, mine, strict=True)]
                           or [np.zeros(0, np.int64)])
    if len(target) > limit:
        keep = np.sort(np.random.default_rng(seed + 1).permutation(len(target))[:limit])
        target, owner = target[keep], owner[keep]
    train_y, test_y = task.train_y.numpy(), task.test_y.numpy()
    free = np.random.default_rng([seed, 0xF2EE]).permutation(
        np.setdiff1d(np.arange(len(train_y)), np.concatenate(rows)))
    half = len(test_y) // 2
    partner = pair_by_class(train_y[target], train_y[free], seed + 2)
    if len(target) and (partner >= 0).all():
        partner = free[partner]
        heldout = ("train", FREE_TRAIN + ", the targets' classes")
        free = np.setdiff1d(free, partner)
        keep = 2 * shadow_in if len(free) >= 2 * shadow_in else 0  # the pool's
        lira = _lira_partners(run, (train_y[target], train_y), free, len(free) - keep)
        free = np.setdiff1d(free, lira)
    else:
        partner = pair_by_class(train_y[target], test_y[half:], seed + 2)
        partner = np.where(partner >= 0, partner + half, -1)
        heldout = ("test", "second half of the test set, the targets' classes (too few "
                   "training samples no client holds)")
        rest = np.setdiff1d(np.arange(half, len(test_y)), partner)
        lira = _lira_partners(run, (train_y[target], test_y), rest, len(rest))
    shadow = (np.sort(free), "train", FREE_TRAIN) if len(free) >= 2 * shadow_in \
        else (np.arange(half), "test", "first half of the test set")
    sets = MiaSets(target, owner.astype(np.int64), partner, *heldout, *shadow, lira)
    check_disjoint(sets, np.concatenate(rows))
    return sets


def check_disjoint(sets: MiaSets, client_held: np.ndarray) -> None:
    """Raise RuntimeError if two sets share a row or a client holds a free row."""
    lira = sets.lira_partner[sets.lira_partner >= 0]
    named = {"target": ("train", sets.target),
             "non-member": (sets.heldout_split, sets.partner[sets.partner >= 0]),
             "shadow": (sets.shadow_split, sets.shadow),
             "LiRA non-member": (sets.heldout_split, lira)}
    if np.unique(lira).size != lira.size:
        raise RuntimeError("membership-inference 'LiRA non-member' rows repeat")
    for a, (split_a, rows_a) in named.items():
        for b, (split_b, rows_b) in named.items():
            if a < b and split_a == split_b and np.intersect1d(rows_a, rows_b).size:
                raise RuntimeError(f"membership-inference sets '{a}' and '{b}' share "
                                   f"{split_a} rows")
    for name in ("non-member", "shadow", "LiRA non-member"):
        split, rows = named[name]
        if split == "train" and np.intersect1d(rows, client_held).size:
            raise RuntimeError(f"membership-inference '{name}' rows are held by a client")
