"""The built-in tasks: one module each, found through one registry.

:data:`BUILTIN_TASKS` is the only list of built-in task names. Each entry is the
``package.module:attribute`` spec of a :class:`task.interface.Task` (or a factory
returning one), resolved by :func:`task.registry.get_task` through the same
import as a user's plug-in (run-config ``task = "package.module:factory"``).
Every fact about a built-in dataset (its files, model, metric, provenance, what
the experiment suites run of it) lives in its module; nothing else branches on
its name. Adding a built-in is one module here plus one line below
(docs/DEVELOPING.md, "Adding a built-in task").

This module imports nothing, so :mod:`task.config` can check run-config
``dataset`` against the names without loading any task.
"""

BUILTIN_TASKS: dict[str, str] = {
    "mnist": "task.tasks.mnist:mnist",
    "fmnist": "task.tasks.mnist:fmnist",
    "cifar10": "task.tasks.cifar10:task",
    "shakespeare": "task.tasks.shakespeare:task",
}
"""Run-config ``dataset`` (or ``task``) name -> the spec of its Task, in the
paper's order (figures and tables show the built-ins in this order)."""
