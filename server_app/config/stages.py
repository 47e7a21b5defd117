"""Run-config section ``stages``: a federation that lives on (:mod:`server_app.stages`).

The keys: ``num-stages``, ``joins-per-stage``, ``leaves-per-stage`` and
``requests-per-stage``. ``num-clients`` counts every client that ever exists:
the first stage has ``num-clients - joins-per-stage x (num-stages - 1)`` of them
and each later stage adds ``joins-per-stage``. What a staged run supports is
checked here, before any engine starts; each error names the key, the value and
what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import server_app.config.methods as registry
from audits.config import AuditConfig
from server_app.config.storage import StorageConfig
from server_app.config.training import TrainingConfig
from server_app.config.unlearning import UnlearningConfig
from server_app.config.values import bad
from task.config import DataConfig
from task.section import Section

MAX_STAGES = 1000


@dataclass(frozen=True)
class StagesConfig(Section):
    """Stages of a run (paper Sec. 3.1: clients join and leave at any time).

    Attributes
    ----------
    num_stages : int
        Stages of ``num-rounds`` rounds each (1: a run without churn).
    joins_per_stage, leaves_per_stage : int
        Clients that join / leave before each stage after the first.
    requests_per_stage : int
        Seeded unlearning requests handled at the end of each stage.
    later_requests : bool
        The run has finished and takes its pending requests from the stored
        history (set by the ``forget`` command; :mod:`server_app.stages.later`).
    forget_run : str
        A finished run whose pending requests this ServerApp carries out with the
        settings the run recorded ('' = none; :mod:`server_app.forget_run`).
    """

    num_stages: int = 1
    joins_per_stage: int = 0
    leaves_per_stage: int = 0
    requests_per_stage: int = 0
    later_requests: bool = False
    forget_run: str = ""

    @property
    def staged(self) -> bool:
        """Whether the run has more than one stage."""
        return self.num_stages > 1

    def initial_clients(self, num_clients: int) -> int:
        """Clients in stage 1: ``num-clients - joins-per-stage x (num-stages - 1)``."""
        return num_clients - self.joins_per_stage * (self.num_stages - 1)

    def validate(self, data: DataConfig, training: TrainingConfig,
                 unlearning: UnlearningConfig, storage: StorageConfig,
                 audit: AuditConfig) -> None:
        """Validate the stage keys against the other sections.

        Raises
        ------
        ConfigError
            A key out of range, a stage key set in a one-stage run, or a setting a
            staged run does not support (frameworks other than SE and FR, coded
            storage, concurrent or explicit requests, backdoor or shadow-model checks).
        """
        if not 1 <= self.num_stages <= MAX_STAGES:
            raise bad("num-stages", self.num_stages, f"an integer in [1, {MAX_STAGES}]")
        for key in ("joins-per-stage", "leaves-per-stage", "requests-per-stage"):
            value = getattr(self, key.replace("-", "_"))
            if not 0 <= value <= data.num_clients:
                raise bad(key, value,
                          f"an integer in [0, num-clients = {data.num_clients}]")
            if value and not self.staged:
                raise bad(key, value, "0 with num-stages = 1 (churn and requests per "
                          "stage need num-stages > 1)")
        if not self.staged:
            return
        self._validate_supported(unlearning, storage, audit)
        first = self.initial_clients(data.num_clients)
        shards = max(training.num_shards, unlearning.baseline_shards)
        if first < shards:  # SE's shards and FR's baseline-shards
            raise bad("joins-per-stage", self.joins_per_stage,
                      f"at most {(data.num_clients - shards) // (self.num_stages - 1)}"
                      f": num-clients = {data.num_clients} counts every client that "
                      f"ever exists, and stage 1 must give each of the {shards} shards "
                      f"a client (it has {first})")

    @staticmethod
    def _validate_supported(unlearning: UnlearningConfig, storage: StorageConfig,
                            audit: AuditConfig) -> None:
        names = unlearning.framework_list
        serves, retrains = registry.proposed(), registry.reference()
        if serves not in names or any(n not in (serves, retrains) for n in names):
            others = [n for n in registry.names() if n not in (serves, retrains)]
            raise bad("frameworks", unlearning.frameworks,
                      f"{serves!r} or '{serves},{retrains}' with num-stages > 1 "
                      f"({', '.join(others)} are not staged)")
        fixed = {"storage": (storage.mode, "uncoded"),
                 "request-mode": (unlearning.request_mode, "sequential"),
                 "num-requests": (unlearning.num_requests, 1),
                 "forget-clients": (unlearning.forget_clients, ""),
                 "forget-records": (unlearning.forget_records, ""),
                 "forget-labels": (unlearning.forget_labels, ""),
                 "backdoor-trigger": (audit.backdoor_trigger, 0),
                 "backdoor-phrase": (audit.backdoor_phrase, ""),
                 "mia-shadows": (audit.mia_shadows, 0)}
        for key, (value, allowed) in fixed.items():
            if value != allowed:
                raise bad(key, value, f"{allowed!r} with num-stages > 1 (staged runs "
                          "take requests-per-stage and the forget command; coded "
                          "storage and the verification checks are not staged yet)")
