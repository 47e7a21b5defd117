"""Which task a run uses (run-config ``task``), its data, and a client's share of it.

``task`` is ``""`` (the built-in task named by ``dataset``: existing runs are
unchanged), a built-in name (:data:`task.tasks.BUILTIN_TASKS`), or
``package.module:factory``: an attribute of an importable module that is a
:class:`~task.interface.Task` or a callable returning one. A built-in name is
resolved through the same import: the registry maps it to its module's
``package.module:attribute``. The module must be
importable wherever the task runs: the command's preflight, the ServerApp and
every ClientApp (docs/TASKS.md: simulation, deployment, the FAB). Tasks are
resolved once per process (:func:`get_task`).

:func:`load_data` loads a task's data once per process and settings and checks
it against the task's declaration; :func:`load_client_data` is a ClientApp's
share (:func:`task.data.client_data`, capped at ``client-samples``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from task.config import PLUGIN_SPEC, TaskConfig, check_spec, task_spec
from task.data import TaskData, client_data
from task.interface import Task
from task.tasks import BUILTIN_TASKS

TASKS = BUILTIN_TASKS  # the built-in tasks (the registry itself, not a copy)



OURS = Path(__file__).resolve().parents[1]
"""The folder holding this app's top-level packages (a checkout, the FAB, site-packages)."""
_PROJECT_NAME = re.compile(r'^name\s*=\s*"([^"]+)"', re.M)


def user_folders() -> list[Path]:
    """Where a user's own modules come from: ``SE_CALLER_DIR``, the cwd, ``PYTHONPATH``."""
    raw = [os.environ.get("SE_CALLER_DIR", ""), os.getcwd(),
           *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    found: list[Path] = []
    for entry in filter(None, raw):
        folder = Path(entry).resolve()
        if folder.is_dir() and folder not in found:
            found.append(folder)
    return found


def _our_copy(top: str) -> Path | None:
    """Where the import system finds ``top`` if that is one of this app's packages."""
    try:
        found = importlib.util.find_spec(top)  # a top-level name: imports nothing
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    where = list(found.submodule_search_locations or []) or [found.origin]
    path = Path(where[0]).resolve() if where[0] else None
    return path if path is not None and path.parent == OURS else None


def _top_level(spec: str) -> str:
    return spec.partition(":")[0].split(".")[0]


def _app_name(folder: Path) -> str | None:
    try:
        found = _PROJECT_NAME.search((folder / "pyproject.toml").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def shadowed(spec: str, folders: Sequence[Path] | None = None) -> tuple[Path, Path] | None:
    """(ours, theirs) when ``spec``'s top-level package is this app's and a user's too.

    ``theirs`` is a ``NAME.py`` or ``NAME/`` in one of ``folders`` (default
    :func:`user_folders`) other than ours; a folder holding another copy of this
    app (its pyproject.toml names the same project: a checkout beside the FAB)
    does not count. None: no shadowing.
    """
    top = _top_level(spec)
    ours = _our_copy(top)
    if ours is None:
        return None
    app = _app_name(OURS)
    for folder in user_folders() if folders is None else folders:
        folder = Path(folder).resolve()
        if folder == OURS or (app is not None and _app_name(folder) == app):
            continue
        for theirs in (folder / f"{top}.py", folder / top):
            if theirs.exists() and theirs.resolve() != ours:
                return ours, theirs
    return None


def check_not_shadowed(spec: str, key: str,
                       folders: Sequence[Path] | None = None) -> None:
    """Refuse a user's spec whose top-level package is ours and theirs (:func:`shadowed`).

    This app installs generic top-level packages (``task``, ``examples``, ...);
    a user's ``task.py`` of the same name would silently lose to ours.

    Raises
    ------
    ValueError
        One line naming ``key``, ``spec`` and both paths.
    """
    both = shadowed(spec, folders)
    if both is not None:
        ours, theirs = both
        raise ValueError(
            f"run-config '{key}' = {spec!r} is not allowed: "
            f"{_top_level(spec)!r} is this app's {ours}, which shadows "
            f"your {theirs}; rename yours (docs/TASKS.md, \"Names this app takes\")")


def import_object(spec: str, key: str, *, builtin: bool = False) -> object:
    """The attribute ``spec`` = ``package.module:attr.sub`` names.

    A user's spec (``builtin`` False) is first checked by :func:`check_not_shadowed`;
    ``builtin``: a spec this app's own registries wrote.

    Raises
    ------
    ValueError
        One line naming ``key`` and ``spec``: a malformed spec, a package that
        shadows a user's module, a module that cannot be imported (with its
        error), or a missing attribute.
    """
    if not PLUGIN_SPEC.fullmatch(spec):
        raise ValueError(f"run-config '{key}' = {spec!r} is not allowed: "
                         "'package.module:attribute'")
    if not builtin:
        check_not_shadowed(spec, key)
    module_name, _, path = spec.partition(":")
    where = ("put its folder on PYTHONPATH or pip-install it where the ServerApp, "
             "the ClientApps and the command run (docs/TASKS.md)")
    try:
        obj: object = importlib.import_module(module_name)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - a user's module, sys.exit too
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"run-config '{key}' = {spec!r} is not allowed: cannot import "
                         f"{module_name!r} ({type(err).__name__}: {first}); "
                         f"{where}") from err
    for part in path.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"run-config '{key}' = {spec!r} is not allowed: "
                             f"{module_name!r} has no attribute {path!r}")
        obj = getattr(obj, part)
    return obj


@functools.cache
def get_task(spec: str) -> Task:
    """The task ``spec`` names (a built-in name or ``package.module:factory``).

    Parameters
    ----------
    spec : str
        :func:`task_spec` of the run config.

    Returns
    -------
    Task
        The same object for the same spec within a process.

    Raises
    ------
    ValueError
        One line naming ``task``: an unknown name, a module that cannot be
        imported, a factory that fails, or one that gives no :class:`Task`.
    """
    check_spec(spec, builtins=tuple(BUILTIN_TASKS))  # the registry as it is now
    made = import_object(BUILTIN_TASKS.get(spec, spec), "task",
                         builtin=spec in BUILTIN_TASKS)
    if not isinstance(made, Task) and callable(made):
        try:
            made = made()
        except (Exception, SystemExit) as err:  # noqa: BLE001 - a user's factory
            raise ValueError(f"run-config 'task' = {spec!r}: calling it failed "
                             f"({type(err).__name__}: {err})") from err
    if not isinstance(made, Task):
        raise ValueError(f"run-config 'task' = {spec!r} is not allowed: it gave a "
                         f"{type(made).__name__}, not a task.interface.Task")
    return made


def is_builtin(task: Task) -> bool:
    """Whether ``task`` is the built-in registered under its name (not a look-alike)."""
    return task.name in BUILTIN_TASKS and get_task(task.name) is task


def task_of(settings: TaskConfig) -> Task:
    """The task of a run's :class:`TaskConfig` (:func:`get_task`)."""
    return get_task(task_spec(settings.task, settings.dataset))


@functools.lru_cache(maxsize=16)
def _load(task: Task, settings: TaskConfig) -> TaskData:
    return task.check_data(task.load(settings))


def load_data(task: Task, settings: TaskConfig, folder: str) -> TaskData:
    """The whole task's data read from ``folder``, once per process and settings.

    Parameters
    ----------
    task : Task
        The run's task.
    settings : TaskConfig
        The run's task settings; ``data_dir`` is replaced by ``folder``.
    folder : str
        Where the data is (:meth:`Task.locate`'s answer; ``""``: none).

    Returns
    -------
    TaskData
        Checked against the task (:meth:`Task.check_data`).

    Raises
    ------
    ValueError, FileNotFoundError
        As the task's ``load``, or data that contradicts its declaration.
    """
    if is_builtin(task):  # task.data caches the files a built-in read
        return task.check_data(task.load(replace(settings, data_dir=folder)))
    return _load(task, replace(settings, data_dir=folder, device="auto"))


def load_test_data(task: Task, settings: TaskConfig, folder: str) -> TaskData:
    """The task's test split alone read from ``folder`` (:attr:`Task.load_test`).

    What the server of a run whose clients read their own folders reads
    (run-config ``client-data = true``): a :class:`TaskData` whose training
    arrays have 0 rows (:meth:`TaskData.test_only`), checked as :func:`load_data`'s.

    Raises
    ------
    ValueError
        The task has no ``load_test`` (one line naming ``task`` and
        ``client-data``), or as the loader.
    FileNotFoundError
        As the loader.
    """
    if task.load_test is None:
        raise ValueError(f"task {task.name!r} has no test-only loader (Task.load_test): "
                         "with run-config client-data = true the server reads only "
                         "the test split; give the task a load_test, or set "
                         "client-data = false")
    settings = replace(settings, data_dir=folder,
                       device=settings.device if is_builtin(task) else "auto")
    data = task.check_data(task.load_test(settings))
    if data.has_train:
        raise ValueError(f"task {task.name!r}: load_test returned {len(data.train_x)} "
                         "training rows; it must return the test split alone "
                         "(TaskData.test_only)")
    return data


def node_folder(task: Task, explicit: str, server: str) -> str:
    """A client node's data folder.

    The server's folder (message ``config["data-dir"]``) where it holds the data
    on this node too; else the run-config ``data-dir`` (``explicit``); then
    :meth:`Task.locate` finds it (an error naming ``data-dir`` when absent,
    never another folder).
    """
    chosen = server if server and task.holds(server) else explicit
    return task.locate(chosen)


def load_client_data(cfg: TaskConfig, partition_id: int, server_data_dir: str = ""
                     ) -> tuple[torch.Tensor, torch.Tensor, TaskData]:
    """A ClientApp's training data: its share of the task, capped at ``client-samples``.

    Parameters
    ----------
    cfg : TaskConfig
        The task's run-config keys.
    partition_id : int
        This node's client index in ``[0, cfg.num_clients)``.
    server_data_dir : str
        The server's data folder (message ``config["data-dir"]``), used where it
        holds the data on this node too (:func:`node_folder`).

    Returns
    -------
    x, y : torch.Tensor
        As :func:`task.data.client_data`, the first ``cfg.client_samples`` rows
        (all if 0).
    task : TaskData
        The whole task (for ``num_classes``).

    Raises
    ------
    ValueError
        Naming ``task``, ``partition-id`` or the partition's keys when invalid.
    FileNotFoundError
        The data is not where this node looks (``DatasetNotFoundError`` for the
        built-in tasks).
    """
    task = task_of(cfg)
    data = load_data(task, cfg, node_folder(task, cfg.data_dir, server_data_dir))
    x, y = client_data(data, partition_id, cfg.num_clients, cfg.partition, cfg.seed,
                       cfg.partition_alpha, cfg.classes_per_client)
    limit = cfg.client_samples or None  # 0: all of the partition
    return x[:limit], y[:limit], data
