"""Which samples the shadow-model membership inference uses (issue 13)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from audits import mia_sets
from audits.mia_sets import (
    FREE_TRAIN,
    MiaSets,
    check_disjoint,
    choose_sets,
    pair_by_class,
)
from server_app.config import RunConfig
from server_app.stages.audit import audited_run
from task.builtin import load_task_data
from task.config import fused_run_config
from tests.conftest import TINY


def _cfg(**overrides) -> RunConfig:
    return RunConfig.from_run_config(fused_run_config({**TINY, **overrides}))


def _assert_sound(sets: MiaSets, task, cfg: RunConfig, targets) -> None:
    """Targets are the targets' rows; non-members and shadows no client's, all disjoint."""
    rows = mia_sets.client_rows(cfg.data, cfg.seed, task)
    held = np.concatenate(rows)
    assert set(sets.target) <= set(np.concatenate([rows[p] for p in targets]))
    assert all(r in set(rows[o]) for r, o in zip(sets.target, sets.owner, strict=True))
    partner = sets.partner[sets.partner >= 0]
    assert len(set(partner)) == len(partner)  # a distinct non-member per target
    split_y = task.train_y if sets.heldout_split == "train" else task.test_y
    ok = sets.partner >= 0
    same = split_y.numpy()[sets.partner[ok]] == task.train_y.numpy()[sets.target[ok]]
    assert same.all()
    if sets.heldout_split == "train":
        assert not set(partner) & set(held)
    if sets.shadow_split == "train":
        assert not set(sets.shadow) & set(held)
    if sets.shadow_split == sets.heldout_split:
        assert not set(sets.shadow) & set(partner)


def test_non_members_are_free_training_images_apart_from_the_shadow_pool(shared_data):
    cfg = _cfg(**{"forget-clients": "3,5"})
    task = load_task_data("mnist", str(shared_data))
    sets = choose_sets(audited_run(cfg), task, [3, 5], shadow_in=4 * 64)
    assert sets.heldout_split == "train" and sets.shadow_split == "train"
    assert sets.shadow_source == FREE_TRAIN and len(sets.target) == 128
    assert (sets.partner >= 0).all()
    _assert_sound(sets, task, cfg, [3, 5])


def test_mia_samples_caps_the_targets(shared_data):
    cfg = _cfg(**{"forget-clients": "3", "mia-samples": 10})
    task = load_task_data("mnist", str(shared_data))
    sets = choose_sets(audited_run(cfg), task, [3], shadow_in=256)
    assert len(sets.target) == len(sets.partner) == 10
    _assert_sound(sets, task, cfg, [3])


def _fake_task(parts, train_y, test_y):
    task = SimpleNamespace(train_y=torch.as_tensor(train_y), test_y=torch.as_tensor(test_y))
    return task, (lambda *a, **k: tuple(np.asarray(p, np.int64) for p in parts))


def test_every_training_image_held_falls_back_to_the_test_set(monkeypatch):
    task, parts = _fake_task([range(0, 10), range(10, 20)], np.arange(20) % 2,
                             np.arange(12) % 2)
    monkeypatch.setattr(mia_sets, "partitions", parts)
    cfg = _cfg(**{"num-clients": 2, "num-shards": 1, "clients-per-round": 1,
                  "client-samples": 0})
    sets = choose_sets(audited_run(cfg), task, [1], shadow_in=3)
    assert sets.heldout_split == "test" and "test set" in sets.heldout_source
    assert sets.shadow_split == "test" and set(sets.shadow) == set(range(6))
    assert set(sets.partner[sets.partner >= 0]) <= set(range(6, 12))
    _assert_sound(sets, task, cfg, [1])


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=2, max_size=5),
       cap=st.integers(0, 8), free=st.integers(0, 40), classes=st.integers(1, 4),
       seed=st.integers(0, 5), shadow_in=st.integers(1, 10))
def test_sets_are_disjoint_for_any_partition(sizes, cap, free, classes, seed, shadow_in):
    rng = np.random.default_rng(seed)
    n = sum(sizes) + free
    order = rng.permutation(n)
    bounds = np.cumsum([0, *sizes])
    parts = [np.sort(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    task, fake = _fake_task(parts, rng.integers(0, classes, n),
                            rng.integers(0, classes, 30))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mia_sets, "partitions", fake)
        cfg = _cfg(**{"num-clients": len(sizes), "num-shards": 1, "clients-per-round": 1,
                      "client-samples": cap, "seed": seed})
        targets = [0, len(sizes) - 1]
        sets = choose_sets(audited_run(cfg), task, targets, shadow_in)
        _assert_sound(sets, task, cfg, targets)


def test_pairs_are_distinct_same_class_and_minus_one_when_short():
    out = pair_by_class(np.array([1, 1, 2, 3, 3]), np.array([3, 1, 1, 1, 2, 2, 0]), 0)
    pool = np.array([3, 1, 1, 1, 2, 2, 0])
    assert (pool[out[:4]] == [1, 1, 2, 3]).all() and out[4] == -1
    assert len(set(out[:4])) == 4


def test_overlapping_sets_are_refused():
    sets = MiaSets(np.array([1, 2]), np.array([0, 0]), np.array([5, 6]), "train", "",
                   np.array([6, 7, 8]), "train", "")
    with pytest.raises(RuntimeError, match="'non-member' and 'shadow'"):
        check_disjoint(sets, np.array([1, 2]))
    held = MiaSets(np.array([1, 2]), np.array([0, 0]), np.array([3, 4]), "train", "",
                   np.array([6, 7, 8]), "train", "")
    with pytest.raises(RuntimeError, match="'non-member' rows are held by a client"):
        check_disjoint(held, np.array([1, 2, 3]))
