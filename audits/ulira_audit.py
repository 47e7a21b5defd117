"""U-LiRA in the shadow-model audit: is an unlearned model like one that never saw F.

With ``mia-unlearn-references`` = k (even, >= 6) the audit trains k references
as the run learns and then unlearns from each with the run's own rules:

- **shard-shaped** (for the original, SE and SE-R): a reference shard of as many
  clients as a run's shard, learned as a shard is (FedAvg, G rounds of
  ``clients-per-round / num-shards`` clients x L local epochs, the run's
  optimizer); f of its clients (the most forgotten clients of one of the run's
  shards) are forgotten;
- **federation-shaped** (for FE and FRec, built only when one of them runs): a
  shard of the baseline federation FE and FRec unlearn (with ``baseline-shards``
  = 1 the whole federation, ``clients-per-round`` a round), f = the most
  forgotten clients holding targets in one of its shards.

The unlearning: each method's own Flower strategy with the run's settings, as
a real request builds it, on the reference's stored history (the recipe the
ServerApp hands over, :class:`audits.run.ReferenceRecipe`: SE's and FE's
calibrated replay, SE-R's and FRec's server-side recovery). FR and RR retrain from
the initial model on the retained clients only: their model is a function of the
retained data and the seeds, so the game is at chance by construction and is not
run (``verification.mia.ulira.exact_by_construction``).

In each reference the f forgotten clients hold a random half of the pool of
targets (the forgotten clients' samples), filled up with shadow-pool samples
(:mod:`audits.mia_sets`) to a run's client size; the others hold
shadow-pool samples. References 2i and 2i + 1 forget complementary halves, so
each target was in k / 2 forget sets and never seen by the other k / 2
(:func:`audits.ulira.balanced_halves`).

Scores (:mod:`audits.ulira`), each with bootstrap intervals:
``ulira_game_*`` the game on the references, each scored with the Gaussians of
all but it and its complementary partner (unlearned vs never saw; original:
learned vs never saw, i.e. online LiRA on the references), and ``ulira_*`` the
run's real model on its forgotten samples, fit the same way, against the game's
negatives (a reference that never saw the sample).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from audits.lira import bootstrap_metrics, logit_confidence
from audits.mia_sets import MiaSets, split_rows
from audits.run import AuditedRun
from audits.ulira import (
    balanced_halves,
    challenge_scores,
    leave_one_out,
)
from task.device import resolve_device

Arrays = dict[str, np.ndarray]
"""A model's state: parameter name -> array."""
Part = tuple[torch.Tensor, torch.Tensor]
"""A client's samples (N, ...) and targets (N,)."""


@dataclass(frozen=True)
class ReferenceShape:
    """The references of one shape: their clients and their forgotten clients.

    Attributes
    ----------
    clients : int
        Clients a reference has.
    forgotten : int
        f, clients of a reference that hold the targets and are forgotten.
    per_round : int
        Clients a learning round.
    client_size : int
        Samples a client (a forgotten one: its share of the targets, filled up
        with shadow-pool samples).
    targets_per_client : int
        Most targets a forgotten client holds: ceil(half the pool / f).
    """

    clients: int
    forgotten: int
    per_round: int
    client_size: int
    targets_per_client: int

    def to_json(self) -> dict[str, int]:
        """``verification.mia.ulira.shapes`` entry."""
        return {"clients": self.clients, "forgotten_clients": self.forgotten,
                "clients_per_round": self.per_round, "client_size": self.client_size,
                "targets_per_client": self.targets_per_client}


def reference_shapes(run: AuditedRun, sets: MiaSets, shards: Sequence[Sequence[int]],
                     pool: int, client_size: int,
                     baseline_shards: Sequence[Sequence[int]] | None = None
                     ) -> dict[str, ReferenceShape]:
    """The shard shape and, when FE or FRec runs, the baseline federation's shape.

    Parameters
    ----------
    run : AuditedRun
        ``clients-per-round``, the partition, the references' recipe.
    sets : MiaSets
        The targets' owners (partition ids).
    shards : sequence of sequence of int
        The run's shards (SE's federation).
    pool : int
        Targets in the pool (even, > 0).
    client_size : int
        Samples a run's forgotten client holds.
    baseline_shards : sequence of sequence of int, optional
        The baseline federation's shards (FE, FRec); without them, one shard of
        every client that holds a target or none.
    """
    owners = list(np.unique(sets.owner))
    per_round = run.clients_per_round

    def shape(parts: Sequence[Sequence[int]]) -> ReferenceShape:
        f = max(1, max(int(np.isin(owners, list(s)).sum()) for s in parts))
        share = -(-(pool // 2) // f)
        return ReferenceShape(max(len(s) for s in parts), f, per_round // len(parts),
                              max(share, client_size), share)

    out = {"shard": shape(shards)}
    if run.references is not None and run.references.needs_federation:
        out["federation"] = shape(baseline_shards or [range(run.data.num_clients)])
    return out


@dataclass
class UliraReferences:
    """phi of the pool under each reference, learned and unlearned.

    Attributes
    ----------
    pool : numpy.ndarray, int64, shape (n,)
        Indices into ``MiaSets.target`` of the pool (even n).
    is_in : numpy.ndarray, bool, shape (k, n)
        Reference i's forget set held pool example j.
    learned : numpy.ndarray, float64, shape (k, n)
        phi under each shard-shaped reference's learned model.
    unlearned : dict of str -> numpy.ndarray, float64, shape (k, n)
        Framework -> phi under each reference after its unlearning.
    shapes : dict of str -> ReferenceShape
        ``"shard"`` and, for FE / FRec, ``"federation"``.
    """

    pool: np.ndarray
    is_in: np.ndarray
    learned: np.ndarray
    unlearned: dict[str, np.ndarray]
    shapes: dict[str, ReferenceShape]


def _reference_parts(shape: ReferenceShape, mine: np.ndarray, rng: np.random.Generator,
                     targets: Part, shadow: Part) -> list[Part]:
    """The clients of one reference: f with ``mine`` (+ shadow fill), then shadow ones."""
    owns = np.array_split(mine, shape.forgotten)
    fill = sum(shape.client_size - len(own) for own in owns)
    drawn = rng.choice(len(shadow[1]), shadow_need(shape, len(mine)), replace=False)
    fills, others = drawn[:fill], drawn[fill:]

    def rows(data: Part, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.from_numpy(idx)
        return data[0][i], data[1][i]

    cuts = np.cumsum([shape.client_size - len(own) for own in owns])[:-1]
    parts = []
    for own, extra in zip(owns, np.split(fills, cuts), strict=True):
        (x_a, y_a), (x_b, y_b) = rows(targets, own), rows(shadow, extra)
        parts.append((torch.cat([x_a, x_b]), torch.cat([y_a, y_b])))
    return parts + [rows(shadow, p)
                    for p in np.array_split(others, shape.clients - shape.forgotten)]


def shadow_need(shape: ReferenceShape, half: int) -> int:
    """Shadow-pool samples one reference of ``shape`` draws (``half`` targets in it)."""
    return shape.clients * shape.client_size - half


class ShadowPoolTooSmallError(ValueError):
    """The shadow pool cannot fill a reference's clients (U-LiRA is not run)."""


def train_references(run: AuditedRun, task, sets: MiaSets,
                     shards: Sequence[Sequence[int]], client_size: int = 0,
                     baseline_shards: Sequence[Sequence[int]] | None = None
                     ) -> UliraReferences:
    """Train ``mia-unlearn-references`` references of each shape; phi of the pool.

    Parameters
    ----------
    run : AuditedRun
        k = ``mia-unlearn-references``, the references' recipe (its frameworks),
        the seed.
    task : TaskData
        The images of the targets and of the shadow pool.
    sets : MiaSets
        Targets (the pool: all of them, an even count), their owners, the pool.
    shards : sequence of sequence of int
        The run's shards.
    client_size : int
        Samples a run's client holds (a forgotten reference client is filled
        up to it).
    baseline_shards : sequence of sequence of int, optional
        The baseline federation's shards (FE, FRec).

    Returns
    -------
    UliraReferences
        phi (k, n) of the pool under each reference, learned and unlearned by
        each framework of the recipe.

    Raises
    ------
    ShadowPoolTooSmallError
        The shadow pool cannot fill a reference's clients.
    """
    k, seed, recipe = run.audit.mia_unlearn_references, run.seed, run.references
    pool = np.arange(len(sets.target) - len(sets.target) % 2)
    is_in = balanced_halves(len(pool), k, seed)
    targets = split_rows(task, "train", sets.target[pool])
    shadow = split_rows(task, sets.shadow_split, sets.shadow)
    shapes = reference_shapes(run, sets, shards, len(pool), client_size,
                              baseline_shards)
    names = list(recipe.frameworks)
    need = max(shadow_need(s, len(pool) // 2) for s in shapes.values())
    if need > len(shadow[1]):
        raise ShadowPoolTooSmallError(
            f"a reference needs {need} shadow-pool samples and the pool has "
            f"{len(shadow[1])} ({sets.shadow_source}): fewer or smaller clients "
            "(num-clients, client-samples) need fewer")
    spec, device = run.task, resolve_device(run.device)

    def phi(state: Arrays) -> np.ndarray:
        model = spec.model(task.num_classes)
        model.load_state_dict({n: torch.from_numpy(v) for n, v in state.items()})
        return logit_confidence(spec.predict(model, targets[0], device=device),
                                targets[1].numpy())

    learned = np.empty(is_in.shape)
    unlearned = {n: np.empty(is_in.shape) for n in names}
    for tag, (label, shape) in enumerate(shapes.items()):
        rng = np.random.default_rng([seed, 0x0E1A + tag])
        for i in range(k):
            mine = rng.permutation(np.flatnonzero(is_in[i]))
            parts = _reference_parts(shape, mine, rng, targets, shadow)
            ref_seed = seed + 101 + 1000 * tag + i
            final, rounds = recipe.learn(task, parts, ref_seed, shape.per_round)
            if label == "shard":
                learned[i] = phi(final)
            for name in names:
                rule = recipe.rules[name]
                if rule.shape == label:
                    gone = rule.unlearn(task, parts, rounds, set(range(shape.forgotten)),
                                        ref_seed, rule.from_first)
                    unlearned[name][i] = phi(final if gone is None else gone)
    return UliraReferences(pool, is_in, learned, unlearned, shapes)


def ulira_scores(refs: UliraReferences, phi_real: np.ndarray, name: str,
                 seed: int) -> dict[str, object]:
    """The game on the references and the real model against its negatives.

    Parameters
    ----------
    refs : UliraReferences
        The references' phi.
    phi_real : numpy.ndarray, float, shape (n,)
        The run's model (each target's shard's) on the pool (NaN: not scored).
    name : str
        ``"original"`` (the learned shard-shaped references: online LiRA) or a
        framework of ``refs.unlearned``.
    seed : int
        Seeds the bootstrap.

    Returns
    -------
    dict
        ``ulira_game_*`` and ``ulira_*`` keys
        (:meth:`audits.lira.LowFprMetrics.to_audit`).
    """
    phi = refs.learned if name == "original" else refs.unlearned[name]
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
