"""What one unlearning framework did: ``frameworks.<name>`` of ``summary.json``.

:class:`FrameworkSummary` holds a framework's scores after forgetting
(:class:`ModelScores` for the learned model beside it), its costs and one
:class:`RequestCost` per request; :mod:`runstore.summary` holds the run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from runstore.summary.records import known_fields, to_json_dict


@dataclass
class RequestCost:
    """What one framework spent on one request (``frameworks.<F>.requests[k]``).

    A request whose clients were all forgotten before is a no-op: only
    ``request``, ``clients`` (empty) and ``noop`` are set. ``modelled_wall_s``,
    ``measured_train_s``, ``measured_wall_s``,
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
    wall_breakdown: dict | None = None
    measured_train_s: float | None = None
    measured_wall_s: float | None = None

    def to_json(self) -> dict:
        """The JSON dict (None fields left out)."""
        return to_json_dict(self)

    @classmethod
    def from_json(cls, data: dict) -> RequestCost:
        """Read back :meth:`to_json`'s dict (shard keys become ints again)."""
        out = cls(**known_fields(cls, data))
        if out.shard_compute_s is not None:
            out.shard_compute_s = {int(k): v for k, v in out.shard_compute_s.items()}
        return out


@dataclass
class ModelScores:
    """Test scores of one model, with its audit (``original``).

    ``backdoor_asr`` (the impacted shard's model) and ``backdoor_asr_ensemble``
    (the shard ensemble) are set with ``backdoor-trigger``;
    ``erased_label_accuracy`` and ``kept_label_accuracy`` with ``forget-labels``.
    """

    accuracy: float | None = None
    loss: float | None = None
    audit: dict[str, float] = field(default_factory=dict)
    perplexity: float | None = None
    backdoor_asr: float | None = None
    backdoor_asr_ensemble: float | None = None
    erased_label_accuracy: float | None = None
    kept_label_accuracy: float | None = None

    def set_backdoor(self, scores: dict[str, float]) -> None:
        """Set ``backdoor_asr`` (and ``backdoor_asr_ensemble`` if given)."""
        self.backdoor_asr = scores["backdoor_asr"]
        self.backdoor_asr_ensemble = scores.get("backdoor_asr_ensemble")

    def to_json(self) -> dict:
        """The JSON dict, the audit as flat ``mia_<metric>`` keys."""
        out = to_json_dict(dataclasses.replace(self, audit=None))
        out.update({f"mia_{k}": v for k, v in self.audit.items()})
        return out

    @classmethod
    def from_json(cls, data: dict) -> ModelScores:
        """Read back :meth:`to_json`'s dict."""
        return cls(**known_fields(cls, data), audit=_audit(data))


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
        (:meth:`server_app.rounds.loop.CostMeter.round_wall_s`, summed), from the
        run's cost model (summary.json ``cost_model``): the same whatever the
        machine's load.
    measured_train_s : float, optional
        Measured on this machine: the clients' training seconds (their replies'
        ``train-seconds``), the clients' part of ``retrain_compute_s``.
    measured_wall_s : float, optional
        Measured on this machine: ``modelled_wall_s``'s critical path with the
        measured training and server seconds (what ``modelled_wall_s`` was
        before the cost model; it moves with the machine's load).
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
    erased_label_accuracy, kept_label_accuracy : float, optional
        With ``forget-labels``: test accuracy on the erased labels' samples and
        on the others (``CentralEvaluator.label_accuracy``).
    wall_breakdown : dict, optional
        Where ``modelled_wall_s`` went, in seconds along each round's critical
        path: ``client_training_s``, ``transfer_s``, ``server_configure_s``
        (sampling, reading the stored history), ``server_aggregate_s``
        (aggregation, calibration), ``retrieval_s`` (coded: fetching and
        decoding slices); they sum to ``modelled_wall_s``. With ``rounds`` and
        ``client_rounds`` (:func:`server_app.unlearning.driver.wall_breakdown`).
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
    wall_breakdown: dict | None = None
    measured_train_s: float | None = None
    measured_wall_s: float | None = None

    erased_label_accuracy: float | None = None
    kept_label_accuracy: float | None = None

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
        out = to_json_dict(dataclasses.replace(self, audit=None))
        out["requests"] = [r.to_json() for r in self.requests]
        out.update({f"mia_{k}": v for k, v in self.audit.items()})
        return out

    @classmethod
    def from_json(cls, data: dict) -> FrameworkSummary:
        """Read back :meth:`to_json`'s dict."""
        known = known_fields(cls, data)
        known["requests"] = [RequestCost.from_json(r) for r in data.get("requests", [])]
        return cls(**known, audit=_audit(data))
