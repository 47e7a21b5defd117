"""The task's settings: the allowed choices, their checks, and :class:`TaskConfig`.

One list of choices for both apps: :data:`DATASETS`, :data:`PARTITIONS` and
:data:`OPTIMIZERS` are defined here only; the ServerApp's run config
(``server_app.config``) and the task modules import them.

One source of defaults: ``[tool.flwr.app.config]`` in ``pyproject.toml``.  Flower
merges those defaults into every ``context.run_config``, so
:meth:`TaskConfig.from_run_config` repeats none of them: a missing key is an
error.  Code that builds a :class:`flwr.app.Context` itself (the in-process grid,
tests) completes its run config with :func:`fused_run_config`, Flower's own merge
of ``pyproject.toml`` defaults and overrides.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.common.config import flatten_dict, fuse_dicts, get_project_config

from task.device import check_device
from task.tasks import BUILTIN_TASKS
from task.values import coerce

PROJECT_ROOT = Path(__file__).resolve().parent.parent
"""The project root (parent of ``task/``, holding ``pyproject.toml``)."""

DATASETS = tuple(BUILTIN_TASKS)
"""Run-config ``dataset``: the built-in tasks registered at import
(:data:`task.tasks.BUILTIN_TASKS`; the checks read the registry itself)."""

PARTITIONS = ("iid", "noniid", "dirichlet", "pathological")
"""Run-config ``partition``: how training samples (images) or blocks (text) are split.

``dirichlet`` and ``pathological`` are Flower Datasets' partitioners
(:mod:`task.partitioners`); text uses its ``noniid`` buckets for every non-IID
scheme (it has no classes)."""

MAX_PARTITION_ALPHA = 1e6
"""Upper bound of run-config ``partition-alpha`` (larger is IID in all but name)."""

OPTIMIZERS = ("sgd", "adam")
"""Run-config ``optimizer``: local optimizers of :func:`task.train.local_train`."""


# --------------------------------------------------------------------------
# Checks of single settings


def is_int(value: object) -> bool:
    """Whether ``value`` is a Python or NumPy integer (``bool`` is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_dataset(dataset: str) -> None:
    """Raise ValueError naming ``dataset`` unless it is a built-in task's name.

    The names are :data:`task.tasks.BUILTIN_TASKS`' keys, read at each call (a
    built-in registered there is accepted at once).
    """
    if dataset not in BUILTIN_TASKS:
        raise ValueError(f"dataset={dataset!r} is not one of {tuple(BUILTIN_TASKS)}")


def check_split(partition: str, num_clients: int, partition_id: int | None = None,
                block_size: int | None = None) -> None:
    """Check the settings that split a task over clients (see :func:`validate_data_args`).

    Raises
    ------
    ValueError
        Naming the key (``partition``, ``num-clients``, ``partition-id`` or
        ``block-size``), the bad value and what is allowed.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"partition={partition!r} is not one of {PARTITIONS}")
    if not is_int(num_clients) or num_clients < 1:
        raise ValueError(f"num-clients={num_clients!r} must be an integer >= 1")
    if partition_id is not None and (
            not is_int(partition_id) or not 0 <= partition_id < num_clients):
        raise ValueError(
            f"partition-id={partition_id!r} must be an integer in [0, {num_clients})"
        )
    if block_size is not None:
        check_block_size(block_size)


def check_block_size(block_size: object) -> None:
    """Refuse a sequence length below 2 (run-config ``block-size`` of a text task).

    Parameters
    ----------
    block_size : object
        The value of run-config ``block-size``.

    Raises
    ------
    ValueError
        ``block_size`` is not an integer >= 2 (naming the key).
    """
    if not is_int(block_size) or block_size < 2:
        raise ValueError(f"block-size={block_size!r} must be an integer >= 2 "
                         "(run-config 'block-size')")


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
    check_dataset(dataset)
    check_split(partition, num_clients, partition_id, block_size)


# --------------------------------------------------------------------------
# The task's part of the run config



def require_keys(run_config: Mapping[str, object], keys) -> None:
    """Every one of ``keys`` is in ``run_config``.

    Raises
    ------
    ValueError
        One line naming the first missing key (pyproject.toml defines each, and
        Flower merges those defaults into every run config).
    """
    for key in keys:
        if key not in run_config:
            raise ValueError(f"run config lacks '{key}' (pyproject.toml's "
                             "[tool.flwr.app.config] defines it; Flower merges "
                             "those defaults into every run config)")

@dataclass(frozen=True)
class TaskConfig:
    """The run-config keys that define the learning task (what a client trains on).

    Attributes
    ----------
    dataset : str
        ``dataset``: one of :data:`DATASETS`.
    partition : str
        ``partition``: one of :data:`PARTITIONS`.
    num_clients : int
        ``num-clients``: clients the training set is split over (>= 1).
    seed : int
        ``seed``: the partition seed.
    data_dir : str
        ``data-dir``: explicit data folder, ``""`` = look in the usual places
        (:func:`task.locate.resolve_data_dir`).
    block_size : int
        ``block-size``: text block length in characters. Only its type is
        checked here: which values a task takes is the task's
        (:meth:`task.interface.Task.check_settings`: >= 2 for a task with
        per-position targets; tasks with class labels ignore it).
    client_samples : int
        ``client-samples``: cap on a client's training samples, 0 = all (>= 0).
    partition_alpha : float
        ``partition-alpha``: Dirichlet concentration of ``dirichlet``, in
        (0, :data:`MAX_PARTITION_ALPHA`].
    classes_per_client : int
        ``classes-per-client``: classes per client of ``pathological``, >= 1
        (at most the task's classes, checked with the data).
    task : str
        ``task``: ``""`` (the built-in task named by ``dataset``), a built-in
        name, or ``package.module:factory`` (:mod:`task.registry`).
    device : str
        ``device``: where this process trains and evaluates (``auto``, ``cpu``,
        ``cuda``, ``cuda:N``; :mod:`task.device`).
    """

    dataset: str
    partition: str
    num_clients: int
    seed: int
    data_dir: str
    block_size: int
    client_samples: int
    partition_alpha: float = 0.5
    classes_per_client: int = 2
    task: str = ""
    device: str = "auto"

    def __post_init__(self) -> None:
        # block-size's range is the task's (Task.check_settings), not the name's
        validate_data_args(self.dataset, self.partition, self.num_clients)
        if not is_int(self.block_size):
            raise ValueError(f"block-size={self.block_size!r} must be an integer "
                             "(run-config 'block-size')")
        if not is_int(self.seed):
            raise ValueError(f"seed={self.seed!r} must be an integer")
        if not is_int(self.client_samples) or self.client_samples < 0:
            raise ValueError(f"client-samples={self.client_samples!r} must be an "
                             "integer >= 0 (0: all of the partition)")
        check_partition_args(self.partition_alpha, self.classes_per_client)
        if not isinstance(self.task, str):
            raise ValueError(f"task={self.task!r} must be a string")
        check_device(self.device)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, object]) -> TaskConfig:
        """Read the task's keys from Flower's ``context.run_config``.

        No key has a default here: Flower fills in ``pyproject.toml``'s
        ``[tool.flwr.app.config]``, so a missing key means the run config was
        built without them (use :func:`fused_run_config`).

        Parameters
        ----------
        run_config : Mapping[str, object]
            Kebab-case keys; other keys are ignored.

        Returns
        -------
        TaskConfig

        Raises
        ------
        ValueError
            One line naming a missing key, or a key whose value has the wrong
            type or is not allowed (:class:`task.values.ConfigError` for a
            wrong type: values are read as the ServerApp reads them,
            :func:`task.values.coerce`).
        """
        def get(key: str, kind: type) -> object:
            require_keys(run_config, (key,))
            return coerce(key, run_config[key], kind)

        return cls(dataset=get("dataset", str), partition=get("partition", str),
                   num_clients=get("num-clients", int), seed=get("seed", int),
                   data_dir=get("data-dir", str), block_size=get("block-size", int),
                   client_samples=get("client-samples", int),
                   partition_alpha=get("partition-alpha", float),
                   classes_per_client=get("classes-per-client", int),
                   task=get("task", str), device=get("device", str))


def check_partition_args(alpha: object, classes_per_client: object) -> None:
    """Check ``partition-alpha`` and ``classes-per-client`` (every scheme checks both).

    Raises
    ------
    ValueError
        One line naming the key, the value and the allowed range.
    """
    ok = isinstance(alpha, (int, float, np.integer, np.floating)) and not isinstance(
        alpha, bool) and math.isfinite(alpha) and 0 < alpha <= MAX_PARTITION_ALPHA
    if not ok:
        raise ValueError(f"partition-alpha={alpha!r} must be a finite number in "
                         f"(0, {MAX_PARTITION_ALPHA:g}]")
    if not is_int(classes_per_client) or classes_per_client < 1:
        raise ValueError(f"classes-per-client={classes_per_client!r} must be an "
                         "integer >= 1")


# --------------------------------------------------------------------------
# the run's settings a client reads, carried by every training message

CLIENT_KEYS = ("dataset", "task", "partition", "num-clients", "seed", "block-size",
               "client-samples", "partition-alpha", "classes-per-client", "device",
               "backdoor-trigger", "backdoor-fraction", "backdoor-target",
               "backdoor-phrase", "backdoor-continuation", "forget-clients",
               "forget-records")
"""The run-config keys the ClientApp reads (:class:`TaskConfig` and the backdoors),
less ``data-dir``: where the data is on a node is the node's own matter (the server's
folder travels as the message's ``data-dir``, :func:`task.registry.node_folder`)."""
RUN_CONFIG_KEY = "run-config"
"""A training message's ``config`` entry: :data:`CLIENT_KEYS` of the run, as JSON."""


def client_settings(run_config: Mapping[str, object]) -> str:
    """The :data:`CLIENT_KEYS` of ``run_config`` (those it has), as JSON text.

    The server puts them in every training message
    (:func:`server_app.run.context.train_config`), so a client reads the run's
    own settings, also where its ``context.run_config`` is not the run's (a
    later request submitted with ``forget-run`` alone).
    """
    import json

    return json.dumps({k: run_config[k] for k in CLIENT_KEYS if k in run_config},
                      sort_keys=True)


def run_config_of(context_config: Mapping[str, object],
                  message_config: Mapping[str, object]) -> dict[str, object]:
    """The run config a client goes by: the message's :data:`RUN_CONFIG_KEY` over its own.

    Raises
    ------
    ValueError
        The message's entry is not a JSON object of :data:`CLIENT_KEYS` (one line).
    """
    import json

    text = message_config.get(RUN_CONFIG_KEY)
    if text is None:
        return dict(context_config)
    try:
        sent = json.loads(str(text))
    except ValueError as err:
        raise ValueError(f"message config {RUN_CONFIG_KEY!r} is not JSON: {err}") from None
    if not isinstance(sent, dict) or set(sent) - set(CLIENT_KEYS):
        raise ValueError(f"message config {RUN_CONFIG_KEY!r} must be a JSON object of "
                         f"the keys {', '.join(CLIENT_KEYS)}")
    return {**context_config, **sent}


# --------------------------------------------------------------------------
# pyproject.toml's defaults


@functools.cache
def _defaults() -> tuple[tuple[str, object], ...]:
    project = get_project_config(PROJECT_ROOT)
    return tuple(flatten_dict(project["tool"]["flwr"]["app"].get("config", {})).items())


def default_run_config() -> dict[str, object]:
    """Every run-config key with its default, from ``pyproject.toml``.

    Read with Flower's own functions (``get_project_config``, ``flatten_dict``),
    as ``flwr run`` reads them.

    Returns
    -------
    dict
        A fresh dict of kebab-case keys (``"num-clients": 100``, ...).

    Raises
    ------
    FileNotFoundError
        ``pyproject.toml`` is not in :data:`PROJECT_ROOT`.
    ValueError
        ``pyproject.toml`` is not a valid Flower app configuration.
    """
    return dict(_defaults())


def fused_run_config(overrides: Mapping[str, object]) -> dict[str, object]:
    """``pyproject.toml``'s defaults with ``overrides`` on top, as Flower fuses them.

    Flower's ``fuse_dicts`` (as ``get_fused_config_from_dir`` uses it): what a
    ClientApp or ServerApp started by ``flwr run --run-config`` finds in
    ``context.run_config``.

    Parameters
    ----------
    overrides : Mapping[str, object]
        Kebab-case keys, each one of ``[tool.flwr.app.config]``.

    Returns
    -------
    dict
        Every run-config key (a fresh dict).

    Raises
    ------
    ValueError
        An override key that ``pyproject.toml`` does not define (one line naming
        it), as ``flwr run`` refuses it.
    """
    defaults = default_run_config()
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(f"run-config key {unknown[0]!r} is not one of pyproject.toml's "
                         "[tool.flwr.app.config] keys (see docs/CONFIG.md's table)")
    return fuse_dicts(defaults, dict(overrides))
