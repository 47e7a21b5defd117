"""The ServerApp: discovery, sharded learning with a stored history, results.

Flow: parse and validate the run config -> find the data -> discover nodes ->
split clients into shards -> G rounds of one stock strategy per shard (isolated)
-> central evaluation of each shard model and of their ensemble -> summary.json.
With ``storage = "coded"`` the sharded history goes to the clients as coded slices
(:mod:`history.coded_recorder`) and SE decodes it when it unlearns.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from logging import INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from history import (
    CodedHistory,
    CodedRecorder,
    CorruptBlobError,
    HistoryStore,
    storage_summary,
)
from server_app.config.run_config import RunConfig
from server_app.evaluation.audit import membership_audit, shadow_audit
from server_app.evaluation.backdoor import BackdoorProbe, participation
from server_app.evaluation.central import CentralEvaluator
from server_app.preflight import (
    baseline_sampling_notes,
    check_partition,
    plan_requests,
    validate_run_config,
)
from server_app.rounds.federation import Federation, assign_shards, discover
from server_app.rounds.learning import LearningResult, run_learning
from server_app.rounds.polling_grid import fast_replies
from server_app.rounds.screening import FaultLog
from server_app.run.catalog import RunLog
from server_app.run.folder import RunFolder
from server_app.run.summary import (
    FrameworkSummary,
    LearningSummary,
    ModelScores,
    RunSummary,
    UnlearningPlan,
)
from server_app.stages.runner import run_staged, staged_summary
from server_app.stages.staged import stage_strategy
from server_app.unlearning.driver import FrameworkResult, run_unlearning
from server_app.unlearning.frameworks import Stage, UnlearningSettings
from strategies import ShardedStrategy
from strategies.factory import server_settings
from strategies.sharded import to_record
from task.data import load_task_data, partition_sizes
from task.locate import resolve_data_dir
from task.model import build_model
from task.provenance import data_provenance

app = ServerApp()


def initial_model(cfg: RunConfig, num_classes: int) -> ArrayRecord:
    """W^0: the model initialised from ``seed`` (the same for every shard)."""
    torch.manual_seed(cfg.seed)
    return ArrayRecord(build_model(cfg.dataset, num_classes).state_dict())


def train_config(cfg: RunConfig, data_dir: str) -> ConfigRecord:
    """What every learning message carries besides the model."""
    return ConfigRecord({
        "lr": cfg.lr, "local-epochs": cfg.local_epochs, "batch-size": cfg.batch_size,
        "optimizer": cfg.optimizer, "momentum": cfg.momentum, "seed": cfg.seed,
        "data-dir": data_dir,
    })


def sharded_strategy(cfg: RunConfig, federation: Federation) -> ShardedStrategy:
    """One fresh ``shard-strategy`` instance per shard of ``federation``.

    Every client is present (:func:`server_app.stages.staged.stage_strategy`).
    """
    return stage_strategy(cfg, federation.shards, list(federation.node_of),
                          federation.node_of)


def shard_strategy_summary(cfg: RunConfig) -> dict:
    """``shard_strategy`` of summary.json: the name and the server settings in use.

    ``server-lr`` 0 / ``server-momentum`` -1 in ``config`` mean the strategy's own
    defaults; this block says which values those were.
    """
    options = cfg.shard_strategy_options
    return {"name": cfg.shard_strategy,
            **server_settings(cfg.shard_strategy, options["server_lr"],
                              options["server_momentum"])}


def learn(grid: Grid, cfg: RunConfig, federation: Federation, folder: RunFolder,
          name: str, evaluator: CentralEvaluator, data_dir: str,
          faults: FaultLog | None = None, coded: bool = False):
    """Learn ``federation`` for G rounds into the store ``folder/history/name``.

    With ``coded`` the history is coded into client slices (the returned store
    is then the :class:`CodedHistory` that fetches and decodes them).
    """
    if coded:
        store = CodedRecorder.create(
            folder.history_dir(name), federation, cfg.coded_blocks_per_shard,
            cfg.quant_scale_bits, cfg.link_rate_mbps, cfg.round_timeout, faults,
            privacy_t=cfg.privacy_t)
    else:
        store = HistoryStore.create(folder.history_dir(name), federation.shard_of,
                                    num_shards=len(federation.shards))
    w0 = initial_model(cfg, evaluator.num_classes)
    result = run_learning(
        grid, sharded_strategy(cfg, federation), federation,
        [w0] * len(federation.shards), cfg.num_rounds, train_config(cfg, data_dir),
        store, evaluate=evaluator.evaluate, timeout=cfg.round_timeout, label=name,
        faults=faults)
    if not coded:  # SE replays from first participations; FedEraser from round 1
        freed = store.prune_models(cfg.calibration_interval if name == "sharded"
                                   else None)
        log(INFO, "%s history: %d bytes of shard models no replay can start from "
            "dropped", name, freed)
    store.mark_complete()
    if coded:
        store.close()
        store = CodedHistory.open(store.root, grid, federation.node_of,
                                  timeout=cfg.round_timeout,
                                  link_rate_mbps=cfg.link_rate_mbps, faults=faults)
    return result, store


def learn_once(runlog: RunLog, grid: Grid, cfg: RunConfig, federation: Federation,
               folder: RunFolder, name: str, evaluator: CentralEvaluator,
               data_dir: str, faults: FaultLog, coded: bool = False
               ) -> tuple[LearningSummary, list[ArrayRecord], HistoryStore | CodedHistory]:
    """:func:`learn`, or, in a resumed run whose learning finished, its results.

    Returns (learning summary, final shard models, history store). A learning
    stage that was interrupted is redone from scratch (its partial store is
    incomplete, so it is removed first): seeded, it ends the same.
    """
    done = runlog.done_as(f"learn:{name}", LearningSummary)
    root = folder.history_dir(name)
    if done is not None and not coded:
        store = HistoryStore.open(root)
        models = [to_record(store.shard_model(s, cfg.num_rounds))
                  for s in range(len(federation.shards))]
        log(INFO, "resumed: %s learning already done", name)
        return done, models, store
    if root.exists():  # interrupted (or coded: slices lived in the lost run)
        shutil.rmtree(root)
    runlog.begin(f"learn:{name}")
    result, store = learn(grid, cfg, federation, folder, name, evaluator, data_dir,
                          faults, coded=coded)
    summary = learning_summary(result)
    runlog.finish(f"learn:{name}", summary.to_json())
    return summary, result.models, store


def unlearn_once(runlog: RunLog, folder: RunFolder, grid: Grid, stage: Stage,
                 requests, evaluator: CentralEvaluator, faults: FaultLog
                 ) -> dict[str, FrameworkResult]:
    """Run each framework not yet done in this run; load the ones that are.

    Each framework's models are saved and its state set to done as soon as it
    finishes, so a killed run loses at most the framework in progress.
    """
    for store in (stage.sharded_store, stage.baseline_store):
        problems = store.verify() if store is not None else []
        if problems:  # before any work: the learned models stay as they are
            raise CorruptBlobError(f"history {store.root} is corrupted, no unlearning "
                                   f"started: {'; '.join(problems[:5])}")
    results = {}
    runlog.set_request_state("in_progress")
    for name in stage.settings.frameworks:
        summary = runlog.done_as(f"unlearn:{name}", FrameworkSummary)
        if summary is not None:
            log(INFO, "resumed: %s already done", name)
            models = [] if summary.noop else folder.load_models(
                name, runlog.models_record(name))
            results[name] = FrameworkResult(models, summary, [])
            continue
        runlog.begin(f"unlearn:{name}")
        result = run_unlearning(grid, stage, requests, evaluator.evaluate,
                                log_fn=lambda m: log(INFO, "%s", m), faults=faults,
                                frameworks=[name])[name]
        if result.models:
            saved = folder.save_models(name, result.models)
            runlog.record_models(name, saved["sha256"], saved["shards"])
        runlog.finish(f"unlearn:{name}", result.summary.to_json())
        log(INFO, "%s done: models saved", name)
        results[name] = result
    runlog.set_request_state("done")
    return results


def learning_summary(result: LearningResult) -> LearningSummary:
    """The ``learning`` block of summary.json for one learning stage."""
    last = result.rounds[-1]
    return LearningSummary(
        accuracy=last["accuracy"], loss=last["loss"],
        shard_accuracy=last["shard_accuracy"], shard_loss=last["shard_loss"],
        wall_time_s=result.wall_time_s, compute_s=result.compute_s,
        client_epochs=result.client_epochs, rounds=result.rounds,
        warnings=result.warnings)


@dataclass
class Prepared:
    """What the ServerApp knows before it contacts a node (all checks passed)."""

    cfg: RunConfig
    data_dir: str
    notes: list[str]
    samples: dict[int, int]
    shards: list[list[int]]
    requests: list[list[int]]
    noops: list[dict]
    folder: RunFolder
    runlog: RunLog
    evaluator: CentralEvaluator


def prepare(run_config) -> Prepared:
    """Check the run config and the data, plan the requests, open the run folder.

    Everything that can fail without a node fails here, before any folder or
    node (:mod:`server_app.preflight`).
    """
    cfg = validate_run_config(run_config, files=False)  # every check without data
    # a staged run takes its requests stage by stage (server_app.stages.staged)
    requests, noops = plan_requests(cfg) if cfg.num_stages == 1 else ([], [])
    data_dir = str(resolve_data_dir(cfg.dataset, cfg.data_dir or None))
    task = load_task_data(cfg.dataset, data_dir, cfg.block_size)  # fail early
    # what needs the data: the partition (once); the rest was checked just above
    notes = baseline_sampling_notes(cfg, requests) + check_partition(cfg, task)
    for note in notes:
        log(INFO, "%s", note)
    # what each client holds bounds the num-examples its replies may claim
    samples = dict(enumerate(partition_sizes(
        task, cfg.num_clients, cfg.partition, cfg.seed, cfg.client_samples,
        cfg.partition_alpha, cfg.classes_per_client)))
    folder = RunFolder.start(cfg)
    # resolved paths: another spelling of the same folders is the same run
    settings = {**cfg.as_dict(), "results-dir": str(folder.path.parent),
                "data-dir": data_dir}
    runlog = RunLog(folder.runlog_path, settings)
    if cfg.framework_list:
        requests = runlog.record_requests(requests)
    log(INFO, "results: %s%s", folder.path, " (resumed)" if runlog.resumed else "")
    evaluator = CentralEvaluator(cfg.dataset, data_dir, cfg.block_size,
                                 cfg.test_samples or None)
    shards = assign_shards(cfg.num_clients, cfg.num_shards, cfg.seed)
    return Prepared(cfg, data_dir, notes, samples, shards, requests, noops, folder,
                    runlog, evaluator)


def unlearn_stage(grid: Grid, run: Prepared, federation: Federation, store,
                  learned_models: list[ArrayRecord], faults: FaultLog,
                  summary: RunSummary):
    """FE's own learning, every framework, the audit; fills ``summary``.

    Returns the baseline federation's history store (None without FE).
    """
    cfg = run.cfg
    baseline = Federation(federation.node_of, assign_shards(
        cfg.num_clients, cfg.baseline_shards, cfg.seed), run.samples)
    baseline_store, baseline_models = None, None
    if "FE" in cfg.framework_list:
        summary.baseline_learning, baseline_models, baseline_store = learn_once(
            run.runlog, grid, cfg, baseline, run.folder, "baseline", run.evaluator,
            run.data_dir, faults)
    stage = Stage(UnlearningSettings.from_config(cfg), federation, baseline, store,
                  baseline_store, learned_models,
                  initial_model(cfg, run.evaluator.num_classes),
                  train_config(cfg, run.data_dir), summary.learning.loss)
    results = unlearn_once(run.runlog, run.folder, grid, stage, run.requests,
                           run.evaluator, faults)
    summary.unlearning = UnlearningPlan(run.requests, run.noops, cfg.request_mode)
    summary.frameworks = {n: r.summary for n, r in results.items()}
    summary.original = ModelScores(summary.learning.accuracy, summary.learning.loss)
    audit_stage(run, summary, store, learned_models, baseline, baseline_models, results)
    return baseline_store


def audit_stage(run: Prepared, summary: RunSummary, store, learned_models, baseline,
                baseline_models, results: dict[str, FrameworkResult]) -> None:
    """The membership-inference audit and the backdoor verification, into ``summary``."""
    cfg = run.cfg
    forget = sorted({p for r in run.requests for p in r})
    if not forget:
        return
    rounds = participation(store, forget, cfg.num_rounds)
    if cfg.backdoor_trigger or cfg.mia_shadows:
        summary.verification = {"forgotten_rounds": rounds}
    unlearned = {n: r.models for n, r in results.items() if r.models}
    if cfg.mia and cfg.mia_shadows:
        shards = {n: run.shards if n == "SE" else baseline.shards for n in unlearned}
        audit, summary.verification["mia"] = shadow_audit(
            cfg, run.data_dir, rounds,
            {"original": (learned_models, run.shards),
             **{n: (m, shards[n]) for n, m in unlearned.items()}})
    elif cfg.mia:
        audit = membership_audit(cfg, run.data_dir, run.shards, forget, learned_models,
                                 unlearned, cfg.mia_samples)
    for name, scores in (audit if cfg.mia else {}).items():
        target = summary.original if name == "original" else summary.frameworks[name]
        target.audit.update(scores)
    if cfg.backdoor_trigger:
        verify_backdoor(run, summary, learned_models, baseline, baseline_models,
                        results)


def verify_backdoor(run: Prepared, summary: RunSummary, learned_models, baseline,
                    baseline_models, results: dict[str, FrameworkResult]) -> None:
    """ASR of the original, FE's own original and every framework (``backdoor_*``)."""
    probe = BackdoorProbe(run.cfg, load_task_data(run.cfg.dataset, run.data_dir,
                                                  run.cfg.block_size))
    summary.original.set_backdoor(probe.scores(learned_models, run.shards))
    if baseline_models is not None:
        summary.baseline_learning.backdoor_asr = probe.scores(
            baseline_models, baseline.shards)["backdoor_asr"]
    for name, result in results.items():
        if result.models:
            shards = run.shards if name == "SE" else baseline.shards
            summary.frameworks[name].set_backdoor(probe.scores(result.models, shards))
    summary.verification["backdoor"] = probe.settings()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one experiment as the run config describes (see docs/CONFIG.md)."""
    grid = fast_replies(grid)  # deployment: replies pulled every 0.2 s, not 3 s
    run = prepare(context.run_config)
    cfg = run.cfg
    node_of = discover(grid, cfg.num_clients, timeout=cfg.round_timeout)
    faults = FaultLog()
    if cfg.num_stages > 1:
        return main_staged(grid, run, node_of, faults)
    federation = Federation(node_of, run.shards, run.samples)
    learned, learned_models, store = learn_once(
        run.runlog, grid, cfg, federation, run.folder, "sharded", run.evaluator,
        run.data_dir, faults, coded=cfg.storage == "coded")
    summary = RunSummary(config=cfg.as_dict(), data_dir=run.data_dir,
                         shards=federation.shards,
                         shard_strategy=shard_strategy_summary(cfg),
                         notes=run.notes,  # settings carried out in a reduced form
                         learning=learned, data=data_provenance(cfg.dataset, run.data_dir))
    log(INFO, "data: %s; sha256 %s over %d file(s) in %s", summary.data["format"],
        summary.data["sha256"][:16], len(summary.data["files"]), run.data_dir)
    baseline_store = None
    if cfg.framework_list:
        baseline_store = unlearn_stage(grid, run, federation, store, learned_models,
                                       faults, summary)
    summary.storage = storage_summary(  # after unlearning: retrievals count
        cfg, store, baseline_store,
        sum(a.numpy().nbytes for a in learned_models[0].values()))
    finish(run, summary, faults)


def finish(run: Prepared, summary: RunSummary, faults: FaultLog) -> None:
    """Faults, warnings and perplexity into ``summary``; write summary.json."""
    summary.faults = {"counts": faults.counts(), "entries": faults.entries}
    summary.warnings = summary.collect_warnings()
    if run.cfg.dataset == "shakespeare":
        summary.add_perplexity()
    path = run.folder.finish(summary.to_json())
    log(INFO, "summary: %s", path)


def main_staged(grid: Grid, run: Prepared, node_of: dict[int, int],
                faults: FaultLog) -> None:
    """A run of ``num-stages`` > 1 stages (:mod:`server_app.stages.runner`)."""
    cfg = run.cfg
    staged = run_staged(grid, run, node_of,
                        initial_model(cfg, run.evaluator.num_classes),
                        train_config(cfg, run.data_dir), faults)
    notes = run.notes + (["mia = true: the membership-inference audit does not run "
                          "in a staged run (not staged yet)"] if cfg.mia else [])
    summary = RunSummary(config=cfg.as_dict(), data_dir=run.data_dir,
                         shards=staged.federation.shards,
                         shard_strategy=shard_strategy_summary(cfg), notes=notes,
                         learning=None, data=data_provenance(cfg.dataset, run.data_dir))
    staged_summary(staged, summary)
    summary.storage = storage_summary(cfg, staged.store, None, sum(
        a.numpy().nbytes for a in staged.models[0].values()))
    finish(run, summary, faults)
