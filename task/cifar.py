"""CIFAR-10: the canonical pickles, or the JPEG copy extracted and decoded once.

The JPEG copy (``cifar10-jpeg/cifar10-jpg.tar.gz``: ``train/<class>/*.jpg``,
``test/<class>/*.jpg``) is extracted once into the user cache
(:func:`extract_cifar_jpeg`), decoded once into .npy arrays, and read from
those arrays afterwards (:func:`load_cifar_jpeg`); concurrent processes wait
for the one that decodes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from task.locate import DatasetNotFoundError, cache_root

log = logging.getLogger(__name__)

CIFAR_TAR = Path("cifar10-jpeg") / "cifar10-jpg.tar.gz"
"""The CIFAR-10 JPEG copy, relative to a data folder."""

CIFAR_PICKLES = Path("cifar-10-batches-py")
"""The canonical CIFAR-10 pickles, relative to a data folder."""


def _atomic_save(path: Path, array: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy.part")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.save(handle, array)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cifar_cache_dir(tar_path: Path) -> Path:
    stat = tar_path.stat()
    return cache_root() / "cifar10-jpeg" / f"{stat.st_size}-{stat.st_mtime_ns}"


def extract_cifar_jpeg(tar_path: Path) -> Path:
    """Extract the CIFAR-10 JPEG tar into the user cache, once.

    Extraction goes to a temporary folder beside the target, which is then
    renamed into place atomically; if another process got there first its
    copy is kept and ours removed.

    Parameters
    ----------
    tar_path : Path
        ``cifar10-jpeg/cifar10-jpg.tar.gz`` (``train/<class>/*.jpg``,
        ``test/<class>/*.jpg``).

    Returns
    -------
    Path
        ``<cache root>/cifar10-jpeg/<size>-<mtime>/images`` holding ``train/``
        and ``test/``.

    Raises
    ------
    DatasetNotFoundError
        If the archive has no ``train/`` and ``test/`` folders.
    """
    final = _cifar_cache_dir(tar_path) / "images"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".extract-"))
    try:
        start = time.perf_counter()
        with tarfile.open(tar_path, "r:*") as archive:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
                archive.extractall(tmp, filter="data")
            else:  # pragma: no cover
                archive.extractall(tmp)  # noqa: S202 - our own dataset archive
        roots = [p for p in (tmp, *tmp.iterdir())
                 if (p / "train").is_dir() and (p / "test").is_dir()]
        if not roots:
            raise DatasetNotFoundError(f"{tar_path} has no train/ and test/ folders")
        try:
            os.rename(roots[0], final)
        except OSError:
            if not final.is_dir():
                raise
            log.info("Another process extracted %s first; using its copy", tar_path)
        else:
            log.info("Extracted %s into %s in %.1f s", tar_path, final,
                     time.perf_counter() - start)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock between processes (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _decode_cifar_jpeg(images: Path, files: dict[str, Path]) -> None:
    """Decode ``images/{train,test}`` with ImageFolder into uint8 / int64 .npy files."""
    from torchvision.datasets import ImageFolder

    start = time.perf_counter()
    for split in ("train", "test"):
        folder = ImageFolder(str(images / split))
        xs = np.empty((len(folder), 3, 32, 32), dtype=np.uint8)
        for i, (path, _) in enumerate(folder.samples):
            picture = np.asarray(folder.loader(path), dtype=np.uint8)
            xs[i] = picture.transpose(2, 0, 1)
        ys = np.asarray(folder.targets, dtype=np.int64)
        _atomic_save(files[f"{split}_y"], ys)
        _atomic_save(files[f"{split}_x"], xs)
    log.info("Decoded CIFAR-10 JPEGs of %s in %.1f s", images,
             time.perf_counter() - start)


def load_cifar_jpeg(tar_path: Path, test_only: bool = False) -> tuple[torch.Tensor, ...]:
    """CIFAR-10 from the JPEG copy, via a .npy cache decoded once.

    Parameters
    ----------
    tar_path : Path
        ``cifar10-jpeg/cifar10-jpg.tar.gz``.
    test_only : bool
        Read only the test split's cache files (the archive, if not decoded
        yet, is decoded whole first); returns ``(test_x, test_y)``.

    Returns
    -------
    tuple of torch.Tensor
        ``(train_x, train_y, test_x, test_y)``: uint8 (N, 3, 32, 32) images and
        int64 (N,) labels (ImageFolder's sorted class names), in a fixed
        shuffled order (seed 0), not class by class.

    Raises
    ------
    DatasetNotFoundError
        If the archive has no ``train/`` and ``test/`` folders.
    """
    cache = _cifar_cache_dir(tar_path)
    files = {f"{split}_{part}": cache / f"{split}_{part}.npy"
             for split in ("train", "test") for part in ("x", "y")}

    def cached() -> bool:
        return all(path.is_file() for path in files.values())

    if not cached():
        # One process extracts and decodes; others wait here, then read the .npy.
        with _file_lock(cache.parent / f".{cache.name}.lock"):
            if not cached():
                _decode_cifar_jpeg(extract_cifar_jpeg(tar_path), files)
    splits = ("test",) if test_only else ("train", "test")
    arrays = [np.load(files[f"{split}_{part}"]) for split in splits for part in "xy"]
    # ImageFolder lists the images class by class; a fixed shuffle (seed 0) puts
    # the samples in a mixed order like the canonical files, so a cap such as
    # test-samples or client-samples does not pick a single class.
    out = []
    for x, y in zip(arrays[0::2], arrays[1::2], strict=True):
        order = np.random.default_rng(0).permutation(len(y))
        out += [torch.from_numpy(x[order]), torch.from_numpy(y[order])]
    return tuple(out)


def load_cifar10(folder: Path, test_only: bool = False
                 ) -> tuple[tuple[torch.Tensor, ...], str]:
    """CIFAR-10 from a data folder: the canonical pickles where present, else the JPEGs.

    Parameters
    ----------
    folder : Path
        A folder holding ``cifar-10-batches-py/`` or ``cifar10-jpeg/cifar10-jpg.tar.gz``
        (see :func:`task.locate.resolve_data_dir`).
    test_only : bool
        Only the test split: ``tensors`` is ``(test_x, test_y)`` (the pickles:
        torchvision ``train=False`` reads ``test_batch`` alone).

    Returns
    -------
    tensors : tuple of torch.Tensor
        ``(train_x, train_y, test_x, test_y)``: uint8 (N, 3, 32, 32) images and
        int64 (N,) labels.
    source : str
        The path read (the pickle folder or the tar file).

    Raises
    ------
    DatasetNotFoundError
        If the JPEG archive has no ``train/`` and ``test/`` folders.
    """
    if (folder / CIFAR_PICKLES / "data_batch_1").is_file():
        import torchvision

        def to_nchw(data: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(data.transpose(0, 3, 1, 2)))

        test = torchvision.datasets.CIFAR10(str(folder), train=False, download=False)
        log.info("CIFAR-10: canonical pickles at %s", folder / CIFAR_PICKLES)
        if test_only:
            return (to_nchw(test.data), torch.as_tensor(test.targets, dtype=torch.int64)
                    ), str(folder / CIFAR_PICKLES)
        train = torchvision.datasets.CIFAR10(str(folder), train=True, download=False)
        return (to_nchw(train.data), torch.as_tensor(train.targets, dtype=torch.int64),
                to_nchw(test.data), torch.as_tensor(test.targets, dtype=torch.int64)
                ), str(folder / CIFAR_PICKLES)
    tar_path = folder / CIFAR_TAR
    log.info("CIFAR-10: JPEG copy (quality ~75, not bit-identical) at %s", tar_path)
    return load_cifar_jpeg(tar_path, test_only), str(tar_path)
