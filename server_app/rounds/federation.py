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
        ``client-samples`` cap), computed once on the server; bounds the
        ``num-examples`` a reply may claim. Empty: unknown.
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


def discover(grid: Grid, num_clients: int, timeout: float = 120.0) -> dict[int, int]:
    """Ask every node for its ``partition-id``; return partition id -> node id.

    Waits up to ``timeout`` seconds for ``num_clients`` nodes to connect. Every
    answer must be one reply per node asked, holding a ConfigRecord ``info``
    whose ``partition-id`` is an int (not a bool) in 0..num_clients-1, distinct
    over nodes (:func:`partition_id_of`).

    Raises
    ------
    DiscoveryError
        Too few nodes, a node without an answer, an error reply, a reply from a
        node not asked or a second reply, a malformed, out-of-range or duplicate
        partition id. The message is one line naming the node and the value.
    """
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise DiscoveryError(
                f"only {len(nodes)} nodes connected after {timeout:.0f} s; the run "
                f"config asks for num-clients = {num_clients}")
        time.sleep(0.5)
    messages = [Message(RecordDict(), dst_node_id=n, message_type="query.discover")
                for n in nodes]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    node_of: dict[int, int] = {}
    answered: set[int] = set()
    for reply in replies:
        node = reply.metadata.src_node_id
        if node not in nodes or node in answered:
            what = "a second reply" if node in answered else "a reply from a node not asked"
            raise DiscoveryError(f"discovery: {what} (node {node})")
        answered.add(node)
        pid = partition_id_of(reply, num_clients)
        if pid in node_of:
            raise DiscoveryError(
                f"nodes {node_of[pid]} and {node} both report partition-id {pid}: "
                f"ids must be distinct and in 0..{num_clients - 1}")
        node_of[pid] = node
    if len(node_of) != num_clients:
        missing = sorted(set(range(num_clients)) - set(node_of))[:10]
        raise DiscoveryError(f"{len(node_of)} of {num_clients} clients answered "
                             f"discovery; missing partition ids include {missing}")
    return node_of


def partition_id_of(reply: Message, num_clients: int) -> int:
    """The ``partition-id`` a discovery reply reports, checked.

    Raises
    ------
    DiscoveryError
        An error reply, no ConfigRecord ``info``, or a ``partition-id`` that is
        missing, not an int (bools and floats are refused) or not in
        0..num_clients-1.
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
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < num_clients:
        raise DiscoveryError(
            f"node {node} reports partition-id = {pid!r}: must be an integer in "
            f"0..{num_clients - 1} (num-clients = {num_clients})")
    return pid


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
