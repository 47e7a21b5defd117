"""A staged run's first requests, checked before any engine starts.

Stage 1's seeded requests are drawn as the ServerApp will draw them
(:class:`server_app.stages.churn.Churn`), so a run whose requests could never be
drawn is refused with the key to change and the most that fits
(:mod:`server_app.unlearning.plan`).
"""

from __future__ import annotations

from server_app.admission import lineage_shards
from server_app.config import RunConfig
from server_app.config.methods import reference
from server_app.config.values import bad as _bad
from server_app.stages.churn import Churn
from server_app.unlearning.plan import feasible, most, no_request_fits
from server_app.unlearning.requests import RequestError, validate_requests


def check_stage_requests(cfg: RunConfig) -> None:
    """Stage 1's ``requests-per-stage`` seeded requests can be drawn (a staged run).

    The draw is the ServerApp's own (:meth:`server_app.stages.churn.Churn.requests`
    over stage 1's clients), so a run whose seeded requests could never be drawn
    is refused before any engine starts; later stages, whose clients change,
    skip a draw that fails with a warning.

    Raises
    ------
    ConfigError
        Naming ``clients-per-request`` (not even one request fits) or
        ``requests-per-stage`` (with the most that fit).
    """
    wanted, per = cfg.stages.requests_per_stage, cfg.unlearning.clients_per_request
    if not wanted:
        return
    first, num_shards = cfg.initial_clients, cfg.training.num_shards
    churn = Churn(lineage_shards(cfg.data.num_clients, first, num_shards, cfg.seed),
                  first, 0, 0, cfg.seed)
    distribution = cfg.unlearning.request_distribution

    def draw(k: int, size: int) -> list[list[int]]:
        return churn.requests(churn.first(), (), k, size, distribution)

    if feasible(draw, wanted, per):
        _check_stage_baseline(cfg, draw(wanted, per))
        return
    where = f"stage 1 has {first} clients in {num_shards} shards and each shard keeps one"
    if not feasible(draw, 1, per):
        sizes = [sum(p < first for p in shard) for shard in churn.shards]
        raise no_request_fits(cfg, sizes, first, "requests-per-stage = 0")
    raise _bad("requests-per-stage", wanted,
               f"at most {most(lambda k: feasible(draw, k, per))} with "
               f"clients-per-request = {per} and request-distribution = "
               f"{distribution!r}: {where}")


def _check_stage_baseline(cfg: RunConfig, requests: list[list[int]]) -> None:
    """Stage 1's seeded ``requests`` leave each FR shard a client (if FR runs)."""
    if reference() not in cfg.unlearning.framework_list:
        return
    first = cfg.initial_clients
    base = [[p for p in pids if p < first] for pids in lineage_shards(
        cfg.data.num_clients, first, cfg.unlearning.baseline_shards, cfg.seed)]
    try:
        validate_requests(requests, base)
    except RequestError as err:
        raise _bad("baseline-shards", cfg.unlearning.baseline_shards,
                   f"fewer baseline shards, so each keeps a client of stage 1 after "
                   f"its seeded requests {requests}: {err}") from err
