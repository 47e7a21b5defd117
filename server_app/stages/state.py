"""What a run knows between its stages: who is present, the models, the history.

:class:`RunState` is the state the pipeline (:mod:`server_app.stages.pipeline`)
carries from one stage to the next; a one-stage run is a run with one stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import ArrayRecord

from runstore.inbox import RequestInbox
from runstore.summary import StageSummary
from server_app.rounds.federation import Federation
from server_app.run.context import RunContext
from server_app.stages.churn import Churn, Membership


@dataclass
class RunState:
    """The run's state between stages.

    Attributes
    ----------
    ctx : RunContext
        The run.
    federation, baseline : Federation
        SE's shards and the baselines' (``baseline-shards``) over every client.
    churn : Churn
        Who joins and leaves (seeded).
    inbox : RequestInbox or None
        Requests of the ``forget`` command (staged runs).
    store : object
        SE's history store (one for every stage), once learning opened it.
    baseline_store : object
        FedEraser's history store (one-stage runs with FE), once it learned.
    models : list[ArrayRecord]
        Each shard's model now (after the last request handled).
    scores : dict
        ``accuracy``, ``loss``, ``shard_accuracy`` of :attr:`models`.
    members : list[Membership]
        Each stage's membership so far.
    forgotten : set[int]
        Every client forgotten so far.
    stages : list[StageSummary]
        The finished stages.
    fr_models : list[ArrayRecord]
        FR's models after the last stage's last request (staged runs, FR asked).
    """

    ctx: RunContext
    federation: Federation
    baseline: Federation
    churn: Churn
    inbox: RequestInbox | None = None
    store: object = None
    baseline_store: object = None
    models: list[ArrayRecord] = field(default_factory=list)
    scores: dict = field(default_factory=dict)
    members: list[Membership] = field(default_factory=list)
    forgotten: set[int] = field(default_factory=set)
    stages: list[StageSummary] = field(default_factory=list)
    fr_models: list[ArrayRecord] = field(default_factory=list)

    def next_member(self) -> Membership:
        """Membership of the next stage (stage 1, or the last one advanced)."""
        if not self.members:
            return self.churn.first()
        return self.churn.advance(self.members[-1], self.forgotten)

    def present_at(self, rnd: int) -> set[int]:
        """Partition ids present in the stage of stored round ``rnd`` (1-based).

        Stage k holds rounds (k - 1) G + 1 .. k G; a round of no stage learned yet
        has no one present.
        """
        stage = (rnd - 1) // self.ctx.cfg.training.num_rounds + 1
        return next((set(m.present) for m in self.members if m.stage == stage), set())

    def restore(self, entry: StageSummary, models: list[ArrayRecord]) -> None:
        """Take back a stage finished before a crash (its summary entry and models)."""
        self.members.append(Membership(entry.stage, entry.present_clients,
                                       entry.joined, entry.left))
        self.forgotten |= set(entry.forgotten)
        self.stages.append(entry)
        self.models = models
        self.scores = {"accuracy": entry.accuracy, "loss": entry.loss,
                       "shard_accuracy": entry.shard_accuracy}
