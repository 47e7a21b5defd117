"""The built-in tasks by name: shortcuts for scripts, benchmarks and tests.

Each function resolves its name through the one registry
(:data:`task.tasks.BUILTIN_TASKS`, :func:`task.registry.get_task`) and calls the
task's own part (:class:`task.interface.Task`): nothing here knows a dataset. The
apps themselves go through :func:`task.registry.task_of`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from torch import nn

from task.config import TaskConfig, check_dataset
from task.data import TaskData, load_files
from task.interface import Task
from task.registry import get_task
from task.tasks import BUILTIN_TASKS
from task.tasks.shakespeare import VOCAB as SHAKESPEARE_VOCAB

__all__ = ["SHAKESPEARE_VOCAB", "TASKS", "build_model", "builtin_task", "data_provenance",
           "load_task_data", "node_data_dir", "resolve_data_dir"]


def builtin_task(name: str) -> Task:
    """The built-in task ``name``.

    Raises
    ------
    ValueError
        ``name`` is not a built-in (``dataset='NAME' is not one of ...``).
    """
    check_dataset(name)
    return get_task(name)


class _Builtins(Mapping):
    """Name -> :class:`Task` of every registered built-in, resolved when read."""

    def __getitem__(self, name: str) -> Task:
        if name not in BUILTIN_TASKS:
            raise KeyError(name)
        return get_task(name)

    def __iter__(self) -> Iterator[str]:
        return iter(BUILTIN_TASKS)

    def __len__(self) -> int:
        return len(BUILTIN_TASKS)


TASKS: Mapping[str, Task] = _Builtins()
"""The built-in tasks by name (run-config ``task``, or ``dataset`` when ``task`` is
``""``), as registered in :data:`task.tasks.BUILTIN_TASKS`."""


def load_task_data(dataset: str, data_dir: str | None = None,
                   block_size: int = 64) -> TaskData:
    """A built-in task's whole data (train and test), read once per process.

    Parameters
    ----------
    dataset : str
        A built-in task's name.
    data_dir : str or None
        Explicit folder (run-config ``data-dir``); ``""`` or None: the usual places
        (:func:`task.locate.resolve_data_dir`).
    block_size : int
        Block length of a text task (ignored by image tasks).

    Returns
    -------
    TaskData
        The same object for the same folder and block size (cached).

    Raises
    ------
    ValueError
        An unknown ``dataset`` or a ``block_size`` the task refuses.
    DatasetNotFoundError
        The data is nowhere to be found.
    """
    task = builtin_task(dataset)
    return task.load(TaskConfig(dataset=dataset, partition="iid", num_clients=1, seed=0,
                                data_dir=data_dir or "", block_size=block_size,
                                client_samples=0))


load_task_data.cache_clear = load_files.cache_clear  # type: ignore[attr-defined]


def build_model(dataset: str, num_classes: int, **kw) -> nn.Module:
    """A built-in task's fresh model; ``kw`` overrides its options (e.g. ``hidden``).

    Raises
    ------
    ValueError
        An unknown ``dataset``.
    """
    return builtin_task(dataset).model(num_classes, **kw)


def resolve_data_dir(dataset: str, data_dir: str | None = None) -> Path:
    """The folder holding a built-in task's data (:meth:`Task.locate`).

    Raises
    ------
    ValueError
        An unknown ``dataset``.
    DatasetNotFoundError
        As :func:`task.locate.resolve_data_dir`.
    """
    return Path(builtin_task(dataset).locate(data_dir or ""))


def node_data_dir(dataset: str, explicit: str, server: str) -> str | None:
    """A client node's data folder of a built-in task.

    Returns
    -------
    str or None
        ``server`` where it holds the data on this node too; else ``explicit``
        (never another folder); else None (the usual places).
    """
    if server and builtin_task(dataset).holds(server):
        return server
    return explicit or None


def data_provenance(dataset: str, folder: str | Path) -> dict:
    """summary.json ``data`` of a built-in task read from ``folder``.

    Raises
    ------
    FileNotFoundError
        ``folder`` holds none of the task's files.
    """
    return builtin_task(dataset).provenance_of(folder)
