"""Tests of task.locate and task.data: finding datasets, loading them, client shares."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from task import locate
from task.builtin import load_task_data, resolve_data_dir
from task.data import TaskData, client_data
from task.locate import DatasetNotFoundError

SHARED = locate.SHARED_DATA_DIR
needs_mnist = pytest.mark.skipif(
    not (SHARED / "MNIST/raw/train-images-idx3-ubyte").is_file(),
    reason="shared MNIST copy not available",
)


def _fake_mnist(root: Path) -> Path:
    marker = root / "MNIST" / "raw" / "train-images-idx3-ubyte"
    marker.parent.mkdir(parents=True)
    marker.write_bytes(b"")
    return root



# ---------------------------------------------------------------- finding data


def test_missing_data_lists_every_place(tmp_path, cache, offline, monkeypatch):
    monkeypatch.setattr(locate, "SHARED_DATA_DIR", tmp_path / "shared")
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
    monkeypatch.setattr(locate, "SHARED_DATA_DIR", _fake_mnist(tmp_path / "shared"))
    with pytest.raises(DatasetNotFoundError) as info:
        resolve_data_dir("mnist", "/nonexistent")
    message = str(info.value)
    assert "'data-dir' = '/nonexistent'" in message and "\n" not in message
    with pytest.raises(DatasetNotFoundError, match="'data-dir'"):
        load_task_data("mnist", str(tmp_path / "empty"))


def test_data_dir_precedence(tmp_path, cache, offline, monkeypatch):
    arg, env, shared = (_fake_mnist(tmp_path / n) for n in ("arg", "env", "shared"))
    monkeypatch.setattr(locate, "SHARED_DATA_DIR", shared)
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
    monkeypatch.setattr(locate, "SHARED_DATA_DIR", tmp_path / "nowhere")
    _fake_mnist(cache / "data")
    assert resolve_data_dir("mnist") == cache / "data"


def test_client_uses_the_servers_folder_else_the_explicit_one(tmp_path):
    # node_data_dir(dataset, run-config data-dir, server's message data-dir)
    from task.builtin import node_data_dir

    held = str(_fake_mnist(tmp_path / "held"))
    empty = str(tmp_path / "empty")
    assert node_data_dir("mnist", "", held) == held
    # the server's folder is not on this node: the explicit setting, never another
    assert node_data_dir("mnist", empty, "/elsewhere") == empty
    assert node_data_dir("mnist", "", "") is None


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
