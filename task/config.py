"""The task's settings: the choices, their checks, :class:`DataConfig`, :class:`TaskConfig`.

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

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.common.config import flatten_dict, fuse_dicts, get_project_config

from task.device import check_device
from task.section import Section
from task.tasks import BUILTIN_TASKS
from task.values import MAX_CLIENTS, ConfigError, bad, coerce

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


PLUGIN_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
"""Run-config ``task`` naming a plug-in: ``package.module:attribute``."""


# --------------------------------------------------------------------------
# Checks of single settings


def task_spec(task: str, dataset: str) -> str:
    """The task a run names: run-config ``task``, or ``dataset`` when it is ``""``."""
    return task or dataset


def is_plugin(spec: str) -> bool:
    """Whether ``spec`` names a plug-in (``package.module:attribute``)."""
    return ":" in spec


def check_spec(spec: str, key: str = "task", builtins: tuple[str, ...] | None = None
               ) -> None:
    """Refuse a malformed spec (without importing anything).

    Raises
    ------
    ValueError
        One line naming ``key``: neither one of ``builtins`` (default: the
        built-in tasks registered now) nor ``package.module:attribute``.
    """
    builtins = tuple(BUILTIN_TASKS) if builtins is None else builtins
    if spec in builtins or PLUGIN_SPEC.fullmatch(spec):
        return
    raise ValueError(f"run-config '{key}' = {spec!r} is not allowed: one of "
                     f"{', '.join(builtins)}, or 'package.module:attribute' importable "
                     "by the ServerApp and the ClientApps (docs/TASKS.md)")



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
    """Check the settings that split a task over clients (a client's partition id too).

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
class DataConfig(Section):
    """The learning task and its data (keys ``task``, ``dataset`` ... ``block-size``).

    Attributes
    ----------
    task : str
        ``""`` (the built-in task named by ``dataset``), a built-in name, or
        ``package.module:factory`` (:mod:`task.registry`); only its form is
        checked here, the import and the task's parts in
        :func:`server_app.preflight.check_run`.
    dataset : str
        A built-in task's name (:data:`task.tasks.BUILTIN_TASKS`, read when
        ``task`` is ``""``); default: the registry's first, as pyproject.toml's.
    data_dir : str
        Where the dataset is ('' = looked up, :func:`task.locate.resolve_data_dir`).
    partition : str
        One of :data:`task.config.PARTITIONS`.
    partition_alpha : float
        Dirichlet concentration of ``partition = 'dirichlet'``.
    classes_per_client : int
        Classes per client of ``partition = 'pathological'``.
    num_clients : int
        C, every client that ever exists (one SuperNode each).
    client_samples, test_samples : int
        Samples per client / test samples (0 = all).
    block_size : int
        Characters per text sample (Tiny Shakespeare; the task checks its range).
    client_data : bool
        Every client reads its own data folder (node-config ``client-data``,
        docs/DEPLOY.md): the server then reads only the task's test split
        (:func:`server_app.config.tasks.load_run_data`), takes each client's size
        from the ``num-records`` its node reports at discovery, and the settings
        that need the clients' training data on the server are refused
        (:meth:`refuse_without_train`).

    The ServerApp reads it as its run config's ``data`` section; the ClientApp
    as part of :class:`TaskConfig`: one schema, one type per key, one check.
    """

    task: str = ""
    dataset: str = DATASETS[0]
    data_dir: str = ""
    partition: str = "iid"
    partition_alpha: float = 0.5
    classes_per_client: int = 2
    num_clients: int = 100
    client_samples: int = 0
    test_samples: int = 0
    block_size: int = 64
    client_data: bool = False

    def validate(self) -> None:
        """Raise :class:`ConfigError` on the first bad value (naming key and value)."""
        names = tuple(BUILTIN_TASKS)  # the registry as it is now
        if self.dataset not in names:
            raise bad("dataset", self.dataset, f"one of {', '.join(names)}")
        try:
            check_spec(self.task_spec, builtins=names)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if self.partition not in PARTITIONS:
            raise bad("partition", self.partition, f"one of {', '.join(PARTITIONS)}")
        self.check_positive("num-clients", "block-size")
        for key in ("client-samples", "test-samples"):
            value = getattr(self, key.replace("-", "_"))
            if value < 0:
                raise bad(key, value, "0 (all) or a positive integer")
        self.check_bounds()
        if self.num_clients > MAX_CLIENTS:
            raise bad("num-clients", self.num_clients,
                      f"at most {MAX_CLIENTS} (one SuperNode and at least one "
                      "training sample each)")
        self._validate_partition()

    @property
    def task_spec(self) -> str:
        """The task the run names: ``task``, or ``dataset`` when ``task`` is ``""``."""
        return task_spec(self.task, self.dataset)

    @property
    def plugin(self) -> bool:
        """Whether the task is a plug-in (``package.module:factory``)."""
        return is_plugin(self.task_spec)

    @property
    def task_label(self) -> str:
        """The task's spec as a folder-name part (``:`` becomes ``.``)."""
        return self.task_spec.replace(":", ".")

    def _validate_partition(self) -> None:
        if not 0 < self.partition_alpha <= MAX_PARTITION_ALPHA:
            raise bad("partition-alpha", self.partition_alpha,
                      f"a finite number in (0, {MAX_PARTITION_ALPHA:g}] (Dirichlet "
                      "concentration of partition='dirichlet'; smaller = more skewed)")
        if self.classes_per_client < 1:
            raise bad("classes-per-client", self.classes_per_client,
                      "a positive integer, at most the task's classes (10), used by "
                      "partition='pathological'")

    def refuse_without_train(self, key: str, value: object, why: str) -> None:
        """Refuse ``key`` = ``value`` when ``client-data`` is true.

        The server then holds no client's training data; ``why``: what the
        setting reads.

        Raises
        ------
        ConfigError
            One line naming ``key``, ``client-data`` and ``why``.
        """
        if self.client_data:
            raise bad(key, value, f"off with client-data = true: {why}, and the "
                      "server holds no client's training data (every client reads "
                      "its own folder)")


@dataclass(frozen=True)
class TaskConfig(DataConfig):
    """What a client trains on: the run's :class:`DataConfig`, its seed and device.

    Attributes
    ----------
    seed : int
        ``seed``: the partition seed.
    device : str
        ``device``: where this process trains and evaluates (``auto``, ``cpu``,
        ``cuda``, ``cuda:N``; :mod:`task.device`).

    The data keys are :class:`DataConfig`'s (checked by its ``validate`` at
    construction). ``block-size``'s range beyond that is the task's
    (:meth:`task.interface.Task.check_settings`).

    Raises
    ------
    ConfigError
        At construction, one line naming the first bad key and value.
    """

    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        # every value read as the ServerApp reads it (types), then DataConfig's checks
        kinds = {f.name: type(f.default) for f in dataclasses.fields(self)}
        for key, name in self.keys().items():
            object.__setattr__(self, name, coerce(key, getattr(self, name), kinds[name]))
        self.validate()
        try:
            check_device(self.device)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, object]) -> TaskConfig:
        """Read the task's keys from Flower's ``context.run_config``.

        No key has a default here: Flower fills in ``pyproject.toml``'s
        ``[tool.flwr.app.config]``, so a missing key means the run config was
        built without them (use :func:`fused_run_config`).

        Raises
        ------
        ValueError
            One line naming a missing key, or a key whose value has the wrong
            type or is not allowed (:class:`task.values.ConfigError`; values
            are read as the ServerApp reads them, :func:`task.values.coerce`).
        """
        require_keys(run_config, cls.keys())
        return super().from_run_config(run_config)

    @classmethod
    def of(cls, data: DataConfig, seed: int, device: str) -> TaskConfig:
        """The run's :class:`DataConfig` with its seed and device."""
        return cls(**dataclasses.asdict(data), seed=seed, device=device)


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
