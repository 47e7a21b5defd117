"""Label partitions through Flower Datasets' partitioners (``flwr-datasets``).

The offline arrays are wrapped in a ``datasets.Dataset`` (``label`` and ``row``
columns, built in memory: nothing is downloaded) and split by one of Flower's
partitioners:

- ``dirichlet``: :class:`flwr_datasets.partitioner.DirichletPartitioner`, each
  class spread over the clients by Dirichlet(``partition-alpha``) proportions
  (Hsu et al. 2019; self-balancing as Flower implements it); every client keeps
  at least one sample;
- ``pathological``: :class:`flwr_datasets.partitioner.PathologicalPartitioner`,
  ``classes-per-client`` classes per client (McMahan et al. 2017), the first one
  assigned round-robin (``first-deterministic``) so every class is used;
- ``noniid``: the paper's 80%-primary-class scheme,
  :class:`task.primary_partitioner.PrimaryClassPartitioner`.

``iid`` and ``noniid`` keep the project's own seeded splits
(:func:`task.partition.partition_indices`), bit for bit; Flower's
``IidPartitioner`` cuts contiguous shards without shuffling, which is a
different split, so it is not used.
"""

from __future__ import annotations

import warnings

import numpy as np

from task.partition import partition_indices

LABEL_SCHEMES = ("dirichlet", "pathological")
"""Partitions built by a Flower Datasets partitioner."""


def make_partitioner(scheme: str, num_clients: int, seed: int, alpha: float = 0.5,
                     classes_per_client: int = 2):
    """The Flower Datasets partitioner of ``scheme`` (no dataset assigned yet).

    Parameters
    ----------
    scheme : {"dirichlet", "pathological", "noniid"}
        Partition scheme.
    num_clients : int
        Partitions ``C`` >= 1.
    seed : int
        The partitioner's seed.
    alpha : float
        Dirichlet concentration (run-config ``partition-alpha``), > 0.
    classes_per_client : int
        Classes per client of ``pathological`` (run-config ``classes-per-client``).

    Returns
    -------
    flwr_datasets.partitioner.Partitioner
        Partitioning the column ``label``.

    Raises
    ------
    ValueError
        ``scheme`` is not one of the above.
    """
    from flwr_datasets.partitioner import DirichletPartitioner, PathologicalPartitioner

    from task.primary_partitioner import PrimaryClassPartitioner

    if scheme == "dirichlet":
        return DirichletPartitioner(num_partitions=num_clients, partition_by="label",
                                    alpha=float(alpha), min_partition_size=1, seed=seed)
    if scheme == "pathological":
        return PathologicalPartitioner(
            num_partitions=num_clients, partition_by="label",
            num_classes_per_partition=int(classes_per_client),
            class_assignment_mode="first-deterministic", seed=seed)
    if scheme == "noniid":
        return PrimaryClassPartitioner(num_partitions=num_clients, seed=seed)
    raise ValueError(f"partition={scheme!r} has no Flower partitioner here; one of "
                     f"{LABEL_SCHEMES + ('noniid',)}")


def _indices(partitioner, num_clients: int) -> list[np.ndarray]:
    """Rows of every partition (sorted int64), read through ``load_partition``."""
    first = partitioner.load_partition(0)  # builds the whole assignment
    mapping = getattr(partitioner, "_partition_id_to_indices", None)
    if isinstance(mapping, dict) and len(mapping) == num_clients:
        # The public route selects a Dataset per client (~2 ms each); the
        # assignment it selects from is the same, so read it once.
        rows = [np.asarray(mapping[i], dtype=np.int64) for i in range(num_clients)]
    else:
        rows = [np.asarray(first["row"], dtype=np.int64)] + [
            np.asarray(partitioner.load_partition(i)["row"], dtype=np.int64)
            for i in range(1, num_clients)]
    return [np.sort(r) for r in rows]


def label_partition(labels: np.ndarray, num_clients: int, scheme: str, seed: int,
                    alpha: float = 0.5, classes_per_client: int = 2) -> list[np.ndarray]:
    """Split labelled samples over clients (image tasks), by any scheme.

    Parameters
    ----------
    labels : np.ndarray
        Integer class labels, shape (N,).
    num_clients : int
        Clients ``C``, 1 <= C <= N.
    scheme : {"iid", "noniid", "dirichlet", "pathological"}
        ``iid`` and ``noniid``: :func:`task.partition.partition_indices` (equal
        sizes); the others: Flower's partitioners (unequal sizes, each >= 1).
    seed : int
        Seed; same arguments, same partition.
    alpha : float
        ``partition-alpha`` of ``dirichlet`` (smaller = more skewed), > 0.
    classes_per_client : int
        ``classes-per-client`` of ``pathological``, 1..number of classes.

    Returns
    -------
    list of np.ndarray
        ``C`` sorted int64 index arrays, pairwise disjoint, each non-empty.

    Raises
    ------
    ValueError
        One line naming ``partition`` and the key that makes it infeasible
        (``num-clients``, ``partition-alpha`` or ``classes-per-client``).
    """
    if scheme not in LABEL_SCHEMES:
        return partition_indices(labels, num_clients, scheme, seed)
    import datasets

    labels = np.asarray(labels).reshape(-1)
    if not 1 <= num_clients <= len(labels):
        raise ValueError(f"num-clients={num_clients!r} must be an integer in "
                         f"[1, {len(labels)}]")
    partitioner = make_partitioner(scheme, num_clients, seed, alpha, classes_per_client)
    partitioner.dataset = datasets.Dataset.from_dict(
        {"label": labels, "row": np.arange(len(labels), dtype=np.int64)})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Dirichlet's redraw notices
            parts = _indices(partitioner, num_clients)
    except ValueError as err:
        raise ValueError(_infeasible(scheme, num_clients, alpha, classes_per_client,
                                     err)) from err
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(_infeasible(scheme, num_clients, alpha, classes_per_client,
                                     f"client {empty[0]} got no sample"))
    return parts


def _infeasible(scheme: str, num_clients: int, alpha: float, classes: int,
                why: object) -> str:
    key = (f"partition-alpha={alpha}" if scheme == "dirichlet"
           else f"classes-per-client={classes}")
    first = str(why).splitlines()[0] if str(why) else type(why).__name__
    return (f"partition='{scheme}' with num-clients={num_clients} and {key} cannot be "
            f"built ({first}); use fewer clients or another {key.split('=')[0]}")
