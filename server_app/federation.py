"""Who is in the federation: node discovery and the split of clients into shards."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from flwr.app import Message, RecordDict
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
    """

    node_of: dict[int, int]
    shards: list[list[int]]

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

    Waits up to ``timeout`` seconds for ``num_clients`` nodes to connect.

    Raises
    ------
    DiscoveryError
        Too few nodes, a node without an answer, duplicate or out-of-range ids.
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
    for reply in replies:
        if reply.has_error():
            raise DiscoveryError(f"node {reply.metadata.src_node_id} failed discovery:"
                                 f" {reply.error.reason}")
        pid = int(reply.content["info"]["partition-id"])
        if not 0 <= pid < num_clients or pid in node_of:
            raise DiscoveryError(
                f"node {reply.metadata.src_node_id} reports partition-id {pid}: "
                f"ids must be distinct and in 0..{num_clients - 1}")
        node_of[pid] = reply.metadata.src_node_id
    if len(node_of) != num_clients:
        missing = sorted(set(range(num_clients)) - set(node_of))[:10]
        raise DiscoveryError(f"{len(node_of)} of {num_clients} clients answered "
                             f"discovery; missing partition ids include {missing}")
    return node_of


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
