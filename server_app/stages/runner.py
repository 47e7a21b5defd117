"""The ServerApp's staged run: stage after stage, resumable, then summary.json.

:func:`run_staged` drives :class:`server_app.stages.staged.StagedRun` through
``num-stages`` stages. Each finished stage is kept in the run catalog with its
models (``models/stage<t>.npz``), so a killed run resumes at the stage it was
in. :func:`staged_summary` turns the stage entries and the receipts into
summary.json: ``stages`` (per stage: clients present, joined, left, forgotten,
requests, learning and accuracy per shard and of the ensemble, unlearning
cost), ``learning`` over all rounds, and ``frameworks.SE`` / ``frameworks.FR``
with the accuracy right after the last request (``original``: right before it)
and the costs summed over requests.
"""

from __future__ import annotations

from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from history import HistoryStore
from history.catalog import CATALOG_FILE
from server_app.rounds.screening import FaultLog
from server_app.run.summary import (
    FrameworkSummary,
    LearningSummary,
    ModelScores,
    UnlearningPlan,
)
from server_app.stages.staged import StagedRun, staged_federations

__all__ = ["run_staged", "staged_summary"]


def open_store(root, federation) -> HistoryStore:
    """The run's history store: a new one, or the one a killed run left."""
    if (root / CATALOG_FILE).exists():
        return HistoryStore.open(root, require_complete=False)
    return HistoryStore.create(root, federation.shard_of,
                               num_shards=len(federation.shards))


def run_staged(grid: Grid, run, node_of: dict[int, int], initial: ArrayRecord,
               train_config: ConfigRecord, faults: FaultLog) -> StagedRun:
    """Run (or resume) every stage of ``run`` (a :class:`server_app.app.Prepared`).

    Returns the finished :class:`StagedRun`; its history store is marked complete.
    """
    cfg = run.cfg
    federations = staged_federations(cfg, node_of, run.samples)
    store = open_store(run.folder.history_dir("sharded"), federations[0])
    staged = StagedRun.create(grid, cfg, federations, store, run.evaluator,
                              train_config, initial, run.folder, faults)
    for t in range(1, cfg.num_stages + 1):
        name = f"stage:{t}"
        done = run.runlog.done(name)
        if done is not None:
            models = run.folder.load_models(f"stage{t}", run.runlog.models_record(
                f"stage{t}"))
            staged.restore(done, models)
            log(INFO, "resumed: stage %d already done", t)
            continue
        run.runlog.begin(name)
        staged.fr_models = []
        entry = staged.run_stage()
        if staged.fr_models:  # FR's models after the stage's last request
            run.folder.save_models(f"stage{t}-FR", staged.fr_models)
        saved = run.folder.save_models(f"stage{t}", staged.models)
        run.runlog.record_models(f"stage{t}", saved["sha256"], saved["shards"])
        run.runlog.finish(name, entry)
        log(INFO, "stage %d/%d done: %d clients, joined %s, left %s, forgotten %s, "
            "accuracy %.4f", t, cfg.num_stages, entry["present"], entry["joined"],
            entry["left"], entry["forgotten"], entry["accuracy"])
    store.mark_complete()
    for receipt in staged.inbox.receipts():  # a receipt file lost or damaged meanwhile
        staged.file_receipt(receipt, staged.stages[-1]["warnings"])
    for request in staged.inbox.all():
        if request.state == "pending":  # arrived after the last boundary
            staged.stages[-1]["warnings"].append(
                f"request {request.id} (clients {request.clients}) arrived after the "
                "last stage boundary: not handled")
            log(WARNING, "%s", staged.stages[-1]["warnings"][-1])
    return staged


def staged_summary(staged: StagedRun, summary) -> None:
    """Fill ``summary`` (a :class:`RunSummary`) from the stages and the receipts."""
    entries = staged.stages
    rounds = [r for e in entries for r in e["learning"]["rounds"]]
    last = entries[-1]
    summary.learning = LearningSummary(
        accuracy=last["learning"]["accuracy"], loss=last["learning"]["loss"],
        shard_accuracy=last["learning"]["shard_accuracy"],
        shard_loss=last["learning"]["shard_loss"],
        wall_time_s=sum(e["learning"]["wall_time_s"] for e in entries),
        compute_s=sum(e["learning"]["compute_s"] for e in entries),
        client_epochs=sum(e["learning"]["client_epochs"] for e in entries),
        rounds=rounds, warnings=[w for e in entries for w in e["warnings"]])
    summary.stages = entries
    kept = staged.inbox.receipts()  # the catalog's copy: the files may be damaged
    receipts = [r for r in kept if r["status"] == "done"]
    if receipts:  # compared at the last request: the models just before and after it
        summary.original = ModelScores(receipts[-1]["accuracy"]["before"])
        summary.frameworks = {name: _framework(name, receipts)
                              for name in staged.cfg.framework_list}
    refused = [{"request": r["request_id"], "clients": r["clients"], "reason": r["reason"]}
               for r in kept if r["status"] == "refused"]
    summary.unlearning = UnlearningPlan([r["clients"] for r in receipts], refused,
                                        "staged")


def _framework(name: str, receipts: list[dict]) -> FrameworkSummary:
    """SE / FR over every request of the run: costs summed, accuracy after the last.

    ``accuracy`` is the ensemble's (SE) or the model's (FR) test accuracy right after
    the run's last request (``original``: right before it); the final models'
    scores are the last entry of ``stages``.
    """
    costs = [r["cost"][name] for r in receipts if name in r["cost"]]
    last = receipts[-1]["accuracy"]
    return FrameworkSummary(
        accuracy=last["after"] if name == "SE" else last.get("FR"),
        retrain_compute_s=sum(c["compute_s"] for c in costs),
        retrain_wall_s=sum(c["wall_s"] for c in costs),
        modelled_wall_s=sum(c["modelled_wall_s"] for c in costs),
        client_epochs=sum(c["client_epochs"] for c in costs),
        rounds_replayed=sum(r["rounds_replayed"] or 0 for r in receipts)
        if name == "SE" else None,
        noop=None if costs else True)
