"""The offline likelihood-ratio attack (LiRA) and its low-FPR metrics (issue 27)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from audits.lira import (
    MIN_FALSE_POSITIVES,
    PHI_FLOOR,
    bootstrap_metrics,
    empirical_pvalues,
    fit_out,
    fpr_label,
    group_means,
    logit_confidence,
    offline_score,
    roc_auc,
    tpr_at_fpr,
)
from audits.shadow import tpr_at_fpr as sklearn_tpr_at_fpr


def _softmax(logits: np.ndarray, dtype=np.float64) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(dtype)


def test_phi_is_the_log_odds_of_the_true_class():
    proba = np.array([[0.9, 0.05, 0.05], [0.2, 0.5, 0.3], [0.25, 0.25, 0.5]])
    phi = logit_confidence(proba, np.array([0, 2, 1]))
    assert phi == pytest.approx([np.log(9.0), np.log(0.3 / 0.7), np.log(1.0 / 3.0)])


def test_phi_of_a_float32_softmax_that_rounded_to_one_stays_exact():
    """p_y == 1.0 in float32, yet phi = z_y - logsumexp(others) from the small p_j."""
    logits = np.array([[30.0, 0.0, -2.0], [60.0, 1.0, 0.5], [200.0, 0.0, 0.0]])
    proba = _softmax(logits, np.float32)
    assert (proba[:2, 0] == 1.0).all()
    phi = logit_confidence(proba, np.zeros(3, np.int64))
    exact = logits[:, 0] - np.log(np.exp(logits[:, 1:]).sum(axis=1))
    assert phi[:2] == pytest.approx(exact[:2], rel=1e-5)
    assert phi[2] == pytest.approx(-np.log(PHI_FLOOR))  # underflowed: floored, finite
    with pytest.raises(ValueError, match="shape"):
        logit_confidence(proba, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        logit_confidence(np.full((2, 3, 4), 0.25), np.zeros((2, 3), np.int64))


def _gaussian_world(n: int, k: int, shift: float, seed: int, sigma: float = 1.0):
    """Examples with their own out-mean; members' phi shifted by ``shift`` sigmas."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, 3.0, 2 * n)  # easy and hard examples: raw phi says little
    references = mu + rng.normal(0.0, sigma, (k, 2 * n))
    observed = mu + rng.normal(0.0, sigma, 2 * n)
    observed[:n] += shift * sigma
    return references, observed


@pytest.mark.parametrize("shift", [0.5, 1.5])
def test_lira_on_gaussians_reaches_the_analytic_auc_and_tpr(shift):
    """z of a non-member ~ N(0, 1 + 1/k), of a member ~ N(shift, 1 + 1/k): known AUC."""
    n, k = 4000, 16
    references, observed = _gaussian_world(n, k, shift, seed=1)
    mu, sigma = fit_out(references)
    assert np.allclose(sigma, sigma[0]) and sigma[0] == pytest.approx(1.0, rel=0.03)
    z = offline_score(observed, mu, sigma)
    spread = np.sqrt(1.0 + 1.0 / k)
    analytic_auc = norm.cdf(shift / (spread * np.sqrt(2.0)))
    assert roc_auc(z[:n], z[n:]) == pytest.approx(analytic_auc, abs=0.015)
    analytic_tpr = norm.sf(norm.isf(0.01) - shift / spread)
    assert tpr_at_fpr(z[:n], z[n:], 0.01) == pytest.approx(analytic_tpr, abs=0.03)
    raw = roc_auc(observed[:n], observed[n:])  # no per-example calibration
    assert raw < analytic_auc - 0.05


def test_identical_in_and_out_distributions_give_chance():
    n = 3000
    references, observed = _gaussian_world(n, 8, 0.0, seed=2)
    z = offline_score(observed, *fit_out(references))
    metrics = bootstrap_metrics(z[:n], z[n:], seed=0)
    assert metrics.auc_ci[0] < 0.5 < metrics.auc_ci[1]
    low, high = metrics.tpr_ci[0.01]
    assert low <= 0.01 <= high


def test_per_example_variance_follows_each_example():
    rng = np.random.default_rng(3)
    spread = np.array([0.5, 1.0, 4.0])
    references = rng.normal(0.0, 1.0, (400, 3)) * spread
    _, per_example = fit_out(references)  # k = 400 >= 64: per example by default
    assert per_example == pytest.approx(spread, rel=0.1)
    _, pooled = fit_out(references[:8])
    assert np.ptp(pooled) == 0.0  # one global sigma with few references
    assert fit_out(references, per_example=False)[1][0] == pytest.approx(
        np.sqrt(np.mean(spread ** 2)), rel=0.1)
    with pytest.raises(ValueError, match="k >= 2"):
        fit_out(references[:1])
    with pytest.raises(ValueError, match="sigma_out"):
        offline_score(np.zeros(3), np.zeros(3), np.zeros(3))


def test_auc_and_low_fpr_tpr_agree_with_sklearn_also_with_ties():
    rng = np.random.default_rng(4)
    member = np.round(rng.normal(1.0, 1.0, 300), 1)
    nonmember = np.round(rng.normal(0.0, 1.0, 5000), 1)
    truth = np.r_[np.ones(300), np.zeros(5000)]
    both = np.r_[member, nonmember]
    assert roc_auc(member, nonmember) == pytest.approx(roc_auc_score(truth, both))
    for fpr in (0.01, 0.001):
        assert tpr_at_fpr(member, nonmember, fpr) == sklearn_tpr_at_fpr(truth, both, fpr)


def test_a_rate_with_too_few_non_members_is_not_read():
    member, nonmember = np.ones(10), np.zeros(1999)
    assert tpr_at_fpr(member, nonmember, 0.001) is None  # 1 false positive allowed
    assert tpr_at_fpr(member, np.zeros(2000), 0.001) == 1.0
    assert MIN_FALSE_POSITIVES == 2 and fpr_label(0.01) == "1" and fpr_label(0.001) == "01"
    metrics = bootstrap_metrics(member, nonmember, n_boot=20)
    assert metrics.tpr[0.001] is None and metrics.tpr_ci[0.001] is None
    flat = metrics.to_audit("lira_")
    assert flat["lira_tpr_at_01fpr"] is None and flat["lira_tpr_at_01fpr_ci"] is None
    assert flat["lira_tpr_at_1fpr"] == 1.0 and flat["lira_n_nonmember"] == 1999
    with pytest.raises(ValueError, match="fpr"):
        tpr_at_fpr(member, nonmember, 0.0)


def test_bootstrap_is_seeded_and_its_interval_covers_the_truth():
    rng = np.random.default_rng(5)
    member, nonmember = rng.normal(1.0, 1.0, 200), rng.normal(0.0, 1.0, 2000)
    a = bootstrap_metrics(member, nonmember, seed=7)
    assert a == bootstrap_metrics(member, nonmember, seed=7)
    assert a.auc_ci != bootstrap_metrics(member, nonmember, seed=8).auc_ci
    assert a.auc_ci[0] < a.auc < a.auc_ci[1]
    truth = norm.cdf(1.0 / np.sqrt(2.0))
    covered = 0
    for trial in range(40):
        draw = np.random.default_rng([6, trial])
        m, n = draw.normal(1.0, 1.0, 100), draw.normal(0.0, 1.0, 300)
        low, high = bootstrap_metrics(m, n, n_boot=200, seed=trial).auc_ci
        covered += low <= truth <= high
    assert 32 <= covered <= 40  # a 95% interval: about 38 of 40


def test_client_level_scores_sharpen_with_client_size():
    """Means of n member samples shifted by 0.3 sigma: clients separate, samples barely."""
    rng = np.random.default_rng(8)
    size, clients, pseudo = 50, 20, 200
    member = rng.normal(0.3, 1.0, clients * size)
    nonmember = rng.normal(0.0, 1.0, pseudo * size)
    groups = [np.arange(i * size, (i + 1) * size) for i in range(clients)]
    null_groups = [np.arange(i * size, (i + 1) * size) for i in range(pseudo)]
    c_member, c_non = group_means(member, groups), group_means(nonmember, null_groups)
    assert c_member[0] == pytest.approx(member[:size].mean())
    sample_auc, client_auc = roc_auc(member, nonmember), roc_auc(c_member, c_non)
    analytic = norm.cdf(0.3 * np.sqrt(size) / np.sqrt(2.0))  # 0.983
    assert sample_auc < 0.62 and client_auc == pytest.approx(analytic, abs=0.05)
    same = group_means(rng.normal(0.0, 1.0, clients * size), groups)
    assert bootstrap_metrics(same, c_non).auc_ci[0] < 0.5
    with pytest.raises(ValueError, match="group 0"):
        group_means(member, [np.array([], np.int64)])


def test_empirical_pvalues_are_exact_under_the_null():
    null = np.arange(1.0, 100.0)  # 99 null scores 1..99
    p = empirical_pvalues([100.0, 99.0, 0.0, 50.0], null)
    assert p == pytest.approx([1 / 100, 2 / 100, 1.0, 51 / 100])
    rng = np.random.default_rng(9)  # exchangeable: P(p <= 0.05) about 0.05
    draws = [empirical_pvalues(rng.normal(size=1), rng.normal(size=199))[0]
             for _ in range(2000)]
    assert np.mean(np.array(draws) <= 0.05) == pytest.approx(0.05, abs=0.015)
    with pytest.raises(ValueError, match="non-empty"):
        empirical_pvalues([1.0], [])
