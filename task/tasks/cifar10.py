"""CIFAR-10: 32x32 colour images of 10 classes, the paper's CNN at a larger size.

Read from the canonical ``cifar-10-batches-py/`` pickles where present, else from
the JPEG copy (quality about 75, decoded once; :mod:`task.cifar`), kept as uint8
(N, 3, 32, 32) images with int64 (N,) labels, and learnt by :class:`task.model.CNN`
(channels 32, 64, hidden 128: 259,914 parameters). The backdoor trigger is the
white square of :func:`task.backdoor.stamp`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from torch import nn

from task.backdoor import stamp
from task.cifar import CIFAR_PICKLES, CIFAR_TAR, load_cifar10
from task.config import TaskConfig
from task.data import TaskData, load_files
from task.interface import Task
from task.locate import DataSource, holds_dataset, resolve_data_dir
from task.model import CNN
from task.provenance import files_provenance

NAME = "cifar10"

NORMALISATION = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
"""Per-channel mean and standard deviation of the training images in [0, 1]
(Python floats: :class:`task.model.CNN` and ResNet-20 of examples/resnet.py keep
them out of the ``state_dict``)."""

CNN_CHANNELS = (32, 64)
"""Convolution channels of the CNN for 3x32x32 images."""

FORMATS = {
    "pickles": "canonical CIFAR-10 python pickles (cifar-10-batches-py)",
    "jpeg": "CIFAR-10 JPEG copy (quality about 75, decoded once to .npy): not "
            "bit-identical to the canonical images; accuracy is not comparable with "
            "runs on them",
}
"""summary.json ``data.format`` of each copy."""


def _download(root: Path) -> None:
    import torchvision

    torchvision.datasets.CIFAR10(str(root), train=True, download=True)


SOURCE = DataSource(NAME, (CIFAR_PICKLES / "data_batch_1", CIFAR_TAR), _download)
"""Either copy marks a folder holding CIFAR-10 (:mod:`task.locate`)."""


def read(folder: Path, block_size: int) -> TaskData:
    """Both splits from ``folder`` (:func:`task.cifar.load_cifar10`); no block size."""
    del block_size
    (train_x, train_y, test_x, test_y), source = load_cifar10(folder)
    return TaskData(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                    num_classes=10, source=source, kind="image")


def load(settings: TaskConfig) -> TaskData:
    """The whole task, read once per process (:func:`task.data.load_files`)."""
    return load_files(SOURCE, read, settings.data_dir or None)


def read_test(folder: Path, block_size: int) -> TaskData:
    """The test split alone (:func:`task.cifar.load_cifar10` ``test_only``)."""
    del block_size
    (test_x, test_y), source = load_cifar10(folder, test_only=True)
    return TaskData.test_only(test_x, test_y, 10, source, "image")


def load_test(settings: TaskConfig) -> TaskData:
    """The test split alone (``client-data = true``), once per process."""
    return load_files(SOURCE, read_test, settings.data_dir or None)


def model(num_classes: int, **kw) -> nn.Module:
    """The CNN for 3x32x32 images; ``kw`` overrides :class:`CNN`'s options."""
    mean, std = NORMALISATION
    return CNN(3, 32, num_classes, **{"mean": mean, "std": std,
                                      "channels": CNN_CHANNELS, **kw})


def locate(data_dir: str) -> str:
    """The folder holding CIFAR-10 (:func:`task.locate.resolve_data_dir`)."""
    return str(resolve_data_dir(SOURCE, data_dir or None))


def provenance(folder: str | Path, test_only: bool = False) -> dict:
    """The pickles where present (what :func:`read` reads), else the JPEG archive.

    ``test_only``: the pickles' ``test_batch`` alone (the archive holds both
    splits in one file).
    """
    folder = Path(folder)
    if (folder / CIFAR_PICKLES / "data_batch_1").is_file():
        pattern = "test_batch*" if test_only else "*_batch*"
        fmt, files = FORMATS["pickles"], sorted((folder / CIFAR_PICKLES).glob(pattern))
    else:
        fmt, files = FORMATS["jpeg"], [folder / CIFAR_TAR]
    return files_provenance(NAME, folder, fmt, files)


task = Task(
    name=NAME, load=load, load_test=load_test, model=model, stamp=stamp, locate=locate,
    holds=partial(holds_dataset, SOURCE), provenance=provenance,
    provenance_test=partial(provenance, test_only=True), num_classes=10)
"""CIFAR-10 (run-config ``dataset = "cifar10"``)."""
