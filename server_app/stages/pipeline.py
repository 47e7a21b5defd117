"""Every run as a sequence of stages: learn, then handle the requests that came.

A run with ``num-stages = 1`` is a run of one stage. Each stage t:

1. its clients (:class:`server_app.stages.churn.Membership`: clients that joined,
   minus those that left or were forgotten) learn ``num-rounds`` rounds, numbered
   ``(t - 1) G + 1 .. t G``, from the shard models the previous stage ended with,
   into the run's one history store (:mod:`server_app.stages.learn`);
2. its requests are handled: a one-stage run's planned requests by every
   framework, then the audit (:mod:`server_app.stages.planned`), with one receipt
   (:mod:`server_app.stages.planned_receipt`) filed after the storage report,
   once its clients' stored updates are erased; a staged run's
   requests that reached the stage boundary by SE (and FR), each with a receipt
   (:mod:`server_app.stages.boundary`);
3. a staged run keeps the stage's summary and models in the run catalog, so a
   killed run resumes at the stage it was in (seeded, it redoes that stage the
   same way, its requests included); a one-stage run keeps its learning and each
   framework as they finish.

:func:`run_pipeline` returns the run's :class:`~runstore.summary.RunSummary`.
"""

from __future__ import annotations

from logging import WARNING

from flwr.supercore import log

from history import StorageSettings, storage_summary
from runstore.inbox import RequestInbox
from runstore.summary import (
    FrameworkSummary,
    LearningSummary,
    ModelScores,
    RunSummary,
    StageSummary,
    UnlearningPlan,
)
from runstore.versions import PLANNED, make_version
from server_app.config.methods import proposed, reference
from server_app.run.context import RunContext
from server_app.stages import erasures
from server_app.stages.boundary import file_receipt, handle_boundary
from server_app.stages.churn import Churn, Membership
from server_app.stages.learn import (
    Continuation,
    first_round,
    learn_federation,
    learn_rounds,
    open_store,
)
from server_app.stages.planned import handle_planned
from server_app.stages.planned_receipt import file_planned_receipt
from server_app.stages.state import RunState
from server_app.unlearning.driver import FrameworkResult
from server_app.unlearning.erasure import planned_erasure
from strategies.factory import server_settings

__all__ = ["run_pipeline"]


def run_pipeline(ctx: RunContext) -> RunSummary:
    """Run (or resume) every stage of the run; return its summary (not yet written)."""
    run = _start(ctx)
    summary = _new_summary(ctx, run)
    se = None
    if ctx.cfg.stages.staged:
        _run_staged(run, summary)
    else:
        se = _run_one_stage(run, summary)
    summary.storage = _storage(run, keep=se is not None)
    if se is not None:  # now that nothing reads them, the planned clients' updates go
        file_planned_receipt(run, summary, se)
    return summary


def _storage(run: RunState, keep: bool) -> dict:
    """The storage report, after unlearning (retrievals count), measured once.

    ``keep``: kept in the run catalog, as a planned request's erasure follows: a
    run killed after it resumes with the report of the stores as the run used them.
    """
    ctx = run.ctx
    storage = ctx.catalog.done("storage")
    if storage is None:
        model_bytes = sum(a.numpy().nbytes for a in run.models[0].values())
        storage = storage_summary(storage_settings(ctx), run.store, run.baseline_store,
                                  model_bytes)
        if keep:
            ctx.catalog.finish("storage", storage)
    return storage


def storage_settings(ctx: RunContext) -> StorageSettings:
    """What the storage report needs of the run's settings."""
    cfg = ctx.cfg
    return StorageSettings(cfg.storage.mode, cfg.training.num_shards,
                           cfg.data.num_clients, cfg.coded_blocks_per_shard,
                           cfg.storage.privacy_t, cfg.unlearning.calibration_interval,
                           cfg.training.link_rate_mbps)


def _start(ctx: RunContext) -> RunState:
    cfg = ctx.cfg
    federation, baseline = ctx.plan.federations()
    inbox = RequestInbox(ctx.folder.runlog_path)
    churn = Churn(federation.shards, cfg.initial_clients, cfg.stages.joins_per_stage,
                  cfg.stages.leaves_per_stage, cfg.seed)
    return RunState(ctx, federation, baseline, churn, inbox,
                    models=[ctx.initial_model()] * len(federation.shards))


def _new_summary(ctx: RunContext, run: RunState) -> RunSummary:
    cfg = ctx.cfg
    options = cfg.training.shard_strategy_options
    strategy = {"name": cfg.training.shard_strategy,
                **server_settings(cfg.training.shard_strategy, options["server_lr"],
                                  options["server_momentum"])}
    task = cfg.task()
    data = task.provenance_of(ctx.data_dir, test_only=cfg.data.client_data)
    ctx.log(f"data: {data['format']}; " + (
        f"sha256 {data['sha256'][:16]} over {len(data['files'])} file(s) in "
        f"{ctx.data_dir}" if data["files"] else f"no file hashed, in {ctx.data_dir}"))
    notes = list(ctx.plan.notes)
    if cfg.stages.staged and cfg.audit.mia:
        notes.append("mia = true: the membership-inference audit does not run in a "
                     "staged run (not staged yet)")
    return RunSummary(config=cfg.as_dict(), data_dir=ctx.data_dir,
                      shards=run.federation.shards, shard_strategy=strategy,
                      notes=notes, learning=None, data=data, task=task.describe(),
                      cost_model=ctx.loop.costs.describe())


def _run_one_stage(run: RunState, summary: RunSummary) -> FrameworkResult | None:
    """Stage 1 of 1: learn SE's shards, then the planned requests by every framework.

    Returns SE's result (None: no framework, or no SE), whose receipt is filed
    after the storage report.
    """
    ctx = run.ctx
    run.members.append(run.next_member())
    summary.learning, run.models, run.store = learn_federation(
        ctx, run.federation, "sharded", coded=ctx.cfg.storage.coded)
    learned = summary.learning
    keep_version(run, 1, run.models, {"accuracy": learned.accuracy, "loss": learned.loss,
                                      "shard_accuracy": learned.shard_accuracy},
                 [], "after learning")
    if not ctx.cfg.unlearning.framework_list:
        return None
    se = handle_planned(run, summary.learning, summary).get(proposed())
    erasure = planned_erasure(ctx.cfg)
    if se is not None and se.models:
        forgotten = ctx.plan.forgotten()
        keep_version(run, 2, se.models, {"accuracy": se.summary.accuracy,
                                         "loss": se.summary.loss,
                                         "shard_accuracy": se.summary.shard_accuracy},
                     [PLANNED], f"after the planned request: {erasure.describe()}"
                     if erasure else
                     f"after the planned requests {ctx.plan.request_lists()}",
                     name=proposed(), forgotten=forgotten)
    return se


def keep_version(run: RunState, number: int, models, scores: dict, requests: list[str],
                 note: str, name: str | None = None,
                 forgotten: list[int] | None = None) -> None:
    """Record model version ``number`` unless a resumed run recorded it already."""
    if any(v.version == number for v in run.inbox.versions()):
        return
    run.inbox.add_version(make_version(run.ctx.folder, number, models, scores, requests,
                                       forgotten or [], note, name))


def _run_staged(run: RunState, summary: RunSummary) -> None:
    """Every stage of a staged run, resumable; then its summary blocks."""
    ctx = run.ctx
    run.store = open_store(ctx.folder.history_dir("sharded"), run.federation)
    for t in range(1, ctx.cfg.stages.num_stages + 1):
        done = ctx.catalog.done_as(f"stage:{t}", StageSummary)
        if done is not None:
            run.restore(done, ctx.folder.load_models(
                f"stage{t}", ctx.catalog.models_record(f"stage{t}")))
            ctx.log(f"resumed: stage {t} already done")
            continue
        ctx.catalog.begin(f"stage:{t}")
        run.fr_models = []
        entry = run_stage(run, run.next_member())
        _keep_stage(run, entry)
    run.store.mark_complete()
    _refile(run)
    _staged_summary(run, summary)


def run_stage(run: RunState, member: Membership) -> StageSummary:
    """Learn one stage, handle the requests at its end; return its summary entry."""
    ctx = run.ctx
    run.members.append(member)
    result = learn_rounds(ctx, run.federation, run.store, run.models, member.present,
                          f"stage {member.stage} learn",
                          Continuation(first_round(ctx.cfg, member.stage)),
                          erasure=erasures.in_force(run) or None)
    run.store.prune_models(ctx.cfg.unlearning.calibration_interval)
    run.models = result.models
    learning = LearningSummary.of(result)
    run.scores = {"accuracy": learning.accuracy, "loss": learning.loss,
                  "shard_accuracy": learning.shard_accuracy}
    learned = learning.to_json()
    del learned["warnings"]  # the stage's, below
    entry = StageSummary(
        stage=member.stage, present=len(member.present),
        present_clients=list(member.present), joined=member.joined, left=member.left,
        forgotten=[], requests=[],
        rounds=[first_round(ctx.cfg, member.stage),
                first_round(ctx.cfg, member.stage + 1) - 1],
        learning=learned, warnings=member.warnings + result.warnings)
    handle_boundary(run, member, entry)
    entry.accuracy, entry.loss = run.scores["accuracy"], run.scores["loss"]
    entry.shard_accuracy = run.scores["shard_accuracy"]
    run.stages.append(entry)
    return entry


def _keep_stage(run: RunState, entry: StageSummary) -> None:
    """The finished stage's models and summary into the run folder and catalog.

    Its models are model version t (stage t's learning and requests).
    """
    ctx, t = run.ctx, entry.stage
    if run.fr_models:  # FR's models after the stage's last request
        ctx.folder.save_models(f"stage{t}-FR", run.fr_models)
    keep_version(run, t, run.models, run.scores, list(entry.requests),
                 f"after stage {t}", name=f"stage{t}", forgotten=sorted(run.forgotten))
    saved = ctx.folder.save_models(f"stage{t}", run.models)
    ctx.catalog.record_models(f"stage{t}", saved["sha256"], saved["shards"])
    ctx.catalog.finish(f"stage:{t}", entry.to_json())
    ctx.log(f"stage {t}/{ctx.cfg.stages.num_stages} done: {entry.present} clients, "
            f"joined {entry.joined}, left {entry.left}, forgotten {entry.forgotten}, "
            f"accuracy {entry.accuracy:.4f}")


def _refile(run: RunState) -> None:
    """Receipt files lost or damaged meanwhile; requests that came too late."""
    last = run.stages[-1].warnings
    for receipt in run.inbox.receipts():
        file_receipt(run, receipt, last)
    for request in run.inbox.all():
        if request.state == "pending":  # arrived after the last boundary
            who = (erasures.asked(request).describe() if request.erasure
                   else f"clients {request.clients}")
            last.append(f"request {request.id} ({who}) arrived after the last stage "
                        "boundary: not handled")
            log(WARNING, "%s", last[-1])


def _staged_summary(run: RunState, summary: RunSummary) -> None:
    """``learning``, ``stages``, ``frameworks``, ``original`` of a staged run."""
    summary.learning = LearningSummary.combined([e.learning_summary() for e in run.stages])
    summary.stages = run.stages
    kept = run.inbox.receipts()  # the catalog's copy: the files may be damaged
    receipts = [r for r in kept if r["status"] == "done" and not r.get("honoured_by")]
    if receipts:  # compared at the last request: the models just before and after it
        summary.original = ModelScores(receipts[-1]["accuracy"]["before"])
        summary.frameworks = {name: _framework(name, receipts)
                              for name in run.ctx.cfg.unlearning.framework_list}
    refused = [{"request": r["request_id"], "clients": r["clients"], "reason": r["reason"]}
               for r in kept if r["status"] == "refused"]
    summary.unlearning = UnlearningPlan([r["clients"] for r in receipts], refused,
                                        "staged")


def _sum_or_none(values: list) -> int | None:
    """The sum; None when a value is missing (a receipt filed before it was kept)."""
    return None if any(v is None for v in values) else sum(values)


def _framework(name: str, receipts: list[dict]) -> FrameworkSummary:
    """SE / FR over every request of the run: costs summed, accuracy after the last.

    ``accuracy`` is the ensemble's (SE) or the model's (FR) test accuracy right after
    the run's last request (``original``: right before it); the final models'
    scores are the last entry of ``stages``.
    """
    costs = [r["cost"][name] for r in receipts if name in r["cost"]]
    last = receipts[-1]["accuracy"]
    return FrameworkSummary(
        accuracy=last["after"] if name == proposed() else last.get(reference()),
        retrain_compute_s=sum(c["compute_s"] for c in costs),
        retrain_wall_s=sum(c["wall_s"] for c in costs),
        modelled_wall_s=sum(c["modelled_wall_s"] for c in costs),
        client_epochs=sum(c["client_epochs"] for c in costs),
        client_rounds=_sum_or_none([c.get("client_rounds") for c in costs]),
        rounds_replayed=sum(r["rounds_replayed"] or 0 for r in receipts)
        if name == proposed() else None,
        noop=None if costs else True)
