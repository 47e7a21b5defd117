"""Membership-inference audit: does a model still remember the forgotten data.

One attack (:class:`server_app.mia.MembershipAttack`) is fit on the ORIGINAL
sharded ensemble's outputs: members are training samples of retained clients,
non-members the first half of the test set. Every model (the original, and each
framework's unlearned models) is then scored on the forgotten clients' training
samples against as many samples of the second half of the test set. As the
auditor, the server rebuilds the clients' partitions from the run config; it
never sees them in learning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord

from server_app.config import RunConfig
from server_app.mia import MembershipAttack
from task.data import client_data, load_task_data
from task.model import build_model
from task.train import predict_proba

MIA_KEYS = ("f1", "precision", "recall", "auc")


def ensemble_proba(models: Sequence[ArrayRecord], x: torch.Tensor, dataset: str,
                   num_classes: int) -> np.ndarray:
    """Mean softmax of ``models`` on ``x``: float32 (N, C) or (N, T, V)."""
    model = build_model(dataset, num_classes)
    total = None
    for arrays in models:
        model.load_state_dict(arrays.to_torch_state_dict())
        p = predict_proba(model, x)
        total = p if total is None else total + p
    return total / len(models)


def _samples(cfg: RunConfig, task, clients: Sequence[int], limit: int, seed: int):
    xs, ys = [], []
    for pid in clients:
        x, y = client_data(task, pid, cfg.num_clients, cfg.partition, cfg.seed,
                           cfg.partition_alpha, cfg.classes_per_client)
        cut = cfg.client_samples or None
        xs.append(x[:cut])
        ys.append(y[:cut])
    x, y = torch.cat(xs), torch.cat(ys)
    if len(x) > limit:
        idx = torch.from_numpy(np.random.default_rng(seed).permutation(len(x))[:limit])
        x, y = x[idx], y[idx]
    return x, y


def membership_audit(cfg: RunConfig, data_dir: str, shards: Sequence[Sequence[int]],
                     forget: Sequence[int], original: Sequence[ArrayRecord],
                     unlearned: Mapping[str, Sequence[ArrayRecord]],
                     max_samples: int = 2000) -> dict[str, dict[str, float]]:
    """MIA scores of the original model and of each unlearned model.

    Parameters
    ----------
    cfg : RunConfig
        Dataset, partition and seed used to rebuild client data.
    data_dir : str
        Dataset folder.
    shards : Sequence[Sequence[int]]
        Partition ids per shard.
    forget : Sequence[int]
        The forgotten clients (the target).
    original : Sequence[ArrayRecord]
        The learned shard models (the attack is fit on their ensemble).
    unlearned : Mapping[str, Sequence[ArrayRecord]]
        Framework name -> its unlearned shard models.
    max_samples : int
        Cap on samples per set (members, non-members, target).

    Returns
    -------
    dict
        ``{"original": {...}, name: {...}}`` with ``f1``, ``precision``,
        ``recall``, ``auc`` (positive class = member).
    """
    task = load_task_data(cfg.dataset, data_dir, cfg.block_size)
    forgotten = set(forget)
    retained = [p for pids in shards for p in pids if p not in forgotten]
    x_mem, y_mem = _samples(cfg, task, retained, max_samples, cfg.seed)
    x_tgt, y_tgt = _samples(cfg, task, sorted(forgotten), max_samples, cfg.seed + 1)
    half = len(task.test_x) // 2
    x_non, y_non = task.test_x[:half][:max_samples], task.test_y[:half][:max_samples]
    x_out, y_out = task.test_x[half:][:max_samples], task.test_y[half:][:max_samples]

    def proba(models, x):
        return ensemble_proba(models, x, cfg.dataset, task.num_classes)

    attack = MembershipAttack().fit(proba(original, x_mem), y_mem.numpy(),
                                    proba(original, x_non), y_non.numpy(), seed=cfg.seed)
    results = {}
    for name, models in {"original": original, **unlearned}.items():
        scores = attack.score(proba(models, x_tgt), y_tgt.numpy(),
                              proba(models, x_out), y_out.numpy())
        results[name] = {k: float(scores[k]) for k in MIA_KEYS}
    return results
