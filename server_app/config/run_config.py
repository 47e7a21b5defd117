"""The run configuration: parsed once from ``[tool.flwr.app.config]``, in sections.

Every setting lives in ``pyproject.toml`` with a default; ``--run-config`` and the
TOML presets in ``presets/`` override them. The keys stay flat (that is what users,
presets and scripts type); :meth:`RunConfig.from_run_config` parses Flower's flat
``context.run_config`` into typed, frozen sections (``data``, ``training``,
``unlearning``, ``storage``, ``stages``, ``audit``, ``output``) plus the run's
``seed`` and each unlearning method's own settings (``method.<key>.<field>``,
:class:`server_app.config.methods.MethodSettings`), and each section validates
its own keys in one place, in that order (a later section may read the earlier
ones). Errors name the key, the value and what is allowed (:class:`ConfigError`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import server_app.config.methods as registry
from audits.config import AuditConfig
from server_app.config.audit import check_against
from server_app.config.output import OutputConfig
from server_app.config.stages import StagesConfig
from server_app.config.storage import StorageConfig
from server_app.config.tasks import check_task, resolve_task
from server_app.config.training import TrainingConfig
from server_app.config.unlearning import UnlearningConfig
from server_app.config.values import MAX_SEED, bad, coerce
from task.config import DataConfig, TaskConfig
from task.interface import Task

SECTIONS = {"data": DataConfig, "training": TrainingConfig,
            "unlearning": UnlearningConfig, "storage": StorageConfig,
            "stages": StagesConfig, "audit": AuditConfig, "output": OutputConfig}
"""Section name -> class, in the order they are validated."""


@dataclass(frozen=True)
class RunConfig:
    """Typed, validated run settings: the run's ``seed`` and one record per section.

    docs/CONFIG.md explains each key. Times are seconds, learning rates are per
    local optimizer step. Build with
    :meth:`from_run_config` (flat kebab-case keys) or :meth:`of` (flat snake-case
    keywords, for code and tests).
    """

    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    unlearning: UnlearningConfig = field(default_factory=UnlearningConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    stages: StagesConfig = field(default_factory=StagesConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    methods: Mapping[str, registry.MethodSettings] = field(
        default_factory=lambda: registry.settings_of({}))
    """Each built-in method's own settings, by name."""

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, object]) -> RunConfig:
        """Build and validate a config from Flower's ``context.run_config``.

        Parameters
        ----------
        run_config : Mapping[str, object]
            Kebab-case keys as in ``pyproject.toml``; missing keys take defaults,
            keys no section knows (a user's own) are ignored.

        Returns
        -------
        RunConfig

        Raises
        ------
        ConfigError
            A value of the wrong type, or a value out of range.
        """
        seed = coerce("seed", run_config["seed"], int) if "seed" in run_config else 0
        cfg = cls(seed, **{name: section.from_run_config(run_config)
                           for name, section in SECTIONS.items()},
                  methods=registry.settings_of(run_config))
        cfg.validate()
        return cfg

    @classmethod
    def of(cls, **values: object) -> RunConfig:
        """A validated config from snake-case keywords (``num_clients=8``).

        Raises
        ------
        ConfigError
            As :meth:`from_run_config`; a keyword no section has.
        """
        known = {"seed", *(k for s in SECTIONS.values() for k in s.keys()),
                 *(k for m in registry.builtins() for k in m.Settings.keys())}
        run_config = {k.replace("_", "-"): v for k, v in values.items()}
        run_config = {("storage" if k == "mode" else k): v for k, v in run_config.items()}
        unknown = sorted(set(run_config) - known)
        if unknown:
            raise bad(unknown[0], run_config[unknown[0]], "a run-config key")
        return cls.from_run_config(run_config)

    def validate(self) -> None:
        """Check every section alone and against the ones before it.

        Only what needs neither data nor nodes; :func:`server_app.preflight.check_run`
        adds the requests, the coded-storage range and the partition.

        Raises
        ------
        ConfigError
            The first bad value, naming the key, value and what is allowed.
        """
        self.data.validate()
        if not 0 <= self.seed <= MAX_SEED:
            raise bad("seed", self.seed, f"an integer in [0, {MAX_SEED}]")
        self.training.validate(self.data)
        self.unlearning.validate(self.data, self.training)
        self.storage.validate(self.data.num_clients)
        self.audit.validate(self.data)
        check_against(self.audit, self.unlearning)
        self.stages.validate(self.data, self.training, self.unlearning, self.storage,
                             self.audit)
        self.output.validate()
        if not self.data.plugin:  # a plug-in is imported by check_run, not here
            check_task(self, self.task())

    def task(self) -> Task:
        """The run's task (:func:`task.registry.get_task`; a plug-in is imported once).

        Raises
        ------
        ConfigError
            One line naming ``task`` (:func:`server_app.config.tasks.resolve_task`).
        """
        return resolve_task(self.data.task_spec)

    def task_settings(self) -> TaskConfig:
        """The task's settings, as every ClientApp reads them from the run config."""
        return TaskConfig.of(self.data, self.seed, self.training.device)

    @property
    def retrain_epochs(self) -> float:
        """L / r: local epochs of a calibration round."""
        return self.training.local_epochs / self.unlearning.retrain_ratio

    @property
    def coded_blocks_per_shard(self) -> int:
        """K of coded storage (:meth:`StorageConfig.blocks` for this run's C)."""
        return self.storage.blocks(self.data.num_clients)

    @property
    def initial_clients(self) -> int:
        """Clients present in stage 1 (:meth:`StagesConfig.initial_clients`)."""
        return self.stages.initial_clients(self.data.num_clients)

    def resolved_run_name(self) -> str:
        """``run-name``, or ``<task>-<partition>-<UTC time>`` when unset.

        ``<task>`` is the dataset for a built-in task, the plug-in's spec with
        ``:`` as ``.`` otherwise.
        """
        if self.output.run_name:
            return self.output.run_name
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return f"{self.data.task_label}-{self.data.partition}-{stamp}"

    def as_dict(self) -> dict[str, object]:
        """Every setting under its kebab-case run-config key (for summary.json)."""
        out: dict[str, object] = {"seed": self.seed}
        for name in SECTIONS:
            out.update(getattr(self, name).as_dict())
        for settings in self.methods.values():
            out.update(settings.as_dict())
        return out

    def method_settings(self, name: str) -> registry.MethodSettings:
        """The own settings of the method ``name`` (a plug-in's: none)."""
        return self.methods.get(name) or registry.MethodSettings()

    def replace(self, **values: object) -> RunConfig:
        """A copy with some flat snake-case settings changed (validated again)."""
        flat = {k.replace("-", "_"): v for k, v in self.as_dict().items()}
        return RunConfig.of(**{**flat, **values})


__all__ = ["RunConfig", "SECTIONS", *(c.__name__ for c in SECTIONS.values())]
