"""Flower Datasets partitioners (dirichlet, pathological, the paper's noniid)."""

import numpy as np
import pytest

from task.config import TaskConfig
from task.partition import partition_indices
from task.partitioners import label_partition, make_partitioner

LABELS = np.repeat(np.arange(10), 200)[np.random.default_rng(3).permutation(2000)]


def _check_split(parts, n):
    rows = np.concatenate(parts)
    assert len(np.unique(rows)) == len(rows)  # disjoint
    assert rows.min() >= 0 and rows.max() < n
    assert all(len(p) >= 1 and np.all(np.diff(p) > 0) for p in parts)  # sorted, non-empty


@pytest.mark.parametrize("scheme", ["dirichlet", "pathological"])
def test_flower_schemes_are_seeded_disjoint_splits(scheme):
    a = label_partition(LABELS, 20, scheme, seed=5, alpha=0.5, classes_per_client=2)
    b = label_partition(LABELS, 20, scheme, seed=5, alpha=0.5, classes_per_client=2)
    c = label_partition(LABELS, 20, scheme, seed=6, alpha=0.5, classes_per_client=2)
    _check_split(a, len(LABELS))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def _top_class_share(parts):
    return np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts])


def test_dirichlet_alpha_controls_skew():
    skewed = label_partition(LABELS, 20, "dirichlet", seed=0, alpha=0.1)
    flat = label_partition(LABELS, 20, "dirichlet", seed=0, alpha=1000.0)
    assert _top_class_share(skewed) > 0.5 > 0.2 > _top_class_share(flat)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_gives_each_client_k_classes(k):
    parts = label_partition(LABELS, 20, "pathological", seed=0, classes_per_client=k)
    _check_split(parts, len(LABELS))
    assert {len(np.unique(LABELS[p])) for p in parts} == {k}


def test_primary_class_partitioner_is_the_noniid_split():
    import datasets

    ds = datasets.Dataset.from_dict({"label": LABELS, "row": np.arange(len(LABELS))})
    partitioner = make_partitioner("noniid", 16, seed=2)
    partitioner.dataset = ds
    ours = partition_indices(LABELS, 16, "noniid", 2)
    for pid in (0, 7, 15):
        assert np.array_equal(partitioner.load_partition(pid)["row"], ours[pid])
    # iid and noniid go through the project's own split, unchanged
    assert all(np.array_equal(x, y) for x, y in
               zip(label_partition(LABELS, 16, "noniid", 2), ours, strict=True))


@pytest.mark.parametrize("scheme, kwargs, key", [
    ("dirichlet", {"alpha": 0.01}, "partition-alpha=0.01"),
    ("pathological", {"classes_per_client": 11}, "classes-per-client=11"),
])
def test_infeasible_split_names_its_key(scheme, kwargs, key):
    with pytest.raises(ValueError, match=f"partition='{scheme}'.*{key}") as err:
        label_partition(LABELS, 1000, scheme, seed=0, **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("field, value, words", [
    ("partition_alpha", 0.0, "'partition-alpha' = 0.0 is not allowed"),
    ("partition_alpha", float("inf"), "'partition-alpha' = inf must be a finite number"),
    ("classes_per_client", 0, "'classes-per-client' = 0 is not allowed"),
])
def test_task_config_checks_partition_keys(field, value, words):
    base = dict(dataset="mnist", partition="dirichlet", num_clients=8, seed=0,
                data_dir="", block_size=64, client_samples=0)
    with pytest.raises(ValueError, match=words):
        TaskConfig(**base, **{field: value})


def test_text_keeps_its_buckets_for_label_schemes(shared_data):
    from task.builtin import load_task_data
    from task.data import partitions

    task = load_task_data("shakespeare", str(shared_data), 16)
    buckets = partitions(task, 8, "noniid", 0)
    for scheme in ("dirichlet", "pathological"):
        parts = partitions(task, 8, scheme, 0, 0.5, 2)
        assert all(np.array_equal(x, y) for x, y in zip(parts, buckets, strict=True))


def test_dirichlet_run_learns_end_to_end(run_server):
    """partition='dirichlet' through the real ServerApp and ClientApps (in-process)."""
    summary, _ = run_server({"partition": "dirichlet", "partition-alpha": 0.5,
                             "frameworks": "none", "num-rounds": 1, "mia": False})
    assert summary["config"]["partition"] == "dirichlet"
    assert summary["config"]["partition-alpha"] == 0.5
    (first,) = summary["learning"]["rounds"]
    assert first["participants"] == 4 and first["warnings"] == []  # every reply accepted
