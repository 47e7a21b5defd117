"""U-LiRA: tell an unlearned model from models that never saw the sample.

Hayes et al., "Inexact Unlearning Needs More Careful Evaluations to Avoid a False
Sense of Privacy" (SaTML 2025), adapt LiRA (Carlini et al., IEEE S&P 2022) to
unlearning: reference models are trained on random halves of a pool of target
examples and then *unlearn* a forget set; for a target x, the references whose
forget set held x give the "unlearned" distribution of phi(x), those that never
saw x the "retrained" one. The test is LiRA's online likelihood ratio
(Carlini et al., Sec. IV-C):

    log Lambda(x) = log N(phi; mu_in(x), sigma_in^2) - log N(phi; mu_out(x), sigma_out^2)

with per-example means and, with few references, one global sigma per side
(the pooled within-example spread, :func:`server_app.evaluation.lira.fit_out`).
An exact method (retraining) makes the two distributions one, and the test is at
chance; an approximate one may leave its forget set visible.

:func:`leave_one_out` plays the game on the references themselves: each
reference in turn is the challenge model, scored with Gaussians fit on the
others, its forget set's examples the positives and the other pool examples the
negatives. numpy and scipy only.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from server_app.evaluation.lira import SIGMA_FLOOR


def _pooled_sigma(phi: np.ndarray, mask: np.ndarray) -> float:
    """The root mean, over examples with >= 2 values in ``mask``, of their variance."""
    counts = mask.sum(axis=0)
    keep = counts >= 2
    if not keep.any():
        raise ValueError("every example needs >= 2 reference models on a side to fit "
                         "its spread; give more reference models")
    values = np.where(mask, phi, np.nan)[:, keep]
    return max(float(np.sqrt(np.nanvar(values, axis=0, ddof=1).mean())), SIGMA_FLOOR)


def fit_in_out(phi, is_in) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Per-example means and global spreads of the "in" and "out" references.

    Parameters
    ----------
    phi : array_like, float, shape (k, n)
        phi of n examples under k reference models.
    is_in : array_like, bool, shape (k, n)
        Whether reference i's forget set held example j ("in": trained on it,
        then unlearned it); False: it never saw the example.

    Returns
    -------
    (mu_in, mu_out, sigma_in, sigma_out)
        mu: float64 (n,), NaN where an example has no reference on that side;
        sigma: floats >= :data:`server_app.evaluation.lira.SIGMA_FLOOR`.

    Raises
    ------
    ValueError
        Shapes that differ, or a side with no example seen by >= 2 references.
    """
    phi, is_in = np.asarray(phi, dtype=np.float64), np.asarray(is_in, dtype=bool)
    if phi.ndim != 2 or phi.shape != is_in.shape:
        raise ValueError(f"phi and is_in must be (k, n) of one shape, got {phi.shape} "
                         f"and {is_in.shape}")
    means = []
    for mask in (is_in, ~is_in):
        count = mask.sum(axis=0)
        total = np.where(mask, phi, 0.0).sum(axis=0)
        means.append(np.where(count > 0, total / np.maximum(count, 1), np.nan))
    return means[0], means[1], _pooled_sigma(phi, is_in), _pooled_sigma(phi, ~is_in)


def log_ratio(phi, mu_in, mu_out, sigma_in: float, sigma_out: float) -> np.ndarray:
    """The online LiRA score log N(phi; mu_in, s_in^2) - log N(phi; mu_out, s_out^2).

    Carlini et al. 2022, Sec. IV-C (online LiRA); in U-LiRA "in" is "unlearned".

    Parameters
    ----------
    phi : array_like, float, shape (n,)
        The challenge model's logit-scaled confidences.
    mu_in : array_like, float, shape (n,)
        Per-example mean of the "in" references.
    mu_out : array_like, float, shape (n,)
        Per-example mean of the "out" references.
    sigma_in, sigma_out : float
        > 0.

    Returns
    -------
    numpy.ndarray, float64, shape (n,)
        Higher: more like the "in" (unlearned) models; NaN where a mean is NaN.
    """
    phi = np.asarray(phi, dtype=np.float64)
    return (norm.logpdf(phi, mu_in, sigma_in) - norm.logpdf(phi, mu_out, sigma_out))


def leave_one_out(phi, is_in) -> tuple[np.ndarray, np.ndarray]:
    """Each reference as the challenge model, scored with the others' Gaussians.

    Parameters
    ----------
    phi : array_like, float, shape (k, n)
        phi of the n pool examples under the k references (k >= 3 a side).
    is_in : array_like, bool, shape (k, n)
        Reference i's forget set held example j.

    Returns
    -------
    (positive, negative) : numpy.ndarray, float64
        :func:`log_ratio` of every (reference, example) pair whose example was
        in that reference's forget set, and of every pair whose example it never
        saw; pairs with no other reference on a side are left out.

    Raises
    ------
    ValueError
        As :func:`fit_in_out` for any held-out fit.
    """
    phi, is_in = np.asarray(phi, dtype=np.float64), np.asarray(is_in, dtype=bool)
    positive, negative = [], []
    for j in range(phi.shape[0]):
        rest = np.arange(phi.shape[0]) != j
        score = log_ratio(phi[j], *fit_in_out(phi[rest], is_in[rest]))
        ok = ~np.isnan(score)
        positive.append(score[ok & is_in[j]])
        negative.append(score[ok & ~is_in[j]])
    return np.concatenate(positive), np.concatenate(negative)


def balanced_halves(pool: int, references: int, seed: int) -> np.ndarray:
    """Which pool examples each reference's forget set holds: complementary halves.

    References 2i and 2i + 1 hold complementary random halves, so each example is
    in exactly k / 2 forget sets (the online LiRA design, Carlini et al., Sec. IV-C).

    Parameters
    ----------
    pool : int
        n examples (even).
    references : int
        k (even, >= 2).
    seed : int
        Seeds the halves.

    Returns
    -------
    numpy.ndarray, bool, shape (k, n)

    Raises
    ------
    ValueError
        An odd count.
    """
    if pool % 2 or references % 2 or references < 2:
        raise ValueError(f"pool = {pool} and references = {references} must be even "
                         "(references >= 2)")
    rng = np.random.default_rng([seed, 0x0171])
    out = np.zeros((references, pool), dtype=bool)
    for i in range(0, references, 2):
        half = rng.permutation(pool)[:pool // 2]
        out[i, half] = True
        out[i + 1] = ~out[i]
    return out
