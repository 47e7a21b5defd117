"""Typed results of a run: what ``summary.json`` holds, written and read back.

The ServerApp builds a :class:`RunSummary` from typed parts and writes it with
:meth:`RunSummary.to_json`; the report and the experiments read it back with
:meth:`RunSummary.load`. The JSON keys are a contract (docs/CONFIG.md, "What a run
writes"): a field that is None is left out of the JSON, as the runs before these types did.
The membership-inference scores of a model are kept in ``audit`` and written as
flat ``mia_<metric>`` keys beside its accuracy.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server_app.rounds.learning import LearningResult


def _to_json(obj: Any) -> dict:
    """A dataclass as a JSON dict: None fields left out, nested dataclasses too."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        if dataclasses.is_dataclass(value):
            value = value.to_json()
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            value = [v.to_json() for v in value]
        elif isinstance(value, dict) and value and \
                dataclasses.is_dataclass(next(iter(value.values()))):
            value = {k: v.to_json() for k, v in value.items()}
        out[f.name] = value
    return out


def _known(cls, data: dict) -> dict:
    """The entries of ``data`` that are fields of ``cls``."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _perplexity(loss: float | None) -> float | None:
    return None if loss is None else math.exp(min(loss, 700.0))


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
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> LearningSummary:
        """Read back :meth:`to_json`'s dict."""
        return cls(**_known(cls, data))

    @classmethod
    def of(cls, result: LearningResult) -> LearningSummary:
        """The summary of a learning stage's result (scores after its last round)."""
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
class RequestCost:
    """What one framework spent on one request (``frameworks.<F>.requests[k]``).

    A request whose clients were all forgotten before is a no-op: only
    ``request``, ``clients`` (empty) and ``noop`` are set. ``modelled_wall_s``,
    ``to_target`` (FR, RR), ``rounds_replayed`` and ``replay`` (SE) are as in
    :class:`FrameworkSummary`, for this request alone.
    """

    request: int
    clients: list[int]
    noop: bool | None = None
    impacted_shards: list[int] | None = None
    compute_s: float | None = None
    wall_s: float | None = None
    client_epochs: float | None = None
    client_rounds: int | None = None
    comm_time_s: float | None = None
    shard_compute_s: dict[int, float] | None = None
    warnings: list[str] | None = None
    slice_retrieval: dict | None = None
    clients_per_round: int | None = None
    modelled_wall_s: float | None = None
    to_target: dict | None = None
    rounds_replayed: int | None = None
    replay: dict | None = None

    def to_json(self) -> dict:
        """The JSON dict (None fields left out)."""
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> RequestCost:
        """Read back :meth:`to_json`'s dict (shard keys become ints again)."""
        out = cls(**_known(cls, data))
        if out.shard_compute_s is not None:
            out.shard_compute_s = {int(k): v for k, v in out.shard_compute_s.items()}
        return out


@dataclass
class ModelScores:
    """Test scores of one model, with its audit (``original``).

    ``backdoor_asr`` (the impacted shard's model) and ``backdoor_asr_ensemble``
    (the shard ensemble) are set with ``backdoor-trigger``.
    """

    accuracy: float | None = None
    loss: float | None = None
    audit: dict[str, float] = field(default_factory=dict)
    perplexity: float | None = None
    backdoor_asr: float | None = None
    backdoor_asr_ensemble: float | None = None

    def set_backdoor(self, scores: dict[str, float]) -> None:
        """Set ``backdoor_asr`` (and ``backdoor_asr_ensemble`` if given)."""
        self.backdoor_asr = scores["backdoor_asr"]
        self.backdoor_asr_ensemble = scores.get("backdoor_asr_ensemble")

    def to_json(self) -> dict:
        """The JSON dict, the audit as flat ``mia_<metric>`` keys."""
        out = _to_json(dataclasses.replace(self, audit=None))
        out.update({f"mia_{k}": v for k, v in self.audit.items()})
        return out

    @classmethod
    def from_json(cls, data: dict) -> ModelScores:
        """Read back :meth:`to_json`'s dict."""
        return cls(**_known(cls, data), audit=_audit(data))


def _audit(data: dict) -> dict[str, float]:
    return {k[4:]: v for k, v in data.items() if k.startswith("mia_")}


@dataclass
class FrameworkSummary:
    """One unlearning framework's result (``frameworks.<SE|FR|FE|RR>``).

    Attributes
    ----------
    accuracy, loss : float, optional
        Test accuracy and loss of the unlearned model (the ensemble for SE).
    shard_accuracy : list[float], optional
        Each shard model's test accuracy.
    retrain_compute_s, retrain_wall_s : float, optional
        Clients' training seconds plus server seconds; wall seconds.
    client_epochs : float, optional
        Local epochs summed over the retraining replies.
    client_rounds : int, optional
        Server rounds that asked at least one client to train, summed over
        requests (measured: a round of SE's shards in parallel counts once).
    comm_time_s : float, optional
        Modelled communication seconds (:func:`history.comm.transfer_seconds`).
    server_storage_bytes : int, optional
        Bytes of the history the framework read (0 for FR, RR).
    requests : list[RequestCost]
        Per request.
    warnings : list[str], optional
        Shard rounds without an accepted reply.
    expected : dict, optional
        SE: the paper's expected totals beside the measured ones (Sec. 4.2).
    clients_per_round : int, optional
        FR, RR: clients sampled per round after forgetting.
    noop : bool, optional
        True when every request was a no-op (no model was produced).
    modelled_wall_s : float, optional
        Modelled wall seconds of a real federation
        (:meth:`server_app.rounds.loop.CostMeter.round_wall_s`, summed).
    to_target : dict, optional
        FR, RR: :meth:`server_app.unlearning.target.TargetWatch.result` of the last request.
    rounds_to_target : int, optional
        FR, RR: first round whose test loss reached the original model's
        (absent when not reached in G rounds).
    rounds_replayed : int, optional
        SE: stored rounds replayed, summed over requests and impacted shards.
    replay : dict, optional
        SE: ``rounds_replayed``, ``rounds_from_round1`` (what replay from round 1
        would take), ``retrain_messages_saved``, ``refilled_slots`` (substitutes
        with ``replay-refill``) and the shards left unchanged.
    audit : dict[str, float]
        Membership-inference scores, written as ``mia_<metric>``.
    perplexity : float, optional
        exp(loss), for the character model.
    backdoor_asr : float, optional
        With ``backdoor-trigger``: attack success rate (SE: the impacted shard's
        model; FR, FE, RR: the single model).
    backdoor_asr_ensemble : float, optional
        SE: the ASR of the mean-softmax ensemble of its shard models.
    """

    accuracy: float | None = None
    loss: float | None = None
    shard_accuracy: list[float] | None = None
    retrain_compute_s: float | None = None
    retrain_wall_s: float | None = None
    client_epochs: float | None = None
    client_rounds: int | None = None
    comm_time_s: float | None = None
    server_storage_bytes: int | None = None
    requests: list[RequestCost] = field(default_factory=list)
    warnings: list[str] | None = None
    expected: dict | None = None
    clients_per_round: int | None = None
    noop: bool | None = None
    audit: dict[str, float] = field(default_factory=dict)
    perplexity: float | None = None
    modelled_wall_s: float | None = None
    to_target: dict | None = None
    rounds_to_target: int | None = None
    rounds_replayed: int | None = None
    replay: dict | None = None
    backdoor_asr: float | None = None
    backdoor_asr_ensemble: float | None = None

    set_backdoor = ModelScores.set_backdoor

    def retrained_shard_accuracy(self, shard_accuracy: list[float] | None = None
                                 ) -> float | None:
        """Mean test accuracy of the shards this framework retrained.

        The ensemble's accuracy can hide a broken shard (three good shards of four
        still vote right); this cannot.

        Parameters
        ----------
        shard_accuracy : list[float], optional
            Per-shard accuracies to average over the same shards instead of this
            framework's own, e.g. the original models' (same length).

        Returns
        -------
        float or None
            None for a single model (it would repeat ``accuracy``), when no
            shard was retrained, or when the lengths do not match.
        """
        own = self.shard_accuracy or []
        scores = own if shard_accuracy is None else shard_accuracy
        shards = sorted({s for r in self.requests for s in r.impacted_shards or []})
        if len(own) < 2 or len(scores) != len(own) or not shards \
                or shards[-1] >= len(own):
            return None
        return sum(scores[s] for s in shards) / len(shards)

    def to_json(self) -> dict:
        """The JSON dict (None fields left out, audit as ``mia_<metric>``)."""
        out = _to_json(dataclasses.replace(self, audit=None))
        out["requests"] = [r.to_json() for r in self.requests]
        out.update({f"mia_{k}": v for k, v in self.audit.items()})
        return out

    @classmethod
    def from_json(cls, data: dict) -> FrameworkSummary:
        """Read back :meth:`to_json`'s dict."""
        known = _known(cls, data)
        known["requests"] = [RequestCost.from_json(r) for r in data.get("requests", [])]
        return cls(**known, audit=_audit(data))


@dataclass
class UnlearningPlan:
    """The requests of the run (``unlearning``)."""

    requests: list[list[int]]
    noops: list[dict]
    mode: str

    def to_json(self) -> dict:
        """The JSON dict."""
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> UnlearningPlan:
        """Read back :meth:`to_json`'s dict."""
        return cls(**_known(cls, data))


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
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> StageSummary:
        """Read back :meth:`to_json`'s dict."""
        return cls(**_known(cls, data))


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
                block.perplexity = _perplexity(block.loss)

    def to_json(self) -> dict:
        """The JSON dict of summary.json (None fields left out)."""
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> RunSummary:
        """Read back :meth:`to_json`'s dict."""
        known = _known(cls, data)
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
