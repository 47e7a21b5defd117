"""The paper's non-IID scheme as a Flower Datasets ``Partitioner``.

Kept apart from :mod:`task.partitioners` so that importing the project's own
splits never imports ``flwr_datasets`` (and ``datasets``, ``pyarrow``).
"""

from __future__ import annotations

import datasets
import numpy as np
from flwr_datasets.partitioner import Partitioner

from task.partition import partition_indices


class PrimaryClassPartitioner(Partitioner):
    """80% of each partition's samples from one primary class (paper, "Experiments").

    The split is :func:`task.partition.partition_indices` with
    ``scheme="noniid"``: equal sizes, primary classes spread evenly, seeded;
    usable with ``flwr_datasets.FederatedDataset`` like any Flower partitioner.

    Parameters
    ----------
    num_partitions : int
        Partitions ``C`` >= 1.
    partition_by : str
        The label column.
    primary_fraction : float
        Share of a partition's samples from its primary class, in [0, 1].
    seed : int
        Seed of the split.
    """

    def __init__(self, num_partitions: int, partition_by: str = "label",
                 primary_fraction: float = 0.8, seed: int = 0) -> None:
        super().__init__()
        if num_partitions < 1:
            raise ValueError(f"num-clients={num_partitions!r} must be >= 1")
        self._num_partitions = int(num_partitions)
        self._partition_by = partition_by
        self._primary_fraction = float(primary_fraction)
        self._seed = int(seed)
        self._partition_id_to_indices: dict[int, np.ndarray] = {}

    @property
    def num_partitions(self) -> int:
        """Number of partitions ``C``."""
        return self._num_partitions

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        """Rows of partition ``partition_id`` (a ``datasets.Dataset``).

        Raises
        ------
        ValueError
            ``partition_id`` is not in [0, C), or the split is infeasible.
        """
        if not 0 <= partition_id < self._num_partitions:
            raise ValueError(f"partition-id={partition_id!r} must be in "
                             f"[0, {self._num_partitions})")
        if not self._partition_id_to_indices:
            labels = np.asarray(self.dataset[self._partition_by])
            parts = partition_indices(labels, self._num_partitions, "noniid",
                                      self._seed, self._primary_fraction)
            self._partition_id_to_indices = dict(enumerate(parts))
        return self.dataset.select(self._partition_id_to_indices[partition_id])
