"""FE: FedEraser's calibrated replay of the baseline federation from round 1."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from server_app.config.methods import UnlearningMethod
from server_app.unlearning.frameworks import Framework, Request
from strategies.sharded import to_record
from strategies.unlearning import FedEraser, ReplaySchedule

if TYPE_CHECKING:
    from audits.run import Unlearn
    from server_app.config import RunConfig


class FedEraserMethod(UnlearningMethod):
    """FE: FedEraser (Liu et al. 2021) on the baseline federation's stored history."""

    name = "FE"
    federation = "baseline"
    calibrated = interval_label = paper_baseline = True
    colour = "#2ca02c"
    summary = "FedEraser (Liu et al. 2021): calibrated replay from round 1"

    @classmethod
    def reference(cls, cfg: RunConfig) -> Unlearn:
        """Unused: U-LiRA's references unlearn with the method's own strategy.

        :mod:`server_app.stages.references` builds them; this hook and
        ``reference_unlearning.se_unlearn`` go with the next remake of the
        results this module shapes (issue 53).
        """
        from server_app.evaluation.reference_unlearning import se_unlearn as unlearn

        return partial(unlearn, cfg, cfg.method_settings(cls.name))

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
