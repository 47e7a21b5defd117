"""U-LiRA: SE's unlearned references against references that never saw (issue 27)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from audits.lira import roc_auc
from audits.ulira import (
    balanced_halves,
    challenge_scores,
    fit_in_out,
    leave_one_out,
    log_ratio,
)
from audits.ulira_audit import (
    ReferenceShape,
    ShadowPoolTooSmallError,
    _reference_parts,
    reference_shapes,
    train_references,
)
from server_app.config import ConfigError, RunConfig
from server_app.config.audit import ulira_methods
from server_app.config.methods import names
from server_app.stages.audit import audited_run
from server_app.stages.references import recipe
from task.config import fused_run_config
from tests.conftest import TINY


def test_balanced_halves_put_each_example_in_half_the_forget_sets():
    halves = balanced_halves(10, 6, seed=0)
    assert halves.shape == (6, 10) and (halves.sum(axis=0) == 3).all()
    assert (halves[0] == ~halves[1]).all() and (halves.sum(axis=1) == 5).all()
    with pytest.raises(ValueError, match="even"):
        balanced_halves(9, 4, seed=0)


def _references(n: int, k: int, shift: float, seed: int):
    rng = np.random.default_rng(seed)
    is_in = balanced_halves(n, k, seed)
    mu = rng.normal(0.0, 3.0, n)
    phi = mu + rng.normal(0.0, 1.0, (k, n)) + shift * is_in
    return phi, is_in


def test_fit_in_out_reads_each_side():
    phi, is_in = _references(400, 16, 2.0, seed=1)
    mu_in, mu_out, s_in, s_out = fit_in_out(phi, is_in)
    assert np.mean(mu_in - mu_out) == pytest.approx(2.0, abs=0.05)
    assert s_in == pytest.approx(1.0, abs=0.05) and s_out == pytest.approx(1.0, abs=0.05)
    score = log_ratio(mu_in, mu_in, mu_out, s_in, s_out)
    assert (score > 0).mean() > 0.99  # at the "in" mean: more like "in"
    with pytest.raises(ValueError, match=">= 2 reference"):
        fit_in_out(phi[:2], is_in[:2])


@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_leave_one_out_game_reaches_the_analytic_auc(shift):
    """An unlearned model shifted by ``shift`` sigmas: AUC about Phi(shift / sqrt 2)."""
    phi, is_in = _references(300, 16, shift, seed=2)
    positive, negative = leave_one_out(phi, is_in)
    assert positive.size == negative.size == 16 * 150
    analytic = norm.cdf(shift / np.sqrt(2.0 * (1.0 + 1.0 / 7.0)))
    assert roc_auc(positive, negative) == pytest.approx(analytic, abs=0.03)


def test_leave_one_out_is_unbiased_under_the_null():
    """Same distribution on both sides: AUC 0.5 on average (leaving one out: 0.490)."""
    aucs = []
    for trial in range(30):
        phi, is_in = _references(200, 16, 0.0, seed=100 + trial)
        aucs.append(roc_auc(*leave_one_out(phi, is_in)))
    assert abs(np.mean(aucs) - 0.5) < 0.006
    phi, is_in = _references(400, 16, 0.0, seed=7)  # a model that never saw the pool
    outside = phi.mean(axis=0) + np.random.default_rng(8).normal(0.0, 1.0, 400)
    real = challenge_scores(outside, phi, is_in)
    negative = leave_one_out(phi, is_in)[1]
    assert abs(roc_auc(real, negative) - 0.5) < 0.04
    unlearned = challenge_scores(outside + 1.0, phi + is_in * 1.0, is_in)
    assert roc_auc(unlearned, negative) > 0.6  # it looks like the "in" side
    phi, is_in = _references(20, 8, 0.0, seed=0)
    with pytest.raises(ValueError, match="complementary"):
        leave_one_out(phi, is_in[[0, 2, 1, 3, 4, 5, 6, 7]])


def test_reference_shapes_follow_the_run_and_the_federation_only_for_fe_or_frec():
    owners = np.repeat([1, 3, 5], 10)  # three forgotten clients, 10 targets each
    sets = type("S", (), {"owner": owners})()
    shards = [[0, 1, 2, 3], [4, 5, 6, 7]]
    cfg = RunConfig.from_run_config(fused_run_config({**TINY, "frameworks": "SE,FR"}))
    shapes = reference_shapes(_with_references(cfg), sets, shards, pool=30, client_size=10)
    assert list(shapes) == ["shard"]
    assert shapes["shard"] == ReferenceShape(4, 2, 2, 10, 8)  # f = 2 (clients 1, 3)
    run = _with_references(RunConfig.from_run_config(fused_run_config(
        {**TINY, "frameworks": "SE,FRec"})))
    fed = reference_shapes(run, sets, shards, pool=30, client_size=10)["federation"]
    assert fed == ReferenceShape(8, 3, 4, 10, 5)
    # FE / FRec on a baseline federation of 2 shards: one of those, 2 a round
    fed = reference_shapes(run, sets, shards, 30, 10, [[1, 3, 5, 0], [2, 4, 6, 7]])
    assert fed["federation"] == ReferenceShape(4, 3, 2, 10, 5)
    every = RunConfig.from_run_config(fused_run_config(
        {**TINY, "frameworks": ",".join(names())}))  # every registered method
    assert set(ulira_methods()) == set(recipe(every).rules)


def _with_references(cfg: RunConfig):
    """The audits' view of ``cfg`` with U-LiRA's recipe, whatever its k."""
    import dataclasses

    return dataclasses.replace(audited_run(cfg), references=recipe(cfg))


def test_a_shadow_pool_too_small_is_refused_before_any_reference_trains():
    cfg = RunConfig.from_run_config(fused_run_config(
        {**TINY, "frameworks": "SE,FE", "mia-shadows": 2, "mia-unlearn-references": 6}))
    task = type("T", (), {"train_x": torch.zeros(100, 1), "train_y": torch.zeros(100),
                          "num_classes": 10})()
    sets = type("S", (), {"target": np.arange(20), "owner": np.repeat([1, 5], 10),
                          "shadow": np.arange(20, 60), "shadow_split": "train",
                          "shadow_source": "free rows"})()
    # shard shape: 4 clients x 10 = 40 samples, 10 of them targets -> 30 from the
    # pool (40 rows: enough); FE's federation: 8 x 10 - 10 = 70 (too many)
    with pytest.raises(ShadowPoolTooSmallError, match="needs 70 shadow-pool samples"):
        train_references(audited_run(cfg), task, sets, [[0, 1, 2, 3], [4, 5, 6, 7]],
                         client_size=10)


def test_u_lira_with_no_targets_is_skipped_and_said():
    from audits.audit import _ulira

    cfg = RunConfig.from_run_config(fused_run_config(
        {**TINY, "mia-shadows": 2, "mia-unlearn-references": 6}))
    sets = type("S", (), {"target": np.zeros(0, np.int64)})()
    settings = _ulira(cfg, None, sets, {"original": (None, [[0, 1], [2, 3]])}, {})
    assert settings == {"skipped": "fewer than 2 targets (the forgotten clients took "
                                   "part in no learning round)"}


def test_reference_clients_hold_their_targets_filled_up_from_the_shadow_pool():
    shape = ReferenceShape(clients=4, forgotten=2, per_round=2, client_size=6,
                           targets_per_client=4)
    targets = (torch.arange(8.0).reshape(8, 1), torch.arange(8))
    shadow = (torch.arange(100.0, 140.0).reshape(40, 1), torch.arange(100, 140))
    parts = _reference_parts(shape, np.array([5, 1, 7, 2, 0, 3, 6, 4]),
                             np.random.default_rng(0), targets, shadow)
    assert [len(y) for _, y in parts] == [6, 6, 6, 6]
    assert sorted(parts[0][1][:4].tolist() + parts[1][1][:4].tolist()) == list(range(8))
    drawn = torch.cat([y for _, y in parts])
    assert drawn.unique().numel() == 24  # nothing twice
    assert all((y[4:] >= 100).all() for _, y in parts[:2])  # filled from the shadow pool
    assert all((y >= 100).all() for _, y in parts[2:])


@pytest.mark.parametrize("overrides", [
    {"mia-unlearn-references": 3, "mia-shadows": 2},
    {"mia-unlearn-references": 4, "mia-shadows": 2},
    {"mia-unlearn-references": 6},
    {"mia-unlearn-references": 6, "mia-shadows": 2, "frameworks": "FR"},
    {"mia-unlearn-references": 6, "mia-shadows": 2, "frameworks": "FR,RR"},
])
def test_bad_unlearn_reference_settings_are_refused(overrides):
    with pytest.raises(ConfigError, match="'mia-unlearn-references'"):
        RunConfig.from_run_config(fused_run_config(overrides))


@pytest.mark.parametrize("frameworks", ["SE-R,FR", "SE,FR", "FE,FR"])
def test_u_lira_takes_any_calibration_interval(frameworks):
    """The references replay with the method's own strategy
    (:mod:`server_app.stages.references`), FedEraser's interval included."""
    cfg = RunConfig.from_run_config(fused_run_config(
        {"mia-unlearn-references": 6, "mia-shadows": 2, "frameworks": frameworks,
         "calibration-interval": 2}))
    assert cfg.audit.mia_unlearn_references == 6
    assert set(recipe(cfg).frameworks) == set(frameworks.split(",")) - {"FR"}
