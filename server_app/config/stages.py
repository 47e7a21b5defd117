"""Checks of the stage keys (a federation that lives on; :mod:`server_app.stages.staged`).

The keys: ``num-stages``, ``joins-per-stage``, ``leaves-per-stage`` and
``requests-per-stage``. ``num-clients`` counts every client that ever exists:
the first stage has ``num-clients - joins-per-stage x (num-stages - 1)`` of them
and each later stage adds ``joins-per-stage``. What a staged run supports is
checked here, before any engine starts; each error names the key, the value and
what is allowed.
"""

from __future__ import annotations

from server_app.config.values import bad

MAX_STAGES = 1000
STAGED_FRAMEWORKS = ("SE", "FR")


def initial_clients(cfg) -> int:
    """Clients present in stage 1: ``num-clients - joins-per-stage x (num-stages - 1)``."""
    return cfg.num_clients - cfg.joins_per_stage * (cfg.num_stages - 1)


def check_stages(cfg) -> None:
    """Validate the stage keys of ``cfg`` (a :class:`server_app.config.RunConfig`).

    Raises
    ------
    ConfigError
        A key out of range, a stage key set in a one-stage run, or a setting a
        staged run does not support (frameworks other than SE and FR, coded
        storage, concurrent or explicit requests, backdoor or shadow-model checks).
    """
    if not 1 <= cfg.num_stages <= MAX_STAGES:
        raise bad("num-stages", cfg.num_stages, f"an integer in [1, {MAX_STAGES}]")
    for key in ("joins-per-stage", "leaves-per-stage", "requests-per-stage"):
        value = getattr(cfg, key.replace("-", "_"))
        if not 0 <= value <= cfg.num_clients:
            raise bad(key, value, f"an integer in [0, num-clients = {cfg.num_clients}]")
        if value and cfg.num_stages == 1:
            raise bad(key, value, "0 with num-stages = 1 (churn and requests per "
                      "stage need num-stages > 1)")
    if cfg.num_stages == 1:
        return
    _check_staged_settings(cfg)
    first, shards = initial_clients(cfg), max(cfg.num_shards, cfg.baseline_shards)
    if first < shards:  # SE's shards and FR's baseline-shards
        raise bad("joins-per-stage", cfg.joins_per_stage,
                  f"at most {(cfg.num_clients - shards) // (cfg.num_stages - 1)}"
                  f": num-clients = {cfg.num_clients} counts every client that ever "
                  f"exists, and stage 1 must give each of the {shards} shards "
                  f"a client (it has {first})")


def _check_staged_settings(cfg) -> None:
    names = cfg.framework_list
    if "SE" not in names or any(n not in STAGED_FRAMEWORKS for n in names):
        raise bad("frameworks", cfg.frameworks,
                  "'SE' or 'SE,FR' with num-stages > 1 (FedEraser and RapidRetrain "
                  "are not staged)")
    fixed = {"storage": (cfg.storage, "uncoded"),
             "request-mode": (cfg.request_mode, "sequential"),
             "num-requests": (cfg.num_requests, 1),
             "forget-clients": (cfg.forget_clients, ""),
             "backdoor-trigger": (cfg.backdoor_trigger, 0),
             "mia-shadows": (cfg.mia_shadows, 0)}
    for key, (value, allowed) in fixed.items():
        if value != allowed:
            raise bad(key, value, f"{allowed!r} with num-stages > 1 (staged runs take "
                      "requests-per-stage and the forget command; coded storage and "
                      "the verification checks are not staged yet)")
