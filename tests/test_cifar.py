"""Tests of task.cifar: the CIFAR-10 JPEG copy, extracted and decoded once."""

from __future__ import annotations

import tarfile
import threading
from pathlib import Path

import torch

from task import cifar
from task.builtin import load_task_data

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
            results.append(cifar.extract_cifar_jpeg(tar_path))
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
    assert cifar.extract_cifar_jpeg(tar_path) == final


def test_cifar_decoded_once_by_concurrent_loaders(tmp_path, cache, monkeypatch):
    tar_path = _fake_cifar_tar(tmp_path) / "cifar10-jpeg" / "cifar10-jpg.tar.gz"
    calls = []
    decode = cifar._decode_cifar_jpeg

    def counting(images, files):
        calls.append(images)
        decode(images, files)

    monkeypatch.setattr(cifar, "_decode_cifar_jpeg", counting)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        cifar.load_cifar_jpeg(tar_path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 3
    assert all(torch.equal(r[0], results[0][0]) for r in results)
