"""The ClientApp: discovery, local training (learning and unlearning), evaluation.

Message types it answers:

- ``query.discover``: reply with this node's ``partition-id`` / ``num-partitions``
  and, for a node with its own data folder, ``num-records`` (its record count).
- ``train``: learning; train ``local-epochs`` from the received model.
  A training message may name records this client no longer has
  (``erased-records``, its ids) and labels no client has (``erased-labels``):
  they are dropped before training (:mod:`task.records`).
- ``train.unlearn``: calibrated retraining (SE, FedEraser); the same local
  optimizer for the epochs the server asks (L / r), seeded apart from learning.
- ``evaluate``: loss and accuracy of the received model on this client's data.
- ``query.store_slice`` / ``query.fetch_slices``: keep this client's coded slices
  of the training history and hand them to a shard server that proves its key
  (``storage = "coded"``; see :mod:`history.coded.slices`).

The data settings (task, dataset, partition, number of clients, seed, data folder,
block size, sample cap, device) come from the run config, read by
:class:`task.config.TaskConfig` (their defaults are ``pyproject.toml``'s, which
Flower merges into every run config); the run's task (:mod:`task.registry`: a
built-in or a plug-in) gives the data, the model and the local training and
evaluation steps, on the run's ``device``; the per-round settings (epochs, lr,
batch size) from the message's ``config`` record, as stock Flower strategies send
them, read by :meth:`task.training_settings.TrainingSettings.from_record` (its
keys: ``lr``, ``local-epochs``, ``batch-size``, ``optimizer`` (``sgd`` or
``adam``, fresh state every message), ``momentum`` (SGD), ``seed``,
``data-dir``, ``server-round``, FedProx's ``proximal-mu`` and RapidRetrain's
``precondition``).  Data, models and training are :mod:`task`'s; this module
only answers messages.

A node's training data is its share of the whole dataset (cut from ``data-dir``
by ``num-clients`` and ``seed``), unless its node config names its own folder,
``client-data`` (:mod:`task.client_folder`): then it reads that folder alone,
checked against the run (task, partition id, its arrays' SHA-256); a folder that
does not fit is a one-line error reply (code :data:`DATA_REFUSED`), not a crash.
"""

from __future__ import annotations

import os

import torch
from flwr.app import (
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from history.coded import slices
from task.backdoor import Backdoor, poison
from task.client_folder import (
    ClientDataError,
    check_against_run,
    load_own_data,
    read_client_folder,
)
from task.config import TaskConfig, run_config_of, task_spec
from task.device import resolve_device
from task.local_training import train_reply
from task.node_cache import cached_client_data
from task.records import LABELS_KEY, RECORDS_KEY, keep_mask
from task.registry import task_of
from task.text_backdoor import TextBackdoor, implant
from task.training_settings import TrainingSettings, data_dir_of

app = ClientApp()

# Ray workers start many handlers per process; one thread each keeps two workers
# on two cores from fighting (measured: training ran 13x slower without it).
_THREADS = int(os.environ.get("SE_TORCH_THREADS", "1"))

CLIENT_DATA = "client-data"
"""Node-config key: this node's own data folder (:mod:`task.client_folder`)."""
DATA_REFUSED = 422
"""Error code of a reply refusing a message: this node's ``client-data`` does not fit."""


def partition_id(context: Context) -> int:
    """The partition id of this node, from its node config (``partition-id``)."""
    try:
        return int(context.node_config["partition-id"])
    except KeyError as err:
        raise ValueError(
            "node config has no 'partition-id': start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<C>\"") from err


def _received(message: Message, context: Context, server_dir: str):
    """The node's training data, the model the message carries, the task and device.

    Returns ``(x, y, model, task, device)``: the node's share of the task
    (:class:`TaskConfig` from the run config; ``server_dir``, the server's
    ``data-dir``, where this node has it), the task's model holding the
    received weights, the run's :class:`task.interface.Task` and this node's
    ``torch.device``. With ``node-dir`` in the node config the share is cached
    there (:mod:`task.node_cache`): a deployed ClientApp process loads the whole
    dataset only for its node's first message.
    """
    run_config = run_config_of(context.run_config, message.content["config"])
    cfg = TaskConfig.from_run_config(run_config)
    task = task_of(cfg)
    x, y, num_classes = _training_data(cfg, context, server_dir)
    # a client of the unlearning request stamps its own data (task.backdoor), or
    # writes the text backdoor's phrase into its blocks (task.text_backdoor)
    x, y, _ = poison(x, y, Backdoor.from_run_config(run_config), cfg.seed,
                     partition_id(context), task.stamp)
    x, y, _ = implant(x, y, TextBackdoor.from_run_config(run_config, task.tokenize),
                      cfg.seed, partition_id(context))
    model = task.model(num_classes)
    try:
        model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    except RuntimeError as err:  # e.g. a folder's num-classes that is not the run's
        if not context.node_config.get(CLIENT_DATA):
            raise
        raise ClientDataError(f"client-data folder {context.node_config[CLIENT_DATA]}: "
                              f"its num-classes = {num_classes} does not fit the model "
                              f"received ({str(err).splitlines()[-1].strip()[:160]})"
                              ) from None
    return x, y, model, task, resolve_device(cfg.device)


def _training_data(cfg: TaskConfig, context: Context, server_dir: str
                   ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(x, y, num_classes)``: the node's own folder if it has one, else its share.

    With node-config ``client-data`` the folder alone is read
    (:func:`task.client_folder.load_own_data`, capped at ``client-samples``);
    without it the partition is cut from the whole dataset, cached under
    ``node-dir`` where given (:func:`task.node_cache.cached_client_data`).

    Raises
    ------
    ClientDataError
        The node's folder is missing, damaged or another run's (one line).
    """
    own = context.node_config.get(CLIENT_DATA) or None
    if own:
        return load_own_data(str(own), task_spec(cfg.task, cfg.dataset),
                             partition_id(context), cfg.client_samples, cfg.block_size)
    return cached_client_data(cfg, partition_id(context), server_dir,
                              context.node_config.get("node-dir") or None)


def _refused(message: Message, err: ClientDataError) -> Message:
    """The error reply to ``message``: this node's data folder does not fit (one line)."""
    reason = (str(err).splitlines() or [""])[0]
    return Message(error=Error(code=DATA_REFUSED, reason=reason), reply_to=message)


def _erase(x: torch.Tensor, y: torch.Tensor, config: ConfigRecord):
    """``x, y`` without the records and labels the message says are erased."""
    ids = list(config.get(RECORDS_KEY) or [])
    labels = list(config.get(LABELS_KEY) or [])
    if not ids and not labels:
        return x, y
    keep = torch.from_numpy(keep_mask(len(x), y.numpy(), ids, labels))
    return x[keep], y[keep]


def _train(message: Message, context: Context, phase: str) -> Message:
    torch.set_num_threads(_THREADS)
    settings = TrainingSettings.from_record(message.content["config"])
    try:
        x, y, model, task, device = _received(message, context, settings.data_dir)
    except ClientDataError as err:
        return _refused(message, err)
    x, y = _erase(x, y, message.content["config"])
    return train_reply(message, x, y, model, task, device,
                       partition_id=partition_id(context), phase=phase)


@app.query("discover")
def discover(message: Message, context: Context) -> Message:
    """Reply with this node's partition id and the number of partitions.

    A node with its own folder (``client-data``) checks it against the run
    first and adds ``num-records``, the records its manifest (matched against
    its arrays) says it holds: what the server bounds its replies'
    ``num-examples`` with. A folder that does not fit: an error reply.
    """
    info = ConfigRecord({
        "partition-id": partition_id(context),
        "num-partitions": int(context.node_config.get("num-partitions", -1)),
    })
    own = context.node_config.get(CLIENT_DATA) or None
    if own:
        try:
            info["num-records"] = _own_records(str(own), message, context)
        except ClientDataError as err:
            return _refused(message, err)
    return Message(content=RecordDict({"info": info}), reply_to=message)


def _own_records(folder: str, message: Message, context: Context) -> int:
    """Records in this node's folder, checked against the run (ClientDataError).

    The run's settings are the question's (the server's), over this node's own.
    """
    sent = message.content["config"] if "config" in message.content else {}
    cfg = TaskConfig.from_run_config(run_config_of(context.run_config, sent))
    manifest = read_client_folder(folder)[2]
    check_against_run(manifest, folder, task_spec(cfg.task, cfg.dataset),
                      partition_id(context), cfg.block_size)
    return manifest.records


@app.query("store_slice")
def store_slice(message: Message, context: Context) -> Message:
    """Keep a coded slice of the training history; reply with an ack."""
    return _slice_reply(slices.store, message, context)


@app.query("fetch_slices")
def fetch_slices(message: Message, context: Context) -> Message:
    """Hand this client's slices to a request proving the shard's key, else refuse."""
    return _slice_reply(slices.fetch, message, context)


@app.query("replace_slice_part")
def replace_slice_part(message: Message, context: Context) -> Message:
    """Replace one shard's part of a stored slice, for a request proving that key."""
    return _slice_reply(slices.replace, message, context)


def _slice_reply(handle, message: Message, context: Context) -> Message:
    """``handle``'s content as the reply; a malformed or unproven request refused."""
    try:
        return Message(content=handle(message.content, context), reply_to=message)
    except (slices.SliceAccessError, slices.SliceFormatError) as err:
        return Message(error=Error(code=slices.REFUSED, reason=str(err)),
                       reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Learning: local training from the received model (``train`` messages)."""
    return _own_data_guard(message, context, "learn")


@app.train("unlearn")
def unlearn(message: Message, context: Context) -> Message:
    """Unlearning: calibrated retraining steps (``train.unlearn`` messages)."""
    return _own_data_guard(message, context, "unlearn")


def _own_data_guard(message: Message, context: Context, phase: str) -> Message:
    """:func:`_train`; a node's own folder that cannot be trained on: an error reply.

    A folder consistent with its manifest may still hold what the model cannot
    take (labels outside its classes, images of another shape): the training
    step's error comes back as the folder's one-line refusal, which the server
    records as the client's fault, not as a crash of the ClientApp.
    """
    try:
        return _train(message, context, phase)
    except (IndexError, RuntimeError, ValueError) as err:
        own = context.node_config.get(CLIENT_DATA)
        if not own:
            raise
        line = (str(err).splitlines() or [type(err).__name__])[0][:300]
        return _refused(message, ClientDataError(
            f"client-data folder {own} cannot be trained on: {type(err).__name__}: "
            f"{line}"))


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this client's data."""
    torch.set_num_threads(_THREADS)
    try:
        x, y, model, task, device = _received(message, context,
                                              data_dir_of(message.content["config"]))
    except ClientDataError as err:
        return _refused(message, err)
    loss, accuracy = task.score(task.predict(model, x, device=device), y.numpy())
    metrics = MetricRecord({"num-examples": len(x), "loss": loss,
                            "accuracy": accuracy})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=message)
