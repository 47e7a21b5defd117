"""Who is present in each stage of a staged run: joins, leaves and planned requests.

A staged run (:mod:`server_app.stages.staged`) starts with the clients
``0 .. C0 - 1`` (C0 = :attr:`server_app.config.RunConfig.initial_clients`), split
into shards by :func:`server_app.rounds.federation.assign_shards`; before stage t >= 2,
``leaves-per-stage`` present clients leave and the next ``joins-per-stage``
partition ids join. A joining client with partition id p joins shard ``p mod S``
and stays there: a shard is a lineage across stages, so isolation holds across
them. Leaving is not a request to be forgotten: a client that left keeps its
past rounds in the history (and its node answers the retraining of those
rounds); it is only no longer sampled. Every draw is seeded by (seed, stage).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from server_app.admission import present_shards
from server_app.unlearning.requests import RequestError, generate_requests

if TYPE_CHECKING:
    pass


@dataclass
class Membership:
    """The clients of one stage and how they changed at its start.

    Attributes
    ----------
    stage : int
        1-based stage number.
    present : list[int]
        Partition ids taking part in this stage's learning, ascending.
    joined, left : list[int]
        Clients that joined / left at the start of this stage.
    warnings : list[str]
        Leaves that could not be drawn without emptying a shard.
    """

    stage: int
    present: list[int]
    joined: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class Churn:
    """The seeded membership plan of a staged run.

    Parameters
    ----------
    shards : Sequence[Sequence[int]]
        :func:`lineage_shards` of the run (every client that ever exists).
    initial : int
        C0, clients of stage 1.
    joins, leaves : int
        Clients joining / leaving before each stage after the first.
    seed : int
        The run's seed.
    """

    def __init__(self, shards: Sequence[Sequence[int]], initial: int, joins: int,
                 leaves: int, seed: int) -> None:
        self.shards = [list(s) for s in shards]
        self.shard_of = {p: s for s, pids in enumerate(self.shards) for p in pids}
        self.initial, self.joins, self.leaves, self.seed = initial, joins, leaves, seed

    def first(self) -> Membership:
        """Stage 1: clients ``0 .. C0 - 1``."""
        return Membership(1, list(range(self.initial)))

    def advance(self, before: Membership, forgotten: Iterable[int]) -> Membership:
        """The next stage: forgotten clients are gone, some leave, the next ids join.

        A leave that would take a shard's last present client is not drawn; the
        shortfall is a warning of the new stage.
        """
        stage = before.stage + 1
        gone = set(forgotten)
        staying = [p for p in before.present if p not in gone]
        counts = np.bincount([self.shard_of[p] for p in staying],
                             minlength=len(self.shards))
        rng = np.random.default_rng([self.seed, stage, 1])
        left = []
        for p in rng.permutation(staying):
            if len(left) == self.leaves:
                break
            if counts[self.shard_of[int(p)]] > 1:
                counts[self.shard_of[int(p)]] -= 1
                left.append(int(p))
        start = self.initial + (stage - 2) * self.joins
        joined = list(range(start, start + self.joins))
        present = sorted(set(staying) - set(left) | set(joined))
        warnings = [] if len(left) == self.leaves else [
            f"stage {stage}: {len(left)} of leaves-per-stage = {self.leaves} clients "
            "left (more would have left a shard without a client)"]
        return Membership(stage, present, joined, sorted(left), warnings)

    def requests(self, member: Membership, forgotten: Iterable[int], count: int,
                 clients_per_request: int, distribution: str) -> list[list[int]]:
        """``count`` seeded requests of the stage among its present clients.

        Raises
        ------
        RequestError
            The requests would leave a shard without a present client.
        """
        if not count:
            return []
        gone = set(forgotten)
        pools = present_shards(self.shards, (p for p in member.present if p not in gone))
        try:
            return generate_requests(pools, count, clients_per_request, distribution,
                                     seed=self.seed * 1_000_003 + member.stage)
        except RequestError as err:
            raise RequestError(f"stage {member.stage}: {err}") from None
