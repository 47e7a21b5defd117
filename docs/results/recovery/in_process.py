"""A shard learned in process with its history, for the recovery experiments here.

What :mod:`estimator` needs to set SE-R's estimates beside the true updates: a
shard learned as the run learns it (FedAvg weighted by sample counts, the task's
``train`` with the run's optimizer), keeping each round's W^(g-1) and every
participant's update U, readable as a one-shard history
(:class:`ReferenceHistory`), and a client's update from any model
(:func:`local_update`). Moved here from the ServerApp when U-LiRA's references
moved to the methods' own strategies (``server_app/stages/references.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from server_app.config import RunConfig
from strategies.calibration import difference, weighted_step
from task.device import resolve_device

Arrays = dict[str, np.ndarray]
"""A model's state: parameter name -> array."""
Part = tuple[torch.Tensor, torch.Tensor]
"""A client's samples (N, ...) and targets (N,)."""


@dataclass
class RoundRecord:
    """One learning round of a reference shard: W^(g-1) and each participant's U."""

    start: Arrays
    updates: dict[int, Arrays]


def _arrays(model: torch.nn.Module) -> Arrays:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def local_update(cfg: RunConfig, task, start: Arrays, part: Part, epochs: float,
                 seed: int) -> Arrays:
    """U = w - W: ``epochs`` local epochs on ``part`` from ``start`` (the task's train).

    Parameters
    ----------
    cfg : RunConfig
        The task and the run's optimizer settings.
    task : TaskData
        ``num_classes`` for the model.
    start : dict
        W, layer name -> ndarray.
    part : (x, y)
        The client's inputs (n, ...) and int64 labels (n,).
    epochs : float
        Local epochs (fractions allowed, as the task's ``train`` takes them).
    seed : int
        Seeds the data order.

    Returns
    -------
    dict
        U, layer name -> ndarray (float32 for float layers).
    """
    spec, training = cfg.task(), cfg.training
    settings = replace(training.local_settings(cfg.seed), local_epochs=epochs)
    local = spec.model(task.num_classes)
    local.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in start.items()})
    settings.train(spec, local, part[0], part[1], seed=seed,
                   device=resolve_device(training.device))
    return difference(_arrays(local), start)


def learn_with_history(cfg: RunConfig, task, parts: Sequence[Part], seed: int,
                       per_round: int | None = None) -> tuple[Arrays, list[RoundRecord]]:
    """A reference learned as the run learns, with its stored history.

    G rounds of FedAvg weighted by sample counts; each round ``per_round``
    clients drawn with ``seed`` train L local epochs with the run's optimizer
    (the task's ``train``) from the current model W^(g-1); the client of index c
    in round g (from 0) trains with seed ``seed * 1000 + g * 100 + c``.

    Parameters
    ----------
    cfg : RunConfig
        The run's training settings and task.
    task : TaskData
        ``num_classes`` for the model.
    parts : sequence of (x, y)
        Each client's images (n_c, ...) and int64 classes (n_c,).
    seed : int
        Seeds the initial model, the draws and the local training.
    per_round : int, optional
        Clients a round (at most ``len(parts)``); default a shard's,
        ``clients-per-round / num-shards``.

    Returns
    -------
    (dict, list of RoundRecord)
        The final model W^G (layer name -> ndarray, the model's dtypes) and, per
        round, W^(g-1) and every participant's update (float32).
    """
    training = cfg.training
    torch.manual_seed(seed)
    state = _arrays(cfg.task().model(task.num_classes))
    if per_round is None:
        per_round = training.clients_per_round // training.num_shards
    per_round = min(len(parts), max(1, per_round))
    rng = np.random.default_rng(seed)
    rounds = []
    for rnd in range(training.num_rounds):
        chosen = sorted(int(c) for c in rng.choice(len(parts), per_round, replace=False))
        updates = {c: local_update(cfg, task, state, parts[c], training.local_epochs,
                                    learning_seed(seed, rnd, c)) for c in chosen}
        rounds.append(RoundRecord(state, updates))
        state = weighted_step(state, list(updates.values()),
                              [len(parts[c][1]) for c in chosen])
    return state, rounds


def learning_seed(seed: int, rnd: int, client: int) -> int:
    """Learning's seed of ``client`` in round ``rnd`` (from 0)."""
    return seed * 1000 + rnd * 100 + client


class ReferenceHistory:
    """A reference's rounds as a one-shard :class:`strategies.unlearning.HistoryReader`.

    Stored round t (from 1) is ``rounds[t - 1]``; n = the client's sample count.
    """

    def __init__(self, rounds: list[RoundRecord], parts: Sequence[Part]) -> None:
        self._rounds, self._sizes = rounds, [len(y) for _, y in parts]

    def rounds(self, shard: int) -> list[int]:
        """Stored rounds 1..G (``shard`` is ignored: one shard)."""
        return list(range(1, len(self._rounds) + 1))

    def participants(self, shard: int, rnd: int) -> list[tuple[int, int]]:
        """(client, sample count) of stored round ``rnd``, by client."""
        return [(c, self._sizes[c]) for c in sorted(self._rounds[rnd - 1].updates)]

    def update(self, shard: int, rnd: int, partition_id: int) -> Arrays:
        """U of ``partition_id`` in stored round ``rnd``."""
        return self._rounds[rnd - 1].updates[partition_id]
