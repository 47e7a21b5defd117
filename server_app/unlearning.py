"""The unlearning stage: run each framework on the requests and measure it.

For every framework (SE, FR, FE, RR) and request batch this builds the strategy
(:mod:`strategies.unlearning`), drives its rounds over the grid and measures:
retraining compute seconds (clients' training seconds plus the server's
aggregation and calibration seconds), wall seconds, client-epochs, modelled
communication time and server storage. The stored histories are only read.

Communication model (paper Sec. 5.1): every transfer of a model (server to
client, or back) costs 0.1 s + bits / link rate; ``comm_time_s`` sums over all
transfers, as if the server's link carried them one after another. With coded
storage SE first fetches and decodes the impacted shards' history from the
clients' slices: its modelled transfer time, decoding seconds and wall seconds
are added to SE's ``comm_time_s``, ``compute_s`` and ``wall_s`` and reported per
request under ``slice_retrieval``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from history import TrainingHistory
from server_app.config import RunConfig
from server_app.federation import Federation
from server_app.requests import expected_cost
from server_app.rounds import CostMeter, run_rounds
from server_app.screening import MAX_TRAIN_SECONDS, FaultLog, ReplyLimits
from strategies.sharded import ShardedStrategy, to_record
from strategies.unlearning import FedEraser, FedRetrain, RapidRetrain, ShardingEraser


def drive(grid: Grid, strategy: ShardedStrategy, initial: Sequence[ArrayRecord],
          num_rounds: int, config: ConfigRecord, link_rate_mbps: float,
          timeout: float | None = None, faults: FaultLog | None = None,
          stage: str = "unlearn", partition_of: Mapping[int, int] | None = None,
          samples: Mapping[int, int] | None = None
          ) -> tuple[list[ArrayRecord], CostMeter]:
    """Run ``num_rounds`` train rounds of ``strategy``; return shard models and costs.

    The rounds go through :func:`server_app.rounds.run_rounds` (replies screened,
    rejected ones and missing answers recorded in ``faults``) with a
    :class:`~server_app.rounds.CostMeter` as observer; its ``wall_s`` is set here.
    ``samples`` (partition id -> samples held) and ``timeout`` (the most training
    seconds a reply may claim) bound the replies' numbers.
    """
    limits = ReplyLimits(samples or {}, timeout or MAX_TRAIN_SECONDS)
    meter = CostMeter(link_rate_mbps)
    t_start = time.perf_counter()
    models = run_rounds(grid, strategy, initial, num_rounds, config, timeout=timeout,
                        faults=faults, label=stage, partition_of=partition_of,
                        limits=limits, observers=[meter])
    meter.wall_s = time.perf_counter() - t_start
    return models, meter


@dataclass
class Stage:
    """What the unlearning stage needs from learning."""

    cfg: RunConfig
    sharded: Federation
    baseline: Federation
    sharded_store: TrainingHistory
    baseline_store: TrainingHistory | None
    sharded_models: list[ArrayRecord]
    initial: ArrayRecord
    train_config: ConfigRecord


def build_framework(name: str, stage: Stage, forget: set[int],
                    batch: Sequence[int] | None = None,
                    current: Sequence[ArrayRecord] | None = None
                    ) -> tuple[ShardedStrategy, list[ArrayRecord], int]:
    """The strategy, its initial shard models and its rounds for ``name``.

    ``forget`` holds every client forgotten so far; for SE, ``batch`` (this
    request's clients) picks the shards to retrain and ``current`` holds the
    shard models after the previous request (default: the learned ones).

    Raises
    ------
    ValueError
        Unknown framework, or FE without a baseline history.
    """
    cfg = stage.cfg
    epochs = cfg.local_epochs / cfg.retrain_ratio
    if name == "SE":
        shard_of = stage.sharded.shard_of
        strategy = ShardingEraser(stage.sharded_store, forget, stage.sharded.shards,
                                  stage.sharded.node_of, epochs,
                                  cfg.calibration_interval,
                                  impacted={shard_of[p] for p in (batch or forget)})
        initial = [to_record(stage.sharded_store.shard_model(s, 0))
                   if s in strategy.impacted else model
                   for s, model in enumerate(current or stage.sharded_models)]
        return strategy, initial, strategy.num_rounds
    if name == "FE":
        if stage.baseline_store is None:
            raise ValueError("FE needs the baseline federation's history")
        strategy = FedEraser(stage.baseline_store, forget, stage.baseline.shards,
                             stage.baseline.node_of, epochs, cfg.calibration_interval)
        initial = [to_record(stage.baseline_store.shard_model(s, 0))
                   for s in range(len(stage.baseline.shards))]
        return strategy, initial, strategy.num_rounds
    if name in ("FR", "RR"):
        cls = FedRetrain if name == "FR" else RapidRetrain
        strategy = cls(forget, stage.baseline.shards, stage.baseline.node_of,
                       cfg.clients_per_round, cfg.num_rounds, cfg.shard_strategy,
                       cfg.seed, **cfg.shard_strategy_options)
        return strategy, [stage.initial] * len(stage.baseline.shards), cfg.num_rounds
    raise ValueError(f"unknown framework {name!r}: SE, FR, FE or RR")


def run_unlearning(grid: Grid, stage: Stage, requests: Sequence[Sequence[int]],
                   evaluate, already_forgotten: Sequence[int] = (),
                   log_fn=print, faults: FaultLog | None = None,
                   frameworks: Sequence[str] | None = None) -> dict[str, dict]:
    """Run every configured framework on ``requests``; return per-framework results.

    Sequential mode handles request k with forget set F_1 u ... u F_k (each
    request alone, from the stored history); concurrent mode handles the union
    once. ``frameworks`` defaults to the run config's. Returns
    ``{name: {"models": [...], "summary": {...}}}``.
    """
    cfg = stage.cfg
    forgotten = set(already_forgotten)
    if cfg.request_mode == "concurrent":
        batches = [sorted({p for r in requests for p in r})]
    else:
        batches = [list(r) for r in requests]
    results: dict[str, dict] = {}
    for name in (cfg.framework_list if frameworks is None else frameworks):
        forget = set(forgotten)
        per_request, total = [], CostMeter(cfg.link_rate_mbps)
        models: list[ArrayRecord] = []
        for k, batch in enumerate(batches):
            if not batch:  # every client already forgotten: a recorded no-op
                per_request.append({"request": k, "clients": [], "noop": True})
                continue
            forget |= set(batch)
            strategy, initial, rounds = build_framework(name, stage, forget, batch,
                                                        models or None)
            models, stats = drive(grid, strategy, initial, rounds, stage.train_config,
                                  cfg.link_rate_mbps, cfg.round_timeout, faults,
                                  f"{name} request {k}", stage.sharded.partition_of,
                                  stage.sharded.samples)
            retrieval = _slice_retrieval(stage) if name == "SE" else None
            if retrieval:  # coded storage: the history was fetched and decoded first
                stats.comm_time_s += retrieval["comm_time_s"]
                stats.compute_s += retrieval["decode_s"]
                stats.wall_s += retrieval["wall_s"]
            impacted = getattr(strategy, "impacted", list(range(strategy.num_shards)))
            per_request.append({
                "request": k, "clients": sorted(batch), "impacted_shards": impacted,
                "compute_s": stats.compute_s, "wall_s": stats.wall_s,
                "client_epochs": stats.client_epochs, "comm_time_s": stats.comm_time_s,
                "shard_compute_s": stats.shard_compute_s, "warnings": stats.warnings,
            })
            if retrieval:
                per_request[-1]["slice_retrieval"] = retrieval
            per_request[-1].update(_sampling(strategy, cfg, f"{name} request {k}",
                                             log_fn))
            _accumulate(total, stats)
            log_fn(f"{name} request {k} (clients {sorted(batch)}): "
                   f"{stats.compute_s:.1f} s compute, {stats.wall_s:.1f} s wall, "
                   f"{stats.client_epochs:.1f} client-epochs")
        if not models:  # only no-ops: the learned models stand
            models = list(stage.sharded_models) if name == "SE" else []
        if not models:
            results[name] = {"models": [], "contacted": [], "summary": {
                "noop": True, "requests": per_request}}
            continue
        metrics = evaluate(models)
        store = {"SE": stage.sharded_store, "FE": stage.baseline_store}.get(name)
        summary = {
            "accuracy": metrics["accuracy"], "loss": metrics["loss"],
            "shard_accuracy": metrics["shard_accuracy"],
            "retrain_compute_s": total.compute_s, "retrain_wall_s": total.wall_s,
            "client_epochs": total.client_epochs, "comm_time_s": total.comm_time_s,
            "server_storage_bytes": store.total_bytes() if store else 0,
            "requests": per_request, "warnings": total.warnings,
        }
        if name == "SE":
            summary["expected"] = _expected(cfg, per_request, len(stage.sharded.shards))
        sampled = [r["clients_per_round"] for r in per_request if "clients_per_round" in r]
        if sampled:  # FR, RR: clients per round of the last request (fewest)
            summary["clients_per_round"] = sampled[-1]
        results[name] = {"models": models, "summary": summary,
                         "contacted": total.contacted}
    return results


def _sampling(strategy: ShardedStrategy, cfg: RunConfig, label: str, log_fn) -> dict:
    """FR, RR: ``{"clients_per_round": n}`` (min(per round, kept) per shard); else {}.

    Says so in the log when fewer clients remain than ``clients-per-round``.
    """
    n = getattr(strategy, "clients_per_round", None)
    if n is None:
        return {}
    if n < cfg.clients_per_round:
        log_fn(f"{label}: samples {n} clients per round (per shard "
               f"{strategy.sampled}), not clients-per-round = {cfg.clients_per_round}:"
               " fewer clients remain after forgetting")
    return {"clients_per_round": n}


def _slice_retrieval(stage: Stage) -> dict | None:
    """Costs of fetching and decoding coded slices for the last SE request, if any.

    Also makes the coded history forget what it decoded: between requests the
    server keeps keys and metadata only.
    """
    return stage.sharded_store.take_retrieval()


def _accumulate(total: CostMeter, stats: CostMeter) -> None:
    for key in ("compute_s", "server_s", "wall_s", "client_epochs", "transfers",
                "comm_time_s"):
        setattr(total, key, getattr(total, key) + getattr(stats, key))
    total.contacted.extend(stats.contacted)
    total.warnings.extend(stats.warnings)


def _expected(cfg: RunConfig, per_request: Sequence[Mapping], num_shards: int) -> dict:
    """Measured SE totals beside the paper's expectations (Sec. 4.2)."""
    per_request = [r for r in per_request if not r.get("noop")]
    costs = [c for r in per_request for c in r["shard_compute_s"].values()]
    shard_cost = sum(costs) / len(costs) if costs else 0.0
    k = cfg.num_requests if not cfg.forget_clients else 1
    return {
        "mode": cfg.request_mode, "num_requests": k,
        "mean_shard_cost_s": shard_cost,
        "measured_total_s": sum(sum(r["shard_compute_s"].values()) for r in per_request),
        "expected_total_s": expected_cost(cfg.request_mode, k, num_shards, shard_cost),
    }
