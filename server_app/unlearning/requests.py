"""Unlearning requests: the paper's scenarios and their validation.

A request names clients (partition ids) to forget. Scenarios (paper Sec. 5.3):

- *even*: K requests spread over the shards (request k from shard k mod S);
- *adapt*: all K requests from one shard;
- *sequential*: each request handled alone, in order (forgetting is cumulative:
  request k removes F_1 u ... u F_k);
- *concurrent*: all K handled as one batch.

Expected retraining cost (paper Sec. 4.2) with mean shard retraining cost c:
sequential T = K c; concurrent T = S c (1 - (1 - 1/S)^K).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class RequestError(ValueError):
    """An unlearning request that cannot be carried out; nothing was changed."""


def generate_requests(shards: Sequence[Sequence[int]], num_requests: int,
                      clients_per_request: int, distribution: str, seed: int
                      ) -> list[list[int]]:
    """Draw K requests of ``clients_per_request`` distinct clients each.

    Each shard's clients are shuffled (seeded) and a request takes the next
    ones of one shard, so no client is named twice and a shard always keeps
    at least one client. A request goes to its seeded shard when that shard
    can serve it; only when it cannot (too few clients left) does it go to a
    shard that can, chosen with the same generator (``even``: among those
    with the fewest requests so far). Every draw that was feasible with the
    seeded shards alone is therefore unchanged.

    Parameters
    ----------
    shards : Sequence[Sequence[int]]
        Partition ids of each shard.
    num_requests : int
        K >= 1.
    clients_per_request : int
        Clients named by one request (>= 1).
    distribution : str
        ``even`` (request k from shard (s0 + k) mod S, s0 seeded) or ``adapt``
        (all K from one seeded shard).
    seed : int
        Seeds the shuffles and the choice of shards.

    Returns
    -------
    list[list[int]]
        K requests, each sorted; no client appears twice over all requests.

    Raises
    ------
    RequestError
        Bad arguments, or no shard can serve a request without losing its last
        client (the message gives the largest shard's size).
    """
    if num_requests < 1 or clients_per_request < 1:
        raise RequestError(f"num-requests = {num_requests} and clients-per-request ="
                           f" {clients_per_request} must be >= 1")
    if distribution not in ("even", "adapt"):
        raise RequestError(f"request-distribution = {distribution!r}: even or adapt")
    rng = np.random.default_rng(seed)
    pools = [list(rng.permutation(list(pids))) for pids in shards]
    first = int(rng.integers(len(shards)))
    if distribution == "adapt":  # one shard serves all K
        first = _serving(pools, first, num_requests * clients_per_request,
                         [0] * len(pools), rng, f"{num_requests} requests from one shard")
    served = [0] * len(pools)
    requests = []
    for k in range(num_requests):
        s = (first + k) % len(shards) if distribution == "even" else first
        s = _serving(pools, s, clients_per_request, served, rng, f"request {k}")
        served[s] += 1
        requests.append(sorted(int(pools[s].pop()) for _ in range(clients_per_request)))
    return requests


def _serving(pools: list[list], seeded: int, wanted: int, served: list[int],
             rng: np.random.Generator, what: str) -> int:
    """``seeded`` if its pool can give ``wanted`` clients and keep one, else another.

    The other is drawn with ``rng`` among the shards that can, those with the
    fewest requests ``served`` so far; ``rng`` is not used when ``seeded`` can.

    Raises
    ------
    RequestError
        No shard can.
    """
    if len(pools[seeded]) > wanted:
        return seeded
    able = [s for s, pool in enumerate(pools) if len(pool) > wanted]
    if not able:
        raise RequestError(
            f"{what} would forget every remaining client of its shard: "
            f"{wanted} client(s) asked, the largest of the {len(pools)} shards has "
            f"{max(map(len, pools))} left and each keeps one; use fewer requests or "
            "clients")
    fewest = min(served[s] for s in able)
    return int(rng.choice([s for s in able if served[s] == fewest]))


def validate_requests(requests: Sequence[Sequence[int]],
                      shards: Sequence[Sequence[int]],
                      already_forgotten: Sequence[int] = ()
                      ) -> tuple[list[list[int]], list[dict]]:
    """Check requests before any work; drop already-forgotten clients as no-ops.

    Parameters
    ----------
    requests : Sequence[Sequence[int]]
        Partition ids per request.
    shards : Sequence[Sequence[int]]
        Partition ids of each shard.
    already_forgotten : Sequence[int]
        Clients forgotten earlier (their repeat is a recorded no-op).

    Returns
    -------
    (requests, noops) : tuple[list[list[int]], list[dict]]
        The requests without already-forgotten clients, and one record per
        no-op (``request``, ``client``, ``reason``).

    Raises
    ------
    RequestError
        An unknown partition id, a client twice in one request, an empty
        request, or forgetting (cumulatively) every client of a shard.
    """
    shard_of = {p: s for s, pids in enumerate(shards) for p in pids}
    forgotten = set(already_forgotten)
    cleaned, noops = [], []
    for k, request in enumerate(requests):
        request = [int(p) for p in request]
        if not request:
            raise RequestError(f"request {k} names no client")
        unknown = [p for p in request if p not in shard_of]
        if unknown:
            raise RequestError(f"request {k}: unknown partition id(s) {unknown}; "
                               f"known ids are 0..{len(shard_of) - 1}")
        if len(set(request)) != len(request):
            twice = sorted({p for p in request if request.count(p) > 1})
            raise RequestError(f"request {k} names client(s) {twice} twice")
        kept = []
        for p in request:
            if p in forgotten:
                noops.append({"request": k, "client": p, "reason": "already forgotten"})
            else:
                kept.append(p)
                forgotten.add(p)
        cleaned.append(kept)
    for s, pids in enumerate(shards):
        if set(pids) <= forgotten:
            raise RequestError(f"the requests would forget every client of shard {s} "
                               f"({sorted(pids)}); a shard must keep one client")
    return cleaned, noops


def expected_cost(mode: str, num_requests: int, num_shards: int,
                  shard_cost: float) -> float:
    """The paper's expected total retraining cost for K uniform requests.

    sequential: K c; concurrent: S c (1 - (1 - 1/S)^K). Units follow
    ``shard_cost`` (e.g. seconds).
    """
    if mode == "sequential":
        return num_requests * shard_cost
    if mode == "concurrent":
        return num_shards * shard_cost * (1 - (1 - 1 / num_shards) ** num_requests)
    raise ValueError(f"request-mode = {mode!r}: sequential or concurrent")


def expected_impacted(num_shards: int, num_requests: int) -> float:
    """The paper's expected impacted shards for K uniform requests: S (1 - (1 - 1/S)^K)."""
    return num_shards * (1 - (1 - 1 / num_shards) ** num_requests)


def simulated_impacted(shards: Sequence[Sequence[int]], num_requests: int,
                       draws: int = 10000, seed: int = 0) -> float:
    """Mean impacted shards over ``draws`` seeded draws of K uniform requests.

    Each draw names K distinct clients uniformly at random (one client per
    request, as a real federation's clients would ask) and counts the shards
    holding them. The paper's formula (:func:`expected_impacted`) draws shards
    with replacement; distinct clients impact slightly more shards when shards
    are small.

    Parameters
    ----------
    shards : Sequence[Sequence[int]]
        Partition ids of each shard.
    num_requests : int
        K, at most the number of clients.
    draws : int
        Draws (> 0).
    seed : int
        Seed of the draws.

    Returns
    -------
    float
        The mean number of impacted shards.

    Raises
    ------
    ValueError
        K above the number of clients, or ``draws`` < 1.
    """
    shard_of = _shard_array(shards)
    if not 0 < num_requests <= len(shard_of) or draws < 1:
        raise ValueError(f"num-requests = {num_requests} with {len(shard_of)} clients "
                         f"and {draws} draws: need 1 <= K <= clients and draws >= 1")
    rng = np.random.default_rng(seed)
    counts = [len(set(shard_of[rng.choice(len(shard_of), num_requests, replace=False)]))
              for _ in range(draws)]
    return float(np.mean(counts))


def _shard_array(shards: Sequence[Sequence[int]]) -> np.ndarray:
    """Shard of each client, indexed by position in the sorted list of clients."""
    pairs = sorted((p, s) for s, pids in enumerate(shards) for p in pids)
    return np.array([s for _, s in pairs], dtype=np.int64)
