"""FedRetrain over stages, and the federations of a staged run.

FR's reference for a staged run retrains every stage so far from W^0, each with
its present clients minus the forgotten ones, with the learning's strategy,
round numbers and seeds, so its models equal (bit for bit on the in-process grid)
a run in which the forgotten clients never existed (:func:`retrain_stages`).
"""

from __future__ import annotations

from collections.abc import Sequence

from flwr.app import ArrayRecord

from server_app.config.methods import reference
from server_app.rounds.federation import Federation
from server_app.rounds.loop import CostMeter, RoundPlan
from server_app.run.context import RunContext
from server_app.stages.churn import Membership
from server_app.stages.learn import first_round, stage_strategy
from server_app.unlearning.driver import accumulate
from server_app.unlearning.erasure import Erasure, erasing_loop

__all__ = ["retrain_stages"]


def retrain_stages(ctx: RunContext, baseline: Federation, members: Sequence[Membership],
                   forgotten: set[int], label: str | None = None, *,
                   erasure: Erasure | None = None
                   ) -> tuple[list[ArrayRecord], CostMeter]:
    """FedRetrain over stages: every stage's rounds again, from W^0, without ``forgotten``.

    Stage t's rounds sample from its present clients minus ``forgotten``, with
    the learning's strategy, seeds and round numbers (:func:`stage_strategy`), so
    the models are those of a run in which the forgotten clients never existed;
    a shard none of whose clients of stage t remains keeps its model in t.
    Returns the shard models (``baseline-shards`` of them) and the summed costs.
    The changed clients of ``erasure`` (records erased so far) train on what
    they keep in every round (:class:`server_app.unlearning.erasure.ErasingGrid`).
    """
    cfg = ctx.cfg
    models = [ctx.initial_model()] * len(baseline.shards)
    loop = erasing_loop(ctx.loop, erasure)
    total = loop.meter()
    for member in members:
        present = [p for p in member.present if p not in forgotten]
        strategy = stage_strategy(cfg, baseline.shards, present, baseline.node_of,
                                  keep_empty=True)
        models, meter = loop.run(
            strategy, models, RoundPlan(cfg.training.num_rounds, ctx.train_config(),
                                        f"{label or reference()} stage {member.stage}"),
            first_round=first_round(cfg, member.stage))
        accumulate(total, meter)
    return models, total
