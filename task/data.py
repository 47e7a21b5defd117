"""The datasets of the paper, loaded once per process, and each client's share.

Four tasks: MNIST, Fashion-MNIST, CIFAR-10 (images, CNN) and Tiny Shakespeare
(characters, NanoGPT-style model).  Where the files are is decided by
:func:`task.locate.resolve_data_dir`; :func:`load_task_data` loads a whole task
once per process (Ray workers call it many times), :func:`partitions` splits it
over the clients (:mod:`task.partition` for images, :func:`task.text.partition_text`
for text) and :func:`client_data` returns one client's share;
:func:`load_client_data` does all of it for a ClientApp from a
:class:`task.config.TaskConfig`.

Images are kept as uint8 tensors of shape (N, C, H, W); the model scales and
normalises them.  Text is kept as int64 blocks of character ids.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from task import text as text_task
from task.cifar import load_cifar10
from task.config import TaskConfig, check_dataset, check_split, validate_data_args
from task.locate import cache_root, node_data_dir, resolve_data_dir
from task.partitioners import label_partition

log = logging.getLogger("task.data")


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
    tensors, source = load_cifar10(folder)
    train_x, train_y, test_x, test_y = tensors
    return TaskData(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                    num_classes=10, source=source, kind="image")


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

    The folder is found by :func:`task.locate.resolve_data_dir`; results are
    cached per (dataset, folder found, block size, cache root), so later calls
    return the same :class:`TaskData` object without reading files.

    MNIST and Fashion-MNIST are read with ``torchvision.datasets.MNIST`` /
    ``FashionMNIST(download=False)``.  CIFAR-10 is read from canonical
    ``cifar-10-batches-py/`` pickles where present, otherwise from the JPEG
    copy, extracted once into the user cache and decoded once into .npy
    arrays (see :mod:`task.cifar`).  Tiny Shakespeare is encoded
    and blocked by :mod:`task.text`.

    Parameters
    ----------
    dataset : str
        One of :data:`task.config.DATASETS`.
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
    check_dataset(dataset)
    if dataset == "shakespeare":
        validate_data_args(dataset, "iid", 1, block_size=block_size)
    else:
        block_size = 0  # not part of an image task's identity
    folder = resolve_data_dir(dataset, data_dir)
    return _load_cached(dataset, str(folder), int(block_size), str(cache_root()))


load_task_data.cache_clear = _load_cached.cache_clear  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=32)
def _partition(task: TaskData, num_clients: int, scheme: str, seed: int, alpha: float,
               classes_per_client: int) -> tuple[np.ndarray, ...]:
    if task.kind == "text":
        # No classes to skew: every non-IID scheme is the text's bucket scheme.
        text_scheme = "iid" if scheme == "iid" else "noniid"
        parts = text_task.partition_text(len(task.train_x), num_clients, text_scheme,
                                         seed)
    else:
        parts = label_partition(task.train_y.numpy(), num_clients, scheme, seed,
                                alpha, classes_per_client)
    return tuple(parts)


def partitions(task: TaskData, num_clients: int, scheme: str, seed: int,
               alpha: float = 0.5, classes_per_client: int = 2
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
    scheme : str
        One of :data:`task.config.PARTITIONS`.
    seed : int
        Partition seed.
    alpha : float
        ``partition-alpha`` (``dirichlet`` only).
    classes_per_client : int
        ``classes-per-client`` (``pathological`` only).

    Returns
    -------
    tuple of np.ndarray
        ``C`` sorted int64 index arrays, pairwise disjoint (images: see
        :func:`task.partitioners.label_partition`; text: see
        :func:`task.text.partition_text`, every non-IID scheme being its
        ``noniid`` buckets).

    Raises
    ------
    ValueError
        Naming ``partition`` or ``num-clients`` when invalid or infeasible.
    """
    check_split(scheme, num_clients)
    return _partition(task, num_clients, scheme, seed, float(alpha),
                      int(classes_per_client))


@functools.lru_cache(maxsize=128)
def client_data(task: TaskData, partition_id: int, num_clients: int, scheme: str,
                seed: int, alpha: float = 0.5, classes_per_client: int = 2
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's training data.

    Images use :func:`task.partition.partition_indices`, text
    :func:`task.text.partition_text` (contiguous block ranges).  Partitions and
    client shares are cached.

    Parameters
    ----------
    task : TaskData
        From :func:`load_task_data`.
    partition_id : int
        Client index in ``[0, num_clients)``.
    num_clients : int
        Number of clients ``C``.
    scheme : str
        One of :data:`task.config.PARTITIONS`.
    seed : int
        Partition seed.
    alpha, classes_per_client :
        As :func:`partitions`.

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
    check_split(scheme, num_clients, partition_id)
    parts = partitions(task, num_clients, scheme, seed, alpha, classes_per_client)
    idx = torch.from_numpy(parts[partition_id])
    return task.train_x[idx], task.train_y[idx]


def partition_sizes(task: TaskData, num_clients: int, scheme: str, seed: int,
                    cap: int = 0, alpha: float = 0.5, classes_per_client: int = 2
                    ) -> list[int]:
    """Training samples each client holds, without copying any data.

    The same partition as :func:`client_data` (cached), so the server can bound
    what a client may claim to have trained on.

    Parameters
    ----------
    task, num_clients, scheme, seed, alpha, classes_per_client :
        As :func:`partitions`.
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
    check_split(scheme, num_clients, None)
    parts = partitions(task, num_clients, scheme, seed, alpha, classes_per_client)
    sizes = [len(part) for part in parts]
    return [min(size, cap) if cap > 0 else size for size in sizes]


def load_client_data(cfg: TaskConfig, partition_id: int, server_data_dir: str = ""
                     ) -> tuple[torch.Tensor, torch.Tensor, TaskData]:
    """A ClientApp's training data: its share of the task, capped at ``client-samples``.

    Parameters
    ----------
    cfg : TaskConfig
        The task's run-config keys.
    partition_id : int
        This node's client index in ``[0, cfg.num_clients)``.
    server_data_dir : str
        The server's data folder (message ``config["data-dir"]``), used where it
        holds the dataset on this node too (:func:`task.locate.node_data_dir`).

    Returns
    -------
    x, y : torch.Tensor
        As :func:`client_data`, the first ``cfg.client_samples`` rows (all if 0).
    task : TaskData
        The whole task (for ``num_classes``).

    Raises
    ------
    ValueError
        Naming ``partition-id`` or the partition's keys when invalid.
    DatasetNotFoundError
        If the dataset is not where this node looks.
    """
    folder = node_data_dir(cfg.dataset, cfg.data_dir, server_data_dir)
    task = load_task_data(cfg.dataset, folder, cfg.block_size)
    x, y = client_data(task, partition_id, cfg.num_clients, cfg.partition, cfg.seed,
                       cfg.partition_alpha, cfg.classes_per_client)
    limit = cfg.client_samples or None  # 0: all of the partition
    return x[:limit], y[:limit], task
