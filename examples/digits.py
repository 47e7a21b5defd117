"""Handwritten digits as 64-feature vectors with an MLP: a plug-in task that is not images.

``task = "examples.digits:task"`` (or ``--preset digits``). scikit-learn's bundled
``load_digits`` (1,797 8x8 digits, no download) is read as 64 features scaled to
[0, 1], split once (seeded) into 1,497 training and 300 test samples, and held as
two Hugging Face ``datasets.Dataset`` (columns ``x`` and ``label``, a
``ClassLabel`` of 10 classes), the form Flower Datasets works with
(:meth:`task.data.TaskData.from_datasets`). The clients' shares are cut by the run's
``partition``: ``dirichlet`` and ``pathological`` are Flower Datasets' own
partitioners (``--preset digits`` uses ``dirichlet``). The model is a
64-64-10 MLP; the default local training, evaluation and membership features
apply. It has no backdoor trigger (``stamp``), so ``backdoor-trigger`` is refused.
"""

from __future__ import annotations

import functools

import numpy as np
from torch import nn

from task.config import TaskConfig
from task.data import TaskData
from task.interface import Task

TEST_SAMPLES = 300
"""Samples held out for the central test set (seeded, before any client sees one)."""


@functools.cache
def _splits() -> tuple:
    """The two ``datasets.Dataset`` splits (built once per process)."""
    import datasets
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # (1797, 64), pixel counts 0..16
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    features = datasets.Features({
        "x": datasets.Sequence(datasets.Value("float32"), length=64),
        "label": datasets.ClassLabel(num_classes=10)})
    return tuple(datasets.Dataset.from_dict({"x": x[rows], "label": y[rows]},
                                            features=features)
                 for rows in (order[TEST_SAMPLES:], order[:TEST_SAMPLES]))


def load(settings: TaskConfig) -> TaskData:
    """The task's data: float32 (N, 64) features and int64 labels (N,) of 10 classes."""
    del settings  # the bundled data needs no folder, block size or seed
    train, test = _splits()
    return TaskData.from_datasets(train, test, features="x", label="label",
                                  source="sklearn.datasets.load_digits", kind="vector")


def mlp(num_classes: int) -> nn.Module:
    """A 64-64-``num_classes`` MLP with ReLU (4,810 parameters for 10 classes)."""
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, num_classes))


task = Task(name="digits", load=load, model=mlp, num_classes=10)
"""The plug-in: digits as vectors, no folder, no trigger."""
