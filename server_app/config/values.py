"""Run-config values: the error type, the sanity ranges, and type coercion.

Shared by :mod:`server_app.config.run_config` and its feature checks
(:mod:`server_app.config.features`), so neither imports the other's internals.
"""

from __future__ import annotations

import math
import re

MAX_SEED = 2**32 - 1
MAX_CLIENTS = 100_000  # beyond any dataset here (MNIST: 60,000 training images);
# the ServerApp refines it with the data (server_app.preflight.check_partition)
MAX_LR = 10.0  # a local step size above this diverges for every model of this app
TEXT_CONTEXT = 64  # task.nanogpt.GPTConfig.block_size: the GPT's context
INT64_MAX = 2**63 - 1  # Flower's protobuf carries ints as int64

# Largest value of each integer key (sanity ceilings, far above any useful run).
MAX_INT = {"local-epochs": 1000, "num-rounds": 100_000, "batch-size": 2**20,
           "block-size": 2**16, "client-samples": 2**31 - 1,
           "test-samples": 2**31 - 1,
           "calibration-interval": 100_000, "mia-samples": 10_000_000,
           "mia-nonmembers": 10_000_000,
           "blocks-per-shard": 100_000, "recovery-warmup": 100_000,
           "recovery-correction": 100_000, "recovery-final": 100_000,
           "recovery-memory": 1000}
# Range of each float key (sanity ranges; lr and momentum have their own checks).
FLOAT_RANGE = {"round-timeout": (1e-3, 1e7), "proximal-mu": (0.0, 1e6),
               "link-rate-mbps": (1e-3, 1e9), "client-gpus": (0.0, 1024.0)}
MAX_SERVER_LR = 1e3  # server-lr's own check (0 means the strategy's default)
EPOCHS_PER_RATIO = (1e-3, 1000.0)  # allowed L / r: the epochs of retraining
VERBATIM = frozenset({"backdoor-phrase", "backdoor-continuation"})
"""String keys kept as given, spaces included (both apps read them raw)."""
RUN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message names key and value."""


def bad(key: str, value: object, allowed: str) -> ConfigError:
    """The one-line error for ``key = value``, saying what is allowed."""
    return ConfigError(f"run-config '{key}' = {value!r} is not allowed: {allowed}")


def coerce(key: str, raw: object, kind: type) -> object:
    """Convert a run-config value to the field's type, or raise ConfigError.

    Numbers must be finite: NaN and infinities are refused for every numeric
    key, naming it (NaN passes every ``<`` / ``>`` range check unnoticed).
    """
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        raise bad(key, raw, "true or false")
    if kind in (int, float) and isinstance(raw, float) and not math.isfinite(raw):
        raise bad(key, raw, "a finite number" if kind is float else "an integer")
    if kind is int:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) \
                or int(raw) != raw:
            raise bad(key, raw, "an integer")
        if abs(int(raw)) > INT64_MAX:
            raise bad(key, raw, f"an integer within int64 (|value| <= {INT64_MAX})")
        return int(raw)
    if kind is float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise bad(key, raw, "a number")
        return float(raw)
    if not isinstance(raw, str):
        raise bad(key, raw, "a string")
    return raw if key in VERBATIM else raw.strip()
