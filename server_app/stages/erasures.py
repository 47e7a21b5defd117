"""The records erasures in force in a run, and whether it can take a records request.

A records request erases some records of clients that stay
(:mod:`server_app.unlearning.erasure`). Once done it stays in force for the rest of
the run: every later replay, retraining and learning round sends the owners the ids
they no longer hold. The erasures in force are the run's planned one
(``forget-records`` / ``forget-labels``) and every records request done since
(the inbox keeps them: :class:`server_app.run.inbox.Request`'s ``erasure``), less
the records of clients forgotten since (gone with their clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from server_app.run.inbox import Request
from server_app.stages.state import RunState
from server_app.unlearning.erasure import Erasure, planned_erasure
from task.records import check_against_sizes


def records_of(request: Request) -> dict[int, list[int]]:
    """A records request's erased ids: client -> ids ({} for a client request)."""
    if not request.erasure:
        return {}
    return {int(p): list(ids) for p, ids in request.erasure["records"].items()}


def in_force(run: RunState, leaving: Sequence[int] = ()) -> Erasure:
    """Every erasure done in the run so far (``fresh`` empty: it erases nothing new).

    Records of clients forgotten so far, or ``leaving`` now, are left out.
    """
    done: dict[int, list[int]] = {}
    for request in run.inbox.all() if run.inbox is not None else []:
        if request.state == "done":
            for p, ids in records_of(request).items():
                done.setdefault(p, []).extend(ids)
    merged = planned_erasure(run.ctx.cfg).merged(done)
    gone = run.forgotten | set(leaving)
    return replace(merged, fresh=frozenset(),
                   records={p: ids for p, ids in merged.records.items() if p not in gone},
                   clients=tuple(p for p in merged.clients if p not in gone))


def records_refusal(run: RunState, request: Request, joined: int) -> str | None:
    """Why the run cannot erase ``request``'s records now (None: it can).

    ``joined``: clients that have joined so far (partition ids below it). An
    owner must have joined and not be forgotten, and every id be one it holds,
    with a record left after every erasure so far (:mod:`task.records`).
    """
    records = records_of(request)
    late = sorted(p for p in records if p >= joined)
    if late:
        return f"client(s) {late} have not joined yet"
    gone = sorted(p for p in records if p in run.forgotten)
    if gone:
        return f"client(s) {gone} are forgotten already: they hold no records"
    return check_against_sizes(in_force(run).merged(records).records, run.ctx.samples)


def asked(request: Request) -> Erasure:
    """The request's own erasure, for its receipt (``erasure``, ``erasure_note``)."""
    return Erasure({p: tuple(ids) for p, ids in records_of(request).items()})
