"""U-LiRA in the shadow-model audit: is SE's unlearned shard like one that never saw F.

With ``mia-unlearn-references`` = k (even, >= 6) the audit trains k reference
shards as the run trains a shard (FedAvg, G rounds of ``clients-per-round /
num-shards`` clients x L local epochs, the run's optimizer) and then unlearns
from each, with SE's calibrated retraining (paper eq. 2-3, FedEraser's rule,
:mod:`strategies.calibration`: the replay from the forgotten clients' first
round, retained clients retraining L / r epochs, their stored norms kept). Each
reference shard has as many clients as a run's shard; f of them (the most
forgotten clients of one of the run's shards) hold a random half of the pool of
targets, the forgotten clients' samples, and are forgotten; the others hold
shadow-pool samples (:mod:`server_app.evaluation.mia_sets`). References 2i and
2i + 1 forget complementary halves, so each target was in k / 2 forget sets and
never seen by the other k / 2 (:func:`server_app.evaluation.ulira.balanced_halves`).

Scores (:mod:`server_app.evaluation.ulira`), each with bootstrap intervals:
``ulira_game_*`` the game on the references, each scored with the Gaussians of
all but it and its complementary partner (SE: unlearned vs never saw; original:
learned vs never saw, i.e. online LiRA on the references), and ``ulira_*`` the
run's real model on its forgotten samples, fit the same way, against the game's
negatives (a reference that never saw the sample). Only SE is referenced: FE and
RR unlearn the unsharded federation and would need references of that shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from server_app.config import RunConfig
from server_app.evaluation.lira import bootstrap_metrics, logit_confidence
from server_app.evaluation.mia_sets import MiaSets, split_rows
from server_app.evaluation.ulira import (
    balanced_halves,
    challenge_scores,
    leave_one_out,
)
from strategies.calibration import calibrate, difference, weighted_step
from task.device import resolve_device

Arrays = dict[str, np.ndarray]
Part = tuple[torch.Tensor, torch.Tensor]


@dataclass
class RoundRecord:
    """One learning round of a reference shard: W^(g-1) and each participant's U."""

    start: Arrays
    updates: dict[int, Arrays]


def _arrays(model: torch.nn.Module) -> Arrays:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def _local_update(cfg: RunConfig, task, start: Arrays, part: Part, epochs: float,
                  seed: int) -> Arrays:
    """U = w - W: ``epochs`` local epochs on ``part`` from ``start`` (the task's train)."""
    spec, training = cfg.task(), cfg.training
    local = spec.model(task.num_classes)
    local.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in start.items()})
    spec.train(local, part[0], part[1], epochs=epochs, batch_size=training.batch_size,
               lr=training.lr, momentum=training.momentum, proximal_mu=0.0, seed=seed,
               grad_transform=None, optimizer=training.optimizer,
               device=resolve_device(training.device))
    return difference(_arrays(local), start)


def learn_with_history(cfg: RunConfig, task, parts: Sequence[Part], seed: int
                       ) -> tuple[Arrays, list[RoundRecord]]:
    """A reference shard learned as the run's shards, with its stored history.

    G rounds of FedAvg weighted by sample counts; each round ``clients-per-round /
    num-shards`` clients drawn with ``seed`` train L local epochs with the run's
    optimizer (the task's ``train``) from the current model W^(g-1).

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

    Returns
    -------
    (dict, list of RoundRecord)
        The final model W^G (layer name -> ndarray, the model's dtypes) and, per
        round, W^(g-1) and every participant's update (float32).
    """
    training = cfg.training
    torch.manual_seed(seed)
    state = _arrays(cfg.task().model(task.num_classes))
    per_round = min(len(parts), max(1, training.clients_per_round // training.num_shards))
    rng = np.random.default_rng(seed)
    rounds = []
    for rnd in range(training.num_rounds):
        chosen = sorted(int(c) for c in rng.choice(len(parts), per_round, replace=False))
        updates = {c: _local_update(cfg, task, state, parts[c], training.local_epochs,
                                    seed * 1000 + rnd * 100 + c) for c in chosen}
        rounds.append(RoundRecord(state, updates))
        state = weighted_step(state, list(updates.values()),
                              [len(parts[c][1]) for c in chosen])
    return state, rounds


def se_unlearn(cfg: RunConfig, task, parts: Sequence[Part], rounds: list[RoundRecord],
               forget: set[int], seed: int) -> Arrays | None:
    """SE's calibrated replay of one shard without the clients ``forget``.

    Parameters
    ----------
    cfg : RunConfig
        L and r (``retrain-ratio``), the training settings.
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

    Returns
    -------
    dict or None
        The unlearned model (layer name -> ndarray).

    From the first round p a forgotten client took part in: W'^(p-1) = W^(p-1);
    round p applies the retained participants' stored updates (paper eq. 2);
    each later round's retained participants train L / r epochs from W'^(g-1)
    and their new updates get the stored norms, layer by layer (eq. 3,
    :func:`strategies.calibration.calibrate`). Rounds left without a retained
    participant are skipped. None when no client of ``forget`` took part: as in
    SE, the shard is then unchanged.
    """
    first = next((g for g, r in enumerate(rounds) if forget & set(r.updates)), None)
    if first is None:
        return None
    state = rounds[first].start
    epochs = cfg.training.local_epochs / cfg.unlearning.retrain_ratio
    for g in range(first, len(rounds)):
        kept = {c: u for c, u in rounds[g].updates.items() if c not in forget}
        if not kept:
            continue
        new = list(kept.values()) if g == first else [
            calibrate(u, _local_update(cfg, task, state, parts[c], epochs,
                                       seed * 1000 + g * 100 + c + 50))
            for c, u in kept.items()]
        state = weighted_step(state, new, [len(parts[c][1]) for c in kept])
    return state


@dataclass
class UliraReferences:
    """phi of the pool under each reference, learned and unlearned.

    Attributes
    ----------
    pool : numpy.ndarray, int64, shape (n,)
        Indices into ``MiaSets.target`` of the pool (even n).
    is_in : numpy.ndarray, bool, shape (k, n)
        Reference i's forget set held pool example j.
    learned, unlearned : numpy.ndarray, float64, shape (k, n)
        phi under each reference's learned and SE-unlearned model.
    forgotten_clients, client_size, shard_clients : int
        f, samples a forgotten client, clients a reference shard.
    """

    pool: np.ndarray
    is_in: np.ndarray
    learned: np.ndarray
    unlearned: np.ndarray
    forgotten_clients: int
    client_size: int
    shard_clients: int


def train_references(cfg: RunConfig, task, sets: MiaSets,
                     shards: Sequence[Sequence[int]]) -> UliraReferences:
    """Train ``mia-unlearn-references`` reference shards; phi of the pool under each.

    Parameters
    ----------
    cfg : RunConfig
        k = ``mia-unlearn-references``, the recipe, the seed.
    task : TaskData
        The images of the targets and of the shadow pool.
    sets : MiaSets
        Targets (the pool: all of them, an even count), their owners, the pool.
    shards : sequence of sequence of int
        The run's shards: f, the most forgotten clients of one shard, and the
        clients a reference shard has.

    Returns
    -------
    UliraReferences
        phi (k, n) of the pool under each reference, learned and unlearned.
    """
    k, seed = cfg.audit.mia_unlearn_references, cfg.seed
    f = max(int(np.isin(np.unique(sets.owner), list(s)).sum()) for s in shards)
    size = max(len(s) for s in shards)
    pool = np.arange(len(sets.target) - len(sets.target) % 2)
    is_in = balanced_halves(len(pool), k, seed)
    x_t, y_t = split_rows(task, "train", sets.target[pool])
    x_s, y_s = split_rows(task, sets.shadow_split, sets.shadow)
    n_c = len(pool) // 2 // f
    rng = np.random.default_rng([seed, 0x0E1A])
    spec, device = cfg.task(), resolve_device(cfg.training.device)
    learned, unlearned = np.empty(is_in.shape), np.empty(is_in.shape)
    for i in range(k):
        mine = rng.permutation(np.flatnonzero(is_in[i]))
        other = rng.choice(len(y_s), (size - f) * n_c, replace=False)
        parts = [(x_t[torch.from_numpy(p)], y_t[torch.from_numpy(p)])
                 for p in np.array_split(mine, f)]
        parts += [(x_s[torch.from_numpy(p)], y_s[torch.from_numpy(p)])
                  for p in np.array_split(other, size - f)]
        final, rounds = learn_with_history(cfg, task, parts, seed + 101 + i)
        gone = se_unlearn(cfg, task, parts, rounds, set(range(f)), seed + 101 + i)
        gone = final if gone is None else gone
        for out, state in ((learned, final), (unlearned, gone)):
            model = spec.model(task.num_classes)
            model.load_state_dict({n: torch.from_numpy(v) for n, v in state.items()})
            out[i] = logit_confidence(spec.predict(model, x_t, device=device), y_t.numpy())
    return UliraReferences(pool, is_in, learned, unlearned, f, n_c, size)


def ulira_scores(refs: UliraReferences, phi_real: np.ndarray, unlearned: bool,
                 seed: int) -> dict[str, object]:
    """The game on the references and the real model against its negatives.

    Parameters
    ----------
    refs : UliraReferences
        The references' phi.
    phi_real : numpy.ndarray, float, shape (n,)
        The run's model (each target's shard's) on the pool (NaN: not scored).
    unlearned : bool
        Use the SE-unlearned references (for SE) or the learned ones (for the
        original: online LiRA).
    seed : int
        Seeds the bootstrap.

    Returns
    -------
    dict
        ``ulira_game_*`` and ``ulira_*`` keys
        (:meth:`server_app.evaluation.lira.LowFprMetrics.to_audit`).
    """
    phi = refs.unlearned if unlearned else refs.learned
    positive, negative = leave_one_out(phi, refs.is_in)
    real = challenge_scores(phi_real, phi, refs.is_in)
    out = bootstrap_metrics(positive, negative, seed=seed).to_audit("ulira_game_")
    out.update(bootstrap_metrics(real[~np.isnan(real)], negative, seed=seed)
               .to_audit("ulira_"))
    return out


def real_phi(sets: MiaSets, refs: UliraReferences, task,
             proba: Callable[[int, torch.Tensor], np.ndarray],
             shards: Sequence[Sequence[int]]) -> np.ndarray:
    """The pool's phi under the real model of each target's shard.

    Parameters
    ----------
    sets : MiaSets
        Targets and their owners.
    refs : UliraReferences
        The pool (indices into ``sets.target``).
    task : TaskData
        The targets' images.
    proba : callable
        ``proba(s, x) -> (N, C)``: shard s's model on images x.
    shards : sequence of sequence of int
        The model's shards (partition ids).

    Returns
    -------
    numpy.ndarray, float64, shape (n,)
        NaN where a target's client is in no shard.
    """
    out = np.full(len(refs.pool), np.nan)
    owner = sets.owner[refs.pool]
    x, y = split_rows(task, "train", sets.target[refs.pool])
    for s, pids in enumerate(shards):
        mine = np.flatnonzero(np.isin(owner, list(pids)))
        if mine.size:
            i = torch.from_numpy(mine)
            out[mine] = logit_confidence(proba(s, x[i]), y[i].numpy())
    return out
