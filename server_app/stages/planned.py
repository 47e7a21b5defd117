"""The planned requests of a one-stage run, handled by every framework.

A run with ``num-stages = 1`` knows its requests before it starts
(``forget-clients``, or ``num-requests`` generated ones; recorded in the run
catalog). After learning, FedEraser's own unsharded federation learns (if FE runs),
then each framework of ``frameworks`` handles the requests (sequential: one after
the other; concurrent: as one batch) from the stored histories, and the audit
scores every model. Each framework's models are saved and its state set to done
as soon as it finishes, so a killed run loses at most the framework in progress.
"""

from __future__ import annotations

from history import CorruptBlobError
from runstore.summary import (
    FrameworkSummary,
    LearningSummary,
    ModelScores,
    RunSummary,
    UnlearningPlan,
)
from server_app.run.context import RunContext
from server_app.stages.audit import audit
from server_app.stages.learn import learn_federation
from server_app.stages.state import RunState
from server_app.unlearning.driver import FrameworkResult, run_unlearning
from server_app.unlearning.erasure import planned_erasure
from server_app.unlearning.frameworks import Stage


def handle_planned(run: RunState, learning: LearningSummary, summary: RunSummary
                   ) -> dict[str, FrameworkResult]:
    """FE's (and FRec's) own learning, every framework on the planned requests, the audit.

    Fills ``summary``'s ``baseline_learning``, ``frameworks``, ``unlearning``,
    ``original`` and the audit's scores; sets ``run.baseline_store``. Returns
    each framework's result.
    """
    ctx = run.ctx
    baseline_models = None
    if ctx.cfg.unlearning.with_fields(on_baseline=True, reads_history=True):
        summary.baseline_learning, baseline_models, run.baseline_store = \
            learn_federation(ctx, run.baseline, "baseline")
    stage = Stage(ctx.cfg, run.federation, run.baseline,
                  run.store, run.baseline_store, run.models, ctx.initial_model(),
                  ctx.train_config(), learning.loss, present=run.present_at)
    results = unlearn_once(ctx, stage)
    erasure = planned_erasure(ctx.cfg)
    summary.unlearning = UnlearningPlan(ctx.plan.request_lists(), list(ctx.plan.noops),
                                        ctx.cfg.unlearning.request_mode,
                                        erasure.to_json() if erasure else None)
    summary.frameworks = {n: r.summary for n, r in results.items()}
    summary.original = ModelScores(learning.accuracy, learning.loss)
    audit(run, summary, baseline_models, results)
    return results


def unlearn_once(ctx: RunContext, stage: Stage) -> dict[str, FrameworkResult]:
    """Run each framework not yet done in this run; load the ones that are.

    Raises
    ------
    CorruptBlobError
        A stored history fails its checks (before any unlearning starts: the
        learned models stay as they are).
    """
    for store in (stage.sharded_store, stage.baseline_store):
        problems = store.verify() if store is not None else []
        if problems:
            raise CorruptBlobError(f"history {store.root} is corrupted, no unlearning "
                                   f"started: {'; '.join(problems[:5])}")
    catalog, results = ctx.catalog, {}
    catalog.set_request_state("in_progress")
    for name in stage.cfg.unlearning.framework_list:
        summary = catalog.done_as(f"unlearn:{name}", FrameworkSummary)
        if summary is not None:
            ctx.log(f"resumed: {name} already done")
            models = [] if summary.noop else ctx.folder.load_models(
                name, catalog.models_record(name))
            results[name] = FrameworkResult(models, summary, [])
            continue
        catalog.begin(f"unlearn:{name}")
        result = run_unlearning(ctx.loop, stage, ctx.plan.request_lists(),
                                ctx.evaluator.evaluate,
                                log_fn=ctx.log, frameworks=[name],
                                erasure=planned_erasure(ctx.cfg))[name]
        if result.models:
            saved = ctx.folder.save_models(name, result.models)
            catalog.record_models(name, saved["sha256"], saved["shards"])
        catalog.finish(f"unlearn:{name}", result.summary.to_json())
        ctx.log(f"{name} done: models saved")
        results[name] = result
    catalog.set_request_state("done")
    return results
