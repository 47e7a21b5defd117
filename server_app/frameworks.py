"""Build an unlearning framework (SE, FE, FR, RR) for one request.

:func:`build_framework` turns a framework's name, the learned stage and the
clients to forget into a :class:`Framework`: its Flower strategy
(:mod:`strategies.unlearning`), the shard models it starts from, its rounds, the
shards it retrains and, for the from-scratch baselines, how many clients it
samples per round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord

from history import TrainingHistory
from server_app.config import RunConfig
from server_app.federation import Federation
from strategies.sharded import ShardedStrategy, to_record
from strategies.unlearning import FedEraser, FedRetrain, RapidRetrain, ShardingEraser

FRAMEWORK_NAMES = ("SE", "FR", "FE", "RR")


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
    link_rate_mbps : float
        Link rate of the communication model.
    round_timeout : float
        Seconds to wait for a round's replies.
    request_mode : str
        ``sequential`` or ``concurrent``.
    num_requests : int
        K, for the paper's expected cost (1 with ``forget-clients``).
    frameworks : tuple[str, ...]
        The frameworks to run, in order (run-config ``frameworks``).
    """

    retrain_epochs: float
    calibration_interval: int
    clients_per_round: int
    num_rounds: int
    shard_strategy: str
    strategy_options: dict
    seed: int
    link_rate_mbps: float
    round_timeout: float
    request_mode: str
    num_requests: int
    frameworks: tuple[str, ...] = FRAMEWORK_NAMES

    @classmethod
    def from_config(cls, cfg: RunConfig) -> UnlearningSettings:
        """The fields of ``cfg`` that unlearning uses."""
        return cls(cfg.local_epochs / cfg.retrain_ratio, cfg.calibration_interval,
                   cfg.clients_per_round, cfg.num_rounds, cfg.shard_strategy,
                   dict(cfg.shard_strategy_options), cfg.seed, cfg.link_rate_mbps,
                   cfg.round_timeout, cfg.request_mode,
                   1 if cfg.forget_clients else cfg.num_requests,
                   tuple(cfg.framework_list))


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
    """

    strategy: ShardedStrategy
    initial: list[ArrayRecord]
    num_rounds: int
    impacted: list[int]
    clients_per_round: int | None = None
    sampled: list[int] | None = None


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
    if name == "SE":
        return _sharding_eraser(stage, forget, batch, current)
    if name == "FE":
        return _fed_eraser(stage, forget)
    if name in ("FR", "RR"):
        return _from_scratch(name, stage, forget)
    raise ValueError(f"unknown framework {name!r}: one of {', '.join(FRAMEWORK_NAMES)}")


def _sharding_eraser(stage: Stage, forget: set[int], batch: Sequence[int] | None,
                     current: Sequence[ArrayRecord] | None) -> Framework:
    settings, shard_of = stage.settings, stage.sharded.shard_of
    strategy = ShardingEraser(stage.sharded_store, forget, stage.sharded.shards,
                              stage.sharded.node_of, settings.retrain_epochs,
                              settings.calibration_interval,
                              impacted={shard_of[p] for p in (batch or forget)})
    initial = [to_record(stage.sharded_store.shard_model(s, 0))
               if s in strategy.impacted else model
               for s, model in enumerate(current or stage.sharded_models)]
    return Framework(strategy, initial, strategy.num_rounds, list(strategy.impacted))


def _fed_eraser(stage: Stage, forget: set[int]) -> Framework:
    if stage.baseline_store is None:
        raise ValueError("FE needs the baseline federation's history")
    settings = stage.settings
    strategy = FedEraser(stage.baseline_store, forget, stage.baseline.shards,
                         stage.baseline.node_of, settings.retrain_epochs,
                         settings.calibration_interval)
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
