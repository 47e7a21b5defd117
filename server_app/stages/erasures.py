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
from task.records import check_against_sizes, keep_mask


def records_of(request: Request) -> dict[int, list[int]]:
    """A records request's erased ids: client -> ids ({} for a client request)."""
    if not request.erasure:
        return {}
    return {int(p): list(ids) for p, ids in request.erasure.get("records", {}).items()}


def labels_of(request: Request) -> list[int]:
    """A class request's erased labels ([] for the other requests)."""
    return [int(c) for c in (request.erasure or {}).get("labels", [])]


def in_force(run: RunState, leaving: Sequence[int] = ()) -> Erasure:
    """Every erasure done in the run so far (``fresh`` empty: it erases nothing new).

    Records of clients forgotten so far, or ``leaving`` now, are left out.
    """
    done: dict[int, list[int]] = {}
    labels: set[int] = set()
    for request in run.inbox.all() if run.inbox is not None else []:
        if request.state == "done":
            for p, ids in records_of(request).items():
                done.setdefault(p, []).extend(ids)
            labels.update(labels_of(request))
    merged = planned_erasure(run.ctx.cfg).merged(done, labels)
    gone = run.forgotten | set(leaving)
    return replace(merged, fresh=frozenset(),
                   records={p: ids for p, ids in merged.records.items() if p not in gone},
                   clients=tuple(p for p in merged.clients if p not in gone))


def for_request(run: RunState, request: Request) -> Erasure | None:
    """The erasure ``request`` is carried out with: those in force, plus its own.

    None when there is none (a client request in a run that erased nothing).
    """
    so_far = in_force(run, request.clients)
    if request.erasure:
        return so_far.merged(records_of(request), labels_of(request))
    return so_far or None


def records_refusal(run: RunState, request: Request, joined: int) -> str | None:
    """Why the run cannot erase ``request``'s records or labels now (None: it can).

    ``joined``: clients that have joined so far (partition ids below it). An
    owner must have joined and not be forgotten, and every id be one it holds,
    with a record left after every erasure so far (:mod:`task.records`); a label
    must be a class of the task, and every client keep a record.
    """
    records, labels = records_of(request), labels_of(request)
    late = sorted(p for p in records if p >= joined)
    if late:
        return f"client(s) {late} have not joined yet"
    gone = sorted(p for p in records if p in run.forgotten)
    if gone:
        return f"client(s) {gone} are forgotten already: they hold no records"
    before = in_force(run)
    new_ids = any(set(ids) - set(before.records.get(p, ())) for p, ids in records.items())
    if not new_ids and not set(labels) - set(before.labels):
        return "every record it names is erased already (by an earlier request)"
    after = before.merged(records, labels)
    why = check_against_sizes(after.records, run.ctx.samples)
    return why or (_label_refusal(run, after, labels) if after.labels else None)


def _label_refusal(run: RunState, after: Erasure, labels: list[int]) -> str | None:
    """A class request's labels against the task and what every client keeps."""
    from server_app.config.tasks import load_run_data
    from server_app.evaluation.mia_sets import client_rows

    cfg = run.ctx.cfg
    task = load_run_data(cfg, run.ctx.data_dir)
    if not task.has_classes:
        return f"{cfg.data.task_spec}'s targets are not class labels: no class request"
    wrong = sorted(c for c in labels if not 0 <= c < task.num_classes)
    if wrong:
        return f"label(s) {wrong} are not classes 0..{task.num_classes - 1}"
    y = task.train_y.numpy()
    for p, rows in enumerate(client_rows(cfg, task)):
        if p in after.clients and not keep_mask(len(rows), y[rows], after.records.get(
                p, ()), after.labels).any():
            return (f"client {p} would keep no record (it holds only labels "
                    f"{sorted(set(after.labels))} or erased records); forget it instead")
    return None


def asked(request: Request) -> Erasure:
    """The request's own erasure (its records and labels)."""
    return Erasure({p: tuple(ids) for p, ids in records_of(request).items()},
                   tuple(labels_of(request)))


def receipt_fields(request: Request) -> dict:
    """``erasure`` and ``erasure_note`` of a records or class request's receipt ({})."""
    if not request.erasure:
        return {}
    own = asked(request)
    return {"erasure": own.to_json(), "erasure_note": own.describe()}
