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
from server_app.evaluation.reference_unlearning import (
    learn_with_history,
    learning_seed,
    local_update,
    recover,
    se_unlearn,
)
from server_app.stages.audit import audited_run
from server_app.stages.references import recipe
from strategies.calibration import calibrate, refill_slots, weighted_step
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


def _own(cfg: RunConfig, name: str = "SE"):
    """The method's own settings in ``cfg`` (what its U-LiRA rule is given)."""
    return cfg.method_settings(name)


def _tiny(num_rounds: int, **overrides):
    cfg = RunConfig.from_run_config(fused_run_config(
        {**TINY, "num-rounds": num_rounds, "clients-per-round": 6, "num-shards": 2,
         **overrides}))
    torch.manual_seed(0)
    parts = [(torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))) for _ in range(3)]
    task = type("T", (), {"num_classes": 10})()
    return cfg, task, parts


@pytest.mark.slow
def test_se_unlearn_of_one_round_is_the_preparation_step():
    """G = 1: W' = W^0 + the retained clients' stored updates, weighted (eq. 2)."""
    cfg, task, parts = _tiny(num_rounds=1)
    learned, rounds = learn_with_history(cfg, task, parts, seed=3)
    assert sorted(rounds[0].updates) == [0, 1, 2]
    gone = se_unlearn(cfg, _own(cfg), task, parts, rounds, {0}, seed=3)
    expected = weighted_step(rounds[0].start, [rounds[0].updates[1], rounds[0].updates[2]],
                             [8, 8])
    assert all(np.array_equal(gone[k], expected[k]) for k in expected)
    assert any(not np.array_equal(gone[k], learned[k]) for k in learned)


@pytest.mark.slow
def test_se_unlearn_replays_later_rounds_and_leaves_a_shard_without_them_unchanged():
    cfg, task, parts = _tiny(num_rounds=2)
    learned, rounds = learn_with_history(cfg, task, parts, seed=4)
    gone = se_unlearn(cfg, _own(cfg), task, parts, rounds, {1}, seed=4)
    assert all(np.isfinite(v).all() for v in gone.values())
    assert gone.keys() == learned.keys()
    again = se_unlearn(cfg, _own(cfg), task, parts, rounds, {1}, seed=4)
    assert all(np.array_equal(gone[k], again[k]) for k in gone)  # seeded
    assert se_unlearn(cfg, _own(cfg), task, parts, rounds, {7}, seed=4) is None  # unchanged


@pytest.mark.slow
def test_se_unlearn_final_rounds_train_all_epochs_uncalibrated():
    """SE's ``calibration-final`` = 1: the last round is the retained clients' update."""
    cfg, task, parts = _tiny(num_rounds=2, **{"method.se.calibration-final": 1})
    learned, rounds = learn_with_history(cfg, task, parts, seed=4)
    forget = next(c for c in rounds[0].updates if len(rounds[1].updates) > (
        c in rounds[1].updates))  # a round-1 client; round 2 keeps another
    gone = se_unlearn(cfg, _own(cfg), task, parts, rounds, {forget}, seed=4)
    state = weighted_step(rounds[0].start, [u for c, u in rounds[0].updates.items()
                                            if c != forget],
                          [8] * (len(rounds[0].updates) - 1))
    kept = [c for c in rounds[1].updates if c != forget]
    fresh = [local_update(cfg, task, state, parts[c], cfg.training.local_epochs,
                          4 * 1000 + 1 * 100 + c + 50) for c in kept]
    want = weighted_step(state, fresh, [8] * len(kept))
    assert all(np.allclose(gone[k], want[k], atol=1e-6) for k in want)


@pytest.mark.slow
def test_se_unlearn_of_the_papers_se_calibrates_its_last_round():
    """``calibration-final`` = 0: round 2's fresh updates get the stored norms."""
    cfg, task, parts = _tiny(num_rounds=2, **{"method.se.calibration-final": 0})
    _, rounds = learn_with_history(cfg, task, parts, seed=4)
    forget = next(iter(rounds[0].updates))
    paper = se_unlearn(cfg, _own(cfg), task, parts, rounds, {forget}, seed=4)
    state = weighted_step(rounds[0].start, [u for c, u in rounds[0].updates.items()
                                            if c != forget],
                          [8] * (len(rounds[0].updates) - 1))
    kept = {c: u for c, u in rounds[1].updates.items() if c != forget}
    epochs = cfg.training.local_epochs / cfg.unlearning.retrain_ratio
    want = weighted_step(state, [calibrate(u, local_update(
        cfg, task, state, parts[c], epochs, 4 * 1000 + 1 * 100 + c + 50))
        for c, u in kept.items()], [8] * len(kept))
    assert all(np.allclose(paper[k], want[k], atol=1e-6) for k in want)


@pytest.mark.slow
def test_se_unlearn_with_refill_trains_a_substitute_in_the_forgotten_slot():
    """``replay-refill``: G = 1, eq. 2 plus a substitute's own L-epoch update."""
    cfg, task, parts = _tiny(num_rounds=1, **{"method.se.replay-refill": True})
    parts = [*parts, *parts[:2]]  # 5 clients, 3 a round: two sit out
    _, rounds = learn_with_history(cfg, task, parts, seed=3)
    forget = next(iter(rounds[0].updates))
    (sub,) = refill_slots(rounds[0].updates, range(5), {forget}, (3, 0, 1))
    assert sub not in rounds[0].updates
    gone = se_unlearn(cfg, _own(cfg), task, parts, rounds, {forget}, seed=3)
    kept = [u for c, u in rounds[0].updates.items() if c != forget]
    fresh = local_update(cfg, task, rounds[0].start, parts[sub],
                         cfg.training.local_epochs, 3 * 1000 + sub + 50)
    want = weighted_step(rounds[0].start, [*kept, fresh], [8] * (len(kept) + 1))
    assert all(np.allclose(gone[k], want[k], atol=1e-6) for k in want)


@pytest.mark.slow
def test_fe_rule_replays_from_round_1_where_se_starts_at_the_first_participation():
    """FedEraser recalibrates rounds before the forgotten client's; SE starts at it."""
    # the paper's SE: no refilled slot
    cfg, task, parts = _tiny(num_rounds=3, **{"method.se.replay-refill": False})
    seed = next(s for s in range(50)  # one client a round; the last round's is new
                if _last_is_new(learn_with_history(cfg, task, parts, s, per_round=1)[1]))
    learned, rounds = learn_with_history(cfg, task, parts, seed, per_round=1)
    late = next(iter(rounds[2].updates))
    se = se_unlearn(cfg, _own(cfg), task, parts, rounds, {late}, seed)
    fe = se_unlearn(cfg, _own(cfg), task, parts, rounds, {late}, seed,
                    from_first_participation=False)
    assert all(np.array_equal(se[k], rounds[2].start[k]) for k in se)  # W^2 kept
    assert any(not np.array_equal(fe[k], se[k]) for k in se)  # round 2 retrained


def _last_is_new(rounds) -> bool:
    seen = set(rounds[0].updates) | set(rounds[1].updates)
    return len(seen) == 2 and not seen & set(rounds[2].updates)


@pytest.mark.slow
def test_recovery_with_every_round_exact_retrains_with_the_learning_seeds():
    """recovery-warmup >= G: round 1 the stored updates (eq. 2), then real training.

    Each retained client trains L epochs from W' with the seed it had in that
    learning round, so the recovered model is FedAvg of exactly those updates.
    """
    cfg, task, parts = _tiny(num_rounds=2, **{"method.se-r.warmup": 5,
                                              "method.se-r.final": 0,
                                              "method.se-r.estimates": "lbfgs"})
    _, rounds = learn_with_history(cfg, task, parts, seed=6)
    got = recover(cfg, _own(cfg, "SE-R"), task, parts, rounds, {0}, seed=6)
    state = weighted_step(rounds[0].start, [rounds[0].updates[1], rounds[0].updates[2]],
                          [8, 8])
    fresh = [local_update(cfg, task, state, parts[c], cfg.training.local_epochs,
                           learning_seed(6, 1, c)) for c in (1, 2)]
    want = weighted_step(state, fresh, [8, 8])
    assert all(np.allclose(got[k], want[k], atol=1e-6) for k in want)
    # an unforgotten history: W' = W, the stored updates come back
    assert recover(cfg, _own(cfg, "SE-R"), task, parts, rounds, {7}, seed=6) is None
    same = local_update(cfg, task, rounds[1].start, parts[1], cfg.training.local_epochs,
                         learning_seed(6, 1, 1))
    assert all(np.allclose(same[k], rounds[1].updates[1][k], atol=1e-6) for k in same)


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
        {**TINY, "frameworks": "SE,FR,FE,RR,SISA,SE-R,FRec"}))
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
