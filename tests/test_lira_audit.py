"""LiRA in the shadow-model audit: its sets, its settings, a run's keys (issue 27)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from audits.lira_audit import LiraAudit, LiraSamples
from audits.mia_sets import MiaSets, check_disjoint, match_by_class
from cli.report import render
from server_app.config import ConfigError, RunConfig
from server_app.stages.audit import audited_run
from task.config import fused_run_config


def test_match_by_class_gives_distinct_rows_of_each_targets_class():
    targets = np.array([0, 1, 0, 2, 1, 0])
    pool = np.array([0] * 10 + [1] * 3 + [2] * 8)
    match = match_by_class(targets, pool, per_target=3, seed=0)
    assert match.shape == (6, 3)
    found = match[match >= 0]
    assert len(set(found.tolist())) == found.size  # distinct
    rows = np.flatnonzero(match >= 0)
    assert (pool[match[match >= 0]] == np.repeat(targets, 3)[match.ravel() >= 0]).all()
    assert rows.size == 3 * 3 + 3 + 3  # class 1: 3 in the pool for 2 x 3 asked
    ones = match[targets == 1]
    assert (ones[:, 0] >= 0).all() and (ones[:, 2] < 0).all()  # short: whole columns
    assert (match == match_by_class(targets, pool, 3, seed=0)).all()


def _world(n_per_client: int, clients: list[int], r: int, shift: float, seed: int):
    """A fake task whose image i is the number i; its out-mean phi is mu[i]."""
    rng = np.random.default_rng(seed)
    n = n_per_client * len(clients)
    size = n * (1 + r)
    task = SimpleNamespace(train_x=torch.arange(size, dtype=torch.float32)[:, None],
                           train_y=torch.zeros(size, dtype=torch.int64))
    sets = MiaSets(np.arange(n), np.repeat(clients, n_per_client), np.full(n, -1),
                   "train", "", np.zeros(0, np.int64), "train", "",
                   np.arange(n, size).reshape(n, r))
    mu = rng.normal(0.0, 2.0, size)
    member = np.zeros(size)
    member[:n] = shift

    def model(noise_seed: int, in_shift: bool):
        noise = np.random.default_rng(noise_seed).normal(0.0, 1.0, size)

        def proba(x: torch.Tensor) -> np.ndarray:
            i = x[:, 0].long().numpy()
            phi = mu[i] + noise[i] + (member[i] if in_shift else 0.0)
            p = 1.0 / (1.0 + np.exp(-phi))
            return np.stack([p, 1.0 - p], axis=1)
        return proba
    return task, sets, model


def test_lira_audit_separates_members_and_forgotten_clients():
    task, sets, model = _world(40, [1, 3], r=60, shift=1.5, seed=0)
    check_disjoint(sets, np.zeros(0, np.int64))
    samples = LiraSamples.from_sets(task, sets)
    assert len(samples.clients) == 2 and len(samples.pseudo) == 2 * 60
    assert all(len(g) == 40 for g in samples.pseudo)
    audit = LiraAudit(samples, [model(10 + i, False) for i in range(8)], seed=0)
    target = model(99, True)
    scores = audit.score(lambda s, x: target(x), [[1, 3]])
    assert scores["lira_n_member"] == 80 and scores["lira_n_nonmember"] == 4800
    assert 0.8 < scores["lira_auc"] < 0.95  # analytic 0.86 for 1.5 sigma, k = 8
    assert scores["lira_auc_ci"][0] < scores["lira_auc"] < scores["lira_auc_ci"][1]
    assert scores["lira_tpr_at_1fpr"] > 0.05 and scores["lira_tpr_at_01fpr"] is not None
    assert scores["lira_client_auc"] == 1.0  # 40 samples of 1.5 sigma each
    assert scores["lira_client_tpr_at_01fpr"] is None  # 120 pseudo-clients: unread
    assert scores["lira_client_pvalues"] == [1 / 121, 1 / 121]  # above every one
    clean = audit.score(lambda s, x: model(98, False)(x), [[1, 3]])
    assert clean["lira_auc_ci"][0] < 0.5 < clean["lira_auc_ci"][1]
    only_one = audit.score(lambda s, x: target(x), [[3]])  # client 1 in no shard
    assert only_one["lira_n_member"] == 40 and only_one["lira_n_nonmember"] == 2400
    settings = audit.settings()
    assert settings["references"] == 8 and settings["variance"].startswith("global")
    assert settings["n_nonmembers"] == 4800 and settings["pseudo_clients"] == 120
    assert any("lira_client_tpr_at_01fpr" in line for line in settings["unread"])
    assert not any(line.startswith("mia_lira_tpr") for line in settings["unread"])


@pytest.mark.parametrize("overrides", [
    {"mia-references": 1, "mia-shadows": 2}, {"mia-references": 257, "mia-shadows": 2},
    {"mia-references": 4},
    {"mia-references": 4, "mia-shadows": 2, "dataset": "shakespeare"},
])
def test_bad_reference_settings_are_refused(overrides):
    with pytest.raises(ConfigError, match="'mia-references'"):
        RunConfig.from_run_config(fused_run_config(overrides))


def test_bad_nonmember_count_is_refused():
    with pytest.raises(ConfigError, match="'mia-nonmembers' = 0"):
        RunConfig.from_run_config(fused_run_config({"mia-nonmembers": 0}))


def test_run_reports_lira_per_example_and_per_client(run_server):
    summary, _ = run_server({"forget-clients": "3", "mia-shadows": 2,
                             "mia-references": 3, "mia-nonmembers": 640,
                             "mia-unlearn-references": 6,
                             "frameworks": "SE,FR,FE,SE-R,FRec"})
    lira = summary["verification"]["mia"]["lira"]
    assert lira["references"] == 3 and lira["n_targets"] == 64
    assert lira["n_nonmembers"] == 640 and lira["pseudo_clients"] == 10
    for block in (summary["original"], *summary["frameworks"].values()):
        assert 0.0 <= block["mia_lira_auc"] <= 1.0
        low, high = block["mia_lira_auc_ci"]
        assert low <= block["mia_lira_auc"] <= high
        assert 0.0 <= block["mia_lira_tpr_at_1fpr"] <= 1.0
        assert block["mia_lira_tpr_at_01fpr"] is None  # 640 non-members: unread
        assert 0.0 <= block["mia_lira_client_auc"] <= 1.0
        assert block["mia_lira_client_n_member"] == 1
        assert block["mia_lira_client_n_nonmember"] == 10
        assert block["mia_auc"] is not None  # Shokri's keys are kept
    text = render(summary)
    assert "LiRA: offline" in text and "client TPR@1%FPR" in text
    assert len(summary["original"]["mia_lira_client_pvalues"]) == 1
    # the verdict is the original's intervals against chance (0.5 AUC, 0.01 TPR)
    original = summary["original"]
    signal = original["mia_lira_auc_ci"][0] > 0.5 or \
        original["mia_lira_tpr_at_1fpr_ci"][0] > 0.01
    assert original["mia_lira_signal"] is signal
    assert ("LiRA: no signal" in text) is not signal
    assert ("each forgotten client's p-value" in text) is signal
    ulira = summary["verification"]["mia"]["ulira"]
    assert ulira["references"] == 6 and ulira["pool"] == 64
    assert ulira["forgotten_clients"] == 1 and ulira["client_size"] == 64
    # client 3's 64 samples are the targets: half of them, filled up to 64
    assert ulira["shapes"]["shard"]["targets_per_client"] == 32
    assert ulira["shapes"]["federation"]["clients"] == 8
    assert ulira["frameworks"] == {"SE": "shard", "FE": "federation",
                                   "SE-R": "shard", "FRec": "federation"}
    assert ulira["exact_by_construction"] == ["FR"]
    for name in ("original", "SE", "FE", "SE-R", "FRec"):
        block = summary["original"] if name == "original" else \
            summary["frameworks"][name]
        assert 0.0 <= block["mia_ulira_game_auc"] <= 1.0
        assert block["mia_ulira_game_n_member"] == 6 * 32  # each reference's half
        assert block["mia_ulira_n_member"] == 64  # the run's model: every target
        assert block["mia_ulira_n_nonmember"] == block["mia_ulira_game_n_nonmember"]
    assert "mia_ulira_auc" not in summary["frameworks"]["FR"]
    assert "U-LiRA: 6 references of each shape (shard-shaped: 4 clients" in text
    assert "FR: retrain without the forgotten clients, exact by construction" in text
    assert any(line.startswith("mia_ulira_game_tpr_at_01fpr not read: 192 negatives")
               for line in ulira["unread"])


def test_experiment_report_lists_lira_of_the_runs_that_have_it():
    from experiments import collect
    from experiments.report.requests import lira_section as _lira_section
    row = {"run": "memorize-seed0", "framework": "FR", "mia_lira_auc": 0.512,
           "mia_lira_tpr_at_1fpr": 0.015, "mia_lira_tpr_at_01fpr": None}
    assert set(collect.LIRA_METRICS) <= set(collect.COLUMNS)
    text = "\n".join(_lira_section([row, {"run": "other", "framework": "SE"}]))
    assert "memorize-seed0" in text and "0.512" in text and "other" not in text
    assert _lira_section([{"run": "other", "framework": "SE"}]) == []
    # a run whose original has no LiRA signal: "no signal" instead of its scores
    quiet = [{"run": "tiny", "framework": "original", "mia_lira_auc": 0.503,
              "mia_lira_signal": False},
             {"run": "tiny", "framework": "SE", "mia_lira_auc": 0.497}]
    text = "\n".join(_lira_section([row, *quiet]))
    assert "0.512" in text and "0.503" not in text and "0.497" not in text
    assert "no signal: the original model's LiRA intervals are not above chance" in text
    assert "run(s) tiny;" in text


def _sets(shared_data, **overrides):
    from audits.mia_sets import choose_sets
    from task.builtin import load_task_data
    from tests.conftest import TINY
    cfg = RunConfig.from_run_config(fused_run_config(
        {**TINY, "forget-clients": "3", "mia-shadows": 2, "mia-references": 2,
         **overrides}))
    task = load_task_data("mnist", str(shared_data))
    return choose_sets(audited_run(cfg), task, [3], shadow_in=4 * 64), task


def test_lira_non_members_are_class_matched_free_rows_apart_from_every_set(shared_data):
    sets, task = _sets(shared_data, **{"mia-nonmembers": 640})
    assert sets.lira_partner.shape == (64, 10) and (sets.lira_partner >= 0).all()
    y = task.train_y.numpy()
    assert (y[sets.lira_partner] == y[sets.target][:, None]).all()
    assert not set(sets.lira_partner.ravel()) & set(sets.shadow)
    assert not set(sets.lira_partner.ravel()) & set(sets.partner)
    assert sets.heldout_split == "train" and len(sets.shadow) >= 2 * 4 * 64


def test_lira_non_members_fall_back_to_the_test_set_with_the_partners(shared_data):
    sets, task = _sets(shared_data, **{"client-samples": 0, "mia-samples": 100})
    assert sets.heldout_split == "test" and sets.lira_partner.shape[0] == 100
    rows = sets.lira_partner[sets.lira_partner >= 0]
    half = len(task.test_y) // 2
    assert rows.min() >= half and not set(rows) & set(sets.partner)
    y = task.test_y.numpy()
    matched = sets.lira_partner >= 0
    assert (y[sets.lira_partner[matched]]
            == task.train_y.numpy()[np.repeat(sets.target, sets.lira_partner.shape[1])
                                    .reshape(sets.lira_partner.shape)][matched]).all()
