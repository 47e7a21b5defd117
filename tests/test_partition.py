"""Tests of task.partition: the iid and noniid partitions of labelled samples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from task import partition
from task.builtin import load_task_data
from task.locate import SHARED_DATA_DIR
from task.partition import partition_indices

SHARED = SHARED_DATA_DIR
needs_mnist = pytest.mark.skipif(
    not (SHARED / "MNIST/raw/train-images-idx3-ubyte").is_file(),
    reason="shared MNIST copy not available",
)


def _check_partition(parts, n_total, num_clients):
    assert len(parts) == num_clients
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted, no repeats
    union = np.concatenate(parts)
    assert len(np.unique(union)) == len(union)  # pairwise disjoint
    assert union.min() >= 0 and union.max() < n_total


def _check_noniid(labels, parts, num_clients, fraction=0.8):
    size = len(labels) // num_clients
    n_primary = round(fraction * size)
    classes = np.unique(labels)
    primaries = []
    for part in parts:
        assert len(part) == size
        counts = np.array([(labels[part] == c).sum() for c in classes])
        assert counts.max() == n_primary
        primaries.append(int(np.argmax(counts)))
    return np.bincount(primaries, minlength=len(classes))




def test_iid_equal_disjoint_deterministic():
    labels = np.arange(1003) % 7
    parts = partition_indices(labels, 10, "iid", seed=3)
    _check_partition(parts, 1003, 10)
    assert {len(p) for p in parts} == {100}
    again = partition_indices(labels, 10, "iid", seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition_indices(labels, 10, "iid", seed=4)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_noniid_synthetic_primary_rule():
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(10), 100))
    parts = partition_indices(labels, 10, "noniid", seed=1)
    _check_partition(parts, 1000, 10)
    per_class = _check_noniid(labels, parts, 10)
    assert list(per_class) == [1] * 10  # one primary client per class
    assert sum(len(p) for p in parts) == 1000  # every sample used


def test_noniid_other_fraction_parameter():
    labels = np.repeat(np.arange(4), 250)
    parts = partition_indices(labels, 8, "noniid", seed=0, primary_fraction=0.5)
    _check_partition(parts, 1000, 8)
    assert list(_check_noniid(labels, parts, 8, fraction=0.5)) == [2, 2, 2, 2]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(num_clients=st.integers(1, 30), n_classes=st.integers(2, 6),
       n=st.integers(60, 600), seed=st.integers(0, 2**32 - 1),
       fraction=st.sampled_from([0.0, 0.5, 0.8, 1.0]))
def test_noniid_property(num_clients, n_classes, n, seed, fraction):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, size=n)
    counts = np.bincount(labels, minlength=n_classes)
    if np.count_nonzero(counts) < 2:
        return
    try:
        parts = partition_indices(labels, num_clients, "noniid", seed, fraction)
    except ValueError as error:
        assert "infeasible" in str(error) and "num-clients" in str(error)
        # only where even one sample a client is impossible
        assert counts[counts > 0].min() < num_clients
        return
    _check_partition(parts, n, num_clients)
    size = len(parts[0])
    assert 1 <= size <= n // num_clients
    assert size == partition.noniid_client_size(labels, num_clients, seed, fraction)
    n_primary = round(fraction * size)
    for part in parts:
        assert len(part) == size
        if 0 < n_primary and size - n_primary < n_primary:
            assert np.bincount(labels[part]).max() == n_primary


@needs_mnist
def test_noniid_on_real_mnist_labels(offline):
    labels = load_task_data("mnist").train_y.numpy()
    parts = partition_indices(labels, 100, "noniid", seed=0)
    _check_partition(parts, 60000, 100)
    assert list(_check_noniid(labels, parts, 100)) == [10] * 10
    assert sum(len(p) for p in parts) == 60000
    again = partition_indices(labels, 100, "noniid", seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def _digest(parts) -> str:
    import hashlib

    digest = hashlib.sha256()
    for part in parts:
        digest.update(np.asarray(part, np.int64).tobytes() + b"|")
    return digest.hexdigest()[:16]


@needs_mnist
@pytest.mark.parametrize("dataset, num_clients, digest", [
    # partitions made before client sizes could scale: they must not change
    ("mnist", 100, "6ec53558f83db09f"), ("mnist", 50, "7b73e8484d4f5a53"),
    ("mnist", 20, "fe912513cd75c413"), ("mnist", 10, "48ff7d091f8cc22d"),
    ("fmnist", 100, "48459064df311613"), ("fmnist", 10, "2512fdb373650691"),
])
def test_noniid_partitions_of_earlier_runs_are_unchanged(offline, dataset, num_clients,
                                                         digest):
    labels = load_task_data(dataset, str(SHARED)).train_y.numpy()
    assert _digest(partition_indices(labels, num_clients, "noniid", seed=0)) == digest


def test_noniid_synthetic_partition_is_unchanged():
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(10), 100))
    assert _digest(partition_indices(labels, 10, "noniid", seed=1)) == "39a491afeb54f40e"


@needs_mnist
@pytest.mark.parametrize("num_clients, size", [(1, 8428), (2, 7831), (8, 7314),
                                               (15, 3718), (30, 2000)])
def test_noniid_small_federations_scale_the_client_size(offline, num_clients, size):
    # MNIST's scarcest primary class limits a client (80% of it from that class)
    labels = load_task_data("mnist").train_y.numpy()
    parts = partition_indices(labels, num_clients, "noniid", seed=0)
    _check_partition(parts, 60000, num_clients)
    assert {len(p) for p in parts} == {size}
    assert {int(np.bincount(labels[p]).max()) for p in parts} == {round(0.8 * size)}


def test_noniid_infeasible_only_without_one_sample_per_primary():
    labels = np.array([0] * 50 + [1])  # class 1: one sample, but 2 primary clients
    with pytest.raises(ValueError, match="num-clients=4 .*infeasible.*class 1"):
        partition_indices(labels, 4, "noniid", seed=0)


@pytest.mark.parametrize("kwargs, key", [
    ({"scheme": "dirichlet"}, "partition='dirichlet'"),
    ({"num_clients": 0}, "num-clients=0"),
    ({"num_clients": 101}, "num-clients=101"),
    ({"primary_fraction": 1.5}, "primary_fraction=1.5"),
])
def test_partition_bad_args(kwargs, key):
    args = {"labels": np.arange(100) % 10, "num_clients": 10, "scheme": "noniid",
            "seed": 0, **kwargs}
    with pytest.raises(ValueError) as info:
        partition_indices(**args)
    assert key in str(info.value)
