"""The records erasures in force in a run, and whether it can take a records request.

A records request erases some records of clients that stay
(:mod:`server_app.unlearning.erasure`). Once done it stays in force for the rest of
the run: every later replay, retraining and learning round sends the owners the ids
they no longer hold. The erasures in force are the run's planned one
(``forget-records`` / ``forget-labels``) and every records request done since
(the inbox keeps them: :class:`runstore.inbox.Request`'s ``erasure``), less
the records of clients forgotten since (gone with their clients).

Whether a records or class request can be carried out is decided in one place,
:func:`erasure_refusal`: the run config's planned request (before any engine,
:func:`server_app.preflight.check_erasure`), the ``forget`` command before it
records a request (:mod:`cli.forget`), and the ServerApp when it takes one (a stage
boundary, a finished run) all call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from runstore.inbox import Request
from server_app.config import ConfigError, RunConfig
from server_app.stages.state import RunState
from server_app.unlearning.erasure import Erasure, planned_erasure
from task.records import check_against_sizes, keep_mask

Refusal = tuple[str, str]
"""``(what, reason)``: ``what`` is ``"records"`` or ``"labels"`` (the option or
run-config key to name), ``reason`` one line."""


@dataclass(frozen=True)
class Holdings:
    """What each client of a run holds: the facts an erasure is checked against.

    Attributes
    ----------
    spec : str
        The run's task (``task`` / ``dataset``), for messages.
    sizes : Mapping[int, int]
        Partition id -> training records it holds (``client-samples`` applied).
    load : Callable[[], tuple]
        ``() -> (TaskData, rows)``: the task's data and each client's training
        rows (a list of int arrays, partition-id order). Called only for a class
        request (labels), so a records request needs the sizes alone.
    own_data : bool
        Run-config ``client-data = true``: every client reads its own folder,
        ``sizes`` are the counts the nodes reported at discovery, and the server
        holds no label: a class request is refused (:func:`erasure_refusal`).
    """

    spec: str
    sizes: Mapping[int, int]
    load: Callable[[], tuple]
    own_data: bool = False

    @classmethod
    def of_run(cls, cfg: RunConfig, data_dir: str,
               sizes: Mapping[int, int] | None = None) -> Holdings:
        """A run's holdings from its settings and data folder (the data loaded once).

        With ``client-data = true`` the server holds no client's rows: ``sizes``
        (the counts the nodes reported) are required, and nothing is loaded.

        Raises
        ------
        ConfigError
            The data cannot be loaded (one line naming ``task``), or
            ``client-data = true`` without ``sizes`` (the run has not reported
            its clients' counts yet).
        """
        if cfg.data.client_data:
            if sizes is None:
                raise ConfigError(
                    "run-config 'client-data' = True: the run has no record counts "
                    "of its clients yet (they are reported at discovery); a records "
                    "request is checked once its nodes have answered")
            return cls(cfg.data.task_spec, dict(sizes), _no_rows, own_data=True)
        from audits.mia_sets import client_rows
        from server_app.config.tasks import load_run_data

        @cache
        def load() -> tuple:
            task = load_run_data(cfg, data_dir)
            return task, client_rows(cfg.data, cfg.seed, task)

        if sizes is None:
            sizes = dict(enumerate(map(len, load()[1])))
        return cls(cfg.data.task_spec, dict(sizes), load)


def _no_rows() -> tuple:
    raise AssertionError("client-data = true: the server holds no client's rows")


def erasure_refusal(records: Mapping[int, Iterable[int]], labels: Sequence[int],
                    held: Holdings, before: Erasure, forgotten: Iterable[int] = (),
                    joined: int | None = None) -> Refusal | None:
    """Why ``records`` and ``labels`` cannot be erased after ``before`` (None: they can).

    The one check of a records or class request, wherever it comes from. An
    owner must have joined and not be forgotten; every id must be one its owner
    holds (positions ``0 .. held - 1`` of its partition, :mod:`task.records`),
    some of them not erased already; every owner must keep a record. A label
    must be a class of the task (a task with classes), and every client of
    ``before.clients`` keep a record after every erasure so far.

    Parameters
    ----------
    records : Mapping[int, Iterable[int]]
        Partition id -> record ids the request erases ({} for a class request).
    labels : Sequence[int]
        Classes the request erases on every client.
    held : Holdings
        What each client holds.
    before : Erasure
        The erasures in force before this request (:func:`in_force_of`), with
        ``clients`` the clients still in the run.
    forgotten : Iterable[int]
        Clients forgotten so far (or to be, by a request ahead of this one).
    joined : int, optional
        Clients joined so far (partition ids below it); None: not checked.

    Returns
    -------
    (str, str) or None
        ``("records" | "labels", one-line reason)``, or None.
    """
    records = {int(p): list(ids) for p, ids in records.items()}
    if labels and held.own_data:
        return "labels", ("a class request is checked against every client's labels, "
                          "and with client-data = true the server holds none (each "
                          "client reads its own folder); name records (--records)")
    late = sorted(p for p in records if joined is not None and p >= joined)
    if late:
        return "records", f"client(s) {late} have not joined yet"
    gone = sorted(set(records) & set(forgotten))
    if gone:
        return "records", f"client(s) {gone} are forgotten already: they hold no records"
    why = check_against_sizes(records, held.sizes)  # the ids alone, then with the rest
    if why:
        return "records", why
    new_ids = any(set(ids) - _erased(held, before, p) for p, ids in records.items())
    if not new_ids and not set(labels) - set(before.labels):
        what = "labels" if labels and not records else "records"
        return what, "every record it names is erased already (by an earlier request)"
    after = before.merged(records, labels)
    why = check_against_sizes(after.records, held.sizes)
    if why:
        return "records", why
    if not after.labels:
        return None
    why = label_refusal(held, after, labels)
    return ("labels", why) if why else None


def _erased(held: Holdings, before: Erasure, p: int) -> set[int]:
    """Client ``p``'s record ids ``before`` erases: named, or of an erased label."""
    erased = set(before.records.get(p, ()))
    if not before.labels:
        return erased
    task, rows = held.load()
    part = np.asarray(rows[p])
    keep = keep_mask(len(part), np.asarray(task.train_y)[part], (), before.labels)
    return erased | {int(i) for i in np.flatnonzero(~keep)}


def label_refusal(held: Holdings, after: Erasure, labels: Sequence[int]) -> str | None:
    """A class request's ``labels`` against the task, and what every client keeps."""
    task, rows = held.load()
    if not task.has_classes:
        return f"{held.spec}'s targets are not class labels: no class request"
    wrong = sorted(c for c in labels if not 0 <= c < task.num_classes)
    if wrong:
        return f"label(s) {wrong} are not classes 0..{task.num_classes - 1}"
    y = np.asarray(task.train_y)
    for p, part in enumerate(rows):
        if p in after.clients and not keep_mask(len(part), y[np.asarray(part)],
                                                after.records.get(p, ()),
                                                after.labels).any():
            return (f"client {p} would keep no record (it holds only labels "
                    f"{sorted(set(after.labels))} or erased records); forget the "
                    "client instead")
    return None


def records_of(request: Request) -> dict[int, list[int]]:
    """A records request's erased ids: client -> ids ({} for a client request)."""
    if not request.erasure:
        return {}
    return {int(p): list(ids) for p, ids in request.erasure.get("records", {}).items()}


def labels_of(request: Request) -> list[int]:
    """A class request's erased labels ([] for the other requests)."""
    return [int(c) for c in (request.erasure or {}).get("labels", [])]


def in_force_of(cfg: RunConfig, requests: Iterable[Request], forgotten: Iterable[int]
                ) -> Erasure:
    """The planned erasure and ``requests``' (records and class requests), merged.

    ``fresh`` is empty (it erases nothing new); records of ``forgotten`` clients
    are left out, and so are they from ``clients``.
    """
    done: dict[int, list[int]] = {}
    labels: set[int] = set()
    for request in requests:
        for p, ids in records_of(request).items():
            done.setdefault(p, []).extend(ids)
        labels.update(labels_of(request))
    merged = planned_erasure(cfg).merged(done, labels)
    gone = set(forgotten)
    return replace(merged, fresh=frozenset(),
                   records={p: ids for p, ids in merged.records.items() if p not in gone},
                   clients=tuple(p for p in merged.clients if p not in gone))


def in_force(run: RunState, leaving: Sequence[int] = ()) -> Erasure:
    """Every erasure done in the run so far (``fresh`` empty: it erases nothing new).

    Records of clients forgotten so far, or ``leaving`` now, are left out.
    """
    done = [r for r in (run.inbox.all() if run.inbox is not None else [])
            if r.state == "done"]
    return in_force_of(run.ctx.cfg, done, run.forgotten | set(leaving))


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

    :func:`erasure_refusal` over the run's holdings and the erasures in force.
    """
    ctx = run.ctx
    held = Holdings.of_run(ctx.cfg, ctx.data_dir, ctx.samples)
    refusal = erasure_refusal(records_of(request), labels_of(request), held,
                              in_force(run), run.forgotten, joined)
    return None if refusal is None else refusal[1]


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


def honoured_by(request: Request, requests: Iterable[Request]) -> list[Request]:
    """The done client requests that forgot every owner of records request ``request``.

    [] when ``request`` is not a records request (labels included) or an owner is
    still in the run. A records request of clients forgotten since it was
    recorded is done by those requests: its records went with their clients.
    """
    owners = set(records_of(request))
    if not owners or labels_of(request):
        return []
    by = [r for r in requests if r.state == "done" and owners & set(r.clients)]
    return by if owners <= {p for r in by for p in r.clients} else []


def merged_order(requests: Sequence[Request]) -> list[Request]:
    """``requests`` in the order they are handled: one replay per client.

    A records request whose owners a later client request of the batch forgets
    goes right after that request (it then only points at it,
    :func:`honoured_by`); the rest keep their order.
    """
    out = list(requests)
    for request in list(out):
        owners = set(records_of(request))
        if not owners or labels_of(request):
            continue
        later = out[out.index(request) + 1:]
        covering = [r for r in later if owners & set(r.clients)]
        if covering and owners <= {p for r in covering for p in r.clients}:
            out.remove(request)
            out.insert(out.index(covering[-1]) + 1, request)
    return out


def honoured_fields(by: Sequence[Request], versions: Sequence = ()) -> dict:
    """A receipt's ``honoured_by``: the requests (and model version) that did it.

    ``versions``: the run's model versions (:class:`runstore.versions.ModelVersion`;
    none for a staged run's boundary), to name the one the last of ``by`` made.
    """
    ids = [r.id for r in by]
    made = next((v.version for v in versions if ids[-1] in v.requests), None)
    clients = sorted({p for r in by for p in r.clients})
    note = (f"client(s) {clients} forgotten by {', '.join(ids)}"
            + (f" (model version v{made})" if made is not None else "")
            + ": every record of theirs went with them")
    return {"honoured_by": {"requests": ids, "version": made, "note": note}}
