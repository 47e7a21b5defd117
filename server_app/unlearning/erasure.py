"""Records and labels a request erases while their clients stay (issue 45).

A client-level request removes whole clients. A records request
(``forget-records``) removes some records of some clients, who keep training on
what they hold; a class-level request (``forget-labels``) removes every record of
a label on every client. Either changes clients' data rather than removing them:
the shards of the changed clients are replayed (SE) or retrained (SISA, FR, RR)
with the changed clients taking part, and every training message to a changed
client names what it no longer has (:class:`ErasingGrid`), so no local training
after the request sees an erased record (:mod:`task.records`, where ids are
defined).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from server_app.config import RunConfig
from task.records import LABELS_KEY, RECORDS_KEY


@dataclass(frozen=True)
class Erasure:
    """What a records or class-level request erases.

    Attributes
    ----------
    records : Mapping[int, tuple[int, ...]]
        Partition id -> the record ids (positions in its partition) erased.
    labels : tuple[int, ...]
        Labels erased on every client (class-level).
    clients : tuple[int, ...]
        Every partition id of the run (a label may be on any of them).
    """

    records: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    labels: tuple[int, ...] = ()
    clients: tuple[int, ...] = ()
    fresh: frozenset[int] | None = None
    """Clients whose records the request at hand erases (None: every changed one).

    A finished run's later requests carry every erasure done before them (the
    changed clients keep training without those records), while only the
    request's own owners send their shards back (:attr:`erasing`)."""

    def __bool__(self) -> bool:
        return bool(self.records or self.labels)

    @property
    def changed(self) -> frozenset[int]:
        """Clients whose data the request changes: every client for a label."""
        return frozenset(self.clients) if self.labels else frozenset(self.records)

    @property
    def erasing(self) -> frozenset[int]:
        """The changed clients whose shards this request sends back."""
        return self.changed if self.fresh is None else frozenset(self.fresh)

    def merged(self, records: Mapping[int, Iterable[int]],
               labels: Iterable[int] = ()) -> Erasure:
        """The erasure with ``records`` and ``labels`` erased too: the request at hand.

        Its ``fresh`` clients are the owners of ``records`` and, with ``labels``,
        every client of :attr:`clients`.
        """
        union = {p: set(ids) for p, ids in self.records.items()}
        for p, ids in records.items():
            union.setdefault(p, set()).update(ids)
        labels = tuple(labels)
        fresh = frozenset(records) | (frozenset(self.clients) if labels else frozenset())
        return Erasure({p: tuple(sorted(ids)) for p, ids in sorted(union.items())},
                       tuple(sorted(set(self.labels) | set(labels))), self.clients, fresh)

    def message_config(self, partition: int) -> dict[str, list[int]]:
        """The config entries a training message to ``partition`` carries."""
        out = {}
        if self.records.get(partition):
            out[RECORDS_KEY] = list(self.records[partition])
        if self.labels:
            out[LABELS_KEY] = list(self.labels)
        return out

    def describe(self) -> str:
        """One line for the log and the receipts."""
        parts = [f"{len(ids)} record{'s' if len(ids) != 1 else ''} of client {p}"
                 for p, ids in sorted(self.records.items())]
        if self.labels:
            parts.append(f"every record of label{'s' if len(self.labels) > 1 else ''} "
                         f"{', '.join(map(str, self.labels))}")
        return "; ".join(parts)

    def to_json(self) -> dict:
        """summary.json's ``unlearning.erasure``."""
        return {"records": {str(p): list(ids) for p, ids in sorted(self.records.items())},
                "labels": list(self.labels)}


def planned_erasure(cfg: RunConfig) -> Erasure:
    """The run's planned records or class-level request (empty: none)."""
    unlearning = cfg.unlearning
    return Erasure({p: tuple(ids) for p, ids in unlearning.erased_records.items()},
                   tuple(unlearning.erased_labels), tuple(range(cfg.data.num_clients)))


class ErasingGrid:
    """A grid that adds each client's erasure to the training messages it sends.

    Wraps the run's grid; every other call passes through. A message of type
    ``train`` or ``train.<phase>`` to a node whose partition the erasure changes
    gets :meth:`Erasure.message_config` in its ``config`` record.
    """

    def __init__(self, grid: Grid, erasure: Erasure, partition_of: Mapping[int, int]):
        self._grid, self._erasure, self._partition_of = grid, erasure, dict(partition_of)

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def _stamp(self, messages: Iterable[Message]) -> list[Message]:
        out = list(messages)
        for message in out:
            kind = message.metadata.message_type
            if kind != "train" and not kind.startswith("train."):
                continue
            pid = self._partition_of.get(message.metadata.dst_node_id)
            extra = self._erasure.message_config(pid) if pid is not None else {}
            if extra and "config" in message.content:
                # a stock strategy sends one RecordDict to every node of a round:
                # this node gets its own content and config, the shared ones stay
                content = RecordDict(dict(message.content.items()))
                content["config"] = ConfigRecord({**dict(content["config"]), **extra})
                message.content = content
        return out

    def send_and_receive(self, messages: Iterable[Message], *args, **kwargs):
        """:meth:`flwr.serverapp.Grid.send_and_receive` of the stamped messages."""
        return self._grid.send_and_receive(self._stamp(messages), *args, **kwargs)

    def push_messages(self, messages: Iterable[Message]):
        """:meth:`flwr.serverapp.Grid.push_messages` of the stamped messages."""
        return self._grid.push_messages(self._stamp(messages))


def erasing_loop(loop, erasure: Erasure | None):
    """``loop`` sending through an :class:`ErasingGrid` of ``erasure``.

    ``loop``: a :class:`server_app.rounds.loop.RoundLoop`; returned as it is when
    nothing is erased.
    """
    if not erasure:
        return loop
    return replace(loop, grid=ErasingGrid(loop.grid, erasure, loop.partition_of))
