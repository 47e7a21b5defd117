"""A client's answer to a training message, given its data: what every node runs.

The ClientApp (:mod:`client_app.app`) loads a node's data and calls
:func:`train_reply`; U-LiRA's reference clients
(:mod:`server_app.stages.references`), whose samples the audit gives, call the
same function, so a reference trains exactly as a run's client does.
"""

from __future__ import annotations

import time

import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from task.interface import Task
from task.train import fisher_preconditioner
from task.training_settings import TrainingSettings


def train_reply(message: Message, x: torch.Tensor, y: torch.Tensor,
                model: torch.nn.Module, task: Task, device: torch.device, *,
                partition_id: int, phase: str) -> Message:
    """Train ``model`` on ``(x, y)`` as ``message``'s config says; the reply.

    Parameters
    ----------
    message : Message
        A ``train`` or ``train.unlearn`` message; its ``config`` record is read
        by :meth:`TrainingSettings.from_record` (epochs, lr, batch size,
        optimizer, seed, server round, RapidRetrain's ``precondition``).
    x, y : torch.Tensor
        The client's inputs (n, ...) and int64 targets (n,), n >= 1.
    model : torch.nn.Module
        The task's model holding the received weights; trained in place.
    task : Task
        The run's task (its ``train``).
    device : torch.device
        Where to train.
    partition_id : int
        The client's partition id (seeds its local order).
    phase : str
        ``"learn"`` or ``"unlearn"`` (:meth:`TrainingSettings.local_seed`).

    Returns
    -------
    Message
        The reply: ``arrays`` (the trained weights) and ``metrics``
        (``num-examples``, ``train-loss``, ``train-seconds`` (seconds measured,
        the Fisher estimate's included), ``local-epochs``).
    """
    settings = TrainingSettings.from_record(message.content["config"])
    seed = settings.local_seed(phase, partition_id)
    transform, t0 = None, time.perf_counter()
    if settings.precondition == "fisher":  # RapidRetrain
        transform = fisher_preconditioner(
            model, x, y, samples=settings.fisher_samples,
            damping=settings.fisher_damping, seed=seed, device=device)
    fisher_seconds = time.perf_counter() - t0
    result = settings.train(task, model, x, y, seed=seed, device=device,
                            grad_transform=transform)
    metrics = MetricRecord({
        "num-examples": len(x),
        "train-loss": result.loss,
        # the Fisher estimate is part of RapidRetrain's training cost
        "train-seconds": result.seconds + fisher_seconds,
        "local-epochs": result.epochs,
    })
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=message)
