"""FE: FedEraser's calibrated replay of the baseline federation from round 1."""

from __future__ import annotations

from server_app.config.methods import UnlearningMethod
from server_app.unlearning.frameworks import Framework, Request
from strategies.sharded import to_record
from strategies.unlearning import FedEraser, ReplaySchedule


class FedEraserMethod(UnlearningMethod):
    """FE: FedEraser (Liu et al. 2021) on the baseline federation's stored history."""

    name = "FE"
    federation = "baseline"
    calibrated = interval_label = paper_baseline = True
    colour = "#2ca02c"
    summary = "FedEraser (Liu et al. 2021): calibrated replay from round 1"

    @classmethod
    def build(cls, request: Request) -> Framework:
        """FedEraser's replay of every stored round, from W^0.

        Raises
        ------
        ValueError
            The baseline federation kept no history.
        """
        return _build(request)


def _build(call: Request) -> Framework:
    stage = call.stage
    if stage.baseline_store is None:
        raise ValueError(f"{call.method.name} needs the baseline federation's history")
    cfg = stage.cfg
    strategy = FedEraser(stage.baseline_store, call.forget, stage.baseline.shards,
                         stage.baseline.node_of, cfg.retrain_epochs,
                         ReplaySchedule(cfg.unlearning.calibration_interval,
                                        from_first_participation=False))  # round 1 on
    initial = [to_record(stage.baseline_store.shard_model(s, 0))
               for s in range(len(stage.baseline.shards))]
    return Framework(strategy, initial, strategy.num_rounds, list(strategy.impacted))
