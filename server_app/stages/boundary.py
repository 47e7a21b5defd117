"""Requests at a stage boundary: what a staged run does with the requests it received.

At the end of stage t the run binds every pending request of its inbox
(:mod:`runstore.inbox`: those of the ``forget`` command) to the stage,
adds the stage's ``requests-per-stage`` seeded ones (drawn once, inserted in one
transaction), and handles them one after the other, the command's first. Each is
refused (a client that has not joined yet, one already forgotten, or a request
that would leave a shard without a present client) or done: SE replays each
impacted shard from the first stored round, in whatever stage, in which a
forgotten client took part (forgetting is cumulative, so the stored models before
that round never saw a forgotten client), and FR, if asked, retrains every stage
so far from W^0 without the forgotten clients
(:func:`server_app.stages.staged.retrain_stages`). Each request gets a receipt
(:mod:`runstore.receipts`), stored with its final state in one
transaction, then written as a file.
"""

from __future__ import annotations

import time

from runstore.inbox import Request
from runstore.receipts import (
    kept_history,
    receipt_cost,
    shard_digests,
    utc,
    write_receipt,
)
from runstore.summary import StageSummary
from server_app.admission import present_shards
from server_app.config.methods import proposed, reference
from server_app.stages import erasures
from server_app.stages.churn import Membership
from server_app.stages.staged import retrain_stages
from server_app.stages.state import RunState
from server_app.unlearning.driver import run_unlearning
from server_app.unlearning.erasure import Erasure
from server_app.unlearning.frameworks import Stage

KEPT_AT_BOUNDARY = ("a staged run erases nothing at a stage boundary (not built yet); "
                    "SE never reads these updates again, and the next request to the "
                    "finished run erases them with its own clients' updates")
"""Why a boundary receipt's ``erased`` lists nothing (and what it keeps)."""


def handle_boundary(run: RunState, member: Membership, entry: StageSummary) -> None:
    """Claim and handle the requests that reached the end of stage ``member.stage``."""
    for request in erasures.merged_order(claim(run, member, entry)):
        entry.requests.append(request.id)
        _handle(run, member, request, entry)


def claim(run: RunState, member: Membership, entry: StageSummary) -> list[Request]:
    """The stage's requests: the pending ones, then its seeded ones (drawn once)."""
    cfg, inbox = run.ctx.cfg, run.inbox
    claimed = inbox.claim(member.stage)
    if cfg.stages.requests_per_stage and not any(r.source == "planned" for r in claimed):
        try:
            planned = run.churn.requests(
                member, run.forgotten | inbox.named_clients(),
                cfg.stages.requests_per_stage, cfg.unlearning.clients_per_request,
                cfg.unlearning.request_distribution)
        except ValueError as err:
            entry.warnings.append(f"{err}: no seeded request this stage")
            planned = []
        inbox.submit_all(planned, "planned", stage=member.stage, unique=False)
        claimed = inbox.claim(member.stage)
    # requests that arrived during the stage first, then the seeded draw
    order = {"command": 0, "planned": 1}
    return sorted(claimed, key=lambda r: order.get(r.source, 2))


def refusal(run: RunState, member: Membership, request: Request) -> str | None:
    """Why ``request`` cannot be carried out at this boundary (None: it can)."""
    cfg = run.ctx.cfg
    joined = cfg.initial_clients + (member.stage - 1) * cfg.stages.joins_per_stage
    late = [p for p in request.clients if p >= joined]
    if late:
        return f"client(s) {late} have not joined by stage {member.stage}"
    if all(p in run.forgotten for p in request.clients):
        return "every client of the request is already forgotten"
    gone = run.forgotten | set(request.clients)
    for fed, what in ((run.federation, "shard"), (run.baseline, f"{reference()} shard")):
        here = present_shards(fed.shards, (p for p in member.present if p not in gone))
        empty = [s for s, pids in enumerate(here) if not pids]
        if empty:
            return (f"{what}(s) {empty} would keep no present client; the "
                    "federation could not go on learning")
    return None


def _handle(run: RunState, member: Membership, request: Request,
            entry: StageSummary) -> None:
    receipt = {"request_id": request.id, "clients": request.clients,
               "source": request.source, "received_at": utc(request.received),
               "stage": member.stage}
    if request.erasure:  # a records request: its clients stay
        receipt.update(erasures.receipt_fields(request))
        by = erasures.honoured_by(request, run.inbox.all())
        if by:  # its owners were forgotten meanwhile: their records went with them
            receipt.update(erasures.honoured_fields(by), status="done",
                           done_at=utc(time.time()))
            run.inbox.finish(request.id, "done", receipt["honoured_by"]["note"],
                             receipt)
            file_receipt(run, receipt, entry.warnings)
            return
        joined = run.ctx.cfg.initial_clients + \
            (member.stage - 1) * run.ctx.cfg.stages.joins_per_stage
        reason = erasures.records_refusal(run, request, joined)
    else:
        reason = refusal(run, member, request)
    if reason is not None:
        receipt.update(status="refused", reason=reason, done_at=utc(time.time()))
        run.inbox.finish(request.id, "refused", reason, receipt)
        file_receipt(run, receipt, entry.warnings)
        entry.warnings.append(f"request {request.id} refused: {reason}")
        return
    receipt.update(_unlearn(run, request))
    receipt.update(status="done", done_at=utc(time.time()))
    run.inbox.finish(request.id, "done", receipt=receipt)  # the record, then the file
    file_receipt(run, receipt, entry.warnings)
    entry.forgotten += sorted(set(request.clients))
    for name, cost in receipt["cost"].items():
        into = entry.unlearning.setdefault(name, {"compute_s": 0.0, "client_epochs": 0.0,
                                                  "modelled_wall_s": 0.0,
                                                  "client_rounds": 0})
        for key in into:
            into[key] += cost.get(key) or 0


def file_receipt(run: RunState, receipt: dict, warnings: list[str]) -> None:
    """Write ``receipt``'s file; one it cannot write is a warning, not a crash.

    The receipt is already kept in ``run.sqlite`` (:meth:`RequestInbox.finish`),
    from which summary.json is built and the file is written again at the end.
    """
    try:
        write_receipt(run.ctx.folder.path, receipt)
    except OSError as err:
        warnings.append(f"receipt of request {receipt['request_id']} not written "
                        f"({err}); it is kept in {run.inbox.catalog_path}")


def _unlearn(run: RunState, request: Request) -> dict:
    """SE (and FR) for one request; the run goes on from SE's models.

    Every erasure done before stays in force (:mod:`server_app.stages.erasures`);
    a records request adds its own, its owners training on what they keep.
    """
    erasure = erasures.for_request(run, request)
    named = sorted(erasure.erasing) if request.erasure else request.clients
    out = {**forget_with_se(run, request.clients, erasure), "verification": None,
           "erased": kept_history(run.store, named, KEPT_AT_BOUNDARY)}
    if reference() in run.ctx.cfg.unlearning.framework_list:
        out["cost"][reference()], out["accuracy"][reference()] = _retrain(run, erasure)
    return out


def forget_with_se(run: RunState, clients: list[int], erasure: Erasure | None = None
                   ) -> dict:
    """SE forgets ``clients`` from ``run.models``; the run goes on from its models.

    ``erasure``: records erased so far (their clients train on what they keep)
    and those this request erases (``clients`` then empty), as
    :func:`server_app.unlearning.driver.run_unlearning` takes it.

    Updates ``run.models``, ``run.scores`` and ``run.forgotten``. Returns the
    receipt's SE part: ``shards_retrained``, ``rounds_replayed``, ``replay``,
    ``models_sha256`` (digests before and after), ``accuracy`` (before, after) and
    ``cost.SE`` (client-epochs, compute, modelled wall and wall seconds).
    """
    ctx = run.ctx
    before = shard_digests(run.models)
    accuracy_before = run.scores.get("accuracy")
    se = run_unlearning(ctx.loop, se_stage(run), [clients] if clients else [],
                        ctx.evaluator.evaluate, already_forgotten=sorted(run.forgotten),
                        log_fn=ctx.log, frameworks=[proposed()],
                        erasure=erasure)[proposed()]
    run.forgotten |= set(clients)
    run.models = se.models
    run.scores = {"accuracy": se.summary.accuracy, "loss": se.summary.loss,
                  "shard_accuracy": se.summary.shard_accuracy}
    cost = se.summary.requests[-1]
    return {"shards_retrained": cost.impacted_shards,
            "rounds_replayed": cost.rounds_replayed, "replay": cost.replay,
            "models_sha256": {"before": before, "after": shard_digests(se.models)},
            "accuracy": {"before": accuracy_before, "after": se.summary.accuracy},
            "cost": {proposed(): receipt_cost(cost)}}


def se_stage(run: RunState) -> Stage:
    """What the unlearning driver needs of the run now (no FedEraser store)."""
    ctx = run.ctx
    return Stage(ctx.cfg, run.federation, run.baseline,
                 run.store, None, run.models, ctx.initial_model(), ctx.train_config(),
                 present=run.present_at)


def _retrain(run: RunState, erasure: Erasure | None = None) -> tuple[dict, float]:
    ctx = run.ctx
    models, meter = retrain_stages(ctx, run.baseline, run.members, run.forgotten,
                                   erasure=erasure)
    run.fr_models = models
    return receipt_cost(meter), ctx.evaluator.evaluate(models)["accuracy"]
