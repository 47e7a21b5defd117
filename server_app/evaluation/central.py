"""Central evaluation on the test set: each shard model and their ensemble.

The deployed predictor averages the S shard models' softmax outputs (as in SISA,
Bourtoule et al. 2021); for the character model, the next-character probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.app import ArrayRecord

from task.data import load_task_data
from task.model import build_model
from task.train import predict_proba, score_proba


class CentralEvaluator:
    """Scores models on the held-out test set of ``dataset``.

    Parameters
    ----------
    dataset : str
        A name from ``task.config.DATASETS``.
    data_dir : str or None
        Passed to ``load_task_data``.
    block_size : int
        Characters per block (text only).
    max_samples : int or None
        Evaluate on the first ``max_samples`` test samples only (tests, speed).
    """

    def __init__(self, dataset: str, data_dir: str | None = None,
                 block_size: int = 64, max_samples: int | None = None) -> None:
        task = load_task_data(dataset, data_dir, block_size)
        self.dataset = dataset
        self.num_classes = task.num_classes
        self.x = task.test_x[:max_samples]
        self.y = task.test_y[:max_samples].numpy()
        self._model = build_model(dataset, task.num_classes)

    def proba(self, arrays: ArrayRecord) -> np.ndarray:
        """Softmax outputs of one model: float32 (N, classes) or (N, T, vocab)."""
        self._model.load_state_dict(arrays.to_torch_state_dict())
        return predict_proba(self._model, self.x)

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
            loss, acc = score_proba(p, self.y)
            shard_loss.append(loss)
            shard_accuracy.append(acc)
            mean = p if mean is None else mean + p
        loss, acc = score_proba(mean / len(models), self.y)
        return {"accuracy": acc, "loss": loss, "shard_accuracy": shard_accuracy,
                "shard_loss": shard_loss}
