"""FR and RR: retrain the baseline federation from W^0 without the forgotten clients."""

from __future__ import annotations

from server_app.config.methods import UnlearningMethod
from server_app.unlearning.frameworks import Framework, Request
from strategies.unlearning import FedRetrain, RapidRetrain


class FedRetrainMethod(UnlearningMethod):
    """FR: the baseline federation from W^0, learning's rounds and sampling."""

    name = "FR"
    federation = "baseline"
    reads_history = False
    exact = from_scratch = paper_baseline = erases_records = True
    staged = "retrains"
    colour = "#1f77b4"
    summary = "FedRetrain: retrain the federation from W^0"

    @classmethod
    def build(cls, request: Request) -> Framework:
        """FedRetrain's strategy on the retained clients."""
        return _retrain(FedRetrain, request)


class RapidRetrainMethod(FedRetrainMethod):
    """RR: RapidRetrain (Liu et al. 2022), FR with Fisher-preconditioned local SGD."""

    name = "RR"
    staged = ""
    colour = "#9467bd"
    summary = "RapidRetrain (Liu et al. 2022): FedRetrain, Fisher-preconditioned local SGD"

    @classmethod
    def build(cls, request: Request) -> Framework:
        """RapidRetrain's strategy on the retained clients."""
        return _retrain(RapidRetrain, request)


def _retrain(cls: type[FedRetrain], call: Request) -> Framework:
    stage, training = call.stage, call.stage.cfg.training
    strategy = cls(
        call.forget, stage.baseline.shards, stage.baseline.node_of,
        training.clients_per_round, training.num_rounds, training.shard_strategy,
        stage.cfg.seed, **training.shard_strategy_options)
    shards = len(stage.baseline.shards)
    return Framework(strategy, [stage.initial] * shards, training.num_rounds,
                     list(range(shards)), strategy.clients_per_round,
                     list(strategy.sampled))
