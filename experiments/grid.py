"""Run the real ServerApp and ClientApp in one process on an in-process Grid.

On a 2-core machine Flower's Ray simulation spends most of a small run starting
workers and moving messages; this Grid calls the same ``client_app.app:app`` for
every message instead, one :class:`flwr.app.Context` per node (so per-node state
persists across rounds, as in Flower), and drives the same
``server_app.app.main``. Messages are delivered one after another.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from cli import config as cli_config
from task.config import fused_run_config

NODE_ID_BASE = 1000
RUN_ID = 1
SERVER_NODE_ID = 0


def set_task_identity(node_id: int = SERVER_NODE_ID) -> None:
    """Make Messages built from now on come from run ``RUN_ID``, node ``node_id``.

    ``flwr.app.Message(...)`` stamps a new message with the sender's run id,
    node id and task id, read from Flower's
    :class:`flwr.supercore.task_identity.TaskIdentity`. Flower's runtimes
    (SuperLink, SuperNode, the simulation engine) set it for the process they
    start; outside them (this in-process Grid, the tests, the storage
    measurement) nobody does and building a Message raises ``RuntimeError``.
    This is the project's one place that sets it.

    Parameters
    ----------
    node_id : int
        The sender: ``SERVER_NODE_ID`` (0) for the ServerApp, a node id while
        that node's ClientApp handles a message.
    """
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, node_id, 1


class InProcessGrid(Grid):
    """A Grid whose nodes are in-process ClientApp calls.

    Parameters
    ----------
    client_app : flwr.clientapp.ClientApp
        The ClientApp every node runs.
    num_nodes : int
        Nodes; node ``NODE_ID_BASE + i`` has ``partition-id`` i.
    run_config : Mapping[str, object]
        Run-config overrides; every node sees them over ``pyproject.toml``'s
        defaults (``context.run_config``, as Flower fuses them:
        :func:`task.config.fused_run_config`).
    absent : Iterable[int]
        Node ids not connected: not listed, never answer.
    silent : Iterable[int]
        Node ids that answer discovery but never a training message (dropouts).
    tamper : Mapping[int, callable], optional
        Node id -> f(reply) -> reply or None, applied to training replies (a
        hostile or lossy client, for fault injection).
    stateless : bool
        Give every message a fresh, empty node state (memory stays flat when
        clients need not remember anything, e.g. storage measurements).
    node_config : Mapping[int, Mapping], optional
        Partition id -> further node-config keys of that node (e.g.
        ``client-data``, its own data folder), as ``flower-supernode
        --node-config`` gives them.

    Every delivered message is logged in ``sent`` as (node id, message type).
    """

    def __init__(self, client_app, num_nodes: int, run_config: Mapping[str, object],
                 absent: Iterable[int] = (), silent: Iterable[int] = (),
                 tamper: Mapping | None = None, stateless: bool = False,
                 node_config: Mapping[int, Mapping] | None = None):
        self.client_app = client_app
        # the methods' own settings are the server's (a built-in's may not be in
        # pyproject.toml, whose keys the clients' run config is fused with)
        fused = fused_run_config({k: v for k, v in run_config.items()
                                  if not k.startswith("method.")})
        extra = dict(node_config or {})
        self.contexts = {
            NODE_ID_BASE + i: Context(
                run_id=RUN_ID, node_id=NODE_ID_BASE + i,
                node_config={"partition-id": i, "num-partitions": num_nodes,
                             **extra.get(i, {})},
                state=RecordDict(), run_config=dict(fused))
            for i in range(num_nodes)
        }
        self.absent, self.silent = set(absent), set(silent)
        self.tamper = dict(tamper or {})
        self.stateless = stateless
        self.sent: list[tuple[int, str]] = []
        self._pending: dict[str, list[Message]] = {}
        # id() of every Message sent that is still alive, with a weak reference
        # (a Message is sent once, as with Flower's Grids); an entry leaves when
        # its Message is freed, so no arrays are kept and no id is reused
        self._sent_ids: dict[int, weakref.ref] = {}

    @property
    def messages_sent(self) -> int:
        """Messages delivered so far."""
        return len(self.sent)

    def set_run(self, run):  # noqa: D102 - Grid API
        self._run = run

    @property
    def run(self):  # noqa: D102 - Grid API
        return getattr(self, "_run", None)

    def create_message(self, content, message_type, dst_node_id, group_id,  # noqa: D102
                       ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self):  # noqa: D102 - Grid API
        return [n for n in self.contexts if n not in self.absent]

    def push_messages(self, messages):
        """Deliver now; keep each reply under a fresh message id for pulling."""
        ids = []
        for message in messages:
            message_id = f"in-process-{len(self.sent)}"
            self._pending[message_id] = self.send_and_receive([message])
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        """The replies to pushed messages (each returned once)."""
        return [r for mid in message_ids for r in self._pending.pop(mid, [])]

    def send_and_receive(self, messages, *, timeout=None):
        """Deliver each message to its node's ClientApp; return the replies."""
        replies = []
        for message in messages:
            self._mark_sent(message)
            dst = message.metadata.dst_node_id
            self.sent.append((dst, message.metadata.message_type))
            training = message.metadata.message_type.startswith("train")
            if dst in self.absent or (dst in self.silent and training):
                continue
            reply = self._deliver(message, dst)
            if dst in self.tamper and training:
                reply = self.tamper[dst](reply)  # None: the reply is lost
            if reply is not None:
                replies.append(reply)
        return replies

    def _mark_sent(self, message: Message) -> None:
        """Refuse a Message sent before (while it lives); remember this one."""
        key = id(message)
        known = self._sent_ids.get(key)
        if known is not None and known() is message:
            raise RuntimeError("a Message can be sent only once")

        def forget(ref: weakref.ref, key: int = key) -> None:
            if self._sent_ids.get(key) is ref:
                del self._sent_ids[key]

        self._sent_ids[key] = weakref.ref(message, forget)

    def _deliver(self, message: Message, dst: int) -> Message:
        """Node ``dst``'s ClientApp handles ``message``, as node ``dst``."""
        context = self.contexts[dst]
        if self.stateless:
            context = Context(run_id=RUN_ID, node_id=dst, node_config=context.node_config,
                              state=RecordDict(), run_config=context.run_config)
        set_task_identity(dst)
        try:
            return self.client_app(message, context)
        finally:
            set_task_identity()


def run_in_process(run_config: Mapping[str, object], client_app=None) -> Path:
    """Run one experiment configuration through the real ServerApp, in process.

    Parameters
    ----------
    run_config : Mapping[str, object]
        Kebab-case run-config keys (as ``--run-config``), over ``pyproject.toml``'s
        defaults; must name ``results-dir`` and ``run-name`` so the summary can be
        found.
    client_app : flwr.clientapp.ClientApp, optional
        The app every node runs (default: ``client_app.app:app``; the cost-only
        runs of :mod:`experiments.costing` pass theirs).

    Returns
    -------
    Path
        The run's ``summary.json``.

    Raises
    ------
    RuntimeError
        The run ended without writing ``summary.json``.
    server_app.config.ConfigError
        A key that is not in pyproject.toml.
    """
    from client_app.app import app as real_app
    from server_app.app import main

    # every key, as a Flower run's context.run_config has: pyproject's defaults
    # < ``run_config`` (an unknown key is a ConfigError)
    config = cli_config.merge(cli_config.defaults(), [run_config]).config
    set_task_identity()
    grid = InProcessGrid(client_app or real_app, int(config["num-clients"]), config)
    main(grid, Context(run_id=RUN_ID, node_id=SERVER_NODE_ID, node_config={},
                       state=RecordDict(), run_config=config))
    path = Path(str(config["results-dir"])) / str(config["run-name"]) / "summary.json"
    if not path.is_file():
        raise RuntimeError(f"the run wrote no summary.json at {path}")
    json.loads(path.read_text())  # a finished run's summary is valid JSON
    return path


def summary_in_scratch(run_config: Mapping[str, object]) -> dict:
    """:func:`run_in_process` in a temporary results folder; the run's summary.json.

    For result scripts that keep only the summary: ``results-dir`` (and the
    models and history the run wrote there) is removed afterwards; ``run-name``
    defaults to ``scratch``.

    Raises
    ------
    RuntimeError, server_app.config.ConfigError
        As :func:`run_in_process`.
    """
    import shutil
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="se-scratch."))
    try:
        path = run_in_process({"run-name": "scratch", **run_config,
                               "results-dir": str(out)})
        return json.loads(path.read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)
