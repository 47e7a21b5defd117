"""A task's data, loaded once per process, and each client's share.

A built-in task's module reads its files (:mod:`task.tasks`); where they are is
decided by :func:`task.locate.resolve_data_dir`, and :func:`load_files` reads a
whole task once per process (Ray workers call it many times). :func:`partitions` splits it
over the clients (labels: :mod:`task.partitioners`; per-position targets:
:func:`task.text.partition_text`) and :func:`client_data` returns one client's
share. :class:`TaskData` is also what a plug-in task's loader returns
(:meth:`TaskData.from_arrays`, :meth:`TaskData.from_datasets`);
:func:`task.registry.load_client_data` does all of it for a ClientApp.

Images are kept as uint8 tensors of shape (N, C, H, W); the model scales and
normalises them.  Text is kept as int64 blocks of character ids.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from task import text as text_task
from task.config import check_split
from task.locate import DataSource, cache_root, resolve_data_dir
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
        A plug-in task's samples may have any trailing shape and dtype its model
        takes (e.g. float32 (N, 64) feature vectors).
    source : str
        Path of the copy that was read (folder, tar file or text file).
    kind : str
        ``"image"``, ``"text"``, or a plug-in task's own word (for the log).
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    source: str
    kind: str

    @property
    def has_classes(self) -> bool:
        """Whether each sample has one class label (targets of shape (N,)).

        Labels are split by the label partitioners (:mod:`task.partitioners`);
        targets of shape (N, T) (next characters) by contiguous ranges
        (:func:`task.text.partition_text`).
        """
        return self.train_y.ndim == 1

    @classmethod
    def from_arrays(cls, train_x, train_y, test_x, test_y, num_classes: int | None = None,
                    source: str = "", kind: str = "") -> TaskData:
        """A task from arrays or tensors: samples (N, ...) and int targets (N,) or (N, T).

        Parameters
        ----------
        train_x, test_x : array_like or torch.Tensor
            Samples, first axis N (kept in their dtype: what the model takes).
        train_y, test_y : array_like or torch.Tensor
            Integer class labels (N,), or per-position targets (N, T); stored int64.
        num_classes : int, optional
            Classes (or vocabulary size); default ``max label + 1``.
        source, kind : str
            As the attributes.

        Returns
        -------
        TaskData

        Raises
        ------
        ValueError
            Lengths that differ, targets that are not integers in
            [0, num_classes), or fewer than 2 classes.
        """
        def tensor(a) -> torch.Tensor:
            return a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))

        xs = [tensor(a) for a in (train_x, test_x)]
        ys = [tensor(a) for a in (train_y, test_y)]
        for name, x, y in (("train", xs[0], ys[0]), ("test", xs[1], ys[1])):
            if len(x) != len(y) or len(x) == 0:
                raise ValueError(f"{name} set: {len(x)} samples but {len(y)} targets "
                                 "(both must be equal and >= 1)")
            if y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
                raise ValueError(f"{name} targets must be integers, got {y.dtype}")
        ys = [y.to(torch.int64) for y in ys]
        classes = int(max(y.max() for y in ys)) + 1 if num_classes is None \
            else int(num_classes)
        low = min(int(y.min()) for y in ys)
        if classes < 2 or low < 0 or max(int(y.max()) for y in ys) >= classes:
            raise ValueError(f"targets must lie in [0, num_classes) with num_classes "
                             f">= 2; got values {low}..{max(int(y.max()) for y in ys)}"
                             f" for num_classes = {classes}")
        return cls(xs[0], ys[0], xs[1], ys[1], classes, source, kind)

    @property
    def has_train(self) -> bool:
        """Whether the training split was loaded (False: :meth:`test_only`)."""
        return len(self.train_x) > 0

    @classmethod
    def test_only(cls, test_x: torch.Tensor, test_y: torch.Tensor, num_classes: int,
                  source: str, kind: str) -> TaskData:
        """The test split alone: training arrays of 0 rows, shaped and typed as the test's.

        What a task's ``load_test`` returns (:class:`task.interface.Task`): the
        server of a run whose clients read their own folders (run-config
        ``client-data = true``) holds no training sample. ``train_x`` is
        ``test_x[:0]`` (shape (0, ...), the test dtype), ``train_y`` likewise, so
        :attr:`has_classes` still reads the targets' shape.
        """
        return cls(test_x[:0].clone(), test_y[:0].clone(), test_x, test_y, num_classes,
                   source, kind)

    @classmethod
    def from_datasets(cls, train, test, features: str = "x", label: str = "label",
                      num_classes: int | None = None, source: str = "",
                      kind: str = "") -> TaskData:
        """A task from two Hugging Face ``datasets.Dataset`` (Flower Datasets' form).

        Parameters
        ----------
        train, test : datasets.Dataset
            The splits; column ``features`` holds a sample (any array shape),
            column ``label`` its integer class. Read once into tensors; the
            clients' shares are cut by the run's ``partition`` (for
            ``dirichlet`` and ``pathological``, Flower Datasets' own partitioners).
        features, label : str
            Column names.
        num_classes : int, optional
            Default: the ``label`` column's ``ClassLabel`` size if it has one,
            else ``max label + 1``.
        source, kind : str
            As the attributes.

        Returns
        -------
        TaskData

        Raises
        ------
        ValueError
            A missing column, or labels as :meth:`from_arrays` refuses.
        """
        for name, split in (("train", train), ("test", test)):
            missing = {features, label} - set(split.column_names)
            if missing:
                raise ValueError(f"{name} dataset lacks column(s) {sorted(missing)}; "
                                 f"it has {split.column_names}")
        if num_classes is None:
            names = getattr(train.features.get(label), "names", None)
            num_classes = len(names) if names else None
        arrays = [split.with_format("numpy")[column] for split in (train, test)
                  for column in (features, label)]
        return cls.from_arrays(arrays[0], arrays[1], arrays[2], arrays[3], num_classes,
                               source, kind)


@functools.lru_cache(maxsize=16)
def _load_cached(name: str, read: Callable[[Path, int], TaskData], folder: str,
                 block_size: int, cache: str) -> TaskData:
    del cache  # part of the key only: e.g. where CIFAR-10's JPEGs are decoded
    start = time.perf_counter()
    task = read(Path(folder), block_size)
    log.info("Loaded %s from %s: %d train / %d test in %.2f s", name, task.source,
             len(task.train_y), len(task.test_y), time.perf_counter() - start)
    return task


def load_files(source: DataSource, read: Callable[[Path, int], TaskData],
               data_dir: str | None = None, block_size: int = 0) -> TaskData:
    """A built-in task's whole data (train and test), read once per process.

    The folder is found by :func:`task.locate.resolve_data_dir`; results are
    cached per (task, reader, folder found, block size, cache root), so later
    calls return the same :class:`TaskData` object without reading files.

    Parameters
    ----------
    source : DataSource
        The task's files (its module's).
    read : callable
        ``read(folder: Path, block_size: int) -> TaskData``, a module-level
        function of the task's module (part of the cache key).
    data_dir : str or None
        Explicit folder (run-config key ``data-dir``); ``""`` or None = unset.
    block_size : int
        What ``read`` gets (a text task's block length; 0 for a task that
        ignores it, so it is not part of that task's identity).

    Returns
    -------
    TaskData

    Raises
    ------
    DatasetNotFoundError
        The data is nowhere to be found (:func:`task.locate.resolve_data_dir`).
    """
    folder = resolve_data_dir(source, data_dir or None)
    return _load_cached(source.name, read, str(folder), int(block_size),
                        str(cache_root()))


load_files.cache_clear = _load_cached.cache_clear  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=32)
def _partition(task: TaskData, num_clients: int, scheme: str, seed: int, alpha: float,
               classes_per_client: int) -> tuple[np.ndarray, ...]:
    if not task.has_classes:
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
