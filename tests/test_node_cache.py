"""task.node_cache: a client's share cached in its node folder, same data as uncached."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from task import node_cache
from task.config import TaskConfig, fused_run_config
from task.registry import load_client_data
from tests.conftest import TINY


@pytest.fixture
def cfg(shared_data) -> TaskConfig:
    return TaskConfig.from_run_config(fused_run_config({**TINY, "partition": "noniid",
                                                        "data-dir": str(shared_data)}))


def test_cached_share_equals_the_loaded_one_and_is_read_from_the_file(
        cfg, tmp_path, monkeypatch):
    x0, y0, task = load_client_data(cfg, 3)
    x1, y1, classes1 = node_cache.cached_client_data(cfg, 3, "", tmp_path)
    files = list((tmp_path / node_cache.CACHE_DIR).glob("*.npz"))
    assert len(files) == 1 and not list(files[0].parent.glob("*.tmp"))

    def no_load(*_a, **_k):
        raise AssertionError("loaded again instead of reading the node-dir cache")

    monkeypatch.setattr(node_cache, "load_client_data", no_load)
    x2, y2, classes2 = node_cache.cached_client_data(cfg, 3, "", tmp_path)
    for x, y in ((x1, y1), (x2, y2)):
        assert x.dtype == x0.dtype and y.dtype == y0.dtype
        assert torch.equal(x, x0) and torch.equal(y, y0)
    assert classes1 == classes2 == task.num_classes == 10
    assert len(x0) == TINY["client-samples"]


def test_every_deciding_setting_changes_the_key(cfg, shared_data):
    base = node_cache.cache_key(cfg, 0, shared_data)
    changed = [node_cache.cache_key(cfg, 1, shared_data),
               node_cache.cache_key(cfg, 0, shared_data / "MNIST")]
    for field, value in (("seed", 1), ("partition", "iid"), ("client_samples", 32),
                         ("num_clients", 4), ("partition_alpha", 0.1)):
        changed.append(node_cache.cache_key(dataclasses.replace(cfg, **{field: value}),
                                            0, shared_data))
    assert base == node_cache.cache_key(cfg, 0, shared_data)  # deterministic
    assert len({base, *changed}) == len(changed) + 1


def test_without_a_node_dir_nothing_is_written(cfg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x, y, classes = node_cache.cached_client_data(cfg, 0, "", None)
    assert len(x) == len(y) == TINY["client-samples"] and classes == 10
    assert not list(tmp_path.rglob("*.npz"))


def test_a_corrupt_cache_file_is_rebuilt(cfg, tmp_path):
    x0, y0, _ = node_cache.cached_client_data(cfg, 2, "", tmp_path)
    (path,) = (tmp_path / node_cache.CACHE_DIR).glob("*.npz")
    path.write_bytes(b"not an npz")
    x1, y1, _ = node_cache.cached_client_data(cfg, 2, "", tmp_path)
    assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert path.stat().st_size > 100  # written again
