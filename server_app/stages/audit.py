"""The audit step of a one-stage run: is the forgotten clients' data forgotten.

With ``mia`` the membership-inference audit scores the original and every
unlearned model on the forgotten clients' data (:mod:`audits.audit`;
with ``mia-shadows`` each model is attacked on its own by shadow models); with
``backdoor-trigger`` (or the text one, ``backdoor-phrase``) the backdoor check
measures the attack success rate of every model
(:mod:`audits.backdoor`). The scores go into the summary
beside each model's accuracy.
"""

from __future__ import annotations

from audits.audit import membership_audit, shadow_audit
from audits.backdoor import backdoor_probe, participation
from audits.run import AuditedRun
from runstore.summary import RunSummary
from server_app.config import RunConfig
from server_app.config.tasks import load_run_data
from server_app.stages import references
from server_app.stages.state import RunState
from server_app.unlearning.driver import FrameworkResult


def audit(run: RunState, summary: RunSummary, baseline_models,
          results: dict[str, FrameworkResult]) -> None:
    """The membership-inference audit and the backdoor check, into ``summary``.

    ``baseline_models``: FedEraser's own original (None without FE).
    """
    ctx = run.ctx
    cfg, checks = ctx.cfg, ctx.cfg.audit
    labels = cfg.unlearning.erased_labels
    if labels:  # a class-level request: is the class gone from every model
        scored = [(summary.original, run.models)] + [
            (summary.frameworks[n], r.models) for n, r in results.items() if r.models]
        for target, models in scored:
            for key, value in ctx.evaluator.label_accuracy(models, labels).items():
                setattr(target, key, value)
    forget = ctx.plan.forgotten()
    owners = sorted(cfg.unlearning.erased_records)  # a records request's clients
    scored = bool(forget) or bool(owners and checks.mia_shadows)
    if checks.mia and not scored and (labels or owners):
        note = ("membership audit not run: a class request forgets no client's data, "
                "and a records request's erased records are scored by the shadow "
                "audit only (mia-shadows >= 1; mia = true was set)")
        summary.notes.append(note)
        ctx.log(note)
    if not forget and not owners:
        return
    rounds = participation(run.store, forget or owners, cfg.training.num_rounds)
    if checks.backdoor or checks.mia_shadows:
        summary.verification = {"forgotten_rounds": rounds}
    unlearned = {n: r.models for n, r in results.items() if r.models}
    if checks.mia and scored:  # forgotten clients' data, or the erased records
        scores = _membership(run, summary, rounds, unlearned)
        for name, values in scores.items():
            target = summary.original if name == "original" else summary.frameworks[name]
            target.audit.update(values)
    if checks.backdoor:
        _backdoor(run, summary, baseline_models, results)


def audited_run(cfg: RunConfig) -> AuditedRun:
    """What the audits know of the run ``cfg`` (:mod:`audits.run`)."""
    training = cfg.training
    recipe = references.recipe(cfg) if cfg.audit.mia_unlearn_references else None
    return AuditedRun(task=cfg.task(), data=cfg.data, seed=cfg.seed,
                      device=training.device, local=training.local_settings(cfg.seed),
                      clients_per_round=training.clients_per_round,
                      num_shards=training.num_shards, num_rounds=training.num_rounds,
                      local_epochs=training.local_epochs, audit=cfg.audit,
                      references=recipe)


def _membership(run: RunState, summary: RunSummary, rounds: dict, unlearned: dict
                ) -> dict[str, dict[str, float]]:
    ctx = run.ctx
    cfg, shards = ctx.cfg, run.federation.shards
    audited, data = audited_run(cfg), load_run_data(cfg, ctx.data_dir)
    if cfg.audit.mia_shadows:
        on_baseline = cfg.unlearning.with_fields(on_baseline=True)
        models = {"original": (run.models, shards),
                  **{n: (m, run.baseline.shards if n in on_baseline else shards)
                     for n, m in unlearned.items()}}
        records = cfg.unlearning.erased_records or None  # a records request
        scores, summary.verification["mia"] = shadow_audit(audited, data, rounds,
                                                           models, records)
        return scores
    forget = ctx.plan.forgotten()
    return membership_audit(audited, data, shards, forget, run.models, unlearned,
                            cfg.audit.mia_samples)


def _backdoor(run: RunState, summary: RunSummary, baseline_models,
              results: dict[str, FrameworkResult]) -> None:
    """ASR of the original, FE's own original and every framework (``backdoor_*``)."""
    ctx = run.ctx
    probe = backdoor_probe(audited_run(ctx.cfg), load_run_data(ctx.cfg, ctx.data_dir),
                           ctx.cfg.as_dict())
    summary.original.set_backdoor(probe.scores(run.models, run.federation.shards))
    if baseline_models is not None:
        summary.baseline_learning.backdoor_asr = probe.scores(
            baseline_models, run.baseline.shards)["backdoor_asr"]
    on_baseline = ctx.cfg.unlearning.with_fields(on_baseline=True)
    for name, result in results.items():
        if result.models:
            shards = run.baseline.shards if name in on_baseline \
                else run.federation.shards
            summary.frameworks[name].set_backdoor(probe.scores(result.models, shards))
    summary.verification["backdoor"] = probe.settings()
