"""Shared fixtures: an in-process Grid that runs the real ClientApp per node."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


class InProcessGrid(Grid):
    """A Grid whose nodes are in-process ClientApp calls, one Context per node.

    Node ids are 1000 + partition id. Every delivered message is logged in
    ``sent`` as (dst node id, message type), and a message can be sent once only,
    as in Flower.
    """

    def __init__(self, client_app, num_nodes: int, run_config: dict,
                 absent: Iterable[int] = (), silent: Iterable[int] = (),
                 tamper=None) -> None:
        self.client_app = client_app
        self.contexts = {
            1000 + i: Context(run_id=1, node_id=1000 + i,
                              node_config={"partition-id": i,
                                           "num-partitions": num_nodes},
                              state=RecordDict(), run_config=dict(run_config))
            for i in range(num_nodes)
        }
        self.absent = set(absent)  # not connected: not listed, never answer
        self.silent = set(silent)  # listed, answer discovery, never train (dropout)
        self.tamper = tamper or {}  # node id -> f(reply) -> reply (hostile client)
        self.sent: list[tuple[int, str]] = []

    def set_run(self, run):
        self._run = run

    @property
    def run(self):
        return getattr(self, "_run", None)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return [n for n in self.contexts if n not in self.absent]

    def push_messages(self, messages):
        raise NotImplementedError("use send_and_receive")

    def pull_messages(self, message_ids):
        raise NotImplementedError("use send_and_receive")

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            if getattr(message, "_in_process_sent", False):
                raise RuntimeError("a Message can be sent only once")
            message._in_process_sent = True
            dst = message.metadata.dst_node_id
            self.sent.append((dst, message.metadata.message_type))
            training = message.metadata.message_type.startswith("train")
            if dst in self.absent or (dst in self.silent and training):
                continue
            TaskIdentity.node_id = dst
            reply = self.client_app(message, self.contexts[dst])
            if dst in self.tamper and training:
                reply = self.tamper[dst](reply)  # None: the reply is lost
            if reply is not None:
                replies.append(reply)
        TaskIdentity.node_id = 0
        return replies


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages built outside a Flower run need a run id and node id."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1
    yield


@pytest.fixture
def make_grid():
    """Factory: ``make_grid(num_nodes, run_config)`` -> InProcessGrid."""
    from client_app.app import app as client_app

    def make(num_nodes: int, run_config: dict, absent: Iterable[int] = (), **kw):
        return InProcessGrid(client_app, num_nodes, run_config, absent, **kw)

    return make


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline datasets (../shared/data); tests needing them skip without."""
    root = Path(os.environ.get("SE_DATA_DIR", SHARED_DATA))
    if not (root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no offline datasets at {root}")
    return root


TINY = {
    "dataset": "mnist", "num-clients": 8, "num-shards": 2, "clients-per-round": 4,
    "num-rounds": 2, "local-epochs": 1, "client-samples": 64, "test-samples": 500,
    "batch-size": 16,
}


@pytest.fixture
def run_server(tmp_path, make_grid, shared_data):
    """Factory: run the real ServerApp in-process on an InProcessGrid.

    ``run_server(overrides) -> (summary dict, grid)``; results go to tmp_path.
    """
    import json

    from server_app.app import main

    def run(overrides: dict | None = None, run_name: str = "t", **grid_kw):
        config = {**TINY, "results-dir": str(tmp_path), "run-name": run_name,
                  "data-dir": str(shared_data), **(overrides or {})}
        grid = make_grid(int(config["num-clients"]), config, **grid_kw)
        main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                           run_config=config))
        return json.loads((tmp_path / run_name / "summary.json").read_text()), grid

    return run
