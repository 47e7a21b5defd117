"""Membership-inference audit: does a model still remember the forgotten data.

One attack (:class:`audits.mia.MembershipAttack`) is fit on the ORIGINAL
sharded ensemble's outputs: members are training samples of retained clients,
non-members the first half of the test set. Every model (the original, and each
framework's unlearned models) is then scored on the forgotten clients' training
samples against as many samples of the second half of the test set. As the
auditor, the server rebuilds the clients' partitions from the run config; it
never sees them in learning.

With ``mia-shadows`` >= 1, :func:`shadow_audit` runs Shokri's shadow-model attack
instead (:mod:`audits.shadow`), on each model separately; with
``mia-references`` >= 2 also the offline likelihood-ratio attack, per example and
per forgotten client (:mod:`audits.lira_audit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.supercore import log

from audits.lira import LOW_FPRS, MIN_FALSE_POSITIVES
from audits.lira_audit import LiraAudit, LiraSamples, unread_note
from audits.mia import MembershipAttack, auc_interval, has_signal
from audits.mia_sets import MiaSets, choose_sets, split_rows
from audits.run import AuditedRun
from audits.shadow import ShadowAttack, shadow_splits
from audits.ulira_audit import (
    ShadowPoolTooSmallError,
    real_phi,
    train_references,
    ulira_scores,
)
from task.data import TaskData, client_data, partition_sizes
from task.device import resolve_device
from task.interface import Task

MIA_KEYS = ("f1", "precision", "recall", "auc")
COUNT_KEYS = ("n_target", "n_heldout")


def ensemble_proba(models: Sequence[ArrayRecord], x: torch.Tensor, task: Task,
                   num_classes: int, device: torch.device | str = "cpu") -> np.ndarray:
    """Mean softmax of ``models`` on ``x`` (the task's ``predict`` on ``device``).

    Returns
    -------
    numpy.ndarray
        float32 (N, C) or (N, T, V).
    """
    model = task.model(num_classes)
    total = None
    for arrays in models:
        model.load_state_dict(arrays.to_torch_state_dict())
        p = task.predict(model, x, device=device)
        total = p if total is None else total + p
    return total / len(models)


def _samples(run: AuditedRun, task, clients: Sequence[int], limit: int, seed: int):
    xs, ys = [], []
    data = run.data
    for pid in clients:
        x, y = client_data(task, pid, data.num_clients, data.partition, run.seed,
                           data.partition_alpha, data.classes_per_client)
        cut = data.client_samples or None
        xs.append(x[:cut])
        ys.append(y[:cut])
    x, y = torch.cat(xs), torch.cat(ys)
    if len(x) > limit:
        idx = torch.from_numpy(np.random.default_rng(seed).permutation(len(x))[:limit])
        x, y = x[idx], y[idx]
    return x, y


def membership_audit(run: AuditedRun, task: TaskData, shards: Sequence[Sequence[int]],
                     forget: Sequence[int], original: Sequence[ArrayRecord],
                     unlearned: Mapping[str, Sequence[ArrayRecord]],
                     max_samples: int = 2000) -> dict[str, dict[str, float]]:
    """MIA scores of the original model and of each unlearned model.

    Parameters
    ----------
    run : AuditedRun
        Task, partition and seed used to rebuild client data.
    task : TaskData
        The run's data.
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
        ``recall``, ``auc`` (positive class = member), the counts scored
        ``n_target`` / ``n_heldout``, and :func:`with_signal`'s keys.
    """
    spec, device = run.task, resolve_device(run.device)
    forgotten = set(forget)
    retained = [p for pids in shards for p in pids if p not in forgotten]
    x_mem, y_mem = _samples(run, task, retained, max_samples, run.seed)
    x_tgt, y_tgt = _samples(run, task, sorted(forgotten), max_samples, run.seed + 1)
    half = len(task.test_x) // 2
    x_non, y_non = task.test_x[:half][:max_samples], task.test_y[:half][:max_samples]
    x_out, y_out = task.test_x[half:][:max_samples], task.test_y[half:][:max_samples]

    def proba(models, x):
        return ensemble_proba(models, x, spec, task.num_classes, device)

    attack = MembershipAttack(features=spec.membership).fit(
        proba(original, x_mem), y_mem.numpy(), proba(original, x_non), y_non.numpy(),
        seed=run.seed)
    results = {}
    for name, models in {"original": original, **unlearned}.items():
        scores = attack.score(proba(models, x_tgt), y_tgt.numpy(),
                              proba(models, x_out), y_out.numpy())
        results[name] = {**{k: float(scores[k]) for k in MIA_KEYS},
                         **{k: int(scores[k]) for k in COUNT_KEYS}}
    return with_signal(results)


def with_signal(results: dict[str, dict]) -> dict[str, dict]:
    """Add each model's AUC interval and, to ``original``, whether the audit has signal.

    The audit can only show forgetting if the attack tells the ORIGINAL model's
    members (the forgotten clients' samples) from non-members: ``signal`` is
    :func:`audits.mia.has_signal` of the original's AUC on its
    ``n_target`` / ``n_heldout`` samples (the 95% interval lies above 0.5).

    Parameters
    ----------
    results : dict
        Model name -> scores with ``auc``, ``n_target``, ``n_heldout``
        (a model without them is left as it is); changed in place.

    Returns
    -------
    dict
        ``results``, each scored model with ``auc_low`` / ``auc_high`` (floats,
        :func:`audits.mia.auc_interval`), ``original`` with
        ``signal`` (bool) and, with LiRA, ``lira_signal`` (:func:`lira_signal`);
        in summary.json ``mia_auc_low``, ``mia_auc_high``, ``mia_signal``,
        ``mia_lira_signal``.
    """
    for name, scores in results.items():
        if "auc" in scores and all(scores.get(k) for k in COUNT_KEYS):
            counts = (scores["auc"], scores["n_target"], scores["n_heldout"])
            scores["auc_low"], scores["auc_high"] = auc_interval(*counts)
            if name == "original":  # the audit's verdict is the original's
                scores["signal"] = has_signal(*counts)
    original = results.get("original", {})
    if original.get("lira_auc_ci"):
        original["lira_signal"] = lira_signal(original)
    return results


def lira_signal(scores: dict) -> bool:
    """Whether LiRA tells the original model's members apart.

    True when its AUC interval lies above 0.5 or its TPR-at-1%-FPR interval
    above 0.01 (chance for each). ``scores`` holds ``lira_auc_ci`` and maybe
    ``lira_tpr_at_1fpr_ci`` (95% bootstrap intervals,
    :meth:`audits.lira.LowFprMetrics.to_audit`); in summary.json
    the verdict is ``mia_lira_signal``.
    """
    auc = scores["lira_auc_ci"]
    tpr = scores.get("lira_tpr_at_1fpr_ci")
    return auc[0] > 0.5 or (tpr is not None and tpr[0] > 0.01)


def _shadow_federation(run: AuditedRun, task, x: torch.Tensor, y: torch.Tensor,
                       clients: int, seed: int):
    """A shadow shard: ``x, y`` split over ``clients`` and trained as the run's shards.

    G rounds of FedAvg (equal parts, so equal weights), ``clients-per-round /
    num-shards`` clients a round drawn with ``seed``, L local epochs each with the
    run's optimizer (the task's ``train``), from a seeded initial model.
    """
    torch.manual_seed(seed)
    spec, settings = run.task, run.local  # as the run's clients train
    device = resolve_device(run.device)
    model = spec.model(task.num_classes)
    parts = np.array_split(np.arange(len(y)), clients)
    per_round = min(clients, max(1, run.shard_per_round))
    rng = np.random.default_rng(seed)
    for rnd in range(run.num_rounds):
        states = []
        for c in rng.choice(clients, size=per_round, replace=False):
            local = spec.model(task.num_classes)
            local.load_state_dict(model.state_dict())
            idx = torch.from_numpy(parts[c])
            settings.train(spec, local, x[idx], y[idx],
                           seed=seed * 1000 + rnd * 100 + int(c), device=device)
            states.append({k: v.cpu() for k, v in local.state_dict().items()})
        model.load_state_dict({k: _mean([s[k] for s in states]) for k in states[0]})
    return model


def _mean(tensors: list[torch.Tensor]) -> torch.Tensor:
    """FedAvg of equal parts, in the tensors' dtype (integer buffers rounded)."""
    mean = sum(tensors) / len(tensors)
    return mean if tensors[0].is_floating_point() else mean.round().to(tensors[0].dtype)


def fit_shadow_attack(run: AuditedRun, task, shards: Sequence[Sequence[int]],
                      x_pool: torch.Tensor, y_pool: torch.Tensor, m: int
                      ) -> tuple[ShadowAttack, list[torch.nn.Module], dict]:
    """Train the shadow models with the run's recipe; fit the attack on ``mia-shadows``.

    Each shadow's "in" and "out" sets are ``m`` samples each of the pool ``x_pool``
    (N, ...), ``y_pool`` (N,) (N >= 2 m), data no client holds and no target or
    non-member (:func:`audits.mia_sets.choose_sets`).
    max(``mia-shadows``, ``mia-references``) are trained; Shokri's attack is fit
    on the first ``mia-shadows``, and LiRA uses the first ``mia-references``.

    Returns the fitted :class:`ShadowAttack`, every shadow model trained, and
    the settings used (for ``verification.mia``).
    """
    probas, labels, is_in, models = [], [], [], []
    spec, device, audit = run.task, resolve_device(run.device), run.audit
    count = max(audit.mia_shadows, audit.mia_references)
    splits = shadow_splits(len(y_pool), m, count, run.seed)
    for i, (inside, outside) in enumerate(splits):
        x_in, y_in = x_pool[torch.from_numpy(inside)], y_pool[torch.from_numpy(inside)]
        model = _shadow_federation(run, task, x_in, y_in, len(shards[0]), run.seed + 1 + i)
        models.append(model)
        if i >= audit.mia_shadows:
            continue
        x_out = x_pool[torch.from_numpy(outside)]
        probas += [spec.predict(model, x_in, device=device),
                   spec.predict(model, x_out, device=device)]
        labels += [y_in.numpy(), y_pool[torch.from_numpy(outside)].numpy()]
        is_in += [np.ones(m, np.int64), np.zeros(m, np.int64)]
    attack = ShadowAttack(task.num_classes, run.seed, spec.membership).fit(
        np.concatenate(probas), np.concatenate(labels), np.concatenate(is_in))
    return attack, models, {"attack": "shadow models, one attack model per class",
                    "shadows": audit.mia_shadows, "shadow_in_samples": m,
                    "shadow_recipe": f"FedAvg of {len(shards[0])} clients, "
                    f"{run.shard_per_round} a round, "
                    f"{run.num_rounds} rounds x {run.local_epochs} local epochs"}


def _scored_sets(run: AuditedRun, task, shard_models, shards, sets: MiaSets):
    """A model's outputs on the targets and on their paired non-members.

    Each target, and its non-member, is scored by the model of its client's shard;
    None if no target is in ``shards``.
    """
    t_p, t_y, h_p, h_y = [], [], [], []
    spec, device = run.task, resolve_device(run.device)
    for s, pids in enumerate(shards):
        mine = np.isin(sets.owner, list(pids))
        if not mine.any():
            continue
        x_t, y_t = split_rows(task, "train", sets.target[mine])
        partner = sets.partner[mine]
        x_h, y_h = split_rows(task, sets.heldout_split, partner[partner >= 0])
        for probas, x in ((t_p, x_t), (h_p, x_h)):
            probas.append(ensemble_proba([shard_models[s]], x, spec,
                                         task.num_classes, device))
        t_y.append(y_t.numpy())
        h_y.append(y_h.numpy())
    if not t_p:
        return None
    return (np.concatenate(t_p), np.concatenate(t_y), np.concatenate(h_p),
            np.concatenate(h_y))


def shadow_audit(run: AuditedRun, task: TaskData, forget_rounds: Mapping[str, int],
                 models: Mapping[str, tuple[Sequence[ArrayRecord],
                                            Sequence[Sequence[int]]]],
                 records: Mapping[int, Sequence[int]] | None = None
                 ) -> tuple[dict[str, dict[str, float]], dict]:
    """Shokri's attack on each model separately: the forgotten clients' samples.

    With ``records`` (a records request: owner -> erased ids), the targets are
    the erased records alone, their owners the clients of ``forget_rounds``;
    U-LiRA, whose references unlearn whole clients, is not run then.

    Parameters
    ----------
    run : AuditedRun
        The run (``mia-shadows`` >= 1, ``mia-samples`` caps the targets).
    task : TaskData
        The run's data.
    forget_rounds : Mapping[str, int]
        Forgotten partition id (str) -> learning rounds it took part in; clients
        with 0 rounds give no targets.
    models : Mapping[str, (models, shards)]
        Name -> its shard models and the partition ids of each shard. A target
        is scored by the model of its client's shard (sharded: the impacted
        shard's model; unsharded: the single model).
    records : Mapping[int, Sequence[int]], optional
        A records request's erased ids per client (positions in its rows).

    Returns
    -------
    (scores, settings)
        Per name ``auc``, ``f1``, ``tpr_at_1fpr``, ``n_target``, ``n_heldout``
        and :func:`with_signal`'s keys; and the ``verification.mia`` block.
    """
    first = next(iter(models.values()))[1]
    shard_size = sum(_sizes(run, task)) // len(first)
    targets = sorted(int(p) for p, n in forget_rounds.items() if n > 0)
    sets = choose_sets(run, task, targets, shard_size, records)
    x_pool, y_pool = split_rows(task, sets.shadow_split, sets.shadow)
    attack, shadows, settings = fit_shadow_attack(run, task, first, x_pool, y_pool,
                                                  min(shard_size, len(y_pool) // 2))
    lira = _lira(run, task, sets, shadows)
    results = {}
    for name, (shard_models, shards) in models.items():
        scored = _scored_sets(run, task, shard_models, shards, sets)
        if scored is not None:
            results[name] = attack.score(*scored)
            if lira is not None:
                results[name].update(lira.score(_shard_proba(run, task, shard_models),
                                                shards))
    settings.update(
        targets=targets, n_targets=int(len(sets.target)),
        target_rounds={str(p): int(forget_rounds[str(p)]) for p in targets},
        heldout=sets.heldout_source, shadow_pool=sets.shadow_source,
        disjoint="targets, non-members and shadow data share no sample",
        scored="each model on its own")
    if lira is not None:
        settings["lira"] = lira.settings()
    if records is not None:
        settings["targets_are"] = "the erased records of the clients named"
    if run.references is not None:
        settings["ulira"] = _ulira(run, task, sets, models, results) if records is None \
            else _ulira_skipped("a records request: U-LiRA's references unlearn whole "
                                "clients, not records")
    return with_signal(results), settings


def _sizes(run: AuditedRun, task) -> list[int]:
    """Every client's samples, as the run cut them."""
    data = run.data
    return partition_sizes(task, data.num_clients, data.partition, run.seed,
                           data.client_samples)


def _ulira(run: AuditedRun, task, sets: MiaSets, models, results: dict) -> dict:
    """U-LiRA of the original and each referenced framework (``ulira_*``); settings.

    Not run, and ``skipped`` says why (logged too), with fewer than 2 targets or
    a shadow pool too small for the references: the run's other scores stand.
    """
    shards = models["original"][1]
    if len(sets.target) < 2:
        return _ulira_skipped("fewer than 2 targets (the forgotten clients took part "
                              "in no learning round)")
    sizes, recipe = _sizes(run, task), run.references
    baseline = next((models[n][1] for n, rule in recipe.rules.items()
                     if rule.shape == "federation" and n in models), None)
    try:
        refs = train_references(run, task, sets, shards,  # a forgotten client's size
                                max(sizes[p] for p in np.unique(sets.owner)), baseline)
    except ShadowPoolTooSmallError as err:
        return _ulira_skipped(str(err))
    for name in ("original", *refs.unlearned):
        if name in models and name in results:
            shard_models, model_shards = models[name]
            phi = real_phi(sets, refs, task, _shard_proba(run, task, shard_models),
                           model_shards)
            results[name].update(ulira_scores(refs, phi, name, run.seed))
    negatives = int((~refs.is_in).sum())
    unread = [unread_note(prefix, negatives, fpr, "negatives (references that never "
                          "saw the sample)") for prefix in ("ulira_game_", "ulira_")
              for fpr in LOW_FPRS if negatives * fpr < MIN_FALSE_POSITIVES]
    shard = refs.shapes["shard"]
    return {"attack": "U-LiRA (Hayes et al. 2025): online LiRA between references that "
            "unlearned a sample with the framework's own rule and references that "
            "never saw it",
            "references": run.audit.mia_unlearn_references,
            "pool": int(len(refs.pool)), "forgotten_clients": shard.forgotten,
            "client_size": shard.client_size, "shard_clients": shard.clients,
            "shapes": {label: shape.to_json() for label, shape in refs.shapes.items()},
            "frameworks": {name: recipe.rules[name].shape for name in refs.unlearned},
            "exact_by_construction": list(recipe.exact), "recipe": recipe.text,
            "game": "each reference against Gaussians of all but it and its "
            "complementary partner (ulira_game_*); the run's model, fit the same way, "
            "against the game's negatives (ulira_*)", "unread": unread}


def _ulira_skipped(why: str) -> dict:
    """``verification.mia.ulira`` of a U-LiRA not run, logged as a warning."""
    log(WARNING, "U-LiRA not run: %s", why)
    return {"skipped": why}


def _lira(run: AuditedRun, task, sets: MiaSets, shadows: Sequence[torch.nn.Module]
          ) -> LiraAudit | None:
    """LiRA with the first ``mia-references`` shadows as reference models (None: off)."""
    k = run.audit.mia_references
    if not k or not sets.lira_partner.size:
        return None
    spec, device = run.task, resolve_device(run.device)
    references = [lambda x, m=model: spec.predict(m, x, device=device)
                  for model in shadows[:k]]
    return LiraAudit(LiraSamples.from_sets(task, sets), references, seed=run.seed)


def _shard_proba(run: AuditedRun, task, shard_models: Sequence[ArrayRecord]):
    """``proba(s, x)``: the softmax of shard model s on ``x`` (N, C)."""
    spec, device = run.task, resolve_device(run.device)
    return lambda s, x: ensemble_proba([shard_models[s]], x, spec, task.num_classes,
                                       device)
