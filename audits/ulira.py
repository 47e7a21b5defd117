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
(the pooled within-example spread, :func:`audits.lira.fit_out`).
An exact method (retraining) makes the two distributions one, and the test is at
chance; an approximate one may leave its forget set visible.

:func:`leave_one_out` plays the game on the references themselves: each
reference in turn is the challenge model, scored with Gaussians fit on the
others but its complementary partner, its forget set's examples the positives
and the other pool examples the negatives. Leaving the partner out too keeps the
two sides the same size for every example: with only the challenge left out, its
own side has one reference fewer, its mean is noisier, the challenge sits
further from it and the game's AUC falls below 0.5 under the null (0.490 on
average at k = 16, n = 200). numpy and scipy only.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from audits.lira import SIGMA_FLOOR


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
        sigma: floats >= :data:`audits.lira.SIGMA_FLOOR`.

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
    """Each reference as the challenge model, scored with the other pairs' Gaussians.

    Parameters
    ----------
    phi : array_like, float, shape (k, n)
        phi of the n pool examples under the k references (k >= 6, even).
    is_in : array_like, bool, shape (k, n)
        Reference i's forget set held example j; references 2i and 2i + 1
        complementary (:func:`balanced_halves`). Challenge j is scored with the
        Gaussians of every reference but j and its partner j XOR 1, so each side
        has k / 2 - 1 references for every example.

    Returns
    -------
    (positive, negative) : numpy.ndarray, float64
        :func:`log_ratio` of every (reference, example) pair whose example was
        in that reference's forget set, and of every pair whose example it never
        saw; pairs with no other reference on a side are left out.

    Raises
    ------
    ValueError
        References that are not complementary pairs, or as :func:`fit_in_out`
        for any held-out fit.
    """
    phi, is_in = np.asarray(phi, dtype=np.float64), np.asarray(is_in, dtype=bool)
    k = phi.shape[0]
    if k % 2 or not (is_in[0::2] == ~is_in[1::2]).all():
        raise ValueError("references 2i and 2i + 1 must forget complementary halves "
                         "(balanced_halves)")
    positive, negative = [], []
    for j in range(k):
        rest = (np.arange(k) != j) & (np.arange(k) != j ^ 1)
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


def challenge_scores(phi_real, phi, is_in) -> np.ndarray:
    """The score log Lambda of a model outside the references, fit as in the game.

    Each example is scored with the Gaussians of all references but one
    complementary pair (pair j mod k / 2 for example j), so the run's model meets
    the same k / 2 - 1 references a side as :func:`leave_one_out`'s challenges,
    and its scores compare with the game's negatives like for like.

    Parameters
    ----------
    phi_real : array_like, float, shape (n,)
        The model's phi of the pool (NaN: not scored).
    phi : array_like, float, shape (k, n)
        The references' phi.
    is_in : array_like, bool, shape (k, n)
        Their forget sets (complementary pairs).

    Returns
    -------
    numpy.ndarray, float64, shape (n,)
        NaN where ``phi_real`` is NaN.

    Raises
    ------
    ValueError
        As :func:`leave_one_out`.
    """
    phi, is_in = np.asarray(phi, dtype=np.float64), np.asarray(is_in, dtype=bool)
    real = np.asarray(phi_real, dtype=np.float64)
    k, n = phi.shape
    if k % 2 or not (is_in[0::2] == ~is_in[1::2]).all() or real.shape != (n,):
        raise ValueError("references 2i and 2i + 1 must forget complementary halves, "
                         f"and phi_real must be ({n},), got {real.shape}")
    out = np.full(n, np.nan)
    for pair in range(k // 2):
        rest = np.ones(k, dtype=bool)
        rest[2 * pair:2 * pair + 2] = False
        mine = np.arange(n) % (k // 2) == pair
        fit = fit_in_out(phi[rest], is_in[rest])
        out[mine] = log_ratio(real, *fit)[mine]
    return out
