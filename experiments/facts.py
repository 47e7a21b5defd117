"""What the experiment suites know of the built-in tasks (issue 53: not the Task's).

A task is the ML task both apps run (:mod:`task.interface`); where it stands in the
paper's experiments is this package's knowledge: :data:`BUILTIN_FACTS` holds, per
built-in task name, the suites and experiments it is in, its ``client-samples`` caps
and extra keys, its preset's training keys, its quality goal, its time-left cost and
the paper's claim it belongs to. A task without an entry (a plug-in, a new built-in
not added here) runs in no suite. ``tests/test_layout.py`` lets the built-ins' names
stand here and in ``task/tasks/`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from task.interface import METRICS

EXPERIMENT_ROLES = ("single", "mia", "concurrent", "storage")
""":attr:`ExperimentFacts.roles`: the experiments of a suite a task runs in
(``mia``: the membership-audit stability configuration, IID, over seeds;
``storage``: the Fig. 5 storage runs)."""


@dataclass(frozen=True, eq=False)
class ExperimentFacts:
    """What the experiment suites (:mod:`experiments`) know of a task.

    Compared and hashed by identity (it holds dicts), so a :class:`Task` holding
    it stays hashable.

    Attributes
    ----------
    roles : Mapping[str, tuple[str, ...]]
        Per suite (``quick``, ``trained``, ``paper``, ``tiny``): the experiments
        it runs this task in, of :data:`EXPERIMENT_ROLES`; a suite not named
        runs none.
    client_samples : Mapping[str, int]
        Per suite: run-config ``client-samples`` of this task's runs (a suite
        not named: every client's whole share).
    config : Mapping[str, Mapping[str, object]]
        Per suite: run-config keys of every run of this task (e.g. more rounds).
    preset : str
        A run preset (presets/NAME.toml) whose ``preset_keys`` every run of this
        task takes (``""``: none); ``preset_default`` where the preset lacks them.
    preset_keys : tuple[str, ...]
        See ``preset``.
    preset_default : Mapping[str, object]
        See ``preset``.
    goal : (str, float) or None
        What a trained model must reach: ``("accuracy", at least)`` or
        ``("loss", at most, in nats)``; None: no goal.
    cost : float
        Relative training seconds per sample-epoch (a text task: per block),
        measured in the trained suite's first rounds (MNIST's CNN = 1, about
        0.15 ms; for the time-left estimate only).
    train_size : int
        Training samples a client's share is cut from (time-left estimate only).
    paper_claim : (str, float) or None
        The paper's non-IID retraining-time claim this task belongs to: the
        claim's words and the reduction it states; None: none.
    paper_reduction : float or None
        The retraining-time reduction the paper reports for SE on this
        dataset's own non-IID cell (its Sec. 5: 0.6641 MNIST, 0.6639
        Fashion-MNIST, 0.6516 CIFAR-10, 0.8762 Tiny Shakespeare), set beside
        the paper-scale runs; None: ``paper_claim``'s figure stands for it.
    mia_check : bool
        Issue 6's check of the paper's MNIST runs applies (FR's membership F1
        below the original's, SE within 0.05 of FR).
    """

    roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    client_samples: Mapping[str, int] = field(default_factory=dict)
    config: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    preset: str = ""
    preset_keys: tuple[str, ...] = ()
    preset_default: Mapping[str, object] = field(default_factory=dict)
    goal: tuple[str, float] | None = None
    cost: float = 1.0
    train_size: int = 60000
    paper_claim: tuple[str, float] | None = None
    paper_reduction: float | None = None
    mia_check: bool = False

    def __post_init__(self) -> None:
        for suite, roles in self.roles.items():
            unknown = set(roles) - set(EXPERIMENT_ROLES)
            if unknown:
                raise ValueError(f"ExperimentFacts.roles[{suite!r}]: {sorted(unknown)}"
                                 f" are not of {EXPERIMENT_ROLES}")
        if self.goal is not None and self.goal[0] not in METRICS:
            raise ValueError(f"ExperimentFacts.goal = {self.goal!r}: the metric must "
                             f"be one of {METRICS}")


_SUITES = ("quick", "trained", "paper")
PAPER_IMAGE_CLAIM = ("Retraining time, SE vs baselines, non-IID MNIST / FMNIST / "
                     "CIFAR-10", 0.66)
"""The paper's retraining-time claim over its three image datasets."""
TEXT_PRESET_KEYS = ("optimizer", "lr", "batch-size", "block-size")
"""Local-training keys of presets/shakespeare.toml every suite run takes (the
character model trains with Adam; SGD barely moves it); topology keys there are
left to the experiment."""

BUILTIN_FACTS: dict[str, ExperimentFacts] = {
    "mnist": ExperimentFacts(
        roles={**dict.fromkeys(_SUITES, ("single", "mia", "storage")),
               "tiny": ("single", "mia", "concurrent", "storage")},
        client_samples={"quick": 64, "tiny": 32},
        # measured (2 local epochs, 8 of 20 clients a round): non-IID 97.4% after 10
        # rounds
        config={"trained": {"num-rounds": 12}},
        goal=("accuracy", 0.97), cost=1.0, train_size=60000,
        paper_claim=PAPER_IMAGE_CLAIM, paper_reduction=0.6641, mia_check=True),
    "fmnist": ExperimentFacts(
        roles=dict.fromkeys(_SUITES, ("single",)),
        client_samples={"quick": 64, "tiny": 32},
        # measured as MNIST's: non-IID 86.2% after 10 rounds
        config={"trained": {"num-rounds": 12}},
        goal=("accuracy", 0.85), cost=1.0, train_size=60000,
        paper_claim=PAPER_IMAGE_CLAIM, paper_reduction=0.6639),
    "cifar10": ExperimentFacts(
        roles=dict.fromkeys(_SUITES, ("single", "concurrent")),
        client_samples={"quick": 64, "tiny": 32},
        # measured: 49% after 8 rounds (2 local epochs, 8 of 20 clients a round)
        goal=("accuracy", 0.45), cost=3.2, train_size=50000,
        paper_claim=PAPER_IMAGE_CLAIM, paper_reduction=0.6516),
    "shakespeare": ExperimentFacts(
        roles=dict.fromkeys(_SUITES, ("single", "concurrent")),
        client_samples={"quick": 32, "tiny": 8},
        # the character model costs more per sample: fewer epochs, test blocks
        config={"quick": {"local-epochs": 2, "test-samples": 200},
                "trained": {"test-samples": 500}},
        preset="shakespeare", preset_keys=TEXT_PRESET_KEYS,
        preset_default={"optimizer": "adam", "lr": 0.01, "batch-size": 8},
        # measured: 2.15 nats/char after 8 rounds
        goal=("loss", 2.3), cost=4.7, train_size=15600,
        paper_claim=("Retraining time, SE vs baselines, non-IID Tiny Shakespeare",
                     0.8762),
        paper_reduction=0.8762),
}
"""Each built-in task's facts, by its run-config ``dataset`` name (in the registry's
order, :data:`task.tasks.BUILTIN_TASKS`)."""


def facts_of(name: str) -> ExperimentFacts | None:
    """What the suites know of the task ``name`` (None: a task they know nothing of).

    Parameters
    ----------
    name : str
        A row's or a run's ``dataset``: a built-in name, or a plug-in's spec.
    """
    return BUILTIN_FACTS.get(name)
