"""Deployment layer: a Grid polling replies every 0.2 s, not every 3 s (Flower patch).

This module changes Flower 1.42's behaviour and is applied only by our own deploy
commands (``cli deploy``, ``deploy --hosts``): they start the SuperLink with
``SE_DEPLOY_GRID_HOOK`` = :data:`GRID_HOOK`, and each ServerApp that SuperLink
starts hands its Grid to :func:`fast_replies` (``server_app.app.deployment_grid``).
A ServerApp started by a plain ``flwr run`` on another SuperLink never imports it,
so no Flower global changes there (``tests/test_polling_grid.py``,
``tests/test_layout.py``). :func:`shorten_object_pulls` is also the retry-wait
patch of :mod:`cli.supernode` and :mod:`cli.warm_exec`.

Flower 1.42's deployment Grid (``flwr.superlink.grid.http_grid``) pulls replies
from the SuperLink every 3 s in ``send_and_receive``; its simulation Grid
(``InMemoryGrid``) every 0.1 s. A deployed round therefore waited 1.5 s on
average (up to 3 s) after its last reply had arrived. Every pull costs the
SuperLink about 10 ms of CPU (measured on 2 cores), so 0.2 s (5 pulls a second
while a round runs) is the compromise. :class:`PollingGrid`
wraps any Grid and keeps everything but the wait: it pushes and pulls through
the wrapped Grid's public ``push_messages`` / ``pull_messages``.

A reply is a set of objects that its SuperNode pushes after the reply itself;
Flower 1.42 retries an object the SuperLink does not have yet after 1 s,
doubling up to 10 s, so the ServerApp often waited 1-2 s for the last reply's
objects. :func:`fast_replies` makes the deployment Grid's pulls retry after
``PULL_BACKOFF_S`` instead.
"""

from __future__ import annotations

import functools
import time
import types
from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

POLL_S = 0.2  # Flower: 3 s deployed, 0.1 s in simulation (InMemoryGrid)
PULL_BACKOFF_S = (0.05, 0.5)
"""First and longest wait (s) before asking again for an object not there yet."""
GRID_HOOK_ENV = "SE_DEPLOY_GRID_HOOK"
"""The variable ``server_app.app.deployment_grid`` reads (the same name there)."""
GRID_HOOK = "cli.polling_grid:fast_replies"
"""Its value in the SuperLinks our deploy commands start (:func:`hook_env`)."""


class PollingGrid(Grid):
    """``grid`` with ``send_and_receive`` polling every ``poll_s`` seconds.

    Parameters
    ----------
    grid : Grid
        The Grid Flower handed to the ServerApp.
    poll_s : float
        Seconds between two pulls while replies are missing (> 0).

    Raises
    ------
    ValueError
        ``poll_s`` is not a positive finite number.
    """

    def __init__(self, grid: Grid, poll_s: float = POLL_S) -> None:
        if not 0 < poll_s < float("inf"):
            raise ValueError(f"poll_s = {poll_s!r} is not allowed: use seconds > 0")
        self.inner = grid
        self.poll_s = poll_s

    def set_run(self, run) -> None:
        """As the wrapped Grid."""
        self.inner.set_run(run)

    @property
    def run(self):
        """As the wrapped Grid."""
        return self.inner.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        """As the wrapped Grid."""
        return self.inner.create_message(content, message_type, dst_node_id, group_id,
                                         ttl)

    def get_node_ids(self) -> Iterable[int]:
        """As the wrapped Grid."""
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """As the wrapped Grid."""
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """As the wrapped Grid."""
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``, pull their replies until all came or ``timeout`` s passed.

        The semantics of ``Grid.send_and_receive`` (``None``: wait for every
        reply; replies that came are returned also when some are missing).
        """
        ids = set(self.push_messages(messages))
        end = time.monotonic() + (timeout or 0.0)
        replies: list[Message] = []
        while timeout is None or time.monotonic() < end:
            got = list(self.pull_messages(ids))
            replies += got
            ids -= {m.metadata.reply_to_message_id for m in got}
            if not ids:
                break
            time.sleep(self.poll_s)
        return replies


def shorten_object_pulls(module: types.ModuleType, name: str,
                         backoff: tuple[float, float] = PULL_BACKOFF_S,
                         max_time_s: float | None = None) -> bool:
    """Make ``module.name`` retry a missing object after ``backoff`` seconds.

    ``name`` is Flower's ``pull_objects`` or ``pull_and_inflate_object_from_tree``
    as imported by ``module``: it becomes a partial with ``initial_backoff`` and
    ``backoff_cap`` set (Flower 1.42: 1 s doubling to 10 s) and, given
    ``max_time_s``, ``max_time`` (seconds before it gives up; Flower: 7200, or
    500 tries). Returns False, and changes nothing, when ``module`` has no such
    function or it is done already.
    """
    original = getattr(module, name, None)
    if not callable(original) or isinstance(original, functools.partial):
        return False
    limit = {} if max_time_s is None else {"max_time": max_time_s}
    setattr(module, name, functools.partial(original, initial_backoff=backoff[0],
                                            backoff_cap=backoff[1], **limit))
    return True


def fast_replies(grid: Grid) -> Grid:
    """``grid`` wrapped in :class:`PollingGrid` if it is Flower's 3-s polling one.

    Flower's deployment Grid (``HttpGrid``) is wrapped, and its module's
    ``pull_objects`` retries a missing object after ``PULL_BACKOFF_S``; any
    other Grid (the simulation's ``InMemoryGrid`` polls every 0.1 s already, the
    tests' in-process Grid answers at once) is returned as it is.
    """
    try:
        from flwr.superlink.grid import http_grid
    except ImportError:  # another Flower layout: match the class by name
        slow = type(grid).__name__ == "HttpGrid"
    else:
        slow = isinstance(grid, http_grid.HttpGrid)
        if slow:
            shorten_object_pulls(http_grid, "pull_objects")
    return PollingGrid(grid) if slow else grid


def hook_env(environ: dict) -> dict:
    """``environ`` with :data:`GRID_HOOK_ENV` set: for a SuperLink our commands start.

    Flower's SuperLink passes its environment to the SuperExec and on to each
    ``flwr-serverapp`` process, whose ServerApp then applies :func:`fast_replies`.
    """
    return {**environ, GRID_HOOK_ENV: GRID_HOOK}
