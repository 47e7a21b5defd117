"""The receipt of a one-stage run's planned requests: what SE did, and what proves it.

A one-stage run knows its requests before it starts (``forget-clients``, or
``num-requests`` generated ones) and handles them all after learning, by every
framework of ``frameworks``, then runs the audit. When SE is among them, the run
files one receipt for the planned requests together (model version 1 -> 2), as a
staged run or a later request files one per request: it is recorded in the run's
inbox as request ``r0001`` (source ``planned``, stage 1, done, its receipt kept in
``run.sqlite`` in the same transaction) and written as ``receipts/r0001.json``, so
``receipts --run NAME`` lists it. It is filed after the storage report: by then
no framework, audit or report reads the stores, and the planned clients' stored
updates and the shard models they shaped are erased
(:func:`server_app.stages.stored_updates.erase_stored`). Beside the digests,
shards, rounds and costs it carries the evidence: ``erased`` (and
``erased_baseline``) and ``verification``, the audit's figures for the original
and every framework (backdoor ASR, membership inference), None when the audit did
not run.
"""

from __future__ import annotations

import time

from history import CodedHistoryError, StoreError
from runstore.receipts import (
    kept_history,
    receipt_cost,
    utc,
    verification_figures,
    write_receipt,
)
from runstore.summary import RunSummary
from server_app.config.methods import proposed
from server_app.stages.state import RunState
from server_app.stages.stored_updates import erase_stored
from server_app.unlearning.driver import FrameworkResult
from server_app.unlearning.erasure import planned_erasure


def file_planned_receipt(run: RunState, summary: RunSummary,
                         se: FrameworkResult | None) -> dict | None:
    """Record and write the receipt of the planned requests, once.

    Parameters
    ----------
    run : RunState
        The one-stage run after its planned requests, audit and storage report (its inbox,
        store, model versions 1 and 2).
    summary : RunSummary
        Its summary so far (``original``, ``frameworks``, ``verification``).
    se : FrameworkResult or None
        SE's result; no receipt without SE's models.

    Returns
    -------
    dict or None
        The receipt, or None: no SE models, no planned client, or a resumed run
        whose receipt is filed already.
    """
    ctx = run.ctx
    clients = ctx.plan.forgotten()
    erasure = planned_erasure(ctx.cfg)  # a records or class request: clients stay
    if se is None or not se.models or not (clients or erasure):
        return None
    mine = [r for r in run.inbox.all() if r.source == "planned" and r.stage == 1]
    if mine and mine[0].state == "done":
        return None
    request = mine[0] if mine else run.inbox.submit_all([clients], "planned", stage=1,
                                                        unique=False)[0]
    receipt = {"request_id": request.id, "clients": clients,
               "requests": ctx.plan.request_lists(), "source": "planned",
               **({"erasure": erasure.to_json(), "erasure_note": erasure.describe()}
                  if erasure else {}),
               "received_at": utc(request.received), "stage": 1,
               **_what_se_did(run, summary, se),
               **_erase(run, request, clients, erasure),
               "verification": verification_figures(_model_scores(summary),
                                                    summary.verification),
               "status": "done", "done_at": utc(time.time())}
    run.inbox.finish(request.id, "done", receipt=receipt)  # the record, then the file
    try:
        write_receipt(ctx.folder.path, receipt)
    except OSError as err:
        ctx.log(f"receipt of request {request.id} not written ({err}); it is kept in "
                f"{ctx.folder.runlog_path}")
    return receipt


def _erase(run: RunState, request, clients: list[int], erasure) -> dict:
    """``erased`` (and ``erased_baseline``): the planned clients' stored updates.

    A records or class request erases its owners' updates (every one saw the
    erased records) and keeps the owners in the run. The learned models of the
    last round stay in the stores: model version 1 holds the same arrays, and a
    run killed before its receipt is filed resumes from them. An erasure that
    fails (a coded round that does not decode, holders that do not answer, a
    store that does not read back) fails no finished run: the receipt says what
    is kept and why; a forgotten client's, the next request to the run erases
    (:func:`erase_stored`'s ``earlier``).
    """
    owners, shaped = ((sorted(erasure.erasing), set(erasure.changed)) if erasure else
                      (clients, set(clients)))
    learned = run.ctx.cfg.training.num_rounds  # v1's models: a resume reads them
    try:
        return erase_stored(run, request, owners, shaped, records=bool(erasure),
                            keep_round=learned)
    except (CodedHistoryError, StoreError) as err:
        then = ("they stay with their owners" if erasure else
                "the next request to the finished run erases them")
        why = f"not erased: {type(err).__name__}: {str(err)[:300]}; {then}"
        run.ctx.log(f"planned request {request.id}: stored updates {why}")
        return {"erased": kept_history(run.store, owners, why)}


def _what_se_did(run: RunState, summary: RunSummary, se: FrameworkResult) -> dict:
    """Versions and digests before and after, shards, rounds, accuracy and costs."""
    versions = {v.version: v for v in run.inbox.versions()}
    before, after = versions.get(1), versions.get(2)
    frameworks = summary.frameworks or {}
    cost = {name: receipt_cost(f) for name, f in frameworks.items() if not f.noop}
    accuracy = {"before": summary.original.accuracy if summary.original else None,
                "after": se.summary.accuracy,
                **{n: f.accuracy for n, f in frameworks.items() if n != proposed()}}
    return {"version": {"before": 1, "after": 2,
                        "after_file_sha256": after.file_sha256 if after else None},
            "models_sha256": {"before": before.digests if before else None,
                              "after": after.digests if after else None},
            "shards_retrained": sorted({s for r in se.summary.requests
                                        for s in r.impacted_shards or []}),
            "rounds_replayed": se.summary.rounds_replayed,
            "replay": se.summary.replay, "accuracy": accuracy, "cost": cost}


def _model_scores(summary: RunSummary) -> dict[str, dict]:
    """The original's and every framework's summary.json block, by name."""
    out = {"original": summary.original.to_json()} if summary.original else {}
    out.update({n: f.to_json() for n, f in (summary.frameworks or {}).items()})
    return out
