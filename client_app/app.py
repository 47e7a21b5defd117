"""The ClientApp: discovery, local training (learning and unlearning), evaluation.

Message types it answers:

- ``query.discover``: reply with this node's ``partition-id`` / ``num-partitions``.
- ``train``: learning; train ``local-epochs`` from the received model.
- ``train.unlearn``: calibrated retraining (SE, FedEraser); the same local
  optimizer for the epochs the server asks (L / r), seeded apart from learning.
- ``evaluate``: loss and accuracy of the received model on this client's data.
- ``query.store_slice`` / ``query.fetch_slices``: keep this client's coded slices
  of the training history and hand them to a shard server that proves its key
  (``storage = "coded"``; see :mod:`history.slices`).

The data settings (dataset, partition, number of clients, seed, data folder) come
from the run config; the per-round settings (epochs, lr, batch size) from the
message's ``config`` record, as stock Flower strategies send them: ``lr``,
``local-epochs``, ``batch-size``, ``optimizer`` (``sgd`` or ``adam``, fresh state
every message), ``momentum`` (SGD), and RapidRetrain's ``precondition``.
"""

from __future__ import annotations

import os
import time
import zlib

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from history import slices
from task.data import client_data, holds_dataset, load_task_data
from task.model import build_model
from task.train import (
    fisher_preconditioner,
    local_train,
    predict_proba,
    score_proba,
)

app = ClientApp()

# Ray workers start many handlers per process; one thread each keeps two workers
# on two cores from fighting (measured: training ran 13x slower without it).
_THREADS = int(os.environ.get("SE_TORCH_THREADS", "1"))


def partition_id(context: Context) -> int:
    """The partition id of this node, from its node config (``partition-id``)."""
    try:
        return int(context.node_config["partition-id"])
    except KeyError as err:
        raise ValueError(
            "node config has no 'partition-id': start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<C>\"") from err


def data_dir(dataset: str, run_config, config: ConfigRecord) -> str | None:
    """The data folder of this node.

    The server's folder (message ``config["data-dir"]``) where it holds the
    dataset on this node too; else the run-config ``data-dir`` (explicit: an
    error naming ``data-dir`` if this node does not have it there, never another
    folder); else ``None``: the lookup order of :func:`resolve_data_dir`.
    """
    server = str(config.get("data-dir", "") or "")
    if server and holds_dataset(dataset, server):
        return server
    return str(run_config.get("data-dir", "") or "") or None


def _client_data(context: Context, config: ConfigRecord):
    run = context.run_config
    dataset = str(run.get("dataset", "mnist"))
    task = load_task_data(dataset, data_dir(dataset, run, config),
                          int(run.get("block-size", 64)))
    x, y = client_data(task, partition_id(context), int(run.get("num-clients", 100)),
                       str(run.get("partition", "iid")), int(run.get("seed", 0)))
    limit = int(run.get("client-samples", 0)) or None  # 0: all of the partition
    return x[:limit], y[:limit], task.num_classes, dataset


def _train(message: Message, context: Context, phase: str) -> Message:
    torch.set_num_threads(_THREADS)
    config = message.content["config"]
    x, y, num_classes, dataset = _client_data(context, config)
    model = build_model(dataset, num_classes)
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    pid = partition_id(context)
    rnd = int(config.get("server-round", 0))
    seed = zlib.crc32(f"{config.get('seed', 0)}:{phase}:{rnd}:{pid}".encode())
    transform, t0 = None, time.perf_counter()
    if config.get("precondition", "") == "fisher":  # RapidRetrain
        transform = fisher_preconditioner(
            model, x, y, samples=int(config.get("fisher-samples", 32)),
            damping=float(config.get("fisher-damping", 1.0)), seed=seed)
    fisher_seconds = time.perf_counter() - t0
    result = local_train(
        model, x, y,
        epochs=float(config["local-epochs"]),
        batch_size=int(config["batch-size"]),
        lr=float(config["lr"]),
        momentum=float(config.get("momentum", 0.0)),
        seed=seed,
        proximal_mu=float(config.get("proximal-mu", 0.0)),
        grad_transform=transform,
        optimizer=str(config.get("optimizer", "sgd")),
    )
    metrics = MetricRecord({
        "num-examples": len(x),
        "train-loss": result.loss,
        # the Fisher estimate is part of RapidRetrain's training cost
        "train-seconds": result.seconds + fisher_seconds,
        "local-epochs": result.epochs,
    })
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": metrics})
    return Message(content=content, reply_to=message)


@app.query("discover")
def discover(message: Message, context: Context) -> Message:
    """Reply with this node's partition id and the number of partitions."""
    info = ConfigRecord({
        "partition-id": partition_id(context),
        "num-partitions": int(context.node_config.get("num-partitions", -1)),
    })
    return Message(content=RecordDict({"info": info}), reply_to=message)


@app.query("store_slice")
def store_slice(message: Message, context: Context) -> Message:
    """Keep a coded slice of the training history; reply with an ack."""
    try:
        return Message(content=slices.store(message.content, context),
                       reply_to=message)
    except slices.SliceFormatError as err:
        return Message(error=Error(code=slices.REFUSED, reason=str(err)),
                       reply_to=message)


@app.query("fetch_slices")
def fetch_slices(message: Message, context: Context) -> Message:
    """Hand this client's slices to a request proving the shard's key, else refuse."""
    try:
        return Message(content=slices.fetch(message.content, context),
                       reply_to=message)
    except (slices.SliceAccessError, slices.SliceFormatError) as err:
        return Message(error=Error(code=slices.REFUSED, reason=str(err)),
                       reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Learning: local training from the received model (``train`` messages)."""
    return _train(message, context, "learn")


@app.train("unlearn")
def unlearn(message: Message, context: Context) -> Message:
    """Unlearning: calibrated retraining steps (``train.unlearn`` messages)."""
    return _train(message, context, "unlearn")


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this client's data."""
    torch.set_num_threads(_THREADS)
    x, y, num_classes, dataset = _client_data(context, message.content["config"])
    model = build_model(dataset, num_classes)
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    loss, accuracy = score_proba(predict_proba(model, x), y.numpy())
    metrics = MetricRecord({"num-examples": len(x), "loss": loss,
                            "accuracy": accuracy})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=message)
