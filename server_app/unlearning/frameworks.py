"""Build an unlearning framework (SE, FE, FR, RR, or one's own) for one request.

:func:`build_framework` turns a framework's name, the learned stage and the
clients to forget into a :class:`Framework`: its Flower strategy
(:mod:`strategies.unlearning`, or a ``package.module:Class`` method of
:mod:`server_app.unlearning.methods`), the shard models it starts from, its
rounds, the shards it retrains and, for the from-scratch baselines, how many
clients it samples per round.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord

from history import StoreError, TrainingHistory
from server_app.config import RunConfig
from server_app.config.unlearning import UnlearningConfig
from server_app.rounds.federation import Federation
from server_app.unlearning.methods import UnlearningRequest, build_method
from strategies.calibration import weighted_step
from strategies.recovery import ShardRecovery
from strategies.sharded import ShardedStrategy, to_record
from strategies.unlearning import (
    FedEraser,
    FedRetrain,
    RapidRetrain,
    ShardingEraser,
    first_participation,
)

FRAMEWORK_NAMES = ("SE", "FR", "FE", "RR", "SE-R", "FRec")
HISTORY_BASELINES = ("FE", "FRec")
"""Baselines that read the baseline federation's own stored history (it learns first)."""
RECOVERY = ("SE-R", "FRec")
"""Server-side recovery (:mod:`strategies.recovery`)."""
"""The frameworks that run on the baselines' federation (``baseline-shards``)."""
# shard strategies whose round is W^g = W^(g-1) + sum n_m U_m^g / sum n_m, so a
# shard model can be rebuilt from the stored record (coded storage keeps no W^g)
REBUILDABLE = ("FedAvg", "FedProx")


@dataclass(frozen=True)
class UnlearningSettings:
    """The run settings the unlearning stage reads (from :class:`RunConfig`).

    Attributes
    ----------
    retrain_epochs : float
        L / r, local epochs of a calibration round (seconds of compute follow).
    calibration_interval : int
        FedEraser's interval: every n-th stored round is replayed.
    clients_per_round, num_rounds : int
        FR / RR: the learning budget they retrain with.
    shard_strategy : str
        FR / RR: the stock strategy of their shards.
    strategy_options : dict
        Its server settings (:attr:`RunConfig.shard_strategy_options`).
    seed : int
        Seeds FR / RR sampling.
    request_mode : str
        ``sequential`` or ``concurrent``.
    num_requests : int
        K, for the paper's expected cost (1 with ``forget-clients``).
    frameworks : tuple[str, ...]
        The frameworks to run, in order (run-config ``frameworks``; a method of
        one's own by its class name).
    methods : dict[str, str]
        Name -> ``package.module:Class`` of each method of one's own.
    """

    retrain_epochs: float
    calibration_interval: int
    clients_per_round: int
    num_rounds: int
    shard_strategy: str
    strategy_options: dict
    seed: int
    request_mode: str
    num_requests: int
    frameworks: tuple[str, ...] = FRAMEWORK_NAMES
    methods: dict = field(default_factory=dict)
    recovery: dict = field(default_factory=dict)
    """SE-R / FRec: ``warmup``, ``correction``, ``final``, ``memory`` (run-config
    ``recovery-*``; :class:`strategies.recovery.RecoveredShard`'s defaults if empty)."""
    calibration_final: int = UnlearningConfig.calibration_final
    """SE: exact, uncalibrated rounds at the end of each shard's replay (run-config
    ``calibration-final``, the same default; FE keeps FedEraser's published rule)."""
    local_epochs: float | None = None
    """L, the local epochs of those exact rounds (None: ``retrain_epochs``)."""
    replay_refill: bool = UnlearningConfig.replay_refill
    """SE: refill forgotten participants' slots (run-config ``replay-refill``)."""
    recovery_refill: bool = UnlearningConfig.recovery_refill
    """SE-R: the same (run-config ``recovery-refill``, the same default)."""

    @classmethod
    def from_config(cls, cfg: RunConfig) -> UnlearningSettings:
        """The fields of ``cfg`` that unlearning uses."""
        training, unlearning = cfg.training, cfg.unlearning
        return cls(cfg.retrain_epochs, unlearning.calibration_interval,
                   training.clients_per_round, training.num_rounds,
                   training.shard_strategy, dict(training.shard_strategy_options),
                   cfg.seed, unlearning.request_mode,
                   1 if unlearning.forget_clients else unlearning.num_requests,
                   tuple(unlearning.framework_list), dict(unlearning.plugin_methods),
                   unlearning.recovery_settings, unlearning.calibration_final,
                   training.local_epochs, unlearning.replay_refill,
                   unlearning.recovery_refill)


@dataclass
class Stage:
    """What the unlearning stage needs from learning."""

    settings: UnlearningSettings
    sharded: Federation
    baseline: Federation
    sharded_store: TrainingHistory
    baseline_store: TrainingHistory | None
    sharded_models: list[ArrayRecord]
    initial: ArrayRecord
    train_config: ConfigRecord
    target_loss: float | None = None
    """FR / RR: the original model's test loss, for rounds-to-target."""
    present: Callable[[int], Collection[int]] | None = None
    """Staged runs: stored round -> the clients present in its stage, the only ones
    ``replay-refill`` may draw (None: every member of the shard)."""


@dataclass
class Framework:
    """One framework, built for one request.

    Attributes
    ----------
    strategy : ShardedStrategy
        The Flower strategy to run.
    initial : list[ArrayRecord]
        Each shard's model before round 1.
    num_rounds : int
        Rounds to run.
    impacted : list[int]
        Shards it retrains (SE: those holding a forgotten client; else all).
    clients_per_round : int, optional
        FR / RR: clients sampled per round over all shards (fewer than in
        learning when forgetting left a shard too few).
    sampled : list[int], optional
        FR / RR: clients each shard samples per round.
    replay : dict, optional
        SE: per impacted shard, :meth:`CalibratedRetraining.replay_report`;
        ``unchanged``: shards of the request whose clients never trained there
        (left as they are); ``start_models``: where each W^(g0-1) came from.
    """

    strategy: ShardedStrategy
    initial: list[ArrayRecord]
    num_rounds: int
    impacted: list[int]
    clients_per_round: int | None = None
    sampled: list[int] | None = None
    replay: dict | None = None


def build_framework(name: str, stage: Stage, forget: set[int],
                    batch: Sequence[int] | None = None,
                    current: Sequence[ArrayRecord] | None = None) -> Framework:
    """The framework ``name`` for forgetting ``forget``.

    ``forget`` holds every client forgotten so far; for SE, ``batch`` (this
    request's clients) picks the shards to retrain and ``current`` holds the
    shard models after the previous request (default: the learned ones).

    Raises
    ------
    ValueError
        Unknown framework, or FE without a baseline history.
    """
    if name in stage.settings.methods:
        return _method(stage.settings.methods[name], stage, forget, batch, current)
    if name == "SE":
        return _sharding_eraser(stage, forget, batch, current)
    if name == "FE":
        return _fed_eraser(stage, forget)
    if name in RECOVERY:
        return _recovery(name, stage, forget, batch, current)
    if name in ("FR", "RR"):
        return _from_scratch(name, stage, forget)
    raise ValueError(f"unknown framework {name!r}: one of {', '.join(FRAMEWORK_NAMES)}")


def _sharding_eraser(stage: Stage, forget: set[int], batch: Sequence[int] | None,
                     current: Sequence[ArrayRecord] | None) -> Framework:
    """SE: replay each shard where a client of the request trained, from g0 - 1.

    g0 is the first stored round in which a forgotten client took part; the
    shard starts from the stored W^(g0-1) (coded storage keeps only W^0: rebuilt
    from the decoded record when the shard strategy is a weighted mean of the
    updates, :data:`REBUILDABLE`; otherwise the replay starts at round 1).
    Shards where none of the request's clients ever trained keep their models.
    """
    settings, shard_of, store = stage.settings, stage.sharded.shard_of, stage.sharded_store
    clients = set(batch or forget)
    held = {shard_of[p] for p in clients}
    trained = {s for s in held if first_participation(store, s, clients) is not None}

    def build(late: bool) -> ShardingEraser:
        return ShardingEraser(store, forget, stage.sharded.shards, stage.sharded.node_of,
                              settings.retrain_epochs, settings.calibration_interval,
                              impacted=trained, from_first_participation=late,
                              final=settings.calibration_final,
                              exact_epochs=settings.local_epochs,
                              refill=settings.replay_refill, refill_seed=settings.seed,
                              present=stage.present)

    strategy = build(True)
    starts, sources = {}, {}
    for s, g0 in strategy.start_rounds().items():
        starts[s], sources[s] = _start_model(store, s, g0, settings.shard_strategy)
    if any(model is None for model in starts.values()):  # cannot start late
        strategy = build(False)
        starts = {s: store.shard_model(s, 0) for s in strategy.impacted}
        sources = dict.fromkeys(starts, "stored W^0 (replay from round 1)")
    initial = [to_record(starts[s]) if s in starts else model
               for s, model in enumerate(current or stage.sharded_models)]
    replay = {"shards": strategy.replay_report(), "unchanged": sorted(held - trained),
              "start_models": sources}
    return Framework(strategy, initial, strategy.num_rounds, list(strategy.impacted),
                     replay=replay)


def _start_model(store: TrainingHistory, shard: int, g0: int | None,
                 shard_strategy: str) -> tuple[dict | None, str]:
    """W^(g0-1) of ``shard`` and where it came from; (None, why) if unavailable."""
    start = (g0 or 1) - 1
    try:
        return store.shard_model(shard, start), f"stored W^{start}"
    except StoreError:
        if shard_strategy not in REBUILDABLE:
            return None, f"no W^{start} and {shard_strategy} cannot be rebuilt"
    return rebuild_shard_model(store, shard, start), f"W^{start} rebuilt from the record"


def rebuild_shard_model(store: TrainingHistory, shard: int, rnd: int) -> dict:
    """W_s^rnd = W_s^0 + the FedAvg steps of stored rounds 1..rnd (float32).

    Exact for a FedAvg / FedProx shard up to float32 rounding and, with coded
    storage, the quantisation step (2^-quant-scale-bits) of each stored update.

    Raises
    ------
    StoreError
        The record of a round is missing.
    """
    model = store.shard_model(shard, 0)
    for g in store.rounds(shard):
        if g > rnd:
            break
        members = store.participants(shard, g)
        model = weighted_step(model, [store.update(shard, g, p) for p, _ in members],
                              [n for _, n in members])
    return model


def _method(spec: str, stage: Stage, forget: set[int], batch: Sequence[int] | None,
            current: Sequence[ArrayRecord] | None) -> Framework:
    """A method of one's own on SE's shards (:mod:`server_app.unlearning.methods`)."""
    settings, federation = stage.settings, stage.sharded
    request = UnlearningRequest(
        frozenset(forget), tuple(sorted(batch or forget)), federation.shards,
        federation.node_of, stage.sharded_store, list(current or stage.sharded_models),
        stage.initial, stage.train_config, settings.retrain_epochs, settings.num_rounds,
        settings.clients_per_round, settings.seed)
    strategy = build_method(spec, request)
    initial = list(getattr(strategy, "initial_models", None) or request.models)
    impacted = list(getattr(strategy, "impacted", None) or range(len(request.shards)))
    return Framework(strategy, initial, strategy.num_rounds, impacted)


def _recovery(name: str, stage: Stage, forget: set[int], batch: Sequence[int] | None,
              current: Sequence[ArrayRecord] | None) -> Framework:
    """SE-R (the impacted shards of SE's federation) or FRec (the unsharded one).

    SE-R starts each impacted shard at g0, the first round a client of the
    request trained there (from the stored or rebuilt W^(g0-1), as SE); FRec
    replays the baseline federation from round 1, as FedRecover does. Both
    rebuild the original models from the record, so the shard strategy must be
    a weighted mean of the updates (:data:`REBUILDABLE`).

    Raises
    ------
    ValueError
        FRec without the baseline federation's history, or a shard strategy
        whose rounds cannot be rebuilt from the record.
    """
    settings = stage.settings
    if settings.shard_strategy not in REBUILDABLE:
        raise ValueError(f"{name} rebuilds the original models from the stored record: "
                         f"shard-strategy {settings.shard_strategy!r} cannot be rebuilt "
                         f"(one of {', '.join(REBUILDABLE)})")
    sharded = name == "SE-R"
    store = stage.sharded_store if sharded else stage.baseline_store
    if store is None:
        raise ValueError(f"{name} needs the baseline federation's history")
    federation = stage.sharded if sharded else stage.baseline
    clients = set(batch or forget) if sharded else set(forget)
    held = {federation.shard_of[p] for p in clients}
    impacted = sorted(s for s in held if first_participation(store, s, clients) is not None)
    # the replay starts where any client forgotten so far first trained (the
    # recovery's own plan), so an earlier request's client is left out again
    starts = {s: rebuild_shard_model(store, s, (
        first_participation(store, s, forget) if sharded else 1) - 1) for s in impacted}
    strategy = ShardRecovery(store, forget, federation.shards, federation.node_of,
                             starts, impacted, from_first_participation=sharded,
                             refill=sharded and settings.recovery_refill,
                             refill_seed=settings.seed, present=stage.present,
                             **settings.recovery)
    models = (current or stage.sharded_models) if sharded else [  # learned, rebuilt
        rebuild_shard_model(store, s, max(store.rounds(s), default=0))
        for s in range(len(federation.shards))]
    initial = [to_record(starts[s]) if s in starts else
               (m if isinstance(m, ArrayRecord) else to_record(m))
               for s, m in enumerate(models)]
    replay = {"shards": strategy.replay_report(), "unchanged": sorted(held - set(impacted))}
    return Framework(strategy, initial, strategy.num_rounds, impacted, replay=replay)


def _fed_eraser(stage: Stage, forget: set[int]) -> Framework:
    if stage.baseline_store is None:
        raise ValueError("FE needs the baseline federation's history")
    settings = stage.settings
    strategy = FedEraser(stage.baseline_store, forget, stage.baseline.shards,
                         stage.baseline.node_of, settings.retrain_epochs,
                         settings.calibration_interval,
                         from_first_participation=False)  # FedEraser: from round 1
    initial = [to_record(stage.baseline_store.shard_model(s, 0))
               for s in range(len(stage.baseline.shards))]
    return Framework(strategy, initial, strategy.num_rounds, list(strategy.impacted))


def _from_scratch(name: str, stage: Stage, forget: set[int]) -> Framework:
    settings = stage.settings
    cls = FedRetrain if name == "FR" else RapidRetrain
    strategy = cls(forget, stage.baseline.shards, stage.baseline.node_of,
                   settings.clients_per_round, settings.num_rounds,
                   settings.shard_strategy, settings.seed, **settings.strategy_options)
    shards = len(stage.baseline.shards)
    return Framework(strategy, [stage.initial] * shards, settings.num_rounds,
                     list(range(shards)), strategy.clients_per_round,
                     list(strategy.sampled))
