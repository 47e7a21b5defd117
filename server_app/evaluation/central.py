"""Central evaluation on the test set: each shard model and their ensemble.

The deployed predictor averages the S shard models' softmax outputs (as in SISA,
Bourtoule et al. 2021); for the character model, the next-character probabilities.
The run's task gives the model, the prediction and the score
(:class:`task.interface.Task`); the models run on the run's ``device``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.app import ArrayRecord

from task.data import TaskData
from task.device import resolve_device
from task.interface import Task


class CentralEvaluator:
    """Scores models on the held-out test set of the run's task.

    Parameters
    ----------
    task : Task
        The run's task (its ``model``, ``predict`` and ``score``).
    data : TaskData
        Its loaded data (the test split is used).
    max_samples : int or None
        Evaluate on the first ``max_samples`` test samples only (tests, speed).
    device : str
        Run-config ``device`` (:func:`task.device.resolve_device`).

    Attributes
    ----------
    task : Task
        The run's task.
    num_classes : int
        The task's classes (the models' output size).
    """

    def __init__(self, task: Task, data: TaskData, max_samples: int | None = None,
                 device: str = "cpu") -> None:
        self.task = task
        self.num_classes = data.num_classes
        self.x = data.test_x[:max_samples]
        self.y = data.test_y[:max_samples].numpy()
        self.device = resolve_device(device)
        self._model = task.model(data.num_classes)

    def proba(self, arrays: ArrayRecord) -> np.ndarray:
        """Softmax outputs of one model: float32 (N, classes) or (N, T, vocab)."""
        self._model.load_state_dict(arrays.to_torch_state_dict())
        return self.task.predict(self._model, self.x, device=self.device)

    def label_accuracy(self, models: Sequence[ArrayRecord], labels: Sequence[int]
                       ) -> dict[str, float]:
        """The ensemble's test accuracy on ``labels``' samples and on the others.

        For a class-level request (``forget-labels``): ``erased_label_accuracy``
        is the share of test samples of an erased label the ensemble (mean
        softmax) still predicts right, ``kept_label_accuracy`` that of the
        other samples (fractions; NaN where the test set has none).
        """
        mean = sum(self.proba(arrays) for arrays in models) / len(models)
        right = mean.argmax(axis=-1) == self.y
        erased = np.isin(self.y, list(labels))
        return {"erased_label_accuracy": float(right[erased].mean()) if erased.any()
                else float("nan"),
                "kept_label_accuracy": float(right[~erased].mean()) if (~erased).any()
                else float("nan")}

    def evaluate(self, models: Sequence[ArrayRecord]) -> dict[str, object]:
        """Loss (nats) and accuracy (fraction) of the ensemble and of each model.

        Returns
        -------
        dict
            ``accuracy``, ``loss`` (ensemble of the mean softmax), and the lists
            ``shard_accuracy``, ``shard_loss`` (one entry per model).
        """
        mean = None
        shard_loss, shard_accuracy = [], []
        for arrays in models:
            p = self.proba(arrays)
            loss, acc = self.task.score(p, self.y)
            shard_loss.append(loss)
            shard_accuracy.append(acc)
            mean = p if mean is None else mean + p
        loss, acc = self.task.score(mean / len(models), self.y)
        return {"accuracy": acc, "loss": loss, "shard_accuracy": shard_accuracy,
                "shard_loss": shard_loss}
