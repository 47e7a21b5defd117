"""Which engine a run ran on, and which nodes trained: what a receipt names.

A run records where it ran (:class:`Engine`): Flower's simulation engine, or the
deployment engine on a federation (``$SE_FEDERATION`` on the SuperLink host: the
name of the connection, a ``[superlink.NAME]`` entry of the submitting machine's
Flower configuration, that reaches this SuperLink; never its credentials). The
``forget`` command sends a later request of a deployed run back to that federation
(:mod:`cli.later`). :class:`TrainedNodes` wraps the run's grid and keeps the nodes
each training message went to, so a receipt can say who trained.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from flwr.app import Message

FEDERATION_ENV = "SE_FEDERATION"
"""The federation's connection name, set on the SuperLink host (``deploy`` sets its own)."""
SIMULATION, DEPLOYMENT = "simulation", "deployment"


@dataclass(frozen=True)
class Engine:
    """Where a run (or one later request) ran.

    Attributes
    ----------
    kind : str
        ``simulation`` (Flower's simulation engine), ``deployment`` (a SuperLink
        and SuperNodes), or the grid's class name (the tests' in-process grid).
    federation : str
        ``$SE_FEDERATION`` where the ServerApp ran ('' = not named).
    """

    kind: str
    federation: str = ""

    def to_json(self) -> dict:
        """``{"kind": ..., "federation": ...}`` for the catalog and receipts."""
        return {"kind": self.kind, "federation": self.federation}


def engine_of(grid) -> Engine:
    """The engine behind Flower's ``grid`` (before any wrapper of ours)."""
    name = type(grid).__name__
    kind = SIMULATION if name == "InMemoryGrid" else (
        DEPLOYMENT if name in ("HttpGrid", "GrpcGrid") else name)
    return Engine(kind, os.environ.get(FEDERATION_ENV, ""))


class TrainedNodes:
    """A grid that keeps the node ids its training messages went to.

    Every other call passes through. :meth:`take` returns and clears them.
    """

    def __init__(self, grid) -> None:
        self._grid, self._trained = grid, set()

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def _keep(self, messages: Iterable[Message]) -> list[Message]:
        out = list(messages)
        self._trained.update(m.metadata.dst_node_id for m in out
                             if m.metadata.message_type.startswith("train"))
        return out

    def send_and_receive(self, messages: Iterable[Message], *args, **kwargs):
        """:meth:`flwr.serverapp.Grid.send_and_receive`, the training nodes kept."""
        return self._grid.send_and_receive(self._keep(messages), *args, **kwargs)

    def push_messages(self, messages: Iterable[Message]):
        """:meth:`flwr.serverapp.Grid.push_messages`, the training nodes kept."""
        return self._grid.push_messages(self._keep(messages))

    def take(self) -> set[int]:
        """Node ids trained since the last call."""
        taken, self._trained = self._trained, set()
        return taken
