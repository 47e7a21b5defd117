"""Superseded: U-LiRA's references are :mod:`server_app.stages.references`'s.

Kept only while the built-ins' former ``reference()`` hooks import it; both go
with the next remake of the results their modules shape (issue 53).

References learned and unlearned in process, as the run learns and unlearns.

For U-LiRA (:mod:`audits.ulira_audit`): a reference federation (or
shard) of given clients is learned with FedAvg and the run's local training (the
task's ``train``), keeping the history SE and SE-R read (each round's W^(g-1) and
every participant's update U); then it unlearns with SE's (FE's) calibrated
replay, :func:`se_unlearn`, or SE-R's (FRec's) server-side recovery,
:func:`recover`. No Flower messages: each client's training is a local call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from audits.ulira_audit import Arrays, Part
from server_app.config import RunConfig
from server_app.config.methods import MethodSettings
from strategies.calibration import (
    calibrate,
    difference,
    final_exact_rounds,
    plan_substitutes,
    weighted_step,
)
from strategies.recovery_replay import RecoveryReplay
from strategies.replay import ReplaySchedule
from task.device import resolve_device


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


def _first_round(rounds: list[RoundRecord], forget: set[int]) -> int | None:
    """The first round (from 0) a client of ``forget`` took part in, or None."""
    return next((g for g, r in enumerate(rounds) if forget & set(r.updates)), None)


def se_unlearn(cfg: RunConfig, own: MethodSettings, task, parts: Sequence[Part],
               rounds: list[RoundRecord], forget: set[int], seed: int,
               from_first_participation: bool = True) -> Arrays | None:
    """SE's (FE's) calibrated replay of one reference without the clients ``forget``.

    Parameters
    ----------
    cfg : RunConfig
        L and r (``retrain-ratio``), the training settings.
    own : MethodSettings
        The method's own settings (SE's ``calibration_final``, ``replay_refill``;
        FE's rule reads none).
    task : TaskData
        ``num_classes`` for the model.
    parts : sequence of (x, y)
        The clients' data, as given to :func:`learn_with_history`.
    rounds : list of RoundRecord
        Its history.
    forget : set of int
        Indices into ``parts`` of the forgotten clients.
    seed : int
        Seeds the retraining.
    from_first_participation : bool
        SE's rule (default); False: FedEraser's own, from round 1.

    Returns
    -------
    dict or None
        The unlearned model (layer name -> ndarray).

    From the first round p a forgotten client took part in (FE: round 1):
    W'^(p-1) = W^(p-1); round p applies the retained participants' stored
    updates (paper eq. 2); each later round's retained participants train L / r
    epochs from W'^(g-1) and their new updates get the stored norms, layer by
    layer (eq. 3, :func:`strategies.calibration.calibrate`); with SE's rule the
    last ``calibration-final`` rounds train L epochs, uncalibrated. With SE's rule
    and ``replay-refill``, each round's forgotten participants' slots go to
    substitutes (:func:`strategies.calibration.refill_slots` over the reference's
    clients), who train L epochs, uncalibrated. Rounds left without a client
    are skipped. None when no client of ``forget`` took
    part and the rule is SE's: the model is then unchanged (FE replays anyway).
    """
    first = _first_round(rounds, forget)
    if first is None and from_first_participation:
        return None
    first = first if from_first_participation else 0  # FE replays from round 1
    state = rounds[first].start
    epochs = cfg.training.local_epochs / cfg.unlearning.retrain_ratio
    final = own.calibration_final if from_first_participation else 0  # SE's
    refill = from_first_participation and own.replay_refill
    drawn = plan_substitutes(ReferenceHistory(rounds, parts), 0, range(1, len(rounds) + 1),
                             range(len(parts)) if refill else None, forget, seed)
    substitutes = [drawn.get(g + 1, []) for g in range(len(rounds))]  # as SE-R's
    exact = {first + k - 1 for k in final_exact_rounds(
        [bool(set(r.updates) - forget or substitutes[g])
         for g, r in enumerate(rounds) if g >= first], final)}
    full = cfg.training.local_epochs  # L: exact rounds and substitutes

    def train(c: int, g: int, n_epochs: float) -> Arrays:
        return local_update(cfg, task, state, parts[c], n_epochs,
                            seed * 1000 + g * 100 + c + 50)

    for g in range(first, len(rounds)):
        kept = {c: u for c, u in rounds[g].updates.items() if c not in forget}
        if g == first:  # eq. 2: the stored updates
            new = list(kept.values())
        elif g in exact:  # calibration-final: L epochs, not calibrated
            new = [train(c, g, full) for c in kept]
        else:
            new = [calibrate(u, train(c, g, epochs)) for c, u in kept.items()]
        new += [train(c, g, full) for c in substitutes[g]]
        clients = [*kept, *substitutes[g]]
        if clients:
            state = weighted_step(state, new, [len(parts[c][1]) for c in clients])
    return state


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


def recover(cfg: RunConfig, own: MethodSettings, task, parts: Sequence[Part],
            rounds: list[RoundRecord], forget: set[int], seed: int,
            from_first_participation: bool = True) -> Arrays | None:
    """SE-R's (FRec's) server-side recovery of one reference without ``forget``.

    :class:`strategies.recovery_replay.RecoveryReplay` with the method's own
    schedule over the reference's history (SE-R's rule with its ``refill``:
    substitutes in the forgotten slots, and its ``estimates``); a client asked
    to train (exact round, an abnormal estimate, or a substitute) trains L local
    epochs from W'^(k-1) with the seed it had in that learning round, as the
    run's clients do.

    Parameters
    ----------
    cfg, task, parts, rounds, forget, seed
        As :func:`se_unlearn` (``seed`` as given to :func:`learn_with_history`).
    own : MethodSettings
        SE-R's or FRec's own settings (``schedule()``; SE-R's ``refill``).
    from_first_participation : bool
        SE-R's rule (default); False: FedRecover's own, from round 1.

    Returns
    -------
    dict or None
        The recovered model; None when no client of ``forget`` took part.
    """
    first = _first_round(rounds, forget)
    if first is None:
        return None
    history = ReferenceHistory(rounds, parts)
    state = rounds[first if from_first_participation else 0].start
    refill = from_first_participation and own.refill
    replay = RecoveryReplay(history, 0, forget, state, ReplaySchedule(
        **own.schedule(), from_first_participation=from_first_participation,
        refill=refill, refill_seed=seed), members=range(len(parts)))
    for k in range(1, replay.num_rounds + 1):
        rnd = replay.stored_round(k) - 1
        exact = {c: local_update(cfg, task, state, parts[c], cfg.training.local_epochs,
                                  learning_seed(seed, rnd, c))
                 for c, _ in replay.begin(k, state)}
        new = replay.finish(k, exact, {c: len(parts[c][1]) for c in exact})
        state = state if new is None else new
    return state
