"""The unlearning stage: run each framework on the requests and measure it.

For every framework (a registered method, :mod:`server_app.config.methods`, or
one of one's own, :mod:`server_app.unlearning.methods`) and request batch this
builds the strategy
(:mod:`server_app.unlearning.frameworks`), drives its rounds over the grid through the
shared round loop and measures: retraining compute seconds (clients' training
seconds plus the server's aggregation and calibration seconds), wall seconds,
client-epochs, modelled communication time and server storage. The stored
histories are only read.

Communication model (paper Sec. 5.1): every transfer of a model (server to
client, or back) costs 0.1 s + bits / link rate; ``comm_time_s`` sums over all
transfers, as if the server's link carried them one after another. With coded
storage SE first fetches and decodes the impacted shards' history from the
clients' slices: its modelled transfer time, decoding seconds and wall seconds
are added to SE's ``comm_time_s``, ``compute_s`` and ``wall_s`` and reported per
request under ``slice_retrieval``.

Time measures (the paper does not define its own): ``modelled_wall_s`` models a
real federation from the run's cost model (:mod:`server_app.rounds.costs`: samples
x epochs x the device profile's seconds per sample, bytes over the link, server
work by its sizes), where clients and shards train in parallel: per round the
slowest participant's download + training + upload, plus the slowest shard
server's configure and aggregate work
(:meth:`server_app.rounds.loop.CostMeter.round_wall_s`), summed over rounds (a coded
retrieval adds one slice transfer and the decoding). It does not depend on the
machine's load. Measured on this machine, beside it: ``retrain_compute_s`` sums
every client's training seconds and the server's (so the paper's SE / FR is
about 1 / (S r) whatever the data; refilled slots add L-epoch substitutes on
top), ``measured_train_s`` the clients' part, ``measured_wall_s`` the same
critical path with measured seconds, ``retrain_wall_s`` the elapsed seconds.
FR and RR also report ``to_target``: the first round whose test loss reached the
original model's, with the costs up to it
(:class:`server_app.unlearning.target.TargetWatch`); they still run their G rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord

from runstore.summary import FrameworkSummary, RequestCost
from server_app.config.methods import UnlearningMethod
from server_app.config.methods import info as method_info
from server_app.rounds.costs import CostModel
from server_app.rounds.loop import CostMeter, RoundLoop, RoundPlan
from server_app.rounds.screening import FaultLog
from server_app.rounds.stopped import RunStoppedError
from server_app.unlearning.erasure import Erasure, erasing_loop
from server_app.unlearning.frameworks import Framework, Stage, build_framework
from server_app.unlearning.requests import expected_cost
from server_app.unlearning.target import TargetWatch

__all__ = ["FrameworkResult", "Stage", "UnlearningDivergedError",
           "UnlearningStalledError", "accumulate",
           "run_unlearning"]


class UnlearningStalledError(RunStoppedError):
    """A framework asked clients for a request and accepted no reply in any round."""


class UnlearningDivergedError(RunStoppedError):
    """A framework's unlearned model has NaN or infinite parameters."""


@dataclass
class FrameworkResult:
    """One framework's outcome: its unlearned shard models and summary."""

    models: list[ArrayRecord]
    summary: FrameworkSummary
    contacted: list[int]


def run_unlearning(loop: RoundLoop, stage: Stage, requests: Sequence[Sequence[int]],
                   evaluate: Callable[[list[ArrayRecord]], dict],
                   already_forgotten: Sequence[int] = (),
                   log_fn: Callable[[str], None] = print,
                   frameworks: Sequence[str] | None = None,
                   erasure: Erasure | None = None
                   ) -> dict[str, FrameworkResult]:
    """Run each of ``frameworks`` on ``requests``; return their results by name.

    Sequential mode handles request k with forget set F_1 u ... u F_k (each
    request alone, from the stored history); concurrent mode handles the union
    once. ``evaluate`` scores shard models (``accuracy``, ``loss``,
    ``shard_accuracy``); ``frameworks`` defaults to the run's
    (:attr:`UnlearningConfig.framework_list`). An ``erasure`` (records or labels,
    :mod:`server_app.unlearning.erasure`) is the one request: it forgets no
    client, the clients it changes train on what they keep. One that erases
    nothing new (``fresh`` empty: a later client request after records
    requests) only keeps the earlier erasures in force while ``requests`` run.
    """
    if erasure and erasure.erasing:
        batches = [[]]
    elif stage.cfg.unlearning.request_mode == "concurrent":
        batches = [sorted({p for r in requests for p in r})]
    else:
        batches = [list(r) for r in requests]
    return {name: _run_framework(name, loop, stage, batches, evaluate,
                                 set(already_forgotten), log_fn, erasure or None)
            for name in (stage.cfg.unlearning.framework_list if frameworks is None
                         else frameworks)}


def _run_framework(name: str, loop: RoundLoop, stage: Stage, batches: list[list[int]],
                   evaluate, forget: set[int], log_fn,
                   erasure: Erasure | None = None) -> FrameworkResult:
    described = method_info(name, stage.cfg.unlearning.plugin_methods)
    loop = erasing_loop(loop, erasure)  # each message names what its client lost
    per_request: list[RequestCost] = []
    total = loop.meter()
    models: list[ArrayRecord] = []
    for k, batch in enumerate(batches):
        if not batch and not (erasure and erasure.erasing):  # all forgotten: a no-op
            per_request.append(RequestCost(k, [], noop=True))
            continue
        forget |= set(batch)
        framework = build_framework(name, stage, forget, batch, models or None,
                                    erasure.changed if erasure else frozenset(),
                                    erasing=erasure.erasing if erasure else None)
        label = f"{name} request {k}"
        _log_unchanged(framework, label, log_fn)
        meter = loop.meter()
        watch = TargetWatch(evaluate, stage.target_loss, meter) \
            if described.from_scratch and stage.target_loss is not None else None
        plan = RoundPlan(framework.num_rounds, stage.train_config, label)
        models, stats = loop.run(framework.strategy, framework.initial, plan,
                                 observers=[watch] if watch else [], meter=meter)
        _check_progress(label, stats, loop.faults)
        _check_finite(label, models)
        cost = _request_cost(k, batch, framework, stats, stage, described)
        cost.to_target = watch.result() if watch else None
        per_request.append(cost)
        _log_sampling(framework, stage.cfg.training.clients_per_round, label, log_fn)
        accumulate(total, stats)
        what = erasure.describe() if erasure and not batch else f"clients {sorted(batch)}"
        log_fn(f"{label} ({what}): {stats.compute_s:.1f} s compute, "
               f"{stats.wall_s:.1f} s wall, {stats.client_epochs:.1f} client-epochs")
    if not models and described.replay_report:  # only no-ops: the learned models stand
        models = list(stage.sharded_models)
    if not models:
        return FrameworkResult([], FrameworkSummary(requests=per_request, noop=True), [])
    summary = _framework_summary(described, stage, evaluate(models), total, per_request)
    return FrameworkResult(models, summary, total.contacted)


def _check_progress(label: str, stats: CostMeter, faults: FaultLog) -> None:
    """Raise :class:`UnlearningStalledError` if clients were asked and none accepted."""
    if not stats.contacted or stats.accepted:
        return
    mine = [f for f in faults.entries if f["stage"] == label]
    first = next((f for f in mine if f["kind"] != "dropout"), None)
    example = (f"; first rejection: round {first['round']}, partition "
               f"{first['partition']}: {first['reason']}" if first else "")
    raise UnlearningStalledError(
        f"{label}: {stats.rounds} round(s) asked {len(stats.contacted)} client(s) "
        f"and accepted no reply ({len(mine)} fault(s){example}); stopped instead "
        "of reporting a model that was not retrained")


def _check_finite(label: str, models: Sequence[ArrayRecord]) -> None:
    """Raise :class:`UnlearningDivergedError` if a model has NaN / inf parameters.

    Found with SE-R without its abnormality check (``recovery-threshold`` = 1e6):
    the L-BFGS estimates blew the impacted shard up, while the ensemble of the
    other shards still scored 97.8%. Such a model is never saved or reported.
    """
    bad = [s for s, record in enumerate(models)
           if not all(np.isfinite(a.numpy()).all() for a in record.values())]
    if bad:
        raise UnlearningDivergedError(
            f"{label}: the unlearned model of shard(s) {bad} has NaN or infinite "
            "parameters; stopped instead of saving it")


def _request_cost(k: int, batch: Sequence[int], framework: Framework,
                  stats: CostMeter, stage: Stage,
                  described: type[UnlearningMethod]) -> RequestCost:
    """The per-request entry; adds a slice retrieval (coded) to ``stats``.

    A method on SE's shards reads SE's sharded history (coded: fetched and
    decoded first); a baseline method reads its own, which is never coded.
    """
    retrieval = _slice_retrieval(stage) if not described.on_baseline else None
    if retrieval:  # coded storage: the history was fetched and decoded first
        stats.comm_time_s += stats.costs.transfers_s(retrieval["transfers"],
                                                      retrieval["bytes"])
        stats.compute_s += retrieval["decode_s"]
        stats.wall_s += retrieval["wall_s"]
        stats.measured_wall_s += _retrieval_wall_s(retrieval, stats.costs, measured=True)
        seconds = _retrieval_wall_s(retrieval, stats.costs)
        stats.modelled_wall_s += seconds
        stats.wall_parts["retrieval_s"] += seconds
    return RequestCost(
        k, sorted(batch), impacted_shards=framework.impacted,
        compute_s=stats.compute_s, wall_s=stats.wall_s,
        modelled_wall_s=stats.modelled_wall_s, measured_train_s=stats.measured_train_s,
        measured_wall_s=stats.measured_wall_s,
        client_epochs=stats.client_epochs, client_rounds=stats.client_rounds,
        comm_time_s=stats.comm_time_s, shard_compute_s=stats.shard_compute_s,
        warnings=stats.warnings, wall_breakdown=wall_breakdown(stats),
        slice_retrieval=retrieval or None, clients_per_round=framework.clients_per_round,
        rounds_replayed=_rounds_replayed(framework.replay), replay=framework.replay)


def _rounds_replayed(replay: dict | None) -> int | None:
    """SE: stored rounds replayed over the request's impacted shards."""
    if replay is None:
        return None
    return sum(r["rounds_replayed"] for r in replay["shards"].values())


def _framework_summary(described: type[UnlearningMethod], stage: Stage, metrics: dict,
                       total: CostMeter, per_request: list[RequestCost]
                       ) -> FrameworkSummary:
    store = None if not described.reads_history else (
        stage.baseline_store if described.on_baseline else stage.sharded_store)
    replays = described.replay_report
    sampled = [r.clients_per_round for r in per_request
               if r.clients_per_round is not None]
    target = next((r.to_target for r in reversed(per_request) if r.to_target), None)
    return FrameworkSummary(
        accuracy=metrics["accuracy"], loss=metrics["loss"],
        shard_accuracy=metrics["shard_accuracy"],
        retrain_compute_s=total.compute_s, retrain_wall_s=total.wall_s,
        modelled_wall_s=total.modelled_wall_s, measured_train_s=total.measured_train_s,
        measured_wall_s=total.measured_wall_s,
        client_epochs=total.client_epochs, client_rounds=total.client_rounds,
        comm_time_s=total.comm_time_s,
        server_storage_bytes=store.total_bytes() if store else 0,
        requests=per_request, warnings=total.warnings,
        wall_breakdown=wall_breakdown(total),
        expected=_expected(stage, per_request) if replays else None,
        # FR, RR: clients per round of the last request (the fewest)
        clients_per_round=sampled[-1] if sampled else None,
        # FR, RR: of the last request; absent when not reached in G rounds
        to_target=target,
        rounds_replayed=sum(r.rounds_replayed or 0 for r in per_request)
        if replays else None,
        replay=_replay_total(per_request) if replays else None,
        rounds_to_target=target.get("round") if target else None)


def _log_unchanged(framework: Framework, label: str, log_fn) -> None:
    """SE: log the shards that stay as they are (the clients never trained there)."""
    unchanged = framework.unchanged or (framework.replay or {}).get("unchanged")
    if unchanged:
        log_fn(f"{label}: the request's clients never trained in shard(s) "
               f"{unchanged}: those shard models are unchanged"
               + ("; nothing to replay" if not framework.num_rounds else ""))


def _log_sampling(framework: Framework, clients_per_round: int, label: str,
                  log_fn) -> None:
    """FR, RR: say so when fewer clients remain than ``clients-per-round``."""
    n = framework.clients_per_round
    if n is not None and n < clients_per_round:
        log_fn(f"{label}: samples {n} clients per round (per shard "
               f"{framework.sampled}), not clients-per-round = {clients_per_round}:"
               " fewer clients remain after forgetting")


def _slice_retrieval(stage: Stage) -> dict | None:
    """Costs of fetching and decoding coded slices for the last SE request, if any.

    Also makes the coded history forget what it decoded: between requests the
    server keeps keys and metadata only.
    """
    return stage.sharded_store.take_retrieval()


def _replay_total(per_request: Sequence[RequestCost]) -> dict:
    """SE over all requests: rounds replayed against replay from round 1."""
    shards = [r for c in per_request for r in ((c.replay or {}).get("shards") or {})
              .values()]
    return {"rounds_replayed": sum(r["rounds_replayed"] for r in shards),
            "rounds_from_round1": sum(r["rounds_from_round1"] for r in shards),
            "retrain_messages_saved": sum(r["retrain_messages_saved"] for r in shards),
            "refilled_slots": sum(r.get("refilled_slots", 0) for r in shards),
            "unchanged_shards": sorted({s for c in per_request
                                        for s in (c.replay or {}).get("unchanged", [])})}


def _retrieval_wall_s(retrieval: dict, costs: CostModel, measured: bool = False
                      ) -> float:
    """Wall seconds of a coded retrieval: one slice transfer, then the decoding.

    Slices arrive in parallel: one transfer of the mean slice size (bytes /
    transfers), priced by ``costs``; the decoding is ``costs.decode_s`` of its
    multiply-adds (``decode_ops``: slice values x blocks), or, ``measured``, the
    decoding seconds measured on this machine (``decode_s``).
    """
    transfers = retrieval["transfers"]
    per = costs.transfer_s(retrieval["bytes"] / transfers) if transfers else 0.0
    decode = retrieval["decode_s"] if measured else \
        costs.decode_s(retrieval.get("decode_ops", 0))
    return per + decode


def accumulate(total: CostMeter, stats: CostMeter) -> None:
    """Add the costs, contacts, accepted replies and warnings of ``stats`` to ``total``."""
    for key in ("compute_s", "server_s", "wall_s", "client_epochs", "transfers",
                "comm_time_s", "modelled_wall_s", "accepted", "client_rounds", "rounds",
                "measured_train_s", "measured_wall_s"):
        setattr(total, key, getattr(total, key) + getattr(stats, key))
    for key, seconds in stats.wall_parts.items():
        total.wall_parts[key] += seconds
    total.contacted.extend(stats.contacted)
    total.warnings.extend(stats.warnings)


def wall_breakdown(stats: CostMeter) -> dict:
    """Where ``stats.modelled_wall_s`` went (summary key ``wall_breakdown``).

    The parts of :attr:`CostMeter.wall_parts` (seconds along each round's critical
    path: the slowest participant's training and transfers, the server's
    configure and aggregate seconds, a coded retrieval), which sum to the modelled
    wall time, with the server rounds and the rounds that asked clients to train.
    """
    return {**{k: float(v) for k, v in stats.wall_parts.items()},
            "rounds": stats.rounds, "client_rounds": stats.client_rounds}


def _expected(stage: Stage, per_request: Sequence[RequestCost]) -> dict:
    """Measured SE totals beside the paper's expectations (Sec. 4.2)."""
    unlearning = stage.cfg.unlearning
    done = [r for r in per_request if not r.noop]
    costs = [c for r in done for c in r.shard_compute_s.values()]
    shard_cost = sum(costs) / len(costs) if costs else 0.0
    k, num_shards = unlearning.request_count, len(stage.sharded.shards)
    return {
        "mode": unlearning.request_mode, "num_requests": k,
        "mean_shard_cost_s": shard_cost,
        "measured_total_s": sum(sum(r.shard_compute_s.values()) for r in done),
        "expected_total_s": expected_cost(unlearning.request_mode, k, num_shards,
                                          shard_cost),
    }
