"""U-LiRA's references, learned and unlearned by the run's own Flower strategies.

A reference is a small federation of the audit's clients, each holding the
samples :mod:`audits.ulira_audit` gives it (targets and shadow-pool samples), on
an in-process :class:`ReferenceGrid`: node ``c + 1`` holds client c's samples and
answers a training message with :func:`task.local_training.train_reply`, the
function a run's ClientApp answers with. The reference learns as a shard of the
run learns (:func:`learn_reference`: the run's stock shard strategy,
:func:`server_app.stages.learn.stage_strategy`, through a round loop into its own
history store, :func:`server_app.rounds.learning.run_learning`); a method then
unlearns it with the strategy it runs on a real request
(:func:`unlearn_reference`: :func:`server_app.unlearning.frameworks.build_framework`
and the round loop), so U-LiRA tests the method as shipped, not a second
implementation of it. :func:`recipe` hands both to the audit
(:class:`audits.run.ReferenceRecipe`) for every framework of the run that is not
exact.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid

from audits.run import ReferenceRecipe, Rule
from history import HistoryStore
from server_app.config import RunConfig
from server_app.rounds.federation import Federation
from server_app.rounds.learning import run_learning
from server_app.rounds.loop import RoundLoop, RoundPlan
from server_app.run.context import train_config
from server_app.stages.learn import stage_strategy
from server_app.unlearning.frameworks import Stage, build_framework
from task.device import resolve_device
from task.local_training import train_reply

Part = tuple[torch.Tensor, torch.Tensor]
"""A reference client's inputs (n, ...) and int64 targets (n,)."""
TRAINING = ("train", "train.unlearn")
"""The message types a reference client answers (learning, unlearning)."""


class ReferenceGrid(Grid):
    """A Grid whose nodes are the reference's clients, trained in this process.

    Parameters
    ----------
    task : Task
        The run's task (model, local training).
    parts : sequence of (x, y)
        Client c's samples; its node id is ``c + 1``.
    num_classes : int
        Classes of the model.
    device : str
        Where the clients train (``auto``, ``cpu``, ``cuda[:N]``).

    ``sent`` logs every answered message as (node id, message type).
    """

    def __init__(self, task, parts: Sequence[Part], num_classes: int,
                 device: str = "cpu") -> None:
        self._task, self._parts, self._classes = task, list(parts), num_classes
        self._device = resolve_device(device)
        self._pending: dict[str, list[Message]] = {}
        self.sent: list[tuple[int, str]] = []

    @property
    def run(self):  # noqa: D102 - Grid API
        return getattr(self, "_run", None)

    def set_run(self, run):  # noqa: D102 - Grid API
        self._run = run

    def create_message(self, content, message_type, dst_node_id, group_id,  # noqa: D102
                       ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> list[int]:
        """Node ``c + 1`` for each client c."""
        return list(range(1, len(self._parts) + 1))

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Answer now; keep each reply for :meth:`pull_messages`."""
        ids = []
        for message in messages:
            ids.append(f"reference-{len(self.sent)}")
            self._pending[ids[-1]] = self.send_and_receive([message])
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies to pushed messages (each returned once)."""
        return [r for mid in message_ids for r in self._pending.pop(mid, [])]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        """Each client trains on its samples from the model it received.

        Raises
        ------
        ValueError
            A message of another type than :data:`TRAINING`, or to no client.
        """
        return [self._answer(m) for m in messages]

    def _answer(self, message: Message) -> Message:
        node, kind = message.metadata.dst_node_id, message.metadata.message_type
        if kind not in TRAINING or not 1 <= node <= len(self._parts):
            raise ValueError(f"a reference client answers {', '.join(TRAINING)} "
                             f"messages to nodes 1..{len(self._parts)}, not {kind!r} "
                             f"to node {node}")
        self.sent.append((node, kind))
        model = self._task.model(self._classes)
        model.load_state_dict(message.content["arrays"].to_torch_state_dict())
        x, y = self._parts[node - 1]
        return train_reply(message, x, y, model, self._task, self._device,
                           partition_id=node - 1,
                           phase="unlearn" if kind == "train.unlearn" else "learn")


@dataclass
class LearnedReference:
    """A reference after learning: what a method's unlearning starts from.

    Attributes
    ----------
    stage : Stage
        The learned stage a method builds its framework on: the run's config
        with the reference's seed and clients a round, the reference as both SE's
        (one shard) and the baseline federation, its history store, its final
        model and W^0.
    loop : RoundLoop
        The reference's round loop (its :class:`ReferenceGrid`).
    """

    stage: Stage
    loop: RoundLoop

    @property
    def grid(self) -> ReferenceGrid:
        """The reference's clients."""
        return self.loop.grid


def reference_config(cfg: RunConfig, seed: int, per_round: int) -> RunConfig:
    """The run's config for a reference: its ``seed``, ``per_round`` clients a round.

    One shard: :func:`stage_strategy` samples ``clients-per-round / S`` clients a
    round, so the reference's ``clients-per-round`` is ``per_round`` with S = 1.
    """
    training = dataclasses.replace(cfg.training, clients_per_round=per_round,
                                   num_shards=1)
    return dataclasses.replace(cfg, seed=seed, training=training)


def learn_reference(cfg: RunConfig, task_data, parts: Sequence[Part], seed: int,
                    per_round: int) -> tuple[dict[str, np.ndarray], LearnedReference]:
    """A reference learned as a shard of the run ``cfg`` learns, with its history.

    G rounds of the run's shard strategy over ``parts``' clients, ``per_round`` a
    round (at most ``len(parts)``), each client training with the run's local
    settings (:func:`train_config`, seeded by ``seed``) from W^0, the task's
    model initialised under ``torch.manual_seed(seed)``. The stored shard models
    are pruned as the run prunes its own (with ``storage = "coded"``: W^0 and
    the last only); the updates are kept unquantised. The history lives in a
    temporary folder, removed when the returned reference is freed (or when
    learning fails).

    Parameters
    ----------
    cfg : RunConfig
        The run's settings (task, training, methods).
    task_data : TaskData
        ``num_classes`` for the model.
    parts : sequence of (x, y)
        Each client's samples (n_c, ...) and int64 targets (n_c,), n_c >= 1.
    seed : int
        Seeds W^0, the sampling and the clients' local training.
    per_round : int
        Clients a round (>= 1).

    Returns
    -------
    (dict, LearnedReference)
        W^G (parameter name -> ndarray) and the learned reference.
    """
    per_round = min(len(parts), max(1, per_round))
    ref = reference_config(cfg, seed, per_round)
    task = cfg.task()
    torch.manual_seed(seed)
    initial = ArrayRecord(task.model(task_data.num_classes).state_dict())
    grid = ReferenceGrid(task, parts, task_data.num_classes, cfg.training.device)
    federation = Federation({c: c + 1 for c in range(len(parts))},
                            [list(range(len(parts)))],
                            {c: len(y) for c, (_, y) in enumerate(parts)})
    loop = RoundLoop(grid, partition_of=federation.partition_of,
                     samples=federation.samples)
    folder = Path(tempfile.mkdtemp(prefix="se-reference."))
    store = HistoryStore.create(folder / "history", federation.shard_of, num_shards=1)
    config = train_config(ref, "")
    strategy = stage_strategy(ref, federation.shards, list(federation.node_of),
                              federation.node_of)
    try:
        result = run_learning(loop, strategy, federation, [initial], RoundPlan(
            ref.training.num_rounds, config, "reference"), store)
        # the models a replay may start from, as the run keeps them: a coded
        # history keeps W^0 and the last model only (its updates are not
        # quantised here)
        store.prune_models(None if cfg.storage.coded
                           else cfg.unlearning.calibration_interval)
        store.mark_complete()
    except BaseException:
        _remove(store, folder)
        raise
    learned = LearnedReference(
        Stage(ref, federation, federation, store, store, result.models, initial, config),
        loop)
    weakref.finalize(learned, _remove, store, folder)
    return _arrays(result.models[0]), learned


def _remove(store: HistoryStore, folder: Path) -> None:
    store.close()
    shutil.rmtree(folder, ignore_errors=True)


def _arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def unlearn_reference(name: str, learned: LearnedReference, forgotten: Iterable[int]
                      ) -> dict[str, np.ndarray] | None:
    """The method ``name`` unlearns the clients ``forgotten`` from ``learned``.

    The framework a request to the run builds (:func:`build_framework` on the
    reference's stage), run through the reference's round loop.

    Returns
    -------
    dict or None
        The unlearned model (parameter name -> ndarray); None when the method
        runs no round and starts from the learned model (no forgotten client
        ever trained: the learned model stands).

    Raises
    ------
    ValueError
        ``name`` is no framework, or its builder refuses the reference.
    """
    framework = build_framework(name, learned.stage, set(forgotten))
    if framework.num_rounds == 0:  # its start model stands: the learned one, or not
        start = _arrays(framework.initial[0])
        learned_model = _arrays(learned.stage.sharded_models[0])
        same = all(np.array_equal(start[k], learned_model[k]) for k in learned_model)
        return None if same else start
    models, _ = learned.loop.run(framework.strategy, framework.initial, RoundPlan(
        framework.num_rounds, learned.stage.train_config, f"reference {name}"))
    return _arrays(models[0])


def recipe(cfg: RunConfig) -> ReferenceRecipe:
    """How U-LiRA's references learn and unlearn as the run ``cfg`` does.

    Every framework of the run that U-LiRA references
    (:meth:`~server_app.config.methods.UnlearningMethod.is_referenced`: by
    default each that is not exact) gets a rule: a method on SE's
    shards is referenced by shard-shaped references, one on the baseline
    federation by federation-shaped ones; each unlearns with its own strategy
    (:func:`unlearn_reference`).
    """
    unlearning = cfg.unlearning
    rules = {m.name: Rule("federation" if m.on_baseline else "shard",
                          _unlearner(m.name), not m.on_baseline)
             for m in unlearning.method_infos if m.is_referenced()}
    training = cfg.training
    text = (f"{training.shard_strategy}, {training.num_rounds} rounds x "
            f"{training.local_epochs} local epochs, the run's clients' training; "
            f"each of {', '.join(rules) or 'no framework'} unlearns with its own "
            "strategy and settings")
    return ReferenceRecipe(
        learn=lambda task, parts, seed, per_round: learn_reference(
            cfg, task, parts, seed, per_round),
        rules=rules, frameworks=tuple(rules),
        exact=tuple(unlearning.with_fields(exact=True)), text=text)


def _unlearner(name: str):
    """``unlearn(task, parts, learned, forgotten, seed, from_first)`` of ``name``."""
    def unlearn(task, parts, learned, forgotten, seed, from_first):
        return unlearn_reference(name, learned, forgotten)
    return unlearn
