"""Run-config values: the error type, the sanity ranges, and type coercion.

Shared by :mod:`server_app.config.run_config` and its feature checks
(:mod:`server_app.config.features`), so neither imports the other's internals.
The type converter :func:`coerce`, :class:`ConfigError`, :func:`bad` and the
sanity ranges are :mod:`task.values`' (the first three re-exported here), the
same the ClientApp reads its settings with, so both apps read a value alike.
"""

from __future__ import annotations

import re

from task.values import ConfigError, bad, coerce

__all__ = ["ConfigError", "bad", "coerce"]

MAX_SEED = 2**32 - 1
TEXT_CONTEXT = 64  # task.nanogpt.GPTConfig.block_size: the GPT's context

MAX_SERVER_LR = 1e3  # server-lr's own check (0 means the strategy's default)
EPOCHS_PER_RATIO = (1e-3, 1000.0)  # allowed L / r: the epochs of retraining
RUN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


