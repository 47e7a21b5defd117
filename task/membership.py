"""What the membership-inference audit feeds its attack: features of a model's outputs.

The default of :attr:`task.interface.Task.membership`: a task gives the audit its
predictions (softmax outputs) and targets, and these functions turn them into one
row of attack features per sample (Shokri et al., IEEE S&P 2017; the features of
:mod:`audits.mia`). numpy only.
"""

from __future__ import annotations

import numpy as np

#: Floor on p[y] before the log, so a zero probability gives a finite loss
#: (-log 1e-12 = 27.6 nats).
PROBA_FLOOR = 1e-12

#: Largest allowed |sum of a probability vector - 1| (float32 softmax, averaged
#: ensembles and rounding stay far inside it; logits do not).
SUM_TOLERANCE = 1e-3

def check_proba(proba, name: str) -> np.ndarray:
    """``proba`` as a float64 array (N, C) or (N, T, V), validated."""
    array = np.asarray(proba)
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(
            f"{name} must hold floating-point probabilities, got dtype {array.dtype} "
            f"with shape {array.shape}"
        )
    if array.ndim not in (2, 3):
        raise ValueError(
            f"{name} must have shape (N, C) or (N, T, V), got shape {array.shape}"
        )
    if array.size == 0:
        raise ValueError(f"{name} is empty: shape {array.shape}")
    if array.shape[-1] < 2:
        raise ValueError(
            f"{name} has fewer than 2 classes on its last axis: shape {array.shape}"
        )
    array = array.astype(np.float64, copy=False)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} (shape {array.shape}) holds NaN or infinite values")
    if array.min() < 0.0 or array.max() > 1.0:
        raise ValueError(
            f"{name} (shape {array.shape}) must hold probabilities in [0, 1], "
            f"found values in [{array.min():.4g}, {array.max():.4g}]"
        )
    sums = array.sum(axis=-1)
    worst = float(np.max(np.abs(sums - 1.0)))
    if worst > SUM_TOLERANCE:
        raise ValueError(
            f"{name} (shape {array.shape}) must sum to 1 over its last axis "
            f"(softmax outputs, not logits); off by up to {worst:.4g}"
        )
    return array


def check_labels(labels, proba: np.ndarray, name: str, proba_name: str) -> np.ndarray:
    """``labels`` as an int64 array of shape ``proba.shape[:-1]``, validated."""
    array = np.asarray(labels)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"{name} must hold integer class indices, got dtype {array.dtype} "
            f"with shape {array.shape}"
        )
    if array.shape != proba.shape[:-1]:
        raise ValueError(
            f"{name} must have shape {proba.shape[:-1]} to match {proba_name} "
            f"{proba.shape}, got shape {array.shape}"
        )
    num_classes = proba.shape[-1]
    if array.min() < 0 or array.max() >= num_classes:
        raise ValueError(
            f"{name} (shape {array.shape}) must lie in [0, {num_classes}) for "
            f"{proba_name} {proba.shape}, found values in "
            f"[{array.min()}, {array.max()}]"
        )
    return array.astype(np.int64, copy=False)


def membership_features(proba, labels) -> np.ndarray:
    """Attack features of each sample from a model's outputs.

    Parameters
    ----------
    proba : array_like, float, shape (N, C) or (N, T, V)
        Softmax outputs of the attacked model: class probabilities of N images,
        or next-character probabilities of N blocks of T characters.
    labels : array_like, int, shape (N,) or (N, T)
        True classes, or the next characters (targets) of each block.

    Returns
    -------
    numpy.ndarray, float64, shape (N, 2 C + 1) or (N, 4)
        Classifiers: the probabilities sorted in descending order, the one-hot
        true label, and the loss -log p[y] (nats). Character model: mean, min,
        max and standard deviation of the per-character loss (nats).

    Raises
    ------
    ValueError
        If an array is empty, of the wrong shape or dtype, has fewer than 2
        classes, or holds values that are not probabilities / valid labels.
    """
    proba = check_proba(proba, "proba")
    labels = check_labels(labels, proba, "labels", "proba")
    p_true = np.take_along_axis(proba, labels[..., None], axis=-1)[..., 0]
    loss = -np.log(np.maximum(p_true, PROBA_FLOOR))
    if proba.ndim == 3:
        return np.stack(
            [loss.mean(axis=1), loss.min(axis=1), loss.max(axis=1), loss.std(axis=1)],
            axis=1,
        )
    num_samples, num_classes = proba.shape
    ranked = -np.sort(-proba, axis=1)
    one_hot = np.zeros((num_samples, num_classes))
    one_hot[np.arange(num_samples), labels] = 1.0
    return np.concatenate([ranked, one_hot, loss[:, None]], axis=1)
