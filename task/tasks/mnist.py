"""MNIST and Fashion-MNIST: 28x28 grey images of 10 classes, the paper's small CNN.

One module for the family (the two share everything but facts), two registrations
(:data:`task.tasks.BUILTIN_TASKS`): :data:`mnist` and :data:`fmnist`. Both are read
from their uncompressed IDX files by torchvision (``download=False``), kept as
uint8 (N, 1, 28, 28) images with int64 (N,) labels, and learnt by
:class:`task.model.CNN` (channels 16, 32, hidden 128: 80,202 parameters), which
normalises them with the dataset's mean and standard deviation. The backdoor
trigger is the white square of :func:`task.backdoor.stamp`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

from task.backdoor import stamp
from task.config import TaskConfig
from task.data import TaskData, load_files
from task.interface import Task
from task.locate import DataSource, holds_dataset, resolve_data_dir
from task.model import CNN
from task.provenance import files_provenance

CNN_CHANNELS = (16, 32)
"""Convolution channels of the CNN for 1x28x28 images."""

IMAGE_SIDE = 28
"""Side of the square images, in pixels (one channel)."""


@dataclass(frozen=True)
class Idx:
    """One dataset of the family: where its files are and what it is.

    Attributes
    ----------
    name : str
        The run-config ``dataset`` name.
    folder : str
        The folder under the data folder torchvision reads (``<folder>/raw``).
    reader : str
        The ``torchvision.datasets`` class reading it.
    normalisation : (tuple of float, tuple of float)
        Mean and standard deviation of the training images in [0, 1].
    format : str
        summary.json ``data.format``.
    """

    name: str
    folder: str
    reader: str
    normalisation: tuple[tuple[float, ...], tuple[float, ...]]
    format: str

    @property
    def source(self) -> DataSource:
        """The marker file and the download (:mod:`task.locate`)."""
        marker = Path(self.folder) / "raw" / "train-images-idx3-ubyte"
        return DataSource(self.name, (marker,), partial(_download, self.reader))


MNIST = Idx("mnist", "MNIST", "MNIST", ((0.1307,), (0.3081,)),
            "MNIST IDX files (uncompressed), read by torchvision.datasets.MNIST")
FMNIST = Idx("fmnist", "FashionMNIST", "FashionMNIST", ((0.2860,), (0.3530,)),
             "Fashion-MNIST IDX files (uncompressed), read by "
             "torchvision.datasets.FashionMNIST")


def _download(reader: str, root: Path) -> None:
    import torchvision

    cls = getattr(torchvision.datasets, reader)
    cls(str(root), train=True, download=True)
    cls(str(root), train=False, download=True)


def _read(reader: str, folder: Path, block_size: int) -> TaskData:
    """Both splits through torchvision; ``block_size`` is ignored (0)."""
    import torchvision

    cls = getattr(torchvision.datasets, reader)
    train = cls(str(folder), train=True, download=False)
    test = cls(str(folder), train=False, download=False)
    return TaskData(
        train_x=train.data.unsqueeze(1).contiguous(),
        train_y=train.targets.to(torch.int64),
        test_x=test.data.unsqueeze(1).contiguous(),
        test_y=test.targets.to(torch.int64),
        num_classes=10, source=str(Path(train.raw_folder)), kind="image")


def _read_test(reader: str, folder: Path, block_size: int) -> TaskData:
    """The test split alone (torchvision ``train=False``: only the t10k files)."""
    import torchvision

    test = getattr(torchvision.datasets, reader)(str(folder), train=False,
                                                 download=False)
    return TaskData.test_only(test.data.unsqueeze(1).contiguous(),
                              test.targets.to(torch.int64), 10,
                              str(Path(test.raw_folder)), "image")


_READERS = {idx.reader: partial(_read, idx.reader) for idx in (MNIST, FMNIST)}
_TEST_READERS = {idx.reader: partial(_read_test, idx.reader) for idx in (MNIST, FMNIST)}


def _load(idx: Idx, settings: TaskConfig) -> TaskData:
    # one reader object per dataset: it is part of task.data's cache key
    return load_files(idx.source, _READERS[idx.reader], settings.data_dir or None)


def _load_test(idx: Idx, settings: TaskConfig) -> TaskData:
    return load_files(idx.source, _TEST_READERS[idx.reader], settings.data_dir or None)


def _model(idx: Idx, num_classes: int, **kw) -> nn.Module:
    """The CNN for 1x28x28 images; ``kw`` overrides :class:`CNN`'s options."""
    mean, std = idx.normalisation
    options = {"mean": mean, "std": std, "channels": CNN_CHANNELS, **kw}
    return CNN(1, IMAGE_SIDE, num_classes, **options)


def _locate(idx: Idx, data_dir: str) -> str:
    return str(resolve_data_dir(idx.source, data_dir or None))


def _provenance(idx: Idx, folder: str | Path, test_only: bool = False) -> dict:
    raw = Path(folder) / idx.folder / "raw"
    pattern = "t10k-*-ubyte" if test_only else "*-ubyte"  # t10k: the test split
    return files_provenance(idx.name, folder, idx.format, sorted(raw.glob(pattern)))


def _task(idx: Idx) -> Task:
    return Task(name=idx.name, load=partial(_load, idx), model=partial(_model, idx),
                load_test=partial(_load_test, idx),
                stamp=stamp, locate=partial(_locate, idx),
                holds=partial(holds_dataset, idx.source),
                provenance=partial(_provenance, idx),
                provenance_test=partial(_provenance, idx, test_only=True), num_classes=10)


mnist = _task(MNIST)
"""MNIST (run-config ``dataset = "mnist"``)."""

fmnist = _task(FMNIST)
"""Fashion-MNIST (run-config ``dataset = "fmnist"``)."""
