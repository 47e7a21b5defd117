"""SE-R and FRec: FedRecover's server-side recovery (:mod:`strategies.recovery`)."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ArrayRecord

from server_app.config.methods import MethodSettings, UnlearningMethod
from server_app.unlearning.frameworks import (
    REBUILDABLE,
    Framework,
    Request,
    rebuild_shard_model,
    retrained_shards,
)
from strategies.recovery import ShardRecovery
from strategies.replay import ReplaySchedule
from strategies.sharded import to_record
from strategies.unlearning import first_participation

ESTIMATES = ("stored", "lbfgs")
"""SE-R's estimates of the retained participants' updates (``method.se-r.estimates``)."""
RENAMED = {f"recovery-{k}": k for k in ("warmup", "correction", "final", "memory",
                                         "threshold")}
"""FedRecover's schedule keys before they were each method's own."""


@dataclass(frozen=True)
class RecoverySettings(MethodSettings):
    """FedRecover's schedule (:class:`strategies.recovery.RecoveredShard`).

    Attributes
    ----------
    warmup, correction, final, memory : int
        Exact rounds after the first (T_w >= 0), an exact round every T_c-th after
        them (0: none), exact final rounds (T_f >= 0), L-BFGS pairs kept per shard
        (s >= 1); each at most 100000 (memory: 1000).
    threshold : float
        tau > 0: an estimated update further than tau ||U|| from the stored U is
        abnormal and the client trains instead (FedRecover's abnormality fixing).
    """

    warmup: int = 2
    correction: int = 4
    final: int = 1
    memory: int = 2
    threshold: float = 1.0

    def validate(self) -> None:
        """Each value in its range (see the attributes)."""
        for name, least, most in (("warmup", 0, 100_000), ("correction", 0, 100_000),
                                  ("final", 0, 100_000), ("memory", 1, 1000)):
            if not least <= getattr(self, name) <= most:
                raise self.refuse(name, f"an integer in [{least}, {most}]")
        if not 0 < self.threshold < float("inf"):
            raise self.refuse("threshold", "a number > 0")

    def schedule(self) -> dict:
        """FedRecover's :class:`strategies.replay.ReplaySchedule` keywords."""
        return {"warmup": self.warmup, "correction": self.correction,
                "final": self.final, "memory": self.memory, "threshold": self.threshold}


class ShardRecoveryMethod(UnlearningMethod):
    """SE-R: SE with FedRecover's server-side recovery on the impacted shards."""

    name = "SE-R"
    refill_key = "method.se-r.refill"
    colour = "#e377c2"
    summary = "SE with FedRecover's server-side recovery on the impacted shards"
    renamed = {**RENAMED, "recovery-refill": "refill", "recovery-estimates": "estimates"}

    @dataclass(frozen=True)
    class Settings(RecoverySettings):
        """SE-R's own settings (``method.se-r.*``): FedRecover's schedule and two more.

        Attributes
        ----------
        refill : bool
            Refill forgotten slots as SE's ``replay-refill`` does (the
            substitutes always train).
        estimates : str
            ``lbfgs`` (FedRecover's estimates, with the schedule above) or
            ``stored`` (each retained participant's stored update is its
            estimate: no warm-up, no correction round; the ``final`` exact rounds
            stay; docs/DESIGN.md, "Choosing SE's schedule").
        """

        refill: bool = True
        estimates: str = "lbfgs"

        def validate(self) -> None:
            """The schedule's ranges, and ``estimates`` one of :data:`ESTIMATES`."""
            super().validate()
            if self.estimates not in ESTIMATES:
                raise self.refuse("estimates", f"one of {', '.join(ESTIMATES)}")

        def schedule(self) -> dict:
            """FedRecover's keywords; with ``stored`` estimates no warm-up or correction."""
            schedule = super().schedule()
            return schedule if self.estimates == "lbfgs" else {
                **schedule, "warmup": 0, "correction": 0}

    @classmethod
    def build(cls, request: Request) -> Framework:
        """The recovery of the impacted shards (:func:`recover`)."""
        return recover(request)


class FedRecoverMethod(UnlearningMethod):
    """FRec: FedRecover (Cao et al. 2023), server-side recovery of the federation."""

    name = "FRec"
    federation = "baseline"
    colour = "#17becf"
    summary = "FedRecover (Cao et al. 2023): server-side recovery of the federation"
    renamed = RENAMED

    @dataclass(frozen=True)
    class Settings(RecoverySettings):
        """FRec's own settings (``method.frec.*``): FedRecover's schedule."""

    @classmethod
    def build(cls, request: Request) -> Framework:
        """The recovery of the baseline federation from round 1 (:func:`recover`)."""
        return recover(request)


def recover(call: Request) -> Framework:
    """SE-R (the impacted shards of SE's federation) or FRec (the baseline one).

    SE-R starts each impacted shard at g0, the first round a client of the
    request trained there (from the stored or rebuilt W^(g0-1), as SE); FRec
    replays the baseline federation from round 1, as FedRecover does, with
    FedRecover's estimates (SE-R's: its ``estimates``). Both
    rebuild the original models from the record, so the shard strategy must be
    a weighted mean of the updates (:data:`REBUILDABLE`).

    Raises
    ------
    ValueError
        FRec without the baseline federation's history, or a shard strategy
        whose rounds cannot be rebuilt from the record.
    """
    name, stage, forget = call.method.name, call.stage, call.forget
    cfg, base = stage.cfg, stage.cfg.training.shard_strategy
    if base not in REBUILDABLE:
        raise ValueError(f"{name} rebuilds the original models from the stored record: "
                         f"shard-strategy {base!r} cannot be rebuilt "
                         f"(one of {', '.join(REBUILDABLE)})")
    sharded = not call.method.on_baseline
    store = stage.sharded_store if sharded else stage.baseline_store
    if store is None:
        raise ValueError(f"{name} needs the baseline federation's history")
    federation = stage.sharded if sharded else stage.baseline
    clients = set(call.batch or forget) if sharded else set(forget)
    # with refill, an earlier replay may have drawn one of them into a shard
    impacted, unchanged = retrained_shards(store, federation.shard_of, clients,
                                           set(forget) - clients,
                                           sharded and call.settings.refill)
    # the replay starts where any client forgotten so far first trained (the
    # recovery's own plan), so an earlier request's client is left out again
    schedule = call.settings.schedule()
    starts = {s: rebuild_shard_model(store, s, (
        first_participation(store, s, forget) if sharded else 1) - 1) for s in impacted}
    strategy = ShardRecovery(store, forget, federation.shards, federation.node_of,
                             starts, impacted, ReplaySchedule(
                                 from_first_participation=sharded,
                                 refill=sharded and call.settings.refill,
                                 refill_seed=cfg.seed, present=stage.present,
                                 **schedule))
    models = (call.current or stage.sharded_models) if sharded else [  # learned, rebuilt
        rebuild_shard_model(store, s, max(store.rounds(s), default=0))
        for s in range(len(federation.shards))]
    initial = [to_record(starts[s]) if s in starts else
               (m if isinstance(m, ArrayRecord) else to_record(m))
               for s, m in enumerate(models)]
    replay = {"shards": strategy.replay_report(), "unchanged": unchanged}
    return Framework(strategy, initial, strategy.num_rounds, impacted, replay=replay)
