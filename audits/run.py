"""What the audits know of the run they verify: one object the ServerApp builds.

The audits observe a run; they import nothing of the ServerApp. The ServerApp
(:func:`server_app.stages.audit.audited_run`) hands them an :class:`AuditedRun`:
the task, how the data was split, how the clients trained, the ``audit``
settings and, for U-LiRA, a :class:`ReferenceRecipe` of how references learn and
unlearn as the run's methods do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from audits.config import AuditConfig
from task.config import DataConfig
from task.interface import Task
from task.training_settings import TrainingSettings

Learn = Callable[..., tuple]
"""``learn(task, parts, seed, per_round) -> (final, learned)``: a reference's learning;
``learned`` is what its unlearning starts from (the ServerApp's
``server_app.stages.references.learn_reference``: its history store)."""
Unlearn = Callable[..., object]
"""``unlearn(task, parts, learned, forgotten, seed, from_first) -> state or None``: a
method's unlearning of a reference (None: the learned model stands)."""


@dataclass(frozen=True)
class Rule:
    """How U-LiRA's references unlearn like one method.

    Attributes
    ----------
    shape : str
        ``shard`` (a method on SE's shards) or ``federation`` (one on the baseline
        federation).
    unlearn : Unlearn
        The method's unlearning of a reference.
    from_first : bool
        Replays from the forgotten clients' first round (else from round 1).
    """

    shape: str
    unlearn: Unlearn
    from_first: bool


@dataclass(frozen=True)
class ReferenceRecipe:
    """How U-LiRA's references learn and unlearn as the run does.

    Attributes
    ----------
    learn : Learn
        A reference's learning, with the history its unlearning replays.
    rules : Mapping[str, Rule]
        Every method U-LiRA can reference, by name.
    frameworks : tuple[str, ...]
        The run's frameworks that have a rule, in the run's order.
    exact : tuple[str, ...]
        The run's frameworks whose model never depends on the forgotten samples
        (their game is at chance by construction; not run).
    text : str
        The recipe in words (``verification.mia.ulira.recipe``).
    """

    learn: Learn
    rules: Mapping[str, Rule]
    frameworks: tuple[str, ...]
    exact: tuple[str, ...]
    text: str

    @property
    def needs_federation(self) -> bool:
        """A framework of the run is referenced by federation-shaped references."""
        return any(self.rules[n].shape == "federation" for n in self.frameworks)


@dataclass(frozen=True)
class AuditedRun:
    """The run the audits verify.

    Attributes
    ----------
    task : Task
        The task (model, ``predict``, the membership features).
    data : DataConfig
        How the clients' partitions were cut (the auditor rebuilds them).
    seed : int
        The run's seed.
    device : str
        Where the audits' models run (``auto``, ``cpu``, ``cuda[:N]``).
    local : TrainingSettings
        The clients' local training of a learning round (the shadow models
        train so).
    clients_per_round, num_shards, num_rounds, local_epochs : int
        Learning's sampling and schedule (C_r over all shards, S, G, L).
    audit : AuditConfig
        The ``audit`` section.
    references : ReferenceRecipe or None
        U-LiRA's references (None: ``mia-unlearn-references`` = 0).
    """

    task: Task
    data: DataConfig
    seed: int
    device: str
    local: TrainingSettings
    clients_per_round: int
    num_shards: int
    num_rounds: int
    local_epochs: int
    audit: AuditConfig
    references: ReferenceRecipe | None = None

    @property
    def shard_per_round(self) -> int:
        """Clients a shard samples a learning round."""
        return self.clients_per_round // self.num_shards
