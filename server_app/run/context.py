"""One run as one object: its settings, round loop, folder, catalog and evaluator.

:class:`RunContext` is built once per run, after every check has passed and the
nodes have been found (:func:`server_app.app.open_run`). Each step of the run
(learning, unlearning, the audit, stages) takes it and returns typed summaries,
so no step passes the run's settings on as loose parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from history import SliceTransfer
from runstore.catalog import RunLog
from runstore.folder import RunFolder
from server_app.config import RunConfig
from server_app.evaluation.central import CentralEvaluator
from server_app.rounds.engine import Engine
from server_app.rounds.federation import Federation
from server_app.rounds.loop import RoundLoop
from server_app.rounds.screening import FaultLog
from server_app.run.plan import RunPlan
from task.config import RUN_CONFIG_KEY, client_settings


def initial_model(cfg: RunConfig, num_classes: int) -> ArrayRecord:
    """W^0: the run's task's model initialised from ``seed`` (the same for every shard)."""
    torch.manual_seed(cfg.seed)
    return ArrayRecord(cfg.task().model(num_classes).state_dict())


def train_config(cfg: RunConfig, data_dir: str) -> ConfigRecord:
    """What every learning message carries besides the model.

    The run's :class:`task.training_settings.TrainingSettings` as a record,
    which the ClientApp reads back with ``TrainingSettings.from_record``, and the
    run's settings a client reads (:func:`task.config.client_settings`: its data
    share, the backdoors), so every client trains on the run's own settings.
    """
    record = cfg.training.local_settings(cfg.seed, data_dir).to_record()
    record[RUN_CONFIG_KEY] = client_settings(cfg.as_dict())
    return record


@dataclass
class RunContext:
    """Everything a step of the run needs, built once.

    Attributes
    ----------
    cfg : RunConfig
        The validated settings.
    plan : RunPlan
        What the run will do, completed by discovery (shards, planned
        requests, notes, the node map and each client's size).
    loop : RoundLoop
        The run's round loop (grid, reply bounds, timeout, fault log).
    folder : RunFolder
        The run folder (locked while the run lives).
    catalog : RunLog
        The run catalog ``run.sqlite`` (what is done, for resuming).
    evaluator : CentralEvaluator
        Scores shard models on the test set.
    data_dir : str
        The dataset's folder, resolved.
    engine : Engine
        Where this process runs (:mod:`server_app.rounds.engine`).
    """

    cfg: RunConfig
    plan: RunPlan
    loop: RoundLoop
    folder: RunFolder
    catalog: RunLog
    evaluator: CentralEvaluator
    data_dir: str
    engine: Engine = field(default_factory=lambda: Engine("in-process"))

    @property
    def grid(self) -> Grid:
        """The run's grid."""
        return self.loop.grid

    @property
    def faults(self) -> FaultLog:
        """The run's fault log."""
        return self.loop.faults

    def trained(self) -> list[int]:
        """Partition ids the run's grid sent training messages to since the last call.

        [] where the grid keeps none (:class:`server_app.rounds.engine.TrainedNodes`).
        """
        take = getattr(self.loop.grid, "take", None)
        if take is None:
            return []
        partition = {n: p for p, n in self.plan.node_of.items()}
        return sorted(partition[n] for n in take() if n in partition)

    def federation(self, shards: list[list[int]]) -> Federation:
        """The run's nodes split into ``shards`` (partition ids)."""
        return Federation(dict(self.plan.node_of), shards, dict(self.plan.samples))

    def initial_model(self) -> ArrayRecord:
        """W^0 (:func:`initial_model`)."""
        return initial_model(self.cfg, self.evaluator.num_classes)

    def train_config(self) -> ConfigRecord:
        """The learning messages' config (:func:`train_config`)."""
        return train_config(self.cfg, self.data_dir)

    def slice_transfer(self) -> SliceTransfer:
        """The coded store's exchanges: the round timeout, link rate and fault log."""
        training = self.cfg.training
        return SliceTransfer(training.round_timeout, training.link_rate_mbps, self.faults)

    @staticmethod
    def log(message: str) -> None:
        """One line in the ServerApp's log."""
        log(INFO, "%s", message)
