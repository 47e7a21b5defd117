"""The offline likelihood-ratio attack (LiRA) and its low-FPR metrics.

Carlini et al., "Membership Inference Attacks From First Principles", IEEE S&P
2022 (LiRA). Per example (x, y) the observation is the logit-scaled confidence of
the true class, phi = log(p_y / (1 - p_y)) (Sec. IV-B: it makes the confidences of
many models close to Gaussian). k reference models that never trained on the
example give phi_1 .. phi_k: the "out" distribution N(mu_out, sigma_out^2), fit
per example (Sec. IV-C). The offline test is one-sided (Sec. IV-C, "offline"):
Lambda = 1 - Pr[Z > phi_obs], Z ~ N(mu_out, sigma_out^2), i.e. Phi(z) with
z = (phi_obs - mu_out) / sigma_out. This module scores examples by z itself: it
ranks them as Lambda does (Phi is increasing), and does not saturate, where
Phi(z) rounds to 1 in float64 for z > 8.3 and would tie the most confident
members. With few reference models the variance is global, one sigma_out for
every example, as the paper does for fewer than 64 (Sec. VI-A, Fig. 8).

Metrics (Sec. III-B): ROC AUC and the true-positive rate at a low false-positive
rate (1%, 0.1%), each with a seeded stratified bootstrap percentile interval; a
rate whose false-positive budget is under :data:`MIN_FALSE_POSITIVES` non-members
is not read (None), since it would rest on one sample. Client-level inference
scores a client as the mean of its samples' z (:func:`group_means`).

numpy and scipy only; no Flower, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from task.membership import check_labels, check_proba

#: Floor of p_y and of 1 - p_y before the log: the smallest positive float32, so
#: phi stays finite where a float32 softmax underflowed (|phi| <= 103.3).
PHI_FLOOR = float(np.nextafter(np.float32(0), np.float32(1)))

#: Reference models from which the variance is fit per example (fewer: global).
PER_EXAMPLE_VARIANCE = 64

#: Floor of sigma_out, so identical reference confidences give a finite z.
SIGMA_FLOOR = 1e-6

#: The false-positive rates the attack is read at: 1% and 0.1%.
LOW_FPRS = (0.01, 0.001)

#: Fewest false positives a rate's budget must allow (FPR x non-members) to be read.
MIN_FALSE_POSITIVES = 2

#: Bootstrap replicates of every interval, and its two-sided level.
BOOTSTRAP = 1000
LEVEL = 0.95


def logit_confidence(proba, labels) -> np.ndarray:
    """The logit-scaled confidence phi = log(p_y / (1 - p_y)) (Carlini et al., Sec. IV-B).

    Computed as log p_y - log(sum over the other classes of p_j), so that a float32
    softmax whose p_y rounded to 1 still gives the right phi from the small
    probabilities of the other classes; both terms are floored at
    :data:`PHI_FLOOR`.

    Parameters
    ----------
    proba : array_like, float, shape (N, C)
        Softmax outputs (rows sum to 1).
    labels : array_like, int, shape (N,)
        True classes in 0..C-1.

    Returns
    -------
    numpy.ndarray, float64, shape (N,)
        phi in nats, in [-103.3, 103.3].

    Raises
    ------
    ValueError
        Outputs that are not (N, C) probabilities, or labels of another shape
        or outside 0..C-1.
    """
    proba = check_proba(proba, "proba")
    if proba.ndim != 2:
        raise ValueError(f"proba must have shape (N, C), got shape {proba.shape}")
    labels = check_labels(labels, proba, "labels", "proba")
    rows = np.arange(len(labels))
    p_y = proba[rows, labels]
    others = proba.copy()
    others[rows, labels] = 0.0  # 1 - p_y without cancellation
    rest = others.sum(axis=1)
    return np.log(np.maximum(p_y, PHI_FLOOR)) - np.log(np.maximum(rest, PHI_FLOOR))


def fit_out(reference_phi, per_example: bool | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """The "out" Gaussians N(mu_out, sigma_out^2) of each example.

    Parameters
    ----------
    reference_phi : array_like, float, shape (k, N)
        phi of N examples under k >= 2 reference models that never trained on
        them.
    per_example : bool, optional
        Fit sigma_out per example (sample standard deviation, ddof 1) or one
        global sigma_out for all (the square root of the mean over examples of
        their sample variances: the pooled within-example spread, not the
        spread of all values, which would add the differences between the
        examples' means). Default: per example when k >=
        :data:`PER_EXAMPLE_VARIANCE` (the paper's global variance below 64).

    Returns
    -------
    (mu_out, sigma_out) : numpy.ndarray, float64, shape (N,) each
        The per-example mean; sigma_out >= :data:`SIGMA_FLOOR`.

    Raises
    ------
    ValueError
        Not 2-D, fewer than 2 reference models, no example, or a value that is
        not finite.
    """
    phi = np.asarray(reference_phi, dtype=np.float64)
    if phi.ndim != 2 or phi.shape[0] < 2 or phi.shape[1] == 0:
        raise ValueError(f"reference_phi must have shape (k, N) with k >= 2 reference "
                         f"models and N >= 1 examples, got shape {phi.shape}")
    if not np.isfinite(phi).all():
        raise ValueError(f"reference_phi (shape {phi.shape}) holds NaN or infinities")
    if per_example is None:
        per_example = phi.shape[0] >= PER_EXAMPLE_VARIANCE
    var = phi.var(axis=0, ddof=1)
    if not per_example:
        var = np.full_like(var, var.mean())
    return phi.mean(axis=0), np.maximum(np.sqrt(var), SIGMA_FLOOR)


def offline_score(phi, mu_out, sigma_out) -> np.ndarray:
    """The offline LiRA score z = (phi - mu_out) / sigma_out, higher = member.

    Lambda = Phi(z) = 1 - Pr[Z > phi], Z ~ N(mu_out, sigma_out^2) (Carlini et al.
    2022, Sec. IV-C, the offline one-sided test); z ranks as Lambda does.

    Parameters
    ----------
    phi : array_like, float, shape (N,)
        The attacked model's :func:`logit_confidence` of the N examples.
    mu_out, sigma_out : array_like, float, shape (N,)
        :func:`fit_out` of the same examples (sigma_out > 0).

    Returns
    -------
    numpy.ndarray, float64, shape (N,)

    Raises
    ------
    ValueError
        Shapes that differ, or a sigma_out that is not positive.
    """
    phi, mu, sigma = (np.asarray(a, dtype=np.float64) for a in (phi, mu_out, sigma_out))
    if not phi.shape == mu.shape == sigma.shape or phi.ndim != 1:
        raise ValueError(f"phi, mu_out and sigma_out must be (N,) of one shape, got "
                         f"{phi.shape}, {mu.shape}, {sigma.shape}")
    if not (sigma > 0).all():
        raise ValueError("sigma_out must be > 0 for every example")
    return (phi - mu) / sigma


def _checked(member, nonmember) -> tuple[np.ndarray, np.ndarray]:
    m, n = (np.asarray(a, dtype=np.float64) for a in (member, nonmember))
    if m.ndim != 1 or n.ndim != 1 or not m.size or not n.size:
        raise ValueError(f"member and nonmember scores must be non-empty (N,) arrays, "
                         f"got shapes {m.shape} and {n.shape}")
    if not (np.isfinite(m).all() and np.isfinite(n).all()):
        raise ValueError("member and nonmember scores must be finite")
    return m, n


def roc_auc(member, nonmember) -> float:
    """ROC AUC: Pr[a member outscores a non-member], ties counted one half.

    The Mann-Whitney statistic U / (n_m n_n), computed with a sort.

    Parameters
    ----------
    member : array_like, float, shape (n_m,)
        Scores of members (higher = member).
    nonmember : array_like, float, shape (n_n,)
        Scores of non-members.

    Returns
    -------
    float
        In [0, 1]; 0.5 at chance.

    Raises
    ------
    ValueError
        An empty, non-1-D or non-finite input.
    """
    m, n = _checked(member, nonmember)
    return _auc_sorted(m, np.sort(n))


def _auc_sorted(m: np.ndarray, n_sorted: np.ndarray) -> float:
    below = (np.searchsorted(n_sorted, m, side="left")
             + np.searchsorted(n_sorted, m, side="right"))
    return float(below.sum() / (2.0 * m.size * n_sorted.size))


def tpr_at_fpr(member, nonmember, fpr: float) -> float | None:
    """Largest true-positive rate at a false-positive rate <= ``fpr``.

    With f = floor(fpr n_n) false positives allowed, the threshold is the
    (f + 1)-th highest non-member score and the rate the share of members
    strictly above it: the best point of the ROC curve with FPR <= ``fpr``
    (as :func:`audits.shadow.tpr_at_fpr` reads sklearn's curve).

    Parameters
    ----------
    member, nonmember : array_like, float, shapes (n_m,), (n_n,)
        As :func:`roc_auc`.
    fpr : float
        The false-positive budget, in (0, 1].

    Returns
    -------
    float or None
        In [0, 1]; None when f < :data:`MIN_FALSE_POSITIVES`: too few
        non-members to read the rate (it would rest on one sample).

    Raises
    ------
    ValueError
        As :func:`roc_auc`, or ``fpr`` outside (0, 1].
    """
    if not 0.0 < fpr <= 1.0:
        raise ValueError(f"fpr = {fpr!r} is not allowed: a rate in (0, 1]")
    m, n = _checked(member, nonmember)
    return _tpr_sorted(m, np.sort(n), fpr)


def _tpr_sorted(m: np.ndarray, n_sorted: np.ndarray, fpr: float) -> float | None:
    allowed = math.floor(fpr * n_sorted.size + 1e-9)
    if allowed < MIN_FALSE_POSITIVES:
        return None
    if allowed >= n_sorted.size:
        return 1.0
    threshold = n_sorted[n_sorted.size - 1 - allowed]  # the (allowed + 1)-th highest
    return float((m > threshold).mean())


def fpr_label(fpr: float) -> str:
    """``"1"`` for 0.01, ``"01"`` for 0.001: the summary key's suffix ``tpr_at_<l>fpr``."""
    return f"{100 * fpr:g}".replace(".", "")


@dataclass
class LowFprMetrics:
    """AUC and TPR at low FPR of one attack, with bootstrap intervals.

    Attributes
    ----------
    auc : float
        ROC AUC (:func:`roc_auc`).
    auc_ci : (float, float)
        Its bootstrap percentile interval at :data:`LEVEL`.
    tpr : dict of float to float or None
        FPR -> :func:`tpr_at_fpr` (None: too few non-members to read it).
    tpr_ci : dict of float to (float, float) or None
        FPR -> its interval (None with the rate).
    n_member, n_nonmember : int
        Scores on each side.
    """

    auc: float
    auc_ci: tuple[float, float]
    tpr: dict[float, float | None] = field(default_factory=dict)
    tpr_ci: dict[float, tuple[float, float] | None] = field(default_factory=dict)
    n_member: int = 0
    n_nonmember: int = 0

    def to_audit(self, prefix: str) -> dict[str, object]:
        """Flat keys ``<prefix>auc``, ``<prefix>auc_ci``, ``<prefix>tpr_at_1fpr``, ...

        The JSON boundary: summary.json writes them as ``mia_<key>``; an
        interval is a list [low, high]; an unreadable rate is None (null).
        """
        out: dict[str, object] = {f"{prefix}auc": self.auc,
                                  f"{prefix}auc_ci": list(self.auc_ci)}
        for fpr, value in self.tpr.items():
            key = f"{prefix}tpr_at_{fpr_label(fpr)}fpr"
            out[key] = value
            ci = self.tpr_ci.get(fpr)
            out[f"{key}_ci"] = None if ci is None else list(ci)
        out[f"{prefix}n_member"] = self.n_member
        out[f"{prefix}n_nonmember"] = self.n_nonmember
        return out


def bootstrap_metrics(member, nonmember, fprs=LOW_FPRS, n_boot: int = BOOTSTRAP,
                      seed: int = 0, level: float = LEVEL) -> LowFprMetrics:
    """AUC and TPR at each FPR, each with a stratified bootstrap interval.

    Each of ``n_boot`` replicates draws n_m members and n_n non-members with
    replacement (the two sides apart, so every replicate has both); the
    interval is the (1 - level) / 2 and (1 + level) / 2 percentiles of the
    replicates (Efron and Tibshirani 1993, the percentile interval).

    Parameters
    ----------
    member, nonmember : array_like, float, shapes (n_m,), (n_n,)
        Attack scores, higher = member.
    fprs : sequence of float
        False-positive rates in (0, 1].
    n_boot : int
        Replicates (>= 1).
    seed : int
        Seeds the replicates: the same inputs and seed give the same intervals.
    level : float
        Two-sided level in (0, 1).

    Returns
    -------
    LowFprMetrics

    Raises
    ------
    ValueError
        As :func:`roc_auc` and :func:`tpr_at_fpr`, ``n_boot`` < 1, or a level
        outside (0, 1).
    """
    m, n = _checked(member, nonmember)
    if n_boot < 1 or not 0.0 < level < 1.0:
        raise ValueError(f"n_boot = {n_boot!r} must be >= 1 and level = {level!r} "
                         "in (0, 1)")
    out = LowFprMetrics(roc_auc(m, n), (0.0, 0.0), n_member=m.size, n_nonmember=n.size)
    out.tpr = {f: tpr_at_fpr(m, n, f) for f in fprs}
    rng = np.random.default_rng([seed, 0xB007])
    aucs, tprs = np.empty(n_boot), {f: np.empty(n_boot) for f in fprs}
    for b in range(n_boot):
        bm = m[rng.integers(0, m.size, m.size)]
        bn = np.sort(n[rng.integers(0, n.size, n.size)])
        aucs[b] = _auc_sorted(bm, bn)
        for f in fprs:
            if out.tpr[f] is not None:
                tprs[f][b] = _tpr_sorted(bm, bn, f)
    q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
    out.auc_ci = tuple(float(v) for v in np.percentile(aucs, q))
    out.tpr_ci = {f: None if out.tpr[f] is None else
                  tuple(float(v) for v in np.percentile(tprs[f], q)) for f in fprs}
    return out


def group_means(scores, groups) -> np.ndarray:
    """Each group's mean score: a client's score from its samples' scores.

    Client-level inference scores a client as a unit by the mean of its
    samples' LiRA z; with a global sigma_out a non-member client's mean of n
    roughly independent z is about N(0, 1 / n), so the mean sharpens with n.

    Parameters
    ----------
    scores : array_like, float, shape (N,)
        Per-sample scores.
    groups : sequence of array_like of int
        Each the indices into ``scores`` of one group's samples (>= 1 each;
        groups may differ in size).

    Returns
    -------
    numpy.ndarray, float64, shape (G,)

    Raises
    ------
    ValueError
        An empty group, or an index outside 0..N-1.
    """
    s = np.asarray(scores, dtype=np.float64)
    out = np.empty(len(groups))
    for i, group in enumerate(groups):
        g = np.asarray(group, dtype=np.int64)
        if g.ndim != 1 or not g.size or g.min() < 0 or g.max() >= s.size:
            raise ValueError(f"group {i} must be a non-empty 1-D index array into "
                             f"0..{s.size - 1}, got {g.tolist()[:8]}")
        out[i] = s[g].mean()
    return out


def empirical_pvalues(scores, null) -> np.ndarray:
    """Each score's one-sided p-value against a null sample: (1 + #null >= s) / (1 + n).

    The exact p-value of a permutation test when the score and the null
    draws are exchangeable under the null hypothesis (Phipson and Smyth 2010,
    eq. 2): here a forgotten client's mean score against pseudo-clients of
    non-members, a finer view than an AUC over a handful of clients.

    Parameters
    ----------
    scores : array_like, float, shape (G,)
        The tested scores (higher = member).
    null : array_like, float, shape (n,)
        Scores drawn under the null (n >= 1).

    Returns
    -------
    numpy.ndarray, float64, shape (G,)
        In [1 / (n + 1), 1].

    Raises
    ------
    ValueError
        An empty null or non-finite values.
    """
    s, n = _checked(np.atleast_1d(scores), null)
    n = np.sort(n)
    above = n.size - np.searchsorted(n, s, side="left")
    return (1.0 + above) / (1.0 + n.size)
