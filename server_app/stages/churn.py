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

from server_app.config.methods import reference
from server_app.rounds.federation import assign_shards
from server_app.unlearning.requests import RequestError, generate_requests

if TYPE_CHECKING:
    from server_app.config import RunConfig


def lineage_shards(num_clients: int, initial: int, num_shards: int, seed: int
                   ) -> list[list[int]]:
    """Shards over every client that ever exists (partition ids ascending).

    Clients ``0 .. initial - 1`` are split by :func:`assign_shards`; a later
    client p joins shard ``p mod num_shards``.

    Raises
    ------
    ValueError
        ``num_shards`` not in [1, initial].
    """
    shards = assign_shards(initial, num_shards, seed)
    for p in range(initial, num_clients):
        shards[p % num_shards].append(p)
    return shards


def present_shards(shards: Sequence[Sequence[int]], present: Iterable[int]
                   ) -> list[list[int]]:
    """Each shard's clients that are in ``present`` (order kept)."""
    here = set(present)
    return [[p for p in pids if p in here] for pids in shards]


def run_shards(cfg: RunConfig) -> list[tuple[list[list[int]], str]]:
    """The shards a request to a finished run must leave a client in.

    SE's (``num-shards``) and, when ``frameworks`` has FR, FR's
    (``baseline-shards``), as the ServerApp builds them: lineages for a staged
    run (:func:`lineage_shards`), else :func:`assign_shards` over every client.

    Returns
    -------
    list of (shards, what)
        Each federation's shards (partition ids) and its name in a refusal
        (``shard``, ``FR shard``).
    """
    clients = cfg.data.num_clients

    def split(num_shards: int) -> list[list[int]]:
        if cfg.stages.staged:
            return lineage_shards(clients, cfg.initial_clients, num_shards, cfg.seed)
        return assign_shards(clients, num_shards, cfg.seed)

    feds = [(split(cfg.training.num_shards), "shard")]
    if reference() in cfg.unlearning.framework_list:
        feds.append((split(cfg.unlearning.baseline_shards), f"{reference()} shard"))
    return feds


def later_refusal(clients: Sequence[int], joined: int, forgotten: Iterable[int],
                  present: Iterable[int],
                  feds: Sequence[tuple[Sequence[Sequence[int]], str]]) -> str | None:
    """Why a finished run cannot forget ``clients`` (None: it can).

    Any client that ever took part can be forgotten, one that left included;
    one whose removal would leave a shard of the last stage without a client
    cannot. The ServerApp refuses such a request in its receipt; ``forget``
    refuses it before recording it.

    Parameters
    ----------
    clients : Sequence[int]
        The request's partition ids.
    joined : int
        Clients that ever joined the run (ids ``0 .. joined - 1``).
    forgotten : Iterable[int]
        Every client forgotten so far.
    present : Iterable[int]
        The last stage's clients.
    feds : Sequence of (shards, what)
        Each federation's shards and its name (:func:`run_shards`).

    Returns
    -------
    str or None
        The reason, in one line, or None.
    """
    unknown = [p for p in clients if p >= joined]
    if unknown:
        return f"client(s) {unknown} are not clients of this run"
    done_before = set(forgotten)
    done = [p for p in clients if p in done_before]
    if done:
        return f"client(s) {done} are already forgotten"
    gone = done_before | set(clients)
    present = list(present)
    for shards, what in feds:
        here = present_shards(shards, (p for p in present if p not in gone))
        empty = [s for s, pids in enumerate(here) if not pids]
        if empty:
            return f"{what}(s) {empty} would keep no client"
    return None


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
