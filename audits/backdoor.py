"""Verification of forgetting: the backdoor the forgotten clients planted.

With ``backdoor-trigger`` > 0 the clients of ``forget-clients`` trained on
triggered, relabelled images (:mod:`task.backdoor`). Here the server measures,
for the original model and every framework's models, the attack success rate
(ASR) on the test images of the other classes, stamped with the trigger:

- ``backdoor_asr``: sharded models (the original, SE): the impacted shard's model
  (the shard holding the poisoned clients; the mean over impacted shards if
  several); unsharded models (FR, FE, RR, FE's own original): the single model;
- ``backdoor_asr_ensemble``: the mean-softmax ensemble of the S shard models,
  which may dilute a backdoor that only one shard learned.

With ``backdoor-phrase`` (a task with per-position targets, e.g. Tiny
Shakespeare) the poisoned clients wrote a phrase and its continuation into their
blocks (:mod:`task.text_backdoor`); :class:`TextBackdoorProbe` measures the share
of test contexts ending in the phrase whose greedy continuation is exactly the
continuation, under the same keys (the ensemble decodes with the mean of the
shard models' softmax outputs). :func:`backdoor_probe` picks the probe.

It also counts in how many learning rounds each forgotten client took part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord

from audits.run import AuditedRun
from task.backdoor import Backdoor, attack_success_rate, triggered_test_set
from task.data import TaskData
from task.device import resolve_device
from task.text_backdoor import (
    TextBackdoor,
    greedy_continuations,
    text_attack_success_rate,
    trigger_contexts,
)


class BackdoorProbe:
    """Measures the ASR of shard models on the triggered test set.

    Parameters
    ----------
    run : AuditedRun
        The run (its task, ``test-samples``, ``device``).
    task : TaskData
        The loaded data (its test set is stamped with the task's trigger).
    run_config : Mapping
        Flower's flat run config: ``backdoor-*`` and ``forget-clients``, read as
        the clients read them (:meth:`task.backdoor.Backdoor.from_run_config`).
    """

    def __init__(self, run: AuditedRun, task: TaskData,
                 run_config: Mapping[str, object]) -> None:
        self.backdoor = Backdoor.from_run_config(run_config)
        self.task = run.task
        self.device = resolve_device(run.device)
        cut = run.data.test_samples or None
        self.x = triggered_test_set(task.test_x[:cut], task.test_y[:cut], self.backdoor,
                                    self.task.stamp)
        self._model = self.task.model(task.num_classes)

    def _proba(self, arrays: ArrayRecord) -> np.ndarray:
        self._model.load_state_dict(arrays.to_torch_state_dict())
        return self.task.predict(self._model, self.x, device=self.device)

    def scores(self, models: Sequence[ArrayRecord], shards: Sequence[Sequence[int]]
               ) -> dict[str, float]:
        """ASR of ``models`` (one per shard of ``shards``), in [0, 1].

        Returns
        -------
        dict
            ``backdoor_asr`` (impacted shards' mean, or the single model's) and,
            with more than one model, ``backdoor_asr_ensemble``.
        """
        if len(models) != len(shards):
            raise ValueError(f"{len(models)} models for {len(shards)} shards")
        poisoned = set(self.backdoor.poisoned)
        probas = [self._proba(m) for m in models]
        target = self.backdoor.target
        impacted = [s for s, pids in enumerate(shards) if poisoned & set(pids)]
        if not impacted:
            raise ValueError(f"no shard holds the poisoned clients {sorted(poisoned)}")
        out = {"backdoor_asr": float(np.mean(
            [attack_success_rate(probas[s], target) for s in impacted]))}
        if len(models) > 1:
            out["backdoor_asr_ensemble"] = attack_success_rate(
                np.mean(probas, axis=0), target)
        return out

    def settings(self) -> dict:
        """The ``verification.backdoor`` block: the settings and the test set size."""
        b = self.backdoor
        return {"trigger": f"{b.trigger}x{b.trigger} white square, bottom-right",
                "trigger_pixels": b.trigger, "fraction": b.fraction, "target": b.target,
                "poisoned_clients": list(b.clients) + [p for p, _ in b.records],
                "poisoned_records": {str(p): len(ids) for p, ids in b.records},
                "triggered_test_images": len(self.x)}


class TextBackdoorProbe:
    """Measures the text backdoor's ASR of shard models on test contexts.

    Parameters
    ----------
    run : AuditedRun
        The run (its task, ``test-samples``, ``device``).
    task : TaskData
        The loaded data: its test blocks (int64 (N, T)), the first
        ``test-samples`` of them (all with 0), each cut to end in the phrase.
    run_config : Mapping
        Flower's flat run config: ``backdoor-phrase``, ``-continuation``,
        ``-fraction``, ``forget-clients``, read as the clients read them.
    """

    def __init__(self, run: AuditedRun, task: TaskData,
                 run_config: Mapping[str, object]) -> None:
        self.task = run.task
        self.backdoor = TextBackdoor.from_run_config(run_config, self.task.tokenize)
        self.device = resolve_device(run.device)
        cut = run.data.test_samples or None
        self.contexts = trigger_contexts(task.test_x[:cut], self.backdoor)
        self._classes = task.num_classes

    def _predictor(self, arrays: ArrayRecord):
        model = self.task.model(self._classes)
        model.load_state_dict(arrays.to_torch_state_dict())
        return lambda x: self.task.predict(model, x, device=self.device)

    def _asr(self, models: Sequence[ArrayRecord]) -> float:
        decoded = greedy_continuations([self._predictor(m) for m in models],
                                       self.contexts, len(self.backdoor.continuation))
        return text_attack_success_rate(decoded, self.backdoor.continuation)

    def scores(self, models: Sequence[ArrayRecord], shards: Sequence[Sequence[int]]
               ) -> dict[str, float]:
        """ASR of ``models`` (one per shard of ``shards``), in [0, 1].

        Returns
        -------
        dict
            ``backdoor_asr`` (the impacted shards' models, each decoding on its
            own, mean over them; or the single model's) and, with more than one
            model, ``backdoor_asr_ensemble`` (greedy decoding with the mean of
            every shard model's next-character probabilities).

        Raises
        ------
        ValueError
            ``models`` and ``shards`` of different lengths, or no shard holding
            a poisoned client.
        """
        if len(models) != len(shards):
            raise ValueError(f"{len(models)} models for {len(shards)} shards")
        poisoned = set(self.backdoor.clients)
        impacted = [s for s, pids in enumerate(shards) if poisoned & set(pids)]
        if not impacted:
            raise ValueError(f"no shard holds the poisoned clients {sorted(poisoned)}")
        out = {"backdoor_asr": float(np.mean([self._asr([models[s]]) for s in impacted]))}
        if len(models) > 1:
            out["backdoor_asr_ensemble"] = self._asr(models)
        return out

    def settings(self) -> dict:
        """The ``verification.backdoor`` block: the settings and the test set size."""
        b = self.backdoor
        phrase, continuation = b.text
        return {"kind": "text", "trigger": f"phrase {phrase!r}",
                "phrase": phrase, "continuation": continuation, "fraction": b.fraction,
                "target": continuation, "poisoned_clients": list(b.clients),
                "triggered_test_contexts": len(self.contexts)}


def backdoor_probe(run: AuditedRun, task: TaskData, run_config: Mapping[str, object]
                   ) -> BackdoorProbe | TextBackdoorProbe:
    """The run's probe: the text one with ``backdoor-phrase``, else the image one."""
    if run.audit.backdoor_phrase:
        return TextBackdoorProbe(run, task, run_config)
    return BackdoorProbe(run, task, run_config)


def participation(store, forget: Sequence[int], num_rounds: int) -> dict[str, int]:
    """Learning rounds (1..G) in which each client of ``forget`` took part.

    Parameters
    ----------
    store : history.TrainingHistory
        The learning stage's history (``participants(shard, round)``).
    forget : Sequence[int]
        Partition ids.
    num_rounds : int
        G.

    Returns
    -------
    dict
        ``{str(partition id): rounds}`` (JSON keys are strings).
    """
    shard_of = store.client_shard()
    out = {}
    for pid in forget:
        shard = shard_of[pid]
        out[str(pid)] = sum(
            any(p == pid for p, _ in store.participants(shard, g))
            for g in range(1, num_rounds + 1))
    return out

