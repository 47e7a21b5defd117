"""Local training and evaluation loops (plain PyTorch, no Flower).

One loop serves image classifiers (logits (B, classes)) and the character model
(logits (B, T, vocab)): cross-entropy over the last dimension.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TrainResult:
    """What one client's local training did.

    Attributes
    ----------
    seconds : float
        Wall seconds spent in the training loop (compute, seconds).
    loss : float
        Mean training loss per sample seen (nats; cross-entropy plus FedProx's
        proximal term when it is on).
    steps : int
        Optimizer steps taken (mini-batches).
    epochs : float
        Local epochs performed: samples seen / samples held, exactly (e.g. 2.0
        for two full passes, 0.5 for half a pass).
    samples : int
        Samples seen (with repetition across passes).
    """

    seconds: float
    loss: float
    steps: int
    epochs: float
    samples: int


BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
"""Layers that :func:`fisher_preconditioner` runs in eval mode (one sample a pass)."""

EPOCH_TOLERANCE = 1e-9
"""``epochs`` within this of an integer count as that integer (float round-off of L/r)."""


def epoch_schedule(n: int, epochs: float, batch_size: int) -> list[int]:
    """Mini-batch sizes of ``epochs`` local epochs over ``n`` samples.

    Every whole epoch is one full pass over the ``n`` samples in mini-batches of
    ``batch_size`` (the last one smaller when ``batch_size`` does not divide
    ``n``, and a single batch of ``n`` when ``n < batch_size``). A fractional
    rest ``f = epochs - floor(epochs)`` adds a partial pass of
    ``max(1, round(f * n))`` samples, cut the same way.

    Parameters
    ----------
    n : int
        Samples the client holds (>= 1).
    epochs : float
        Local epochs (> 0), e.g. L, or L / r when unlearning.
    batch_size : int
        Largest mini-batch (samples, >= 1).

    Returns
    -------
    list[int]
        The size of each step's mini-batch; ``sum`` is the samples seen and
        ``len`` the optimizer steps.

    Raises
    ------
    ValueError
        ``n``, ``epochs`` or ``batch_size`` not positive, or ``epochs`` not finite.
    """
    if n < 1 or not 0 < epochs < math.inf or batch_size < 1:
        raise ValueError(f"cannot train on {n} samples for {epochs} epochs with "
                         f"batch size {batch_size}: all must be positive and finite")
    full = math.floor(epochs + EPOCH_TOLERANCE)
    rest = epochs - full
    passes = [n] * full
    if rest > EPOCH_TOLERANCE:
        passes.append(max(1, round(rest * n)))
    return [min(batch_size, size - start) for size in passes
            for start in range(0, size, batch_size)]


def _batches(n: int, sizes: list[int], generator: torch.Generator):
    """Index tensors of the mini-batches ``sizes``: a fresh permutation per pass."""
    order, pos = None, n
    for size in sizes:
        if pos >= n:
            order, pos = torch.randperm(n, generator=generator), 0
        yield order[pos:pos + size]
        pos += size


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def local_seed(run_seed: object, phase: str, server_round: int, partition_id: int
               ) -> int:
    """The seed of one client's local training for one message.

    Learning and unlearning (``phase``), rounds and clients are seeded apart:
    the CRC-32 of ``"<run seed>:<phase>:<server round>:<partition id>"``.

    Parameters
    ----------
    run_seed : object
        The message's ``seed`` (the run-config seed), formatted with ``str``.
    phase : str
        ``"learn"`` or ``"unlearn"``.
    server_round : int
        The message's ``server-round``.
    partition_id : int
        The client's partition id.

    Returns
    -------
    int
        A seed in ``[0, 2**32)``.
    """
    return zlib.crc32(f"{run_seed}:{phase}:{server_round}:{partition_id}".encode())


class LocalSettings(Protocol):
    """What :func:`local_train` reads of its settings.

    :class:`task.training_settings.TrainingSettings` has these attributes (units
    and ranges there; it refuses a value out of range when it is made).
    """

    local_epochs: float
    batch_size: int
    lr: float
    momentum: float
    proximal_mu: float
    optimizer: str


def local_train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: LocalSettings,
    *,
    seed: int = 0,
    grad_transform: Callable[[list[torch.Tensor]], None] | None = None,
    device: torch.device | str | None = None,
) -> TrainResult:
    """Train ``model`` in place with mini-batches for ``settings.local_epochs`` epochs.

    Parameters
    ----------
    model : nn.Module
        Starts from the received model; updated in place.
    x, y : torch.Tensor
        The client's samples (N, ...) and targets (N,) or (N, T).
    settings : LocalSettings
        A :class:`task.training_settings.TrainingSettings`; what is read of it:

        - ``local_epochs``: local epochs L (may be fractional, e.g. L/r when
          unlearning): each whole epoch is one full pass over the N samples in a
          fresh seeded order, and a fractional rest f adds a partial pass over
          max(1, round(f N)) samples (:func:`epoch_schedule`). A client with
          fewer samples than a batch still makes exactly the passes asked for
          (one batch of N per pass).
        - ``batch_size``: largest mini-batch (samples); the last batch of a pass
          may be smaller.
        - ``lr``, ``momentum``: learning rate; SGD's momentum (unused by Adam,
          which keeps torch's betas (0.9, 0.999)).
        - ``proximal_mu``: FedProx's proximal term (mu / 2) ||w - w_start||^2
          (Li et al., MLSys 2020).
        - ``optimizer``: ``sgd`` or ``adam``; built fresh on every call, so Adam's
          moment estimates start from zero every local round (no optimizer state
          crosses rounds, clients or the server).

        Its ``seed`` (the run's) is not read: the order's seed is ``seed``.
    seed : int
        Seeds the shuffling, so a (client, round) pair trains reproducibly.
    grad_transform : callable, optional
        A diagonal preconditioner that scales a list of per-parameter tensors in
        place (RapidRetrain's Fisher preconditioning). With ``sgd`` it scales the
        gradients after backward and before the step (the momentum buffer then
        accumulates preconditioned gradients: w <- w - lr P g). With ``adam`` it
        scales each *step* instead (w <- w + P * adam_step): Adam divides every
        coordinate by its own running gradient scale, which would cancel any fixed
        diagonal rescaling of the gradient, so the preconditioner acts on the step.
    device : torch.device or str, optional
        Where the model and each mini-batch are moved (default: the CPU). The
        shuffling generator stays on the CPU, so the batches, and on the CPU the
        results, are those of a run without it.

    Returns
    -------
    TrainResult
        ``epochs`` = samples seen / N exactly; ``loss`` is the mean per sample seen.

    Raises
    ------
    ValueError
        Empty data or infinite ``local_epochs`` (:func:`epoch_schedule`); the
        settings' other ranges are refused when they are made.
    """
    epochs, batch_size, lr = settings.local_epochs, settings.batch_size, settings.lr
    momentum, proximal_mu, optimizer = (settings.momentum, settings.proximal_mu,
                                        settings.optimizer)
    n = len(x)
    sizes = epoch_schedule(n, epochs, batch_size)
    generator = torch.Generator().manual_seed(seed)
    device = torch.device(device or "cpu")
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params] if proximal_mu > 0 else None
    if optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=lr)
    else:
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    precondition_step = grad_transform is not None and optimizer == "adam"
    model.train()
    t0 = time.perf_counter()
    total = 0.0
    for idx in _batches(n, sizes, generator):
        opt.zero_grad(set_to_none=True)
        loss = _loss(model(x[idx].to(device)), y[idx].to(device))
        if start is not None:
            prox = sum(((p - s) ** 2).sum() for p, s in zip(params, start, strict=True))
            loss = loss + 0.5 * proximal_mu * prox
        loss.backward()
        if precondition_step:
            _preconditioned_step(opt, params, grad_transform)
        else:
            if grad_transform is not None:
                grad_transform([p.grad for p in params])
            opt.step()
        total += float(loss.detach()) * len(idx)
    seconds = time.perf_counter() - t0
    seen = sum(sizes)
    return TrainResult(seconds=seconds, loss=total / seen, steps=len(sizes),
                       epochs=seen / n, samples=seen)


def _preconditioned_step(opt: torch.optim.Optimizer, params: list[torch.Tensor],
                         grad_transform: Callable[[list[torch.Tensor]], None]) -> None:
    """One optimizer step whose step (not gradient) is scaled by ``grad_transform``."""
    before = [p.detach().clone() for p in params]
    opt.step()
    with torch.no_grad():
        steps_taken = [p - b for p, b in zip(params, before, strict=True)]
        grad_transform(steps_taken)
        for p, b, d in zip(params, before, steps_taken, strict=True):
            p.copy_(b + d)


@torch.no_grad()
def predict_proba(model: nn.Module, x: torch.Tensor, batch_size: int = 1000,
                  device: torch.device | str | None = None) -> np.ndarray:
    """Softmax outputs of ``model`` on ``x``, in batches of ``batch_size`` samples.

    ``model`` and each batch are moved to ``device`` (default: the CPU); the
    outputs come back to the CPU.

    Returns
    -------
    np.ndarray
        float32, (N, classes) for classifiers or (N, T, vocab) for the char model.
    """
    device = torch.device(device or "cpu")
    model.to(device)
    model.eval()
    out = [F.softmax(model(x[i:i + batch_size].to(device)).float(), dim=-1).cpu()
           for i in range(0, len(x), batch_size)]
    return torch.cat(out).numpy()


def score_proba(proba: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Mean cross-entropy (nats) and accuracy of predicted probabilities.

    Parameters
    ----------
    proba : np.ndarray
        (N, C) or (N, T, C) probabilities (rows sum to 1).
    y : np.ndarray
        int targets (N,) or (N, T).

    Returns
    -------
    (loss, accuracy) : tuple[float, float]
        Loss in nats per prediction; accuracy as a fraction in [0, 1].
    """
    flat = proba.reshape(-1, proba.shape[-1])
    target = np.asarray(y).reshape(-1)
    picked = flat[np.arange(len(target)), target]
    loss = float(-np.log(np.clip(picked, 1e-12, None)).mean())
    accuracy = float((flat.argmax(axis=1) == target).mean())
    return loss, accuracy


def fisher_preconditioner(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    samples: int = 32,
    damping: float = 1.0,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> Callable[[list[torch.Tensor]], None]:
    """RapidRetrain's diagonal empirical-Fisher preconditioner for local steps.

    Source: Liu et al., "The Right to be Forgotten in Federated Learning: An
    Efficient Realization with Rapid Retraining" (INFOCOM 2022): local steps
    w <- w - lr * (F + lambda I)^-1 g with F the diagonal empirical Fisher
    information. Here F[l] = mean_i g_i[l]^2 over ``samples`` per-sample
    gradients (seeded subset) of layer l at the start of local training,
    lambda[l] = damping * mean(F[l]), and the gradient is scaled elementwise by
    P = (mean(F[l]) + lambda[l]) / (F + lambda[l]): 1 where the curvature is
    average, larger along flat directions, smaller along steep ones; with
    damping 1, P lies in (0, 2] so ``lr`` keeps its meaning (our choice; the
    paper tunes the step size instead). The paper's rule is for SGD, where P
    scales the gradient; with Adam, :func:`local_train` applies P to Adam's step
    (w <- w + P * adam_step), since Adam's per-coordinate normalisation would
    cancel a fixed rescaling of the gradient.

    Per-sample gradients are taken in training mode, except BatchNorm layers
    (:data:`BATCH_NORMS`): on one sample they normalise with their running
    statistics and do not update them, so the Fisher estimate leaves every buffer
    of the model as it was.

    Parameters
    ----------
    model : nn.Module
        The model at the start of local training.
    x, y : torch.Tensor
        The client's data; ``samples`` of them are used.
    samples : int
        Per-sample gradients averaged into F (>= 1).
    damping : float
        lambda relative to the mean of F per layer (> 0).
    seed : int
        Seeds the choice of samples.
    device : torch.device or str, optional
        Where the per-sample gradients are computed (default: the CPU); the
        scales stay there, as the gradients of :func:`local_train` on it do.

    Returns
    -------
    callable
        ``grad_transform`` for :func:`local_train`: scales gradients in place.

    Raises
    ------
    ValueError
        ``samples < 1`` or ``damping <= 0``.
    """
    if samples < 1 or not damping > 0:
        raise ValueError(f"fisher samples = {samples} (>= 1) and damping = {damping}"
                         " (> 0) are required")
    device = torch.device(device or "cpu")
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    fisher = [torch.zeros_like(p) for p in params]
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(x), generator=generator)[:samples]
    model.train()
    # one sample a pass: BatchNorm normalises with its running statistics and
    # leaves them (and num_batches_tracked) as they are
    norms = [m for m in model.modules() if isinstance(m, BATCH_NORMS)]
    for m in norms:
        m.eval()
    for i in chosen:
        model.zero_grad(set_to_none=True)
        _loss(model(x[i:i + 1].to(device)), y[i:i + 1].to(device)).backward()
        for f, p in zip(fisher, params, strict=True):
            f += p.grad.detach() ** 2
    model.zero_grad(set_to_none=True)
    for m in norms:
        m.train()
    scales = []
    for f in fisher:
        f /= len(chosen)
        lam = damping * f.mean() + 1e-12
        scales.append((f.mean() + lam) / (f + lam))

    def transform(grads: list[torch.Tensor]) -> None:
        for g, s in zip(grads, scales, strict=True):
            if g is not None:
                g.mul_(s)

    return transform
