"""Run-config values: the error type, the sanity ranges, and type coercion.

Shared by :mod:`server_app.config.run_config` and its feature checks
(:mod:`server_app.config.features`), so neither imports the other's internals.
The type converter :func:`coerce` and :class:`ConfigError` are
:mod:`task.values`' (re-exported here), the same the ClientApp reads its
settings with, so both apps read a value alike.
"""

from __future__ import annotations

import re

from task.values import ConfigError, coerce

__all__ = ["ConfigError", "bad", "coerce"]

MAX_SEED = 2**32 - 1
MAX_CLIENTS = 100_000  # beyond any dataset here (MNIST: 60,000 training images);
# the ServerApp refines it with the data (server_app.preflight.check_partition)
MAX_LR = 10.0  # a local step size above this diverges for every model of this app
TEXT_CONTEXT = 64  # task.nanogpt.GPTConfig.block_size: the GPT's context

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
RUN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


def bad(key: str, value: object, allowed: str) -> ConfigError:
    """The one-line error for ``key = value``, saying what is allowed."""
    return ConfigError(f"run-config '{key}' = {value!r} is not allowed: {allowed}")
