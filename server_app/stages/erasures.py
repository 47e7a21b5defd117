"""The records erasures in force in a run, as its stages carry requests out.

A records request erases some records of clients that stay
(:mod:`server_app.unlearning.erasure`). Once done it stays in force for the rest of
the run: every later replay, retraining and learning round sends the owners the ids
they no longer hold. The erasures in force are the run's planned one
(``forget-records`` / ``forget-labels``) and every records request done since
(the inbox keeps them: :class:`runstore.inbox.Request`'s ``erasure``), less
the records of clients forgotten since (gone with their clients). Whether a
request can be carried out is :mod:`server_app.admission`'s rule, which the
``forget`` command and the preflight read too; here it is applied to a run's state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from runstore.inbox import Request
from server_app.admission import (
    Holdings,
    asked,
    erasure_refusal,
    in_force_of,
    labels_of,
    records_of,
)
from server_app.stages.state import RunState
from server_app.unlearning.erasure import Erasure


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
    held = Holdings.of_run(ctx.cfg, ctx.data_dir, dict(ctx.plan.samples))
    refusal = erasure_refusal(records_of(request), labels_of(request), held,
                              in_force(run), run.forgotten, joined)
    return None if refusal is None else refusal[1]


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
