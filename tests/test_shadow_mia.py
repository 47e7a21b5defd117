"""Shokri's shadow-model membership inference (issue 13)."""

from __future__ import annotations

import numpy as np
import pytest

from audits.shadow import ShadowAttack, shadow_splits, tpr_at_fpr
from cli.report import render
from server_app.config import ConfigError, RunConfig
from task.config import fused_run_config


def _proba(n, classes, confident, rng):
    """Softmax rows whose true class gets ``confident`` on average."""
    labels = rng.integers(0, classes, n)
    p = rng.dirichlet(np.ones(classes), n) * (1 - confident)
    p[np.arange(n), labels] += confident
    return p / p.sum(axis=1, keepdims=True), labels


def test_tpr_at_low_fpr_reads_the_roc_curve():
    truth = np.array([1, 1, 1, 0, 0, 0])
    assert tpr_at_fpr(truth, np.array([0.9, 0.8, 0.7, 0.3, 0.2, 0.1])) == 1.0
    assert tpr_at_fpr(truth, np.array([0.1, 0.2, 0.3, 0.7, 0.8, 0.9])) == 0.0


def test_per_class_attack_separates_overfit_members_from_heldout():
    rng = np.random.default_rng(0)
    p_in, y_in = _proba(600, 10, 0.95, rng)
    p_out, y_out = _proba(600, 10, 0.5, rng)
    attack = ShadowAttack(10, seed=0).fit(
        np.concatenate([p_in, p_out]), np.concatenate([y_in, y_out]),
        np.r_[np.ones(600), np.zeros(600)])
    assert set(attack.models_) == set(range(-1, 10))  # one per class + fallback
    t, yt = _proba(200, 10, 0.95, rng)
    h, yh = _proba(200, 10, 0.5, rng)
    scores = attack.score(t, yt, h, yh)
    assert scores["auc"] > 0.9 and scores["tpr_at_1fpr"] > 0.3
    same = attack.score(h[:100], yh[:100], h[100:], yh[100:])
    assert 0.3 < same["auc"] < 0.7  # no signal, no claim


def test_shadow_splits_are_disjoint_and_need_a_large_enough_pool():
    for inside, outside in shadow_splits(100, 40, 3, seed=0):
        assert len(inside) == len(outside) == 40 and not set(inside) & set(outside)
    with pytest.raises(ValueError, match="shadow pool"):
        shadow_splits(50, 40, 1, seed=0)


@pytest.mark.parametrize("overrides", [
    {"mia-shadows": 33}, {"mia-shadows": -1}, {"mia-shadows": 2, "mia": False},
    {"mia-shadows": 2, "dataset": "shakespeare"},
])
def test_bad_shadow_settings_are_refused(overrides):
    with pytest.raises(ConfigError, match="'mia-shadows'"):
        RunConfig.from_run_config(fused_run_config(overrides))


def test_run_reports_shadow_mia_for_each_model(run_server):
    summary, _ = run_server({"forget-clients": "3", "mia-shadows": 2,
                             "frameworks": "SE,FR"})
    for block in (summary["original"], *summary["frameworks"].values()):
        for key in ("mia_auc", "mia_f1", "mia_tpr_at_1fpr"):
            assert 0.0 <= block[key] <= 1.0, key
        assert block["mia_n_target"] == 64
    verification = summary["verification"]
    rounds = verification["forgotten_rounds"]["3"]
    assert rounds >= 1  # client 3 gave targets (mia_n_target above)
    mia = verification["mia"]
    assert mia["shadows"] == 2 and mia["targets"] == [3]
    assert mia["shadow_pool"] == "training samples no client holds"
    assert mia["heldout"].startswith("training samples no client holds")
    assert mia["n_targets"] == 64 and mia["target_rounds"] == {"3": rounds}
    original = summary["original"]
    assert original["mia_signal"] is (original["mia_auc_low"] > 0.5)
    text = render(summary)
    assert ("TPR@1%FPR" in text) is original["mia_signal"]
    assert ("no signal" in text) is not original["mia_signal"]
    assert "membership inference: shadow models" in text
    with_signal = render({**summary, "original": {**original, "mia_signal": True}})
    assert "TPR@1%FPR" in with_signal and "no signal" not in with_signal
    assert "64 targets; non-members: training samples no client holds" in text
