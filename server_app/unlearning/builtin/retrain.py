"""FR and RR: retrain the baseline federation from W^0 without the forgotten clients."""

from __future__ import annotations

from server_app.unlearning.frameworks import BuildCall, Framework
from strategies.unlearning import FedRetrain, RapidRetrain


def fed_retrain(call: BuildCall) -> Framework:
    """FedRetrain: the baseline federation from W^0, learning's rounds and sampling."""
    return _retrain(FedRetrain, call)


def rapid_retrain(call: BuildCall) -> Framework:
    """RapidRetrain (Liu et al. 2022): FedRetrain with Fisher-preconditioned local SGD."""
    return _retrain(RapidRetrain, call)


def _retrain(cls: type[FedRetrain], call: BuildCall) -> Framework:
    stage, settings = call.stage, call.stage.settings
    strategy = cls(
        call.forget, stage.baseline.shards, stage.baseline.node_of,
        settings.clients_per_round, settings.num_rounds, settings.shard_strategy,
        settings.seed, **settings.strategy_options)
    shards = len(stage.baseline.shards)
    return Framework(strategy, [stage.initial] * shards, settings.num_rounds,
                     list(range(shards)), strategy.clients_per_round,
                     list(strategy.sampled))
