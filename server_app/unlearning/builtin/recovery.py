"""SE-R and FRec: FedRecover's server-side recovery (:mod:`strategies.recovery`)."""

from __future__ import annotations

from flwr.app import ArrayRecord

from server_app.config.unlearning import se_r_schedule
from server_app.config.methods import UnlearningMethod
from server_app.unlearning.frameworks import (
    REBUILDABLE,
    Framework,
    Request,
    rebuild_shard_model,
)
from strategies.recovery import ShardRecovery
from strategies.sharded import to_record
from strategies.unlearning import first_participation


class ShardRecoveryMethod(UnlearningMethod):
    """SE-R: SE with FedRecover's server-side recovery on the impacted shards."""

    name = "SE-R"
    ulira = "recover"
    refill_key = "recovery-refill"
    colour = "#e377c2"
    summary = "SE with FedRecover's server-side recovery on the impacted shards"

    @classmethod
    def build(cls, request: Request) -> Framework:
        """The recovery of the impacted shards (:func:`recover`)."""
        return recover(request)


class FedRecoverMethod(UnlearningMethod):
    """FRec: FedRecover (Cao et al. 2023), server-side recovery of the federation."""

    name = "FRec"
    federation = "baseline"
    ulira = "recover"
    colour = "#17becf"
    summary = "FedRecover (Cao et al. 2023): server-side recovery of the federation"

    @classmethod
    def build(cls, request: Request) -> Framework:
        """The recovery of the baseline federation from round 1 (:func:`recover`)."""
        return recover(request)


def recover(call: Request) -> Framework:
    """SE-R (the impacted shards of SE's federation) or FRec (the baseline one).

    SE-R starts each impacted shard at g0, the first round a client of the
    request trained there (from the stored or rebuilt W^(g0-1), as SE); FRec
    replays the baseline federation from round 1, as FedRecover does, with
    FedRecover's estimates (SE-R's: ``recovery-estimates``). Both
    rebuild the original models from the record, so the shard strategy must be
    a weighted mean of the updates (:data:`REBUILDABLE`).

    Raises
    ------
    ValueError
        FRec without the baseline federation's history, or a shard strategy
        whose rounds cannot be rebuilt from the record.
    """
    name, stage, forget = call.method.name, call.stage, call.forget
    settings = stage.settings
    if settings.shard_strategy not in REBUILDABLE:
        raise ValueError(f"{name} rebuilds the original models from the stored record: "
                         f"shard-strategy {settings.shard_strategy!r} cannot be rebuilt "
                         f"(one of {', '.join(REBUILDABLE)})")
    sharded = not call.method.on_baseline
    store = stage.sharded_store if sharded else stage.baseline_store
    if store is None:
        raise ValueError(f"{name} needs the baseline federation's history")
    federation = stage.sharded if sharded else stage.baseline
    clients = set(call.batch or forget) if sharded else set(forget)
    held = {federation.shard_of[p] for p in clients}
    impacted = sorted(s for s in held if first_participation(store, s, clients) is not None)
    # the replay starts where any client forgotten so far first trained (the
    # recovery's own plan), so an earlier request's client is left out again
    schedule = se_r_schedule(settings.recovery, settings.recovery_estimates) \
        if sharded else settings.recovery
    starts = {s: rebuild_shard_model(store, s, (
        first_participation(store, s, forget) if sharded else 1) - 1) for s in impacted}
    strategy = ShardRecovery(store, forget, federation.shards, federation.node_of,
                             starts, impacted, from_first_participation=sharded,
                             refill=sharded and settings.recovery_refill,
                             refill_seed=settings.seed, present=stage.present,
                             **schedule)
    models = (call.current or stage.sharded_models) if sharded else [  # learned, rebuilt
        rebuild_shard_model(store, s, max(store.rounds(s), default=0))
        for s in range(len(federation.shards))]
    initial = [to_record(starts[s]) if s in starts else
               (m if isinstance(m, ArrayRecord) else to_record(m))
               for s, m in enumerate(models)]
    replay = {"shards": strategy.replay_report(), "unchanged": sorted(held - set(impacted))}
    return Framework(strategy, initial, strategy.num_rounds, impacted, replay=replay)
