"""Requests to a finished run: forget later, from the stored history, as a new version.

A finished run keeps its history store, its model versions and its catalog. The
``forget`` command records a request in the run's inbox and starts the engine the
run used with ``later-requests = true``; the ServerApp then (:func:`serve_later`):

1. takes back the run's state: SE's shard models of the latest version
   (:mod:`runstore.versions`), every client forgotten so far, the shards and,
   for a staged run, each stage's members;
2. for each pending request, refuses it (one line in its receipt) when a client is
   unknown, already forgotten, or its removal would leave a shard without a
   client; else SE replays each impacted shard from the first stored round in
   which any client forgotten so far took part (coded storage: decoded from the
   clients' slices first), FR retrains from scratch as the reference when the
   run's ``frameworks`` has FR, the forgotten clients' stored updates and the
   shard models they shaped are erased from the store, and the result is a new
   model version;
3. writes the receipt (versions and digests before and after, shards and rounds
   replayed, what was erased) with the version in one catalog transaction, then
   as a file. The run's summary.json and earlier versions are never rewritten.

A request killed half-way stays pending; the next ``forget`` (or ``forget
--pending``) handles it once, from the same latest version, to the same models.
"""

from __future__ import annotations

import time

from history import (
    CodedHistory,
    CodedHistoryError,
    CorruptBlobError,
    HistoryStore,
    HoldersUnreachableError,
    StoreError,
)
from runstore.catalog import RunLogError
from runstore.folder import ModelsFileError
from runstore.inbox import Request, RequestInbox
from runstore.receipts import (
    receipt_cost,
    utc,
    write_receipt,
)
from runstore.summary import StageSummary
from runstore.versions import LATER, ModelVersion, make_version
from server_app.admission import later_refusal
from server_app.config.methods import reference
from server_app.run.context import RunContext
from server_app.stages import erasures
from server_app.stages.boundary import forget_with_se, se_stage
from server_app.stages.churn import Churn, Membership
from server_app.stages.staged import retrain_stages
from server_app.stages.state import RunState
from server_app.stages.stored_updates import erase_stored
from server_app.unlearning.driver import run_unlearning
from server_app.unlearning.erasure import Erasure

__all__ = ["FINAL", "serve_later"]

FINAL = (CodedHistoryError, StoreError, ModelsFileError)
"""Failures of a later request that a retry cannot fix: slices damaged beyond what
the code corrects, a history or models file that does not read back. The store
must be repaired first; the request is marked ``failed``. Not final: too few
slices while some holders did not answer (:class:`history.HoldersUnreachableError`):
the request stays pending and the command exits 1."""


def serve_later(ctx: RunContext) -> list[dict]:
    """Handle every pending request of the finished run; return their receipts.

    A request whose history cannot be decoded or read back (:data:`FINAL`) is
    marked ``failed`` with its one-line reason; the requests after it stay
    pending for the next command.

    Raises
    ------
    RunLogError
        The run has no model versions (it was made before they existed).
    """
    run, latest = _restore(ctx)
    receipts = []
    while (pending := run.inbox.pending()):  # also those recorded meanwhile
        request = erasures.merged_order(pending)[0]  # one replay per client
        try:
            receipt, latest = _handle(run, request, latest)
        except FINAL as err:  # a retry would fail alike: failed, not left pending
            if isinstance(err, HoldersUnreachableError):
                raise  # holders that did not answer may: it stays pending (exit 1)
            receipts.append(_fail(run, request, latest, err))
            break  # the run's state may be half-replayed: the rest wait, pending
        receipts.append(receipt)
    if not receipts:
        ctx.log("later requests: none pending")
    return receipts


def _restore(ctx: RunContext) -> tuple[RunState, ModelVersion]:
    """The finished run's state at its latest model version."""
    cfg = ctx.cfg
    inbox = RequestInbox(ctx.folder.runlog_path)
    versions = inbox.versions()
    if not versions:
        raise RunLogError(f"{ctx.folder.path} has no model versions (a run made "
                          "before they existed): it cannot take later requests")
    latest = versions[-1]
    federation, baseline = ctx.plan.federations()
    churn = Churn(federation.shards, cfg.initial_clients, cfg.stages.joins_per_stage,
                  cfg.stages.leaves_per_stage, cfg.seed)
    run = RunState(ctx, federation, baseline, churn, inbox, store=_open_store(ctx))
    problems = run.store.verify() if isinstance(run.store, HistoryStore) else []
    if problems:  # before any work: no version is made from a damaged history
        raise CorruptBlobError(f"history {run.store.root} is corrupted, no request "
                               f"handled: {'; '.join(problems[:5])}")
    run.models = ctx.folder.load_models(latest.file.removeprefix("models/")
                                        .removesuffix(".npz"),
                                        {"sha256": latest.file_sha256,
                                         "shards": latest.shards})
    run.scores, run.forgotten = dict(latest.scores), set(latest.forgotten)
    run.members = _members(ctx, run)
    return run, latest


def _open_store(ctx: RunContext):
    root = ctx.folder.history_dir("sharded")
    if not ctx.cfg.storage.coded:
        return HistoryStore.open(root)
    return CodedHistory.open(root, ctx.grid, dict(ctx.plan.node_of),
                             transfer=ctx.slice_transfer())


def _members(ctx: RunContext, run: RunState) -> list[Membership]:
    """Each stage's members (a one-stage run: every client in stage 1)."""
    if not ctx.cfg.stages.staged:
        return [run.churn.first()]
    entries = [ctx.catalog.done_as(f"stage:{t}", StageSummary)
               for t in range(1, ctx.cfg.stages.num_stages + 1)]
    return [Membership(e.stage, e.present_clients, e.joined, e.left) for e in entries]


def refusal(run: RunState, request: Request) -> str | None:
    """Why a finished run cannot forget ``request``'s clients (None: it can).

    :func:`server_app.admission.later_refusal` over the run's own
    federations: SE's shards and, with FR in ``frameworks``, FR's.
    """
    cfg = run.ctx.cfg
    joined = cfg.initial_clients + (len(run.members) - 1) * cfg.stages.joins_per_stage
    feds = [(run.federation.shards, "shard")]
    if reference() in cfg.unlearning.framework_list:
        feds.append((run.baseline.shards, f"{reference()} shard"))
    return later_refusal(request.clients, joined, run.forgotten, run.members[-1].present,
                         feds)


def records_refusal(run: RunState, request: Request) -> str | None:
    """Why a finished run cannot erase ``request``'s records (None: it can).

    :func:`server_app.stages.erasures.records_refusal`, every client joined.
    """
    return erasures.records_refusal(run, request, run.ctx.cfg.data.num_clients)


def _receipt_head(request: Request, ctx: RunContext) -> dict:
    """What every receipt of a later request starts with (a records request's too).

    ``engine``: where this process runs (:mod:`server_app.rounds.engine`); a done
    request's adds ``trained``, the partition ids its rounds trained on.
    """
    return {"request_id": request.id, "clients": request.clients,
            "source": request.source, "received_at": utc(request.received),
            "stage": None, "after_run": True, "engine": ctx.engine.to_json(),
            **erasures.receipt_fields(request)}


def _handle(run: RunState, request: Request, latest: ModelVersion
            ) -> tuple[dict, ModelVersion]:
    """Refuse or carry out one request; return its receipt and the latest version."""
    ctx = run.ctx
    receipt = _receipt_head(request, ctx)
    ctx.trained()  # from here on: this request's
    by = erasures.honoured_by(request, run.inbox.all())
    if by:  # its owners were forgotten meanwhile: their records went with them
        receipt.update(erasures.honoured_fields(by, run.inbox.versions()),
                       status="done", done_at=utc(time.time()),
                       version={"before": latest.version, "after": latest.version})
        run.inbox.finish(request.id, "done", receipt["honoured_by"]["note"], receipt)
        _file(ctx, receipt)
        ctx.log(f"request {request.id} done: {receipt['honoured_by']['note']}")
        return receipt, latest
    reason = (records_refusal if request.erasure else refusal)(run, request)
    if reason is not None:
        receipt.update(status="refused", reason=reason, done_at=utc(time.time()),
                       version={"before": latest.version, "after": latest.version})
        run.inbox.finish(request.id, "refused", reason, receipt)
        _file(ctx, receipt)
        ctx.log(f"request {request.id} refused: {reason}")
        return receipt, latest
    receipt.update(_forget(run, request, latest))
    receipt["engine"]["trained"] = ctx.trained()
    version = make_version(ctx.folder, latest.version + 1, run.models, run.scores,
                           [request.id], sorted(run.forgotten),
                           f"{LATER}{request.id}")
    receipt["version"]["after_file_sha256"] = version.file_sha256
    receipt.update(status="done", done_at=utc(time.time()))
    run.inbox.finish(request.id, "done", receipt=receipt, version=version)
    _file(ctx, receipt)
    what = (receipt["erasure_note"] + " erased" if request.erasure
            else f"clients {request.clients} forgotten")
    ctx.log(f"request {request.id} done: {what}, model version v{version.version} "
            f"({version.file})")
    return receipt, version


def _fail(run: RunState, request: Request, latest: ModelVersion,
          err: Exception) -> dict:
    """Mark ``request`` failed with ``err``'s first line; return its receipt."""
    reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    receipt = {**_receipt_head(request, run.ctx), "status": "failed", "reason": reason,
               "done_at": utc(time.time()),
               "version": {"before": latest.version, "after": latest.version}}
    run.inbox.finish(request.id, "failed", reason, receipt)
    _file(run.ctx, receipt)
    run.ctx.log(f"request {request.id} failed (not retried: repair the store, then "
                f"request its clients again): {reason}")
    return receipt


def _forget(run: RunState, request: Request, latest: ModelVersion) -> dict:
    """SE (and FR) for ``request`` from ``latest``; erase what it leaves unused.

    Every erasure done before stays in force (:mod:`server_app.stages.erasures`); a
    records request adds its own: its owners' shards are replayed with them
    training on what they keep, then their stored updates (all computed on the
    erased records) and the shard models those shaped are erased
    (:func:`~server_app.stages.stored_updates.erase_stored`). No replay reads an
    owner's update again.
    """
    erasure = erasures.for_request(run, request)
    out = forget_with_se(run, request.clients, erasure)
    out["version"] = {"before": latest.version, "after": latest.version + 1}
    out["models_sha256"]["before"] = latest.digests
    clients, shaped = ((request.clients, run.forgotten) if not request.erasure else
                       (sorted(erasure.erasing), run.forgotten | erasure.changed))
    earlier = run.forgotten - set(request.clients)  # a boundary kept theirs
    out.update(erase_stored(run, request, clients, shaped, bool(request.erasure),
                            earlier), verification=None)
    if reference() in run.ctx.cfg.unlearning.framework_list:
        out["cost"][reference()], out["accuracy"][reference()] = _retrain(run, erasure)
    return out


def _retrain(run: RunState, erasure: Erasure | None = None) -> tuple[dict, float]:
    """FR, the reference: from scratch without every client forgotten so far.

    The changed clients of ``erasure`` train on the records they keep.
    """
    ctx = run.ctx
    if ctx.cfg.stages.staged:
        models, meter = retrain_stages(ctx, run.baseline, run.members, run.forgotten,
                                       erasure=erasure)
        return receipt_cost(meter), ctx.evaluator.evaluate(models)["accuracy"]
    name = reference()
    requests = [] if erasure and erasure.erasing else [sorted(run.forgotten)]
    fr = run_unlearning(ctx.loop, se_stage(run), requests, ctx.evaluator.evaluate,
                        already_forgotten=sorted(run.forgotten), log_fn=ctx.log,
                        frameworks=[name], erasure=erasure)[name]
    return receipt_cost(fr.summary), fr.summary.accuracy


def _file(ctx: RunContext, receipt: dict) -> None:
    try:
        write_receipt(ctx.folder.path, receipt)
    except OSError as err:
        ctx.log(f"receipt of request {receipt['request_id']} not written ({err}); it "
                f"is kept in {ctx.folder.runlog_path}")
