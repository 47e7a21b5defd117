"""SE: calibrated replay of the shards a request's clients trained in (paper Sec. 3-4)."""

from __future__ import annotations

from dataclasses import dataclass

from history import StoreError, TrainingHistory
from server_app.config.methods import MethodSettings, UnlearningMethod
from server_app.unlearning.frameworks import (
    REBUILDABLE,
    Framework,
    Request,
    rebuild_shard_model,
    retrained_shards,
)
from strategies.sharded import to_record
from strategies.unlearning import ReplaySchedule, ShardingEraser


class ShardingEraserMethod(UnlearningMethod):
    """SE: Sharding Eraser's calibrated replay of the impacted shards (the paper)."""

    name = "SE"
    calibrated = replay_report = erases_records = True
    refill_key = "method.se.replay-refill"
    staged = "serves"
    colour = "#d62728"
    summary = "Sharding Eraser: calibrated replay of the impacted shards (the paper)"
    renamed = {"calibration-final": "calibration_final", "replay-refill": "replay_refill"}

    @dataclass(frozen=True)
    class Settings(MethodSettings):
        """SE's own settings (``method.se.*``).

        Attributes
        ----------
        calibration_final : int
            The last n replayed rounds of each impacted shard are exact (0..100000):
            the retained participants train L epochs and their updates are not
            calibrated (0: the paper's SE). FE keeps FedEraser's published rule.
        replay_refill : bool
            Each forgotten participant's slot in a replayed round goes to a
            retained member of its shard who did not take part, who trains L
            epochs uncalibrated (:func:`strategies.calibration.refill_slots`).
            False: the paper's SE, which replays only the stored round's retained
            participants.
        """

        calibration_final: int = 2
        replay_refill: bool = True

        def validate(self) -> None:
            """``calibration-final`` in 0..100000."""
            if not 0 <= self.calibration_final <= 100_000:
                raise self.refuse("calibration_final", "an integer in [0, 100000]")

    @classmethod
    def build(cls, request: Request) -> Framework:
        """Replay each shard where a client of the request trained (:func:`replay`)."""
        return replay(request)


def replay(call: Request) -> Framework:
    """SE: replay each shard where a client of the request trained, from g0 - 1.

    g0 is the first stored round in which a forgotten client took part; the
    shard starts from the stored W^(g0-1) (coded storage keeps only W^0: rebuilt
    from the decoded record when the shard strategy is a weighted mean of the
    updates, :data:`REBUILDABLE`; otherwise the replay starts at round 1).
    Shards that hold no data of the request's clients keep their models
    (:func:`retrained_shards`: with refill, a shard an earlier request replayed
    may hold a client drawn into a refilled slot).
    """
    stage, forget, own = call.stage, call.forget, call.settings
    cfg, shard_of, store = stage.cfg, stage.sharded.shard_of, stage.sharded_store
    # a changed client (records erased) stays and retrains
    trained, unchanged = retrained_shards(store, shard_of, call.clients, call.earlier,
                                          own.replay_refill)

    def make(late: bool) -> ShardingEraser:
        schedule = ReplaySchedule(cfg.unlearning.calibration_interval,
                                  from_first_participation=late,
                                  final=own.calibration_final,
                                  exact_epochs=cfg.training.local_epochs,
                                  refill=own.replay_refill, refill_seed=cfg.seed,
                                  present=stage.present)
        return ShardingEraser(store, forget, stage.sharded.shards, stage.sharded.node_of,
                              cfg.retrain_epochs, schedule, impacted=trained,
                              changed=call.changed)

    strategy = make(True)
    starts, sources = {}, {}
    for s, g0 in strategy.start_rounds().items():
        starts[s], sources[s] = start_model(store, s, g0, cfg.training.shard_strategy)
    if any(model is None for model in starts.values()):  # cannot start late
        strategy = make(False)
        starts = {s: store.shard_model(s, 0) for s in strategy.impacted}
        sources = dict.fromkeys(starts, "stored W^0 (replay from round 1)")
    initial = [to_record(starts[s]) if s in starts else model
               for s, model in enumerate(call.current or stage.sharded_models)]
    replay = {"shards": strategy.replay_report(), "unchanged": unchanged,
              "start_models": sources}
    return Framework(strategy, initial, strategy.num_rounds, list(strategy.impacted),
                     replay=replay)


def start_model(store: TrainingHistory, shard: int, g0: int | None,
                shard_strategy: str) -> tuple[dict | None, str]:
    """W^(g0-1) of ``shard`` and where it came from; (None, why) if unavailable."""
    start = (g0 or 1) - 1
    try:
        return store.shard_model(shard, start), f"stored W^{start}"
    except StoreError:
        if shard_strategy not in REBUILDABLE:
            return None, f"no W^{start} and {shard_strategy} cannot be rebuilt"
    return rebuild_shard_model(store, shard, start), f"W^{start} rebuilt from the record"
