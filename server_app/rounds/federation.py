"""Who is in the federation: node discovery and the split of clients into shards."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid


class DiscoveryError(RuntimeError):
    """The connected nodes do not form the federation the run config describes."""


@dataclass(frozen=True)
class Federation:
    """Clients, their nodes and their shards.

    Attributes
    ----------
    node_of : dict[int, int]
        partition id -> Flower node id.
    shards : list[list[int]]
        Partition ids of each shard, ascending; disjoint, covering all clients.
    samples : Mapping[int, int]
        Partition id -> training samples that client holds (after the
        ``client-samples`` cap): the size of the partition the server cut, or the
        ``num-records`` a node reading its own data folder reported at discovery
        (:func:`bounded_sizes`); bounds the ``num-examples`` a reply may claim.
        Empty: unknown.
    """

    node_of: dict[int, int]
    shards: list[list[int]]
    samples: Mapping[int, int] = field(default_factory=dict)

    @property
    def shard_of(self) -> dict[int, int]:
        """Partition id -> shard."""
        return {pid: s for s, pids in enumerate(self.shards) for pid in pids}

    @property
    def partition_of(self) -> dict[int, int]:
        """Flower node id -> partition id."""
        return {node: pid for pid, node in self.node_of.items()}

    def shard_nodes(self) -> list[list[int]]:
        """Node ids of each shard, in partition-id order."""
        return [[self.node_of[pid] for pid in pids] for pids in self.shards]


NODE_RULE = "the nodes whose partition-id is in 0..num-clients - 1; the others are left out"
"""Which of the connected nodes a run uses (a run may use fewer clients than are
connected); each run records it, with the nodes it left out."""


@dataclass(frozen=True)
class Discovered:
    """What discovery learned.

    Attributes
    ----------
    node_of : dict[int, int]
        Partition id -> Flower node id.
    records : dict[int, int]
        Partition id -> records the node says it holds (``num-records``), for
        the nodes that read their own data folder (node-config ``client-data``);
        the others report none.
    """

    node_of: dict[int, int]
    records: dict[int, int]
    left_out: dict[int, int] = field(default_factory=dict)
    """Partition id -> node id of the connected nodes the run does not use
    (:data:`NODE_RULE`: their partition id is ``num-clients`` or more)."""


def discover(grid: Grid, num_clients: int, timeout: float = 120.0) -> dict[int, int]:
    """Partition id -> node id (:func:`find_nodes`'s ``node_of``)."""
    return find_nodes(grid, num_clients, timeout).node_of


def find_nodes(grid: Grid, num_clients: int, timeout: float = 120.0,
               config: ConfigRecord | None = None, own_data: bool = False
               ) -> Discovered:
    """Ask every node for its ``partition-id`` (and ``num-records``, if it has them).

    ``config``: sent with the question (the run's client settings,
    :func:`task.config.client_settings`), which a node with its own data folder
    checks the folder against. ``own_data`` (run-config ``client-data = true``):
    every node of the run must report ``num-records`` (the server cut no
    partition to fall back on).

    Waits up to ``timeout`` seconds for ``num_clients`` nodes to connect. Every
    answer must be one reply per node asked, holding a ConfigRecord ``info``
    whose ``partition-id`` is an int (not a bool) in 0..num_clients-1, distinct
    over nodes (:func:`partition_id_of`), and, where present, ``num-records`` an
    int >= 1 (:func:`records_of`).

    Raises
    ------
    DiscoveryError
        Too few nodes, a node without an answer, an error reply (e.g. a node
        whose own data folder does not fit the run), a reply from a node not
        asked or a second reply, a malformed, out-of-range or duplicate
        partition id, a malformed record count, a node without its own data
        folder when ``own_data``. The message is one line naming
        the node and the value.
    """
    deadline = time.monotonic() + timeout  # more nodes may be connected: NODE_RULE
    while len(nodes := sorted(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise DiscoveryError(
                f"only {len(nodes)} nodes connected after {timeout:.0f} s; the run "
                f"config asks for num-clients = {num_clients}")
        time.sleep(0.5)
    content = RecordDict({"config": config}) if config is not None else RecordDict()
    messages = [Message(content, dst_node_id=n, message_type="query.discover")
                for n in nodes]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    node_of: dict[int, int] = {}
    records: dict[int, int] = {}
    left_out: dict[int, int] = {}
    answered: set[int] = set()
    for reply in replies:
        node = reply.metadata.src_node_id
        if node not in nodes or node in answered:
            what = "a second reply" if node in answered else "a reply from a node not asked"
            raise DiscoveryError(f"discovery: {what} (node {node})")
        answered.add(node)
        pid = partition_id_of(reply)
        if pid >= num_clients:  # NODE_RULE: connected, not one of this run's clients
            left_out[pid] = node
            continue
        if pid in node_of:
            raise DiscoveryError(
                f"nodes {node_of[pid]} and {node} both report partition-id {pid}: "
                f"ids must be distinct and in 0..{num_clients - 1}")
        node_of[pid] = node
        held = records_of(reply)
        if held is not None:
            records[pid] = held
        elif own_data:
            raise DiscoveryError(
                f"node {node} (partition-id {pid}) reports no num-records: run-config "
                "client-data = true needs every node to read its own data folder "
                "(node-config client-data)")
    if len(node_of) != num_clients:
        missing = sorted(set(range(num_clients)) - set(node_of))[:10]
        raise DiscoveryError(
            f"{len(node_of)} of {num_clients} clients answered discovery; missing "
            f"partition ids include {missing}" + (
                f" (left out, partition-id >= num-clients: {sorted(left_out)})"
                if left_out else ""))
    return Discovered(node_of, records, left_out)


def partition_id_of(reply: Message) -> int:
    """The ``partition-id`` a discovery reply reports, checked (an int >= 0).

    Raises
    ------
    DiscoveryError
        An error reply, no ConfigRecord ``info``, or a ``partition-id`` that is
        missing, not an int (bools and floats are refused) or negative.
    """
    node = reply.metadata.src_node_id
    if reply.has_error():
        raise DiscoveryError(f"node {node} failed discovery: {reply.error.reason}")
    content = reply.content
    info = content.get("info") if isinstance(content, RecordDict) else None
    if not isinstance(info, ConfigRecord):
        raise DiscoveryError(f"node {node} answered discovery without a ConfigRecord "
                             f"'info' (records: {_names(content)})")
    pid = info.get("partition-id")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise DiscoveryError(f"node {node} reports partition-id = {pid!r}: must be an "
                             "integer >= 0 (the run uses those in 0..num-clients - 1)")
    return pid


def records_of(reply: Message) -> int | None:
    """The ``num-records`` a discovery reply reports (None: the node did not say).

    Call after :func:`partition_id_of` (the reply has its ``info`` record).

    Raises
    ------
    DiscoveryError
        A value that is not an int >= 1 (bools refused).
    """
    held = reply.content["info"].get("num-records")
    if held is None:
        return None
    if isinstance(held, bool) or not isinstance(held, int) or held < 1:
        raise DiscoveryError(f"node {reply.metadata.src_node_id} reports num-records = "
                             f"{held!r}: must be an integer >= 1")
    return held


def bounded_sizes(cut: Mapping[int, int], reported: Mapping[int, int], cap: int = 0
                  ) -> dict[int, int]:
    """Records each client holds: what a node reported, else the partition's size.

    Parameters
    ----------
    cut : Mapping[int, int]
        Partition id -> records of the partition the server cut
        (:func:`task.data.partition_sizes`, ``client-samples`` applied).
    reported : Mapping[int, int]
        Partition id -> ``num-records`` from discovery (own data folders).
    cap : int
        Run-config ``client-samples`` (0: all): applied to what was reported.

    Returns
    -------
    dict[int, int]
        Partition id -> records (``cut`` with ``reported`` over it, capped).
    """
    own = {p: min(n, cap) if cap > 0 else n for p, n in reported.items()}
    return {**dict(cut), **own}


def _names(content: object) -> list[str]:
    return sorted(content.keys()) if isinstance(content, RecordDict) else []


def assign_shards(num_clients: int, num_shards: int, seed: int) -> list[list[int]]:
    """Split partition ids 0..C-1 into S disjoint shards of (nearly) equal size.

    A seeded permutation, then contiguous parts; each shard's ids are sorted.

    Raises
    ------
    ValueError
        S < 1 or S > C.
    """
    if not 1 <= num_shards <= num_clients:
        raise ValueError(f"num-shards = {num_shards} is not allowed: between 1 and "
                         f"num-clients = {num_clients}")
    order = np.random.default_rng(seed).permutation(num_clients)
    return [sorted(int(p) for p in part) for part in np.array_split(order, num_shards)]
