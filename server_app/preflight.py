"""Checks of a run config that need no data, no nodes and no engine.

:func:`preflight` is what the ServerApp runs first and what ``python -m cli``
runs before it starts any process: the typed config
(:meth:`RunConfig.from_run_config`), finite numbers, and the unlearning requests
the config describes (explicit ``forget-clients``, checked even with
``frameworks = "none"``, or generated ones) against the shards it makes.
Every failure is a :class:`ConfigError` whose one-line message names the key,
the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from server_app.config import ConfigError, RunConfig
from server_app.federation import assign_shards
from server_app.requests import RequestError, generate_requests, validate_requests


def preflight(run_config: Mapping[str, object]) -> RunConfig:
    """Parse and check ``run_config`` as far as is possible before any work.

    Parameters
    ----------
    run_config : Mapping[str, object]
        Flower's flat run config (kebab-case keys as in ``pyproject.toml``);
        missing keys take their defaults.

    Returns
    -------
    RunConfig
        The validated config.

    Raises
    ------
    ConfigError
        A bad value (unknown type, out of range, not finite) or unlearning
        requests that cannot be carried out (the message names
        ``forget-clients``, or ``num-requests`` for generated requests).
    """
    cfg = RunConfig.from_run_config(run_config)
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            key = field.name.replace("_", "-")
            raise ConfigError(f"run-config '{key}' = {value!r} is not allowed: "
                              "a finite number")
    if cfg.framework_list or cfg.forget_client_list:  # explicit ids: always checked
        shards = assign_shards(cfg.num_clients, cfg.num_shards, cfg.seed)
        try:
            unlearning_requests(cfg, shards)
        except RequestError as err:
            key = "forget-clients" if cfg.forget_clients else "num-requests"
            value = getattr(cfg, key.replace("-", "_"))
            raise ConfigError(f"run-config '{key}' = {value!r} is not allowed: "
                              f"{err}") from err
    return cfg


def unlearning_requests(cfg: RunConfig, shards: Sequence[Sequence[int]]
                        ) -> tuple[list[list[int]], list[dict]]:
    """The run's requests (``forget-clients``, else generated), validated.

    Parameters
    ----------
    cfg : RunConfig
        The run config.
    shards : Sequence[Sequence[int]]
        Partition ids of each shard.

    Returns
    -------
    (requests, noops) : tuple[list[list[int]], list[dict]]
        As :func:`server_app.requests.validate_requests`.

    Raises
    ------
    RequestError
        A request that cannot be carried out.
    """
    if cfg.forget_client_list:
        requests = [cfg.forget_client_list]
    else:
        requests = generate_requests(shards, cfg.num_requests, cfg.clients_per_request,
                                     cfg.request_distribution, cfg.seed)
    return validate_requests(requests, shards)
