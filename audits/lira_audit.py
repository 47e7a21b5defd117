"""Offline LiRA in the shadow-model audit: per example and per forgotten client.

With ``mia-references`` = k >= 2 (and ``mia-shadows`` >= 1) the audit's shadow
models double as LiRA's reference models (Carlini et al., IEEE S&P 2022; the
scores: :mod:`audits.lira`): each is a shadow shard trained with
the run's recipe on a random part of the shadow pool, data disjoint from every
client, target and non-member (:mod:`audits.mia_sets`), so every
one of them is an OUT model for every example scored. That is the *offline*
variant: no reference model trains on a target. The online variant (reference
models on random halves of a pool including the targets, half of them IN for
each target) would need 2k federations with the forgotten clients' data in half
of them; the offline one reuses the shadows, asks nothing of the targets, and
keeps the audit's sets disjoint.

Per model: phi of the targets (forgotten clients' samples) and of LiRA's
non-members (``mia-nonmembers``, r = ceil(N / n) of each target's class), each
under its client's shard model (sharded: the impacted shard's; unsharded: the
single model), scored against the references' Gaussians. Client level: each
forgotten client's mean score against pseudo-clients of non-members, each with
one non-member of every target of one forgotten client (its size and classes),
scored by that client's shard model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from audits.lira import (
    BOOTSTRAP,
    LEVEL,
    LOW_FPRS,
    MIN_FALSE_POSITIVES,
    PER_EXAMPLE_VARIANCE,
    bootstrap_metrics,
    empirical_pvalues,
    fit_out,
    fpr_label,
    group_means,
    logit_confidence,
    offline_score,
)
from audits.mia_sets import MiaSets, split_rows

#: ``proba(s, x) -> (N, C)``: the evaluated model of shard s on images x.
ShardProba = Callable[[int, torch.Tensor], np.ndarray]


@dataclass(frozen=True)
class LiraSamples:
    """The examples LiRA scores: the targets and their class-matched non-members.

    Attributes
    ----------
    x_target, y_target : torch.Tensor, shapes (n, ...), (n,)
        The targets' images and classes.
    owner : numpy.ndarray, int64, shape (n,)
        The forgotten client of each target.
    x_non, y_non : torch.Tensor, shapes (n_v, ...), (n_v,)
        LiRA's non-members.
    non_owner : numpy.ndarray, int64, shape (n_v,)
        The client of the target each non-member is matched to (its shard's
        model scores it).
    clients : list of numpy.ndarray
        Per forgotten client (sorted ids), the indices of its targets.
    pseudo : list of numpy.ndarray
        Per pseudo-client, the indices of its non-members (complete ones only).
    """

    x_target: torch.Tensor
    y_target: torch.Tensor
    owner: np.ndarray
    x_non: torch.Tensor
    y_non: torch.Tensor
    non_owner: np.ndarray
    clients: list[np.ndarray]
    pseudo: list[np.ndarray]

    @classmethod
    def from_sets(cls, task, sets: MiaSets) -> LiraSamples:
        """The rows of ``sets`` (``lira_partner`` (n, r)) as tensors and groups."""
        partner = sets.lira_partner
        n, r = partner.shape
        flat = partner.ravel()
        valid = flat >= 0
        position = np.cumsum(valid) - 1  # index among the valid non-members
        clients, pseudo = [], []
        for p in np.unique(sets.owner):
            mine = np.flatnonzero(sets.owner == p)
            clients.append(mine)
            for j in range(r):
                cells = mine * r + j
                if valid[cells].all():
                    pseudo.append(position[cells])
        x_t, y_t = split_rows(task, "train", sets.target)
        x_n, y_n = split_rows(task, sets.heldout_split, flat[valid])
        return cls(x_t, y_t, sets.owner, x_n, y_n, np.repeat(sets.owner, r)[valid],
                   clients, pseudo)


def _phi(proba: Callable[[torch.Tensor], np.ndarray], x: torch.Tensor,
         y: torch.Tensor) -> np.ndarray:
    return logit_confidence(proba(x), y.numpy()) if len(y) else np.zeros(0)


class LiraAudit:
    """Offline LiRA of the targets and the forgotten clients, for any model.

    Parameters
    ----------
    samples : LiraSamples
        The targets, non-members and groups.
    references : sequence of callables
        Per reference model, ``proba(x) -> (N, C)`` softmax outputs (k >= 2).
    seed : int
        Seeds the bootstrap intervals.
    """

    def __init__(self, samples: LiraSamples,
                 references: Sequence[Callable[[torch.Tensor], np.ndarray]],
                 seed: int = 0) -> None:
        self.samples, self.seed = samples, seed
        s = samples
        phi = np.stack([np.concatenate([_phi(p, s.x_target, s.y_target),
                                        _phi(p, s.x_non, s.y_non)]) for p in references])
        self.k = len(references)
        self.per_example = self.k >= PER_EXAMPLE_VARIANCE
        self.mu, self.sigma = fit_out(phi, self.per_example)

    def score(self, proba: ShardProba, shards: Sequence[Sequence[int]]
              ) -> dict[str, object]:
        """LiRA of one model: per example (``lira_*``) and per client (``lira_client_*``).

        Parameters
        ----------
        proba : callable
            ``proba(s, x)``: the model of shard s on images x, (N, C) softmax.
        shards : sequence of sequence of int
            Partition ids per shard; an example whose client is in no shard is
            left out.

        Returns
        -------
        dict
            :meth:`audits.lira.LowFprMetrics.to_audit` of the
            samples (prefix ``lira_``) and of the clients against the
            pseudo-clients (``lira_client_``), and ``lira_client_pvalues``:
            each forgotten client's (ids in order) one-sided p-value against
            the pseudo-clients
            (:func:`audits.lira.empirical_pvalues`).
        """
        s, n = self.samples, len(self.samples.y_target)
        phi = np.full(n + len(s.y_non), np.nan)
        for shard, pids in enumerate(shards):
            mine_t = np.flatnonzero(np.isin(s.owner, list(pids)))
            mine_n = np.flatnonzero(np.isin(s.non_owner, list(pids)))
            for mine, x, y, offset in ((mine_t, s.x_target, s.y_target, 0),
                                       (mine_n, s.x_non, s.y_non, n)):
                i = torch.from_numpy(mine)
                phi[offset + mine] = _phi(lambda v, k=shard: proba(k, v), x[i], y[i])
        z = np.where(np.isnan(phi), np.nan, offline_score(
            np.nan_to_num(phi), self.mu, self.sigma))
        z_t, z_n = z[:n], z[n:]
        out = bootstrap_metrics(z_t[~np.isnan(z_t)], z_n[~np.isnan(z_n)],
                                seed=self.seed).to_audit("lira_")
        clients = [g for g in s.clients if not np.isnan(z_t[g]).any()]
        pseudo = [g for g in s.pseudo if not np.isnan(z_n[g]).any()]
        if clients and pseudo:
            member, null = group_means(z_t, clients), group_means(z_n, pseudo)
            out.update(bootstrap_metrics(member, null, seed=self.seed).to_audit(
                "lira_client_"))
            out["lira_client_pvalues"] = empirical_pvalues(member, null).tolist()
        return out

    def settings(self) -> dict[str, object]:
        """The ``verification.mia.lira`` block: what was run, and what was not read."""
        s = self.samples
        sizes = sorted({len(g) for g in s.clients})
        unread = [unread_note(prefix, count, fpr, what)
                  for prefix, what, count in (
                      ("lira_", "non-member samples", len(s.y_non)),
                      ("lira_client_", "non-member pseudo-clients", len(s.pseudo)))
                  for fpr in LOW_FPRS if count * fpr < MIN_FALSE_POSITIVES]
        return {"variant": "offline (Carlini et al. 2022, Sec. IV-C): every reference "
                "model is a shadow shard that never saw a target or non-member",
                "references": self.k,
                "variance": "per example" if self.per_example else
                f"global (one for all examples: fewer than {PER_EXAMPLE_VARIANCE} "
                "reference models)",
                "score": "z = (phi - mu_out) / sigma_out, phi = log(p_y / (1 - p_y))",
                "n_targets": len(s.y_target), "n_nonmembers": len(s.y_non),
                "forgotten_clients": len(s.clients), "client_sizes": sizes,
                "pseudo_clients": len(s.pseudo),
                "client_score": "mean of its samples' z",
                "bootstrap": f"{BOOTSTRAP} stratified replicates, {LEVEL:.0%} "
                "percentile interval", "unread": unread}


def unread_note(prefix: str, count: int, fpr: float, what: str) -> str:
    """Why summary key ``mia_<prefix>tpr_at_<fpr>fpr`` is null: too few negatives.

    Parameters
    ----------
    prefix : str
        The keys' prefix, e.g. ``"lira_"``.
    count : int
        Negatives scored.
    fpr : float
        The rate not read.
    what : str
        The negatives, in words.

    Returns
    -------
    str
        One line for ``verification.mia.<attack>.unread``.
    """
    need = int(np.ceil(MIN_FALSE_POSITIVES / fpr))
    return (f"mia_{prefix}tpr_at_{fpr_label(fpr)}fpr not read: {count} {what} allow "
            f"{int(np.floor(count * fpr + 1e-9))} false positives at {fpr:.1%} FPR; "
            f"reading it needs {MIN_FALSE_POSITIVES}, so at least {need}")

