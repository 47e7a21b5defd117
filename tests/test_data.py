"""Tests of task.data: finding datasets, loading them, partitions."""

from __future__ import annotations

import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from task import data
from task.data import (
    DATASETS,
    PARTITIONS,
    DatasetNotFoundError,
    TaskData,
    client_data,
    load_task_data,
    partition_indices,
    resolve_data_dir,
    validate_data_args,
)

SHARED = data.SHARED_DATA_DIR
needs_mnist = pytest.mark.skipif(
    not (SHARED / "MNIST/raw/train-images-idx3-ubyte").is_file(),
    reason="shared MNIST copy not available",
)


@pytest.fixture
def offline(monkeypatch):
    """No downloads, and an empty user cache."""

    def refuse(dataset, root):
        raise OSError("offline (test)")

    monkeypatch.setattr(data, "_download", refuse)
    monkeypatch.delenv("SE_DATA_DIR", raising=False)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("SE_CACHE_DIR", str(folder))
    return folder


def _fake_mnist(root: Path) -> Path:
    marker = root / "MNIST" / "raw" / "train-images-idx3-ubyte"
    marker.parent.mkdir(parents=True)
    marker.write_bytes(b"")
    return root


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


# ---------------------------------------------------------------- partitions


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
    assert size == data.noniid_client_size(labels, num_clients, seed, fraction)
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


@pytest.mark.parametrize("args, key, allowed", [
    (("svhn", "iid", 10), "dataset='svhn'", str(DATASETS)),
    (("mnist", "shards", 10), "partition='shards'", str(PARTITIONS)),
    (("mnist", "iid", 0), "num-clients=0", ">= 1"),
    (("mnist", "iid", "10"), "num-clients='10'", ">= 1"),
])
def test_validate_data_args(args, key, allowed):
    with pytest.raises(ValueError) as info:
        validate_data_args(*args)
    assert key in str(info.value) and allowed in str(info.value)


def test_validate_data_args_optional_keys():
    validate_data_args("shakespeare", "noniid", 100, partition_id=99, block_size=64)
    with pytest.raises(ValueError, match="partition-id=100"):
        validate_data_args("mnist", "iid", 100, partition_id=100)
    with pytest.raises(ValueError, match="block-size=1"):
        validate_data_args("shakespeare", "iid", 100, block_size=1)


# ---------------------------------------------------------------- finding data


def test_missing_data_lists_every_place(tmp_path, cache, offline, monkeypatch):
    monkeypatch.setattr(data, "SHARED_DATA_DIR", tmp_path / "shared")
    monkeypatch.setenv("SE_DATA_DIR", str(tmp_path / "env"))
    with pytest.raises(DatasetNotFoundError) as info:
        resolve_data_dir("mnist")
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for place in ("env", "shared", "cache"):
        assert str(tmp_path / place) in message
    assert "data-dir" in message and "SE_DATA_DIR" in message
    assert "offline (test)" in message
    with pytest.raises(DatasetNotFoundError, match="data-dir argument: \\(unset\\)"):
        load_task_data("cifar10", "")


def test_explicit_data_dir_is_never_replaced(tmp_path, cache, offline, monkeypatch):
    monkeypatch.setattr(data, "SHARED_DATA_DIR", _fake_mnist(tmp_path / "shared"))
    with pytest.raises(DatasetNotFoundError) as info:
        resolve_data_dir("mnist", "/nonexistent")
    message = str(info.value)
    assert "'data-dir' = '/nonexistent'" in message and "\n" not in message
    with pytest.raises(DatasetNotFoundError, match="'data-dir'"):
        load_task_data("mnist", str(tmp_path / "empty"))


def test_data_dir_precedence(tmp_path, cache, offline, monkeypatch):
    arg, env, shared = (_fake_mnist(tmp_path / n) for n in ("arg", "env", "shared"))
    monkeypatch.setattr(data, "SHARED_DATA_DIR", shared)
    assert resolve_data_dir("mnist") == shared
    assert resolve_data_dir("mnist", "") == shared
    monkeypatch.setenv("SE_DATA_DIR", str(env))
    assert resolve_data_dir("mnist") == env
    assert resolve_data_dir("mnist", str(arg)) == arg
    # An unset candidate that does not hold the dataset does not count.
    monkeypatch.setenv("SE_DATA_DIR", str(tmp_path / "empty"))
    assert resolve_data_dir("mnist") == shared
    # The user cache counts once it holds the data.
    monkeypatch.delenv("SE_DATA_DIR")
    monkeypatch.setattr(data, "SHARED_DATA_DIR", tmp_path / "nowhere")
    _fake_mnist(cache / "data")
    assert resolve_data_dir("mnist") == cache / "data"


def test_client_uses_the_servers_folder_else_the_explicit_one(tmp_path):
    from flwr.app import ConfigRecord

    from client_app.app import data_dir

    held = str(_fake_mnist(tmp_path / "held"))
    empty = str(tmp_path / "empty")
    assert data_dir("mnist", {"data-dir": ""}, ConfigRecord({"data-dir": held})) == held
    # the server's folder is not on this node: the explicit setting, never another
    assert data_dir("mnist", {"data-dir": empty},
                    ConfigRecord({"data-dir": "/elsewhere"})) == empty
    assert data_dir("mnist", {"data-dir": ""}, ConfigRecord({})) is None


def test_unknown_dataset():
    with pytest.raises(ValueError, match="dataset='svhn'"):
        resolve_data_dir("svhn")
    with pytest.raises(ValueError, match="dataset='svhn'"):
        load_task_data("svhn")


# ---------------------------------------------------------------- loading


@needs_mnist
def test_load_mnist(offline):
    task = load_task_data("mnist")
    assert task.kind == "image" and task.num_classes == 10
    assert task.train_x.shape == (60000, 1, 28, 28)
    assert task.train_x.dtype == torch.uint8
    assert task.test_x.shape == (10000, 1, 28, 28)
    assert task.train_y.dtype == torch.int64 and task.train_y.shape == (60000,)
    assert set(task.train_y.unique().tolist()) == set(range(10))
    assert "MNIST" in task.source
    assert load_task_data("mnist", None) is task  # cached
    assert load_task_data("mnist", data_dir="") is task


@needs_mnist
def test_client_data_images(offline):
    task = load_task_data("mnist")
    x, y = client_data(task, 3, 100, "noniid", 0)
    assert x.shape == (600, 1, 28, 28) and x.dtype == torch.uint8
    assert y.shape == (600,) and y.dtype == torch.int64
    assert torch.bincount(y).max() == 480
    assert client_data(task, 3, 100, "noniid", 0)[0] is x  # cached
    xs = [client_data(task, i, 100, "iid", 1)[1] for i in range(100)]
    assert sum(len(v) for v in xs) == 60000
    with pytest.raises(ValueError, match="partition-id=100"):
        client_data(task, 100, 100, "iid", 0)
    with pytest.raises(ValueError, match="partition='x'"):
        client_data(task, 0, 100, "x", 0)


def test_taskdata_hashes_by_identity():
    t = torch.zeros(2, 1)
    a = TaskData(t, t, t, t, 2, "a", "image")
    b = TaskData(t, t, t, t, 2, "a", "image")
    assert a != b and len({a, b}) == 2


# ---------------------------------------------------------------- CIFAR-10 JPEG

CLASSES = {"cat": (200, 30, 30), "airplane": (20, 40, 220), "dog": (10, 200, 10)}


def _fake_cifar_tar(root: Path) -> Path:
    from PIL import Image

    build = root / "build"
    for split, count in (("train", 3), ("test", 1)):
        for name, colour in CLASSES.items():
            folder = build / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (32, 32), colour).save(folder / f"{i:04d}.jpg",
                                                        quality=95)
    (build / "README.md").write_text("fake")
    tar_path = root / "data" / "cifar10-jpeg" / "cifar10-jpg.tar.gz"
    tar_path.parent.mkdir(parents=True)
    with tarfile.open(tar_path, "w:gz") as archive:
        for item in ("train", "test", "README.md"):
            archive.add(build / item, arcname=item)
    return root / "data"


def test_cifar_jpeg_extract_decode_and_cache(tmp_path, cache, offline, monkeypatch):
    folder = _fake_cifar_tar(tmp_path)
    task = load_task_data("cifar10", str(folder))
    assert task.source.endswith("cifar10-jpg.tar.gz")
    assert task.train_x.shape == (9, 3, 32, 32) and task.train_x.dtype == torch.uint8
    assert task.test_x.shape == (3, 3, 32, 32)
    assert task.train_y.dtype == torch.int64
    # labels follow ImageFolder's sorted class names airplane, cat, dog; the
    # samples come in a fixed shuffled order, not class by class
    assert sorted(task.train_y.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert task.train_y.tolist() != sorted(task.train_y.tolist())
    for label, colour in enumerate(sorted(CLASSES)):
        pixels = task.train_x[task.train_y == label].float().mean(dim=(0, 2, 3))
        assert torch.allclose(pixels, torch.tensor(CLASSES[colour]).float(), atol=4)
    npy = sorted(p.name for p in cache.rglob("*.npy"))
    assert npy == ["test_x.npy", "test_y.npy", "train_x.npy", "train_y.npy"]
    assert not list(cache.rglob(".extract-*")) and not list(cache.rglob("*.part"))

    # A fresh process (cache cleared) reads the .npy arrays, decoding nothing.
    import torchvision.datasets

    def no_decoding(*args, **kwargs):
        raise AssertionError("JPEGs decoded again")

    monkeypatch.setattr(torchvision.datasets, "ImageFolder", no_decoding)
    load_task_data.cache_clear()
    again = load_task_data("cifar10", str(folder))
    assert again is not task
    assert torch.equal(again.train_x, task.train_x)
    assert torch.equal(again.test_y, task.test_y)


def test_cifar_extraction_once_under_races(tmp_path, cache):
    tar_path = _fake_cifar_tar(tmp_path) / "cifar10-jpeg" / "cifar10-jpg.tar.gz"
    results, errors = [], []

    def extract():
        try:
            results.append(data.extract_cifar_jpeg(tar_path))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=extract) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(set(results)) == 1
    final = results[0]
    assert sorted(p.name for p in final.iterdir()) == ["README.md", "test", "train"]
    assert len(list((final / "train" / "cat").iterdir())) == 3
    assert not list(final.parent.glob(".extract-*"))
    assert data.extract_cifar_jpeg(tar_path) == final


def test_cifar_decoded_once_by_concurrent_loaders(tmp_path, cache, monkeypatch):
    tar_path = _fake_cifar_tar(tmp_path) / "cifar10-jpeg" / "cifar10-jpg.tar.gz"
    calls = []
    decode = data._decode_cifar_jpeg

    def counting(images, files):
        calls.append(images)
        decode(images, files)

    monkeypatch.setattr(data, "_decode_cifar_jpeg", counting)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        data._load_cifar_jpeg(tar_path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 3
    assert all(torch.equal(r[0], results[0][0]) for r in results)
