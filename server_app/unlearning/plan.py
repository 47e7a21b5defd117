"""A run's unlearning requests, planned and checked before any engine starts.

:func:`plan_requests` draws or reads the run's requests
(:mod:`server_app.unlearning.requests`) and checks them against SE's shards and the
baselines' shards; the errors name the run-config key a user can change and the
most that fits. Plain functions of the settings: no nodes, no data.
"""

from __future__ import annotations

from collections.abc import Callable

from server_app.config import ConfigError, RunConfig
from server_app.config.values import bad as _bad
from server_app.rounds.federation import assign_shards
from server_app.unlearning.requests import (
    RequestError,
    generate_requests,
    validate_requests,
)


def plan_requests(cfg: RunConfig) -> tuple[list[list[int]], list[dict]]:
    """The run's unlearning requests, checked against both federations' shards.

    ``forget-clients`` as one request, or ``num-requests`` generated ones
    (:func:`server_app.unlearning.requests.generate_requests`); ``([], [])`` without
    frameworks or with ``forget-records`` / ``forget-labels``
    (:mod:`server_app.unlearning.erasure`: the clients stay).

    Returns
    -------
    (requests, noops)
        As :func:`server_app.unlearning.requests.validate_requests`.

    Raises
    ------
    ConfigError
        Requests that would forget every client of a shard (of SE's shards or,
        when a baseline runs, of the ``baseline-shards`` federation).
    """
    unlearning = cfg.unlearning
    erasing = unlearning.erased_records or unlearning.erased_labels
    if not unlearning.framework_list or erasing:
        return [], []  # none; or a records / class-level request: it forgets no client
    shards = assign_shards(cfg.data.num_clients, cfg.training.num_shards, cfg.seed)
    if cfg.unlearning.forget_client_list:
        requests = [cfg.unlearning.forget_client_list]
    else:
        requests = _generate(cfg, shards)
    try:
        requests, noops = validate_requests(requests, shards)
    except RequestError as err:
        raise _bad("forget-clients", cfg.unlearning.forget_clients,
                   f"ids that leave every shard a client: {err}") from err
    if cfg.unlearning.with_fields(on_baseline=True):
        base = assign_shards(cfg.data.num_clients, cfg.unlearning.baseline_shards, cfg.seed)
        try:
            validate_requests(requests, base)
        except RequestError as err:
            raise _bad("baseline-shards", cfg.unlearning.baseline_shards,
                       f"fewer baseline shards, so each keeps a client after "
                       f"forgetting {sorted({p for r in requests for p in r})}: "
                       f"{err}") from err
    return requests, noops


def _generate(cfg: RunConfig, shards: list[list[int]]) -> list[list[int]]:
    """Generated requests, or a ConfigError naming the generator's keys."""
    unlearning = cfg.unlearning
    per, distribution = unlearning.clients_per_request, unlearning.request_distribution

    def draw(k: int, size: int) -> list[list[int]]:
        return generate_requests(shards, k, size, distribution, cfg.seed)

    try:
        return draw(unlearning.num_requests, per)
    except RequestError as err:
        reason = str(err)
    if not feasible(draw, 1, per):
        raise no_request_fits(cfg, [len(p) for p in shards], cfg.data.num_clients)
    largest = most(lambda k: feasible(draw, k, per))
    raise _bad("num-requests", unlearning.num_requests,
               f"at most {largest} with clients-per-request = {per} "
               f"and request-distribution = {distribution!r}: {reason}")


def no_request_fits(cfg: RunConfig, sizes: list[int], clients: int,
                     instead: str = "frameworks = 'none' (no unlearning)") -> ConfigError:
    """The error when not even one request can be drawn, naming what can change.

    ``sizes`` are the shards' client counts (``clients`` in all; a staged run:
    stage 1's). A request takes ``clients-per-request`` clients of one shard and
    leaves it one, so it needs a shard larger than that: the error names
    ``clients-per-request`` when a shard has two clients or more, else
    ``num-shards`` (or ``num-clients``), then the other ways out (``instead``:
    the setting that asks for no request).
    """
    per, num_shards = cfg.unlearning.clients_per_request, cfg.training.num_shards
    largest = max(sizes, default=0)
    if largest > 1:
        return _bad("clients-per-request", per,
                    f"at most {largest - 1}: the largest of the {len(sizes)} shards has "
                    f"{largest} clients ({clients} clients, num-shards = {num_shards}) "
                    "and a request leaves its shard one")
    joins = (f", fewer joins-per-stage (stage 1 has {clients} of the "
             f"{cfg.data.num_clients} clients)" if cfg.stages.staged else "")
    if clients < 2:
        return _bad("num-clients", cfg.data.num_clients,
                    f"at least 2 clients{' in stage 1' + joins if joins else ''} for "
                    f"an unlearning request (it may not forget the only client), or "
                    f"{instead}")
    return _bad("num-shards", num_shards,
                f"at most {clients - 1} with {clients} clients: each of the {num_shards} "
                "shards has one client and a request may not forget a shard's last one; "
                f"use fewer shards, more clients{joins} or {instead}")


def most(ok: Callable[[int], bool]) -> int:
    """Largest n >= 1 with ok(n), for ok true on a prefix 1..m (0 if m = 0).

    Requests are drawn in order, so fewer (or smaller) requests of a feasible
    draw stay feasible; the search stops at the first failure (at most C steps).
    """
    n = 0
    while ok(n + 1):
        n += 1
    return n


def feasible(draw: Callable[[int, int], object], k: int, per: int) -> bool:
    """True if ``draw(k, per)`` raises no :class:`RequestError`."""
    try:
        draw(k, per)
    except RequestError:
        return False
    return True


def baseline_sampling_notes(cfg: RunConfig, requests: list[list[int]]) -> list[str]:
    """The from-scratch methods' baseline shards that keep fewer clients than they sample.

    FedRetrain and RapidRetrain then sample every retained client of such a
    shard (``min(per round, retained)``; see :class:`strategies.unlearning.FedRetrain`).
    """
    runs = cfg.unlearning.with_fields(from_scratch=True)
    forget = {p for r in requests for p in r}
    if not runs or not forget:
        return []
    base = cfg.unlearning.baseline_shards
    per_round = cfg.training.clients_per_round // base
    notes = []
    for s, pids in enumerate(assign_shards(cfg.data.num_clients, base, cfg.seed)):
        kept = len([p for p in pids if p not in forget])
        if kept < per_round:
            notes.append(f"{'/'.join(runs)}: baseline shard {s} keeps {kept} clients "
                         f"after forgetting, fewer than the {per_round} it sampled per "
                         f"round in learning; it samples all {kept}")
    return notes
