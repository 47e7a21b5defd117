"""FE: FedEraser's calibrated replay of the baseline federation from round 1."""

from __future__ import annotations

from server_app.unlearning.frameworks import BuildCall, Framework
from strategies.sharded import to_record
from strategies.unlearning import FedEraser


def build(call: BuildCall) -> Framework:
    """FedEraser (Liu et al. 2021) on the baseline federation's stored history.

    Raises
    ------
    ValueError
        The baseline federation kept no history.
    """
    stage = call.stage
    if stage.baseline_store is None:
        raise ValueError(f"{call.name} needs the baseline federation's history")
    settings = stage.settings
    strategy = FedEraser(stage.baseline_store, call.forget, stage.baseline.shards,
                         stage.baseline.node_of, settings.retrain_epochs,
                         settings.calibration_interval,
                         from_first_participation=False)  # FedEraser: from round 1
    initial = [to_record(stage.baseline_store.shard_model(s, 0))
               for s in range(len(stage.baseline.shards))]
    return Framework(strategy, initial, strategy.num_rounds, list(strategy.impacted))
