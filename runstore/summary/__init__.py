"""Typed results of a run: what ``summary.json`` holds, written and read back.

The ServerApp builds a :class:`RunSummary` from typed parts and writes it with
:meth:`RunSummary.to_json`; the report and the experiments read it back with
:meth:`RunSummary.load`. The JSON keys are a contract (docs/CONFIG.md, "What a run
writes"): a field that is None is left out of the JSON, as the runs before these types did.
The membership-inference scores of a model are kept in ``audit`` and written as
flat ``mia_<metric>`` keys beside its accuracy.

Here the run's document (learning, the requests, stages, the run); one
framework's record in :mod:`~runstore.summary.framework`; the JSON helpers
they share in :mod:`~runstore.summary.records`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from runstore.summary.framework import FrameworkSummary, ModelScores, RequestCost
from runstore.summary.records import known_fields, perplexity, to_json_dict

__all__ = ["FrameworkSummary", "LearningSummary", "ModelScores", "RequestCost",
           "RunSummary", "StageSummary", "UnlearningPlan"]


@dataclass
class LearningSummary:
    """One learning stage (``learning``, FE's ``baseline_learning``).

    Attributes
    ----------
    accuracy, loss : float
        The shard ensemble's test accuracy and loss (nats) after the last round.
    shard_accuracy, shard_loss : list[float]
        Each shard model's.
    wall_time_s, compute_s : float
        Wall seconds of the stage; clients' training seconds summed.
    client_epochs : float
        Local epochs summed over all participants (samples seen / samples held).
    rounds : list[dict]
        Per round: ``round``, ``participants``, ``compute_s``, ``client_epochs``,
        ``warnings``, the evaluation's ``accuracy`` / ``loss`` / ``shard_*``, and
        ``seconds`` (wall).
    warnings : list[str]
        Shard rounds without an accepted reply; shards that never moved.
    perplexity : float, optional
        exp(loss), for the character model.
    backdoor_asr : float, optional
        With ``backdoor-trigger``: the attack success rate of this stage's model
        (set for FE's own original, ``baseline_learning``; see ``verification``).
    """

    accuracy: float
    loss: float
    shard_accuracy: list[float]
    shard_loss: list[float]
    wall_time_s: float
    compute_s: float
    client_epochs: float
    rounds: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    perplexity: float | None = None
    backdoor_asr: float | None = None

    def to_json(self) -> dict:
        """The JSON dict (None fields left out)."""
        return to_json_dict(self)

    @classmethod
    def from_json(cls, data: dict) -> LearningSummary:
        """Read back :meth:`to_json`'s dict."""
        return cls(**known_fields(cls, data))

    @classmethod
    def of(cls, result) -> LearningSummary:
        """The summary of a learning stage's result (scores after its last round).

        ``result``: the ServerApp's :class:`server_app.rounds.learning.LearningResult`
        (its ``rounds``, ``wall_time_s``, ``compute_s``, ``client_epochs`` and
        ``warnings``; the run store imports no app).
        """
        last = result.rounds[-1]
        return cls(accuracy=last["accuracy"], loss=last["loss"],
                   shard_accuracy=last["shard_accuracy"], shard_loss=last["shard_loss"],
                   wall_time_s=result.wall_time_s, compute_s=result.compute_s,
                   client_epochs=result.client_epochs, rounds=result.rounds,
                   warnings=result.warnings)

    @classmethod
    def combined(cls, parts: list[LearningSummary]) -> LearningSummary:
        """Several learning stages as one: scores of the last, costs and rounds summed."""
        last = parts[-1]
        return cls(accuracy=last.accuracy, loss=last.loss,
                   shard_accuracy=last.shard_accuracy, shard_loss=last.shard_loss,
                   wall_time_s=sum(p.wall_time_s for p in parts),
                   compute_s=sum(p.compute_s for p in parts),
                   client_epochs=sum(p.client_epochs for p in parts),
                   rounds=[r for p in parts for r in p.rounds],
                   warnings=[w for p in parts for w in p.warnings])


@dataclass
class UnlearningPlan:
    """The requests of the run (``unlearning``)."""

    requests: list[list[int]]
    noops: list[dict]
    mode: str
    erasure: dict | None = None
    """A records or class-level request: ``records`` (client -> ids) and
    ``labels`` (:meth:`server_app.unlearning.erasure.Erasure.to_json`)."""

    def to_json(self) -> dict:
        """The JSON dict."""
        return to_json_dict(self)

    @classmethod
    def from_json(cls, data: dict) -> UnlearningPlan:
        """Read back :meth:`to_json`'s dict."""
        return cls(**known_fields(cls, data))


@dataclass
class StageSummary:
    """One stage of a staged run (``stages[t - 1]`` of summary.json).

    Attributes
    ----------
    stage : int
        t, from 1.
    present : int
        Clients present in the stage.
    present_clients, joined, left : list[int]
        Who was present, who joined before it, who left before it.
    forgotten : list[int]
        Clients forgotten at the end of the stage.
    requests : list[str]
        Ids of the requests handled at the end of the stage.
    rounds : list[int]
        First and last (global) round of the stage.
    learning : dict
        The stage's learning: accuracy, loss, shard scores, compute / wall
        seconds, client-epochs and the rounds (as :class:`LearningSummary`
        without its warnings).
    unlearning : dict[str, dict]
        Per framework: ``compute_s``, ``client_epochs``, ``modelled_wall_s``
        summed over the stage's requests.
    warnings : list[str]
        Churn, learning and refused-request warnings of the stage.
    accuracy, loss : float, optional
        The ensemble's test scores at the end of the stage (after its requests).
    shard_accuracy : list[float], optional
        Each shard model's, likewise.
    """

    stage: int
    present: int
    present_clients: list[int]
    joined: list[int]
    left: list[int]
    forgotten: list[int]
    requests: list[str]
    rounds: list[int]
    learning: dict
    unlearning: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    accuracy: float | None = None
    loss: float | None = None
    shard_accuracy: list[float] | None = None

    def learning_summary(self) -> LearningSummary:
        """The stage's learning as a :class:`LearningSummary` (warnings: the stage's)."""
        return LearningSummary.from_json({**self.learning, "warnings": self.warnings})

    def to_json(self) -> dict:
        """The JSON dict (None fields left out)."""
        return to_json_dict(self)

    @classmethod
    def from_json(cls, data: dict) -> StageSummary:
        """Read back :meth:`to_json`'s dict."""
        return cls(**known_fields(cls, data))


@dataclass
class RunSummary:
    """Everything ``summary.json`` holds (keys: docs/CONFIG.md, "What a run writes")."""

    config: dict
    data_dir: str
    shards: list[list[int]]
    shard_strategy: dict
    notes: list[str]
    learning: LearningSummary
    storage: dict = field(default_factory=dict)
    baseline_learning: LearningSummary | None = None
    unlearning: UnlearningPlan | None = None
    frameworks: dict[str, FrameworkSummary] | None = None
    original: ModelScores | None = None
    faults: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    data: dict | None = None
    """The data read (:func:`task.provenance.data_provenance`): files, format,
    checksums."""
    verification: dict | None = None  # backdoor settings, forgotten clients' rounds
    stages: list[StageSummary] | None = None
    """Staged runs: one entry per stage (:mod:`server_app.stages.pipeline`)."""
    cost_model: dict | None = None
    """Which device profile priced the modelled times (name, SHA-256 digest) and
    the prices used (:meth:`server_app.rounds.costs.CostModel.describe`)."""
    task: dict | None = None
    """What the run's task says about itself (:meth:`task.interface.Task.describe`:
    ``name``, ``metric``, ``classes``, ``perplexity``); absent in summaries written
    before it (:meth:`headline_metric` then reads the perplexity)."""

    def headline_metric(self) -> str:
        """The task's headline score: ``"accuracy"`` or ``"loss"``.

        ``task.metric``; in a summary written before the ``task`` block, ``"loss"``
        where the learning block has a perplexity (the task's loss was nats per
        token, :attr:`task.interface.Task.perplexity`), else ``"accuracy"``.

        Returns
        -------
        str
            One of :data:`task.interface.METRICS`.
        """
        if self.task and self.task.get("metric"):
            return str(self.task["metric"])
        return "loss" if self.learning.perplexity is not None else "accuracy"

    def collect_warnings(self) -> list[str]:
        """Every stage's warnings, in run order: learning, baseline, each framework."""
        out = list(self.learning.warnings)
        if self.baseline_learning is not None:
            out += self.baseline_learning.warnings
        for result in (self.frameworks or {}).values():
            out += result.warnings or []
        return out

    def add_perplexity(self) -> None:
        """Character model: ``perplexity`` = exp(test loss, nats/char) beside each loss."""
        blocks = [self.learning, self.baseline_learning, self.original,
                  *(self.frameworks or {}).values()]
        for block in blocks:
            if block is not None and block.loss is not None:
                block.perplexity = perplexity(block.loss)

    def to_json(self) -> dict:
        """The JSON dict of summary.json (None fields left out)."""
        return to_json_dict(self)

    @classmethod
    def from_json(cls, data: dict) -> RunSummary:
        """Read back :meth:`to_json`'s dict."""
        known = known_fields(cls, data)
        known["learning"] = LearningSummary.from_json(data["learning"])
        if "baseline_learning" in data:
            known["baseline_learning"] = LearningSummary.from_json(
                data["baseline_learning"])
        if "unlearning" in data:
            known["unlearning"] = UnlearningPlan.from_json(data["unlearning"])
        if "frameworks" in data:
            known["frameworks"] = {n: FrameworkSummary.from_json(f)
                                   for n, f in data["frameworks"].items()}
        if "original" in data:
            known["original"] = ModelScores.from_json(data["original"])
        if "stages" in data:
            known["stages"] = [StageSummary.from_json(e) for e in data["stages"]]
        return cls(**known)

    @classmethod
    def load(cls, path: str | Path) -> RunSummary:
        """Read a ``summary.json`` file.

        Raises
        ------
        OSError, ValueError, KeyError
            No such file, not JSON, or no ``learning`` block.
        """
        return cls.from_json(json.loads(Path(path).read_text()))
