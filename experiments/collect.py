"""Rows from the runs' summary.json files: ``results.csv``.

``results.csv`` holds one row per run and framework (``original`` is the learned
model before unlearning); :mod:`experiments.compare` derives what report.md and
the figures show from those rows and the storage blocks of the runs' summaries.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from runstore.summary import RequestCost, RunSummary
from server_app.config import methods

#: Offline LiRA (``mia-references``): per example, per forgotten client; U-LiRA
#: (``mia-unlearn-references``): the references' game, the run's model.
LIRA_METRICS = ("mia_lira_auc", "mia_lira_tpr_at_1fpr", "mia_lira_tpr_at_01fpr",
                "mia_lira_client_auc", "mia_lira_client_tpr_at_1fpr",
                "mia_ulira_game_auc", "mia_ulira_tpr_at_1fpr")


def frameworks() -> tuple[str, ...]:
    """The registered methods, in the report's order (:mod:`server_app.config.methods`)."""
    return methods.names()


def baselines() -> tuple[str, ...]:
    """The methods SE's savings are reported against (the paper's baselines)."""
    return tuple(m.name for m in methods.builtins() if m.paper_baseline)


COLUMNS = [
    "experiment", "run", "dataset", "partition", "seed", "num_clients", "num_shards",
    "clients_per_round", "num_rounds", "local_epochs", "retrain_ratio",
    "client_samples", "storage", "request_mode", "request_distribution",
    "num_requests", "requests", "framework", "metric", "accuracy", "loss",
    "retrain_compute_s", "retrain_wall_s", "modelled_wall_s", "measured_train_s",
    "measured_wall_s", "device_profile", "client_epochs",
    "client_rounds", "comm_time_s", "calibration_interval",
    *(k for m in methods.builtins() for k in m.Settings.keys()), "rounds_to_target",
    "target_compute_s", "target_modelled_wall_s", "rounds_replayed",
    "server_storage_bytes", "mia_f1",
    "mia_precision", "mia_recall", "mia_auc", "mia_tpr_at_1fpr", *LIRA_METRICS,
    "mia_lira_signal",
    "backdoor_asr", "backdoor_asr_ensemble",
    "impacted_shards", "impacted_shard_accuracy", "impacted_shard_accuracy_original",
    "se_measured_shard_s", "se_expected_shard_s",
    "se_mean_shard_cost_s", "learning_compute_s", "learning_wall_s", "run_wall_s",
]
_CONFIG_COLUMNS = {
    "dataset": "dataset", "partition": "partition", "seed": "seed",
    "num_clients": "num-clients", "num_shards": "num-shards",
    "clients_per_round": "clients-per-round", "num_rounds": "num-rounds",
    "local_epochs": "local-epochs", "retrain_ratio": "retrain-ratio",
    "client_samples": "client-samples", "storage": "storage",
    "request_mode": "request-mode", "request_distribution": "request-distribution",
    "num_requests": "num-requests", "calibration_interval": "calibration-interval",
    **{k: k for m in methods.builtins() for k in m.Settings.keys()},  # method.<key>.*
}
_METRICS = ("accuracy", "loss", "retrain_compute_s", "retrain_wall_s", "modelled_wall_s",
            "measured_train_s", "measured_wall_s", "rounds_to_target", "rounds_replayed",
            "client_epochs", "client_rounds",
            "comm_time_s", "server_storage_bytes", "mia_f1", "mia_precision",
            "mia_recall", "mia_auc", "mia_tpr_at_1fpr", *LIRA_METRICS,
            "mia_lira_signal", "backdoor_asr",
            "backdoor_asr_ensemble")


def summary_rows(experiment: str, run: str, summary: RunSummary, wall_s: float | None
                 ) -> list[dict]:
    """One row per framework of one run (plus ``original``).

    ``dataset`` is run-config ``task`` where it names one (a plug-in's spec), else
    ``dataset``; ``metric`` is the task's headline score
    (:meth:`RunSummary.headline_metric`), which the report and the figures use.
    """
    cfg = summary.config
    base = {"experiment": experiment, "run": run, "run_wall_s": wall_s,
            "metric": summary.headline_metric(),
            "requests": json.dumps(summary.unlearning.requests
                                   if summary.unlearning else []),
            "learning_compute_s": summary.learning.compute_s,
            "learning_wall_s": summary.learning.wall_time_s,
            # the profile that priced modelled_wall_s (None: made before the cost model)
            "device_profile": (summary.cost_model or {}).get("profile")}
    base.update({col: cfg.get(key) for col, key in _CONFIG_COLUMNS.items()})
    if cfg.get("task"):  # a plug-in task (or a built-in named by task): its name
        base["dataset"] = cfg["task"]
    rows = []
    if summary.original is not None:
        scores = summary.original.to_json()
        rows.append({**base, "framework": "original",
                     **{k: scores[k] for k in _METRICS if k in scores}})
    for name, result in (summary.frameworks or {}).items():
        scores = result.to_json()
        row = {**base, "framework": _label(name, cfg),
               **{k: scores[k] for k in _METRICS if k in scores}}
        if result.to_target and result.to_target.get("reached"):
            row["target_compute_s"] = result.to_target["compute_s"]
            row["target_modelled_wall_s"] = result.to_target["modelled_wall_s"]
        impacted = sorted({s for r in result.requests for s in r.impacted_shards or []})
        replayed = methods.has(name, "replay_report")
        baseline = methods.has(name, "on_baseline")
        row["impacted_shards"] = len(impacted) if replayed else None
        row.update(_impacted_accuracy(
            result, summary.baseline_learning if baseline else summary.learning))
        if result.expected:
            row["se_measured_shard_s"] = result.expected.get("measured_total_s")
            row["se_expected_shard_s"] = result.expected.get("expected_total_s")
            row["se_mean_shard_cost_s"] = result.expected.get("mean_shard_cost_s")
        rows.append(row)
    return rows


def _impacted_accuracy(result, learning) -> dict:
    """The retrained shards' mean test accuracy, and the original's same shards'.

    :meth:`FrameworkSummary.retrained_shard_accuracy`; empty for a single model.
    """
    mine = result.retrained_shard_accuracy()
    if mine is None:
        return {}
    before = result.retrained_shard_accuracy(
        learning.shard_accuracy if learning is not None else [])
    return {"impacted_shard_accuracy": mine,
            "impacted_shard_accuracy_original": before}


def methods_in(rows: Sequence[dict]) -> list[str]:
    """Frameworks of ``rows`` beyond the built-in ones (methods of one's own), sorted."""
    known = {"original", *frameworks()}
    return sorted({r["framework"] for r in rows if r.get("framework") not in known
                   and not str(r.get("framework", "")).startswith(interval_labels())})


def interval_labels() -> tuple[str, ...]:
    """The row-name prefixes ``NAME(dt=`` of the methods labelled by their interval."""
    return tuple(f"{m.name}(dt=" for m in methods.builtins() if m.interval_label)


def _label(name: str, cfg: dict) -> str:
    """The framework's row name (FE at calibration interval n != 1: ``FE(dt=n)``).

    So the headline's FE (interval 1) is never replaced by it.
    """
    interval = int(cfg.get("calibration-interval", 1) or 1)
    labelled = methods.has(name, "interval_label")
    return f"{name}(dt={interval})" if labelled and interval != 1 else name


def load_rows(results: dict, out: Path) -> list[dict]:
    """Rows of every finished app run of ``results`` (see :data:`COLUMNS`)."""
    rows = []
    for entry in results["runs"]:
        if entry.get("status") == "failed" or not entry.get("summary"):
            continue
        summary = load_summary(out, entry)
        rows += summary_rows(entry["spec"]["experiment"], entry["spec"]["name"],
                             summary, entry.get("wall_s"))
    return rows


def load_summary(out: Path, entry: dict) -> RunSummary:
    """The summary.json of a results.json run entry (relative to ``out``)."""
    path = Path(entry["summary"])
    return RunSummary.load(path if path.is_absolute() else out / path)


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str] | None = None
              ) -> None:
    """Write ``rows`` (dicts) as CSV.

    Columns: ``columns``, else :data:`COLUMNS` for run rows, else the keys of
    the first row.
    """
    if columns is None:
        columns = COLUMNS if rows and "framework" in rows[0] else \
            list(rows[0]) if rows else COLUMNS
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv(v) for k, v in row.items()})


def _csv(value: object) -> object:
    if isinstance(value, list | dict | tuple):
        return json.dumps(value)
    return "" if value is None else value


def summaries_by_run(results: dict, out: Path) -> dict[str, RunSummary]:
    """``{run name: summary}`` for every finished run."""
    found = {}
    for entry in results["runs"]:
        if entry.get("summary") and entry.get("status") != "failed":
            found[entry["spec"]["name"]] = load_summary(out, entry)
    return found


def se_requests(summaries: dict[str, RunSummary]) -> dict[str, list[RequestCost]]:
    """``{run name: SE's per-request costs}`` for the runs that ran SE."""
    se = methods.proposed()
    return {name: s.frameworks[se].requests for name, s in summaries.items()
            if s.frameworks and se in s.frameworks}


def storage_blocks(summaries: dict[str, RunSummary]) -> dict[str, dict]:
    """``{run name: its summary's storage block}``."""
    return {name: s.storage for name, s in summaries.items()}
