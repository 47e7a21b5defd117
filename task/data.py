"""Datasets of the paper, found offline, and their federated partitions.

Four tasks: MNIST, Fashion-MNIST, CIFAR-10 (images, CNN) and Tiny Shakespeare
(characters, NanoGPT-style model).  Where the files are is decided by
:func:`resolve_data_dir`; :func:`load_task_data` loads a whole task once per
process (Ray workers call it many times) and :func:`client_data` returns one
client's share.

Images are kept as uint8 tensors of shape (N, C, H, W); the model scales and
normalises them.  Text is kept as int64 blocks of character ids.

Partitions (paper, Section "Experiments"):

- images, ``iid``: equal random parts;
- images, ``noniid``: equal parts in which a fraction ``primary_fraction``
  (80%) of each client's samples come from one *primary* class
  (:func:`partition_indices`);
- text: contiguous block ranges, two unbalanced buckets per client for
  ``noniid`` (:func:`task.text.partition_text`); the text task has no
  labels to skew, so the same scheme names mean something different there.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from task import text as text_task

log = logging.getLogger("task.data")

DATASETS = ("mnist", "fmnist", "cifar10", "shakespeare")
PARTITIONS = ("iid", "noniid")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
"""The project root (parent of ``client_app/``)."""

SHARED_DATA_DIR = PROJECT_ROOT.parent / "shared" / "data"
"""Offline copies kept next to the project (``<project root>/../shared/data``)."""

_CIFAR_TAR = Path("cifar10-jpeg") / "cifar10-jpg.tar.gz"
_CIFAR_PICKLES = Path("cifar-10-batches-py")
_MARKERS = {
    "mnist": (Path("MNIST/raw/train-images-idx3-ubyte"),),
    "fmnist": (Path("FashionMNIST/raw/train-images-idx3-ubyte"),),
    "cifar10": (_CIFAR_PICKLES / "data_batch_1", _CIFAR_TAR),
    "shakespeare": (Path("tinyshakespeare/input.txt"),),
}
_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
    "tinyshakespeare/input.txt"
)


class DatasetNotFoundError(FileNotFoundError):
    """No usable copy of a dataset was found; the message lists every place looked."""


@dataclass(frozen=True, eq=False)
class TaskData:
    """A whole learning task, as loaded by :func:`load_task_data`.

    Compared and hashed by identity (it holds tensors).

    Attributes
    ----------
    train_x, test_x : torch.Tensor
        Images: uint8, shape (N, C, H, W) (MNIST/FMNIST (N, 1, 28, 28),
        CIFAR-10 (N, 3, 32, 32)), raw pixel values 0..255.
        Text: int64, shape (N, T), blocks of ``T = block_size`` character ids.
    train_y, test_y : torch.Tensor
        Images: int64 class labels, shape (N,).  Text: int64, shape (N, T),
        the next character of each position of ``x``.
    num_classes : int
        Number of classes (10), or the vocabulary size for text (65).
    source : str
        Path of the copy that was read (folder, tar file or text file).
    kind : str
        ``"image"`` or ``"text"``.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    source: str
    kind: str


# --------------------------------------------------------------------------
# Validation


def validate_data_args(dataset: str, partition: str, num_clients: int,
                       partition_id: int | None = None,
                       block_size: int | None = None) -> None:
    """Check data settings early, naming the run-config key of a bad value.

    Parameters
    ----------
    dataset : str
        One of :data:`DATASETS` (key ``dataset``).
    partition : str
        One of :data:`PARTITIONS` (key ``partition``).
    num_clients : int
        Number of clients >= 1 (key ``num-clients``).
    partition_id : int, optional
        Client index in ``[0, num_clients)`` (key ``partition-id``).
    block_size : int, optional
        Text block length >= 2 (key ``block-size``).

    Raises
    ------
    ValueError
        Naming the key, the bad value and what is allowed.
    """
    _check_dataset(dataset)
    _check_split_args(partition, num_clients, partition_id, block_size)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_split_args(partition: str, num_clients: int, partition_id: int | None,
                      block_size: int | None) -> None:
    if partition not in PARTITIONS:
        raise ValueError(f"partition={partition!r} is not one of {PARTITIONS}")
    if not _is_int(num_clients) or num_clients < 1:
        raise ValueError(f"num-clients={num_clients!r} must be an integer >= 1")
    if partition_id is not None and (
            not _is_int(partition_id) or not 0 <= partition_id < num_clients):
        raise ValueError(
            f"partition-id={partition_id!r} must be an integer in [0, {num_clients})"
        )
    if block_size is not None and (not _is_int(block_size) or block_size < 2):
        raise ValueError(f"block-size={block_size!r} must be an integer >= 2")


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise ValueError(f"dataset={dataset!r} is not one of {DATASETS}")


# --------------------------------------------------------------------------
# Where the data is


def cache_root() -> Path:
    """The user cache: ``$SE_CACHE_DIR`` or ``~/.cache/sharding-eraser``.

    Returns
    -------
    Path
        Not created here.  Downloads go to ``<cache root>/data``; the CIFAR-10
        JPEG copy is extracted and decoded under ``<cache root>/cifar10-jpeg``.
    """
    env = os.environ.get("SE_CACHE_DIR", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sharding-eraser"


def _holds(dataset: str, folder: Path) -> bool:
    return any((folder / marker).is_file() for marker in _MARKERS[dataset])


def holds_dataset(dataset: str, folder: str) -> bool:
    """Whether ``folder`` (relative: from the project root) holds ``dataset``.

    Checks the marker files :func:`resolve_data_dir` looks for; reads nothing.
    Raises ValueError naming ``dataset`` if it is unknown.
    """
    _check_dataset(dataset)
    return bool(folder) and _holds(dataset, _as_dir(folder))


def _as_dir(value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


def _download(dataset: str, root: Path) -> None:
    """Fetch the canonical copy into ``root`` (needs internet); raises on failure."""
    import torchvision

    root.mkdir(parents=True, exist_ok=True)
    if dataset == "mnist":
        torchvision.datasets.MNIST(str(root), train=True, download=True)
        torchvision.datasets.MNIST(str(root), train=False, download=True)
    elif dataset == "fmnist":
        torchvision.datasets.FashionMNIST(str(root), train=True, download=True)
        torchvision.datasets.FashionMNIST(str(root), train=False, download=True)
    elif dataset == "cifar10":
        torchvision.datasets.CIFAR10(str(root), train=True, download=True)
    else:
        target = root / "tinyshakespeare" / "input.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(_SHAKESPEARE_URL, timeout=30) as response:
            payload = response.read()
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, target)


def resolve_data_dir(dataset: str, data_dir: str | None = None) -> Path:
    """Find a folder that really holds ``dataset``.

    An explicit ``data_dir`` (run-config key ``data-dir``; ``None`` or ``""`` =
    unset; a relative path is taken from the project root) is the only place
    looked: if it does not hold the dataset that is an error, never a silent
    switch to another folder.  Unset, candidates in order (the first one
    holding the dataset wins):

    1. environment variable ``SE_DATA_DIR``;
    2. ``<project root>/../shared/data`` (:data:`SHARED_DATA_DIR`);
    3. the user cache ``<cache root>/data`` (:func:`cache_root`), where the
       canonical copy is downloaded with ``download=True`` if it is not there
       yet (needs internet).

    A folder holds MNIST if it has ``MNIST/raw/train-images-idx3-ubyte``,
    Fashion-MNIST ``FashionMNIST/raw/train-images-idx3-ubyte``, CIFAR-10
    ``cifar-10-batches-py/data_batch_1`` or ``cifar10-jpeg/cifar10-jpg.tar.gz``,
    Tiny Shakespeare ``tinyshakespeare/input.txt``.

    Parameters
    ----------
    dataset : str
        One of :data:`DATASETS`.
    data_dir : str or None
        Explicit folder.

    Returns
    -------
    Path
        The folder (the parent of ``MNIST/``, ``cifar10-jpeg/``...).

    Raises
    ------
    ValueError
        If ``dataset`` is unknown.
    DatasetNotFoundError
        If an explicit ``data_dir`` does not hold the dataset (one line naming
        ``data-dir``), or no candidate holds it and the download failed (the
        message lists every candidate and why it was rejected).
    """
    _check_dataset(dataset)
    wanted = " or ".join(str(m) for m in _MARKERS[dataset])
    if data_dir:
        folder = _as_dir(data_dir)
        if not _holds(dataset, folder):
            raise DatasetNotFoundError(
                f"run-config 'data-dir' = {data_dir!r} is not allowed: {folder} does "
                f"not hold {dataset} (no {wanted}); give a folder that does, or '' "
                "to look in $SE_DATA_DIR, ../shared/data and the user cache")
        return folder
    looked: list[str] = ["data-dir argument: (unset)"]
    candidates = [
        ("SE_DATA_DIR", os.environ.get("SE_DATA_DIR", "")),
        ("shared copy", str(SHARED_DATA_DIR)),
    ]
    for label, value in candidates:
        if not value:
            looked.append(f"{label}: (unset)")
            continue
        folder = _as_dir(value)
        if _holds(dataset, folder):
            log.debug("Using %s of %s: %s", label, dataset, folder)
            return folder
        looked.append(f"{label}: {folder} (no {wanted})")
        if label != "shared copy":
            log.warning("%s %s does not hold %s; looking further",
                        label, folder, dataset)
    cache = cache_root() / "data"
    if _holds(dataset, cache):
        log.debug("Using user cache of %s: %s", dataset, cache)
        return cache
    try:
        _download(dataset, cache)
    except Exception as error:  # noqa: BLE001 - any failure means "not available"
        reason = " ".join(str(error).split())
        looked.append(f"user cache: {cache} (not there; download failed: "
                      f"{type(error).__name__}: {reason})")
    else:
        if _holds(dataset, cache):
            log.info("Downloaded %s into the user cache %s", dataset, cache)
            return cache
        looked.append(f"user cache: {cache} (download left no {wanted})")
    raise DatasetNotFoundError(
        f"dataset {dataset!r} not found; looked in:\n  " + "\n  ".join(looked)
    )


# --------------------------------------------------------------------------
# CIFAR-10 JPEG copy: extract once, decode once


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


def _load_cifar_jpeg(tar_path: Path) -> tuple[torch.Tensor, ...]:
    """(train_x, train_y, test_x, test_y) from the JPEG copy, via a .npy cache."""
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
    arrays = [np.load(files[key]) for key in ("train_x", "train_y", "test_x", "test_y")]
    # ImageFolder lists the images class by class; a fixed shuffle (seed 0) puts
    # the samples in a mixed order like the canonical files, so a cap such as
    # test-samples or client-samples does not pick a single class.
    out = []
    for x, y in ((arrays[0], arrays[1]), (arrays[2], arrays[3])):
        order = np.random.default_rng(0).permutation(len(y))
        out += [torch.from_numpy(x[order]), torch.from_numpy(y[order])]
    return tuple(out)


# --------------------------------------------------------------------------
# Loading


def _load_images(dataset: str, folder: Path) -> TaskData:
    if dataset in ("mnist", "fmnist"):
        import torchvision

        cls = torchvision.datasets.MNIST if dataset == "mnist" else \
            torchvision.datasets.FashionMNIST
        train = cls(str(folder), train=True, download=False)
        test = cls(str(folder), train=False, download=False)
        return TaskData(
            train_x=train.data.unsqueeze(1).contiguous(),
            train_y=train.targets.to(torch.int64),
            test_x=test.data.unsqueeze(1).contiguous(),
            test_y=test.targets.to(torch.int64),
            num_classes=10, source=str(Path(train.raw_folder)), kind="image")
    if (folder / _CIFAR_PICKLES / "data_batch_1").is_file():
        import torchvision

        train = torchvision.datasets.CIFAR10(str(folder), train=True, download=False)
        test = torchvision.datasets.CIFAR10(str(folder), train=False, download=False)

        def to_nchw(data: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(data.transpose(0, 3, 1, 2)))

        log.info("CIFAR-10: canonical pickles at %s", folder / _CIFAR_PICKLES)
        return TaskData(
            train_x=to_nchw(train.data),
            train_y=torch.as_tensor(train.targets, dtype=torch.int64),
            test_x=to_nchw(test.data),
            test_y=torch.as_tensor(test.targets, dtype=torch.int64),
            num_classes=10, source=str(folder / _CIFAR_PICKLES), kind="image")
    tar_path = folder / _CIFAR_TAR
    log.info("CIFAR-10: JPEG copy (quality ~75, not bit-identical) at %s", tar_path)
    train_x, train_y, test_x, test_y = _load_cifar_jpeg(tar_path)
    return TaskData(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                    num_classes=10, source=str(tar_path), kind="image")


def _load_text(folder: Path, block_size: int) -> TaskData:
    path = folder / "tinyshakespeare" / "input.txt"
    corpus = text_task.load_corpus(path)
    train_x, train_y = text_task.blocks(corpus.train_ids, block_size)
    test_x, test_y = text_task.blocks(corpus.test_ids, block_size)
    return TaskData(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                    num_classes=corpus.vocab_size, source=str(path), kind="text")


@functools.lru_cache(maxsize=16)
def _load_cached(dataset: str, folder: str, block_size: int, cache: str) -> TaskData:
    del cache  # part of the key only: the CIFAR-10 JPEG cache location
    start = time.perf_counter()
    if dataset == "shakespeare":
        task = _load_text(Path(folder), block_size)
    else:
        task = _load_images(dataset, Path(folder))
    log.info("Loaded %s from %s: %d train / %d test in %.2f s", dataset, task.source,
             len(task.train_y), len(task.test_y), time.perf_counter() - start)
    return task


def load_task_data(dataset: str, data_dir: str | None = None,
                   block_size: int = 64) -> TaskData:
    """Load a whole task (train and test), once per process.

    The folder is found by :func:`resolve_data_dir`; results are cached per
    (dataset, folder found, block size, cache root), so later calls return
    the same :class:`TaskData` object without reading files.

    MNIST and Fashion-MNIST are read with ``torchvision.datasets.MNIST`` /
    ``FashionMNIST(download=False)``.  CIFAR-10 is read from canonical
    ``cifar-10-batches-py/`` pickles where present, otherwise from the JPEG
    copy, extracted once into the user cache and decoded once into .npy
    arrays (see :func:`extract_cifar_jpeg`).  Tiny Shakespeare is encoded
    and blocked by :mod:`task.text`.

    Parameters
    ----------
    dataset : str
        One of :data:`DATASETS`.
    data_dir : str or None
        Explicit folder (run-config key ``data-dir``); ``""`` = unset.
    block_size : int
        Text block length ``T`` (ignored for images).

    Returns
    -------
    TaskData
        Images: uint8 (N, C, H, W) and int64 labels (N,).  Text: int64 (N, T)
        blocks and int64 (N, T) next-character targets.

    Raises
    ------
    ValueError
        If ``dataset`` or ``block_size`` is invalid.
    DatasetNotFoundError
        If the dataset is nowhere to be found.
    """
    _check_dataset(dataset)
    if dataset == "shakespeare":
        validate_data_args(dataset, "iid", 1, block_size=block_size)
    else:
        block_size = 0  # not part of an image task's identity
    folder = resolve_data_dir(dataset, data_dir)
    return _load_cached(dataset, str(folder), int(block_size), str(cache_root()))


load_task_data.cache_clear = _load_cached.cache_clear  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# Partitions


def partition_indices(labels: np.ndarray, num_clients: int, scheme: str, seed: int,
                      primary_fraction: float = 0.8) -> list[np.ndarray]:
    """Split labelled samples over clients (image tasks).

    ``iid``: a seeded permutation cut into ``C`` equal parts of ``N // C``
    samples (the last ``N mod C`` samples of the permutation are unused).

    ``noniid`` (paper: "80% of each client's samples from one primary
    class"): every client gets the same number ``size`` of samples, of which
    ``round(primary_fraction * size)`` come from its primary class and the rest
    from the other classes.  Primary classes are spread evenly: each class is
    primary for ``C // K`` or ``C // K + 1`` clients (``K`` classes; the extra
    slots go to the largest classes, ties broken by the seed), assigned to
    clients in seeded random order.  The non-primary samples are a seeded
    random draw from what is left of the other classes.  ``size`` is
    ``N // C`` where the classes can supply it, else the largest size they can
    (:func:`noniid_client_size`; e.g. MNIST with 8 clients: not 7500 because class
    8 has only 5851 samples for its primary client: 7314); so any ``C`` works, and
    where ``N // C`` is feasible the partition is the one of earlier versions.

    For the text task, use :func:`task.text.partition_text`, which
    splits training blocks (no labels) into contiguous ranges instead.

    Parameters
    ----------
    labels : np.ndarray
        Integer class labels, shape (N,).
    num_clients : int
        Number of clients ``C`` >= 1.
    scheme : {"iid", "noniid"}
        Partition scheme.
    seed : int
        Seed; same arguments, same partition.
    primary_fraction : float
        Fraction of a ``noniid`` client's samples from its primary class, in [0, 1].

    Returns
    -------
    list of np.ndarray
        ``C`` sorted int64 index arrays of equal length, pairwise disjoint.

    Raises
    ------
    ValueError
        If ``scheme`` is unknown, ``num_clients`` < 1 or > N, ``primary_fraction``
        is outside [0, 1], or the ``noniid`` split is infeasible even with one
        sample per client (a class has fewer samples than primary clients).
    """
    labels = np.asarray(labels).reshape(-1)
    n = len(labels)
    if scheme not in PARTITIONS:
        raise ValueError(f"partition={scheme!r} is not one of {PARTITIONS}")
    if not _is_int(num_clients) or not 1 <= num_clients <= n:
        raise ValueError(f"num-clients={num_clients!r} must be an integer in [1, {n}]")
    if not 0.0 <= primary_fraction <= 1.0:
        raise ValueError(f"primary_fraction={primary_fraction!r} must be in [0, 1]")
    rng = np.random.default_rng(seed)
    size = n // num_clients
    if scheme == "iid":
        perm = rng.permutation(n)[: size * num_clients].reshape(num_clients, size)
        return [np.sort(row).astype(np.int64) for row in perm]
    return _noniid(labels, num_clients, size, primary_fraction, rng)


def _noniid_sizes(counts: np.ndarray, slots: np.ndarray, num_clients: int,
                  size: int, primary_fraction: float) -> np.ndarray:
    """Candidate client sizes ``size, size - 1, ..., 1`` that the classes can supply.

    Size ``s`` (``p = round(f s)`` primary and ``o = s - p`` other samples a
    client) is feasible when every class c holds its primaries,
    ``slots[c] p <= counts[c]``, and the leftovers can fill every client's
    other samples without giving a client its own class:
    ``sum_c min(counts[c] - slots[c] p, (C - slots[c]) o) >= C o``.
    Returns the feasible sizes, largest first (int64, possibly empty).
    """
    sizes = np.arange(size, 0, -1, dtype=np.int64)
    n_p = np.rint(primary_fraction * sizes.astype(np.float64)).astype(np.int64)
    n_o = sizes - n_p
    left = counts[None, :] - slots[None, :] * n_p[:, None]
    cap = (num_clients - slots[None, :]) * n_o[:, None]
    supply = np.minimum(left, cap).sum(axis=1)
    ok = (left >= 0).all(axis=1) & (supply >= num_clients * n_o)
    return sizes[ok]


def _primary_slots(counts: np.ndarray, num_clients: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Primary clients per class: C // K each, the extra ones to the largest classes."""
    k = len(counts)
    slots = np.full(k, num_clients // k)
    tiebreak = rng.permutation(k)
    extra = np.lexsort((tiebreak, -counts))[: num_clients % k]
    slots[extra] += 1
    return slots


def noniid_client_size(labels: np.ndarray, num_clients: int, seed: int,
                       primary_fraction: float = 0.8) -> int:
    """Samples per client of the ``noniid`` partition (see :func:`partition_indices`).

    ``N // C`` where the classes can supply it, else the largest size they can.

    Parameters
    ----------
    labels : np.ndarray
        Integer class labels, shape (N,), at least 2 classes.
    num_clients : int
        ``C``, 1 <= C <= N.
    seed : int
        The partition seed (it breaks ties between equally large classes).
    primary_fraction : float
        Fraction of a client's samples from its primary class, in [0, 1].

    Returns
    -------
    int
        Samples per client (>= 1).

    Raises
    ------
    ValueError
        Fewer than 2 classes, or no size >= 1 is feasible (naming ``num-clients``).
    """
    labels = np.asarray(labels).reshape(-1)
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise ValueError("partition='noniid' needs at least 2 classes; got "
                         f"{len(classes)}")
    slots = _primary_slots(counts, num_clients, np.random.default_rng(seed))
    return _feasible_size(classes, counts, slots, num_clients, len(labels) // num_clients,
                          primary_fraction)


def _feasible_size(classes: np.ndarray, counts: np.ndarray, slots: np.ndarray,
                   num_clients: int, size: int, primary_fraction: float) -> int:
    feasible = _noniid_sizes(counts, slots, num_clients, size, primary_fraction)
    if len(feasible) == 0:
        c = int(np.argmax(slots - counts))
        raise ValueError(
            f"num-clients={num_clients} with partition='noniid' is infeasible: class "
            f"{classes[c]} has {counts[c]} samples for {slots[c]} primary clients; "
            "use fewer clients")
    if feasible[0] < size:
        log.debug("noniid: %d samples per client instead of N // C = %d (class "
                  "supply)", feasible[0], size)
    return int(feasible[0])


def _capped_pool(pool_idx: np.ndarray, pool_cls: np.ndarray, cap: np.ndarray,
                 need: int) -> np.ndarray:
    """The first ``need`` of the shuffled pool, taking at most ``cap[c]`` of class c.

    Equals ``pool_idx[:need]`` whenever no class exceeds its cap there.
    """
    rank = np.empty(len(pool_idx), dtype=np.int64)
    for c in range(len(cap)):
        where = pool_cls == c
        rank[where] = np.arange(int(where.sum()))
    return pool_idx[rank < cap[pool_cls]][:need]


def _noniid(labels: np.ndarray, num_clients: int, size: int, primary_fraction: float,
            rng: np.random.Generator) -> list[np.ndarray]:
    classes, counts = np.unique(labels, return_counts=True)
    k = len(classes)
    if k < 2:
        raise ValueError(f"partition='noniid' needs at least 2 classes; got {k}")
    # Spread primary classes evenly; extra slots go to the largest classes.
    slots = _primary_slots(counts, num_clients, rng)
    size = _feasible_size(classes, counts, slots, num_clients, size, primary_fraction)
    n_primary = int(round(primary_fraction * size))
    n_other = size - n_primary
    # Class (as a position in `classes`) of each client's primary samples.
    primary = rng.permutation(np.repeat(np.arange(k), slots))
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    parts: list[np.ndarray] = [np.empty(0, np.int64)] * num_clients
    pool = []
    for c in range(k):
        owners = np.flatnonzero(primary == c)
        for j, client in enumerate(owners):
            parts[client] = by_class[c][j * n_primary : (j + 1) * n_primary]
        pool.append(by_class[c][len(owners) * n_primary :])
    pool_idx = rng.permutation(np.concatenate(pool))
    # Others: a random draw of the pool, then swaps repair clashes with primaries.
    label_pos = np.searchsorted(classes, labels)
    # The pool exceeds the need by N - C * size samples: keep the head of the
    # shuffled pool, but at most (C - slots[c]) * n_other of class c (more could
    # not all be placed outside class c's primary clients; the size was chosen
    # so that the capped pool still fills every client).
    pool_idx = _capped_pool(pool_idx, label_pos[pool_idx],
                            (num_clients - slots) * n_other, num_clients * n_other)
    pool_cls = label_pos[pool_idx]
    other = pool_idx.reshape(num_clients, n_other)
    other_cls = pool_cls.reshape(num_clients, n_other)
    owner_cls = np.broadcast_to(primary[:, None], other.shape)
    clashes = np.argwhere(other_cls == owner_cls)
    for a, b in clashes:
        if other_cls[a, b] != primary[a]:
            continue  # fixed by an earlier swap
        bad = primary[a]
        valid = (other_cls != bad) & (primary[:, None] != bad)
        cand = np.flatnonzero(valid)
        if len(cand) == 0:
            raise ValueError(
                f"num-clients={num_clients} with primary_fraction={primary_fraction}"
                f" is infeasible: too few samples outside class {classes[bad]}"
            )
        # Prefer a slot that itself clashes: one swap fixes both.
        double = cand[other_cls.flat[cand] == primary[cand // n_other]]
        pick = rng.choice(double if len(double) else cand)
        c_row, c_col = divmod(int(pick), n_other)
        other[a, b], other[c_row, c_col] = other[c_row, c_col], other[a, b]
        other_cls[a, b], other_cls[c_row, c_col] = other_cls[c_row, c_col], bad
    return [np.sort(np.concatenate([parts[i], other[i]])).astype(np.int64)
            for i in range(num_clients)]


@functools.lru_cache(maxsize=32)
def _partition(task: TaskData, num_clients: int, scheme: str, seed: int
               ) -> tuple[np.ndarray, ...]:
    if task.kind == "text":
        parts = text_task.partition_text(len(task.train_x), num_clients, scheme, seed)
    else:
        parts = partition_indices(task.train_y.numpy(), num_clients, scheme, seed)
    return tuple(parts)


def partitions(task: TaskData, num_clients: int, scheme: str, seed: int
               ) -> tuple[np.ndarray, ...]:
    """Every client's rows of ``task.train_x`` (cached per task and arguments).

    The server calls this before the first round, so a partition that cannot be
    built fails there, not in a client in the middle of a round.

    Parameters
    ----------
    task : TaskData
        From :func:`load_task_data`.
    num_clients : int
        Number of clients ``C``.
    scheme : {"iid", "noniid"}
        Partition scheme.
    seed : int
        Partition seed.

    Returns
    -------
    tuple of np.ndarray
        ``C`` sorted int64 index arrays, pairwise disjoint (images: equal
        lengths, see :func:`partition_indices`; text: see
        :func:`task.text.partition_text`).

    Raises
    ------
    ValueError
        Naming ``partition`` or ``num-clients`` when invalid or infeasible.
    """
    _check_split_args(scheme, num_clients, None, None)
    return _partition(task, num_clients, scheme, seed)


@functools.lru_cache(maxsize=128)
def client_data(task: TaskData, partition_id: int, num_clients: int, scheme: str,
                seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's training data.

    Images use :func:`partition_indices`, text :func:`task.text.partition_text`
    (contiguous block ranges).  Partitions and client shares are cached.

    Parameters
    ----------
    task : TaskData
        From :func:`load_task_data`.
    partition_id : int
        Client index in ``[0, num_clients)``.
    num_clients : int
        Number of clients ``C``.
    scheme : {"iid", "noniid"}
        Partition scheme.
    seed : int
        Partition seed.

    Returns
    -------
    x, y : torch.Tensor
        Rows of ``task.train_x`` / ``task.train_y`` for this client (same dtypes
        and trailing shapes; images (n, C, H, W) uint8 and (n,) int64, text
        (n, T) int64 twice).

    Raises
    ------
    ValueError
        Naming ``partition``, ``num-clients`` or ``partition-id`` when invalid,
        or when the partition is infeasible.
    """
    _check_split_args(scheme, num_clients, partition_id, None)
    idx = torch.from_numpy(partitions(task, num_clients, scheme, seed)[partition_id])
    return task.train_x[idx], task.train_y[idx]


def partition_sizes(task: TaskData, num_clients: int, scheme: str, seed: int,
                    cap: int = 0) -> list[int]:
    """Training samples each client holds, without copying any data.

    The same partition as :func:`client_data` (cached), so the server can bound
    what a client may claim to have trained on.

    Parameters
    ----------
    task : TaskData
        From :func:`load_task_data`.
    num_clients : int
        Number of clients ``C``.
    scheme : {"iid", "noniid"}
        Partition scheme.
    seed : int
        Partition seed.
    cap : int
        The run config's ``client-samples``: a client uses only its first
        ``cap`` samples (0 = all).

    Returns
    -------
    list of int
        ``C`` sample counts (images: samples; text: blocks), in partition-id order.

    Raises
    ------
    ValueError
        As :func:`client_data`, naming ``partition`` or ``num-clients``.
    """
    _check_split_args(scheme, num_clients, None, None)
    sizes = [len(part) for part in _partition(task, num_clients, scheme, seed)]
    return [min(size, cap) if cap > 0 else size for size in sizes]
