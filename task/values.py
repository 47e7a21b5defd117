"""Run-config values: one converter for both apps.

The ServerApp's run-config sections (:mod:`task.section`), the
ClientApp's :class:`task.config.TaskConfig` and the train messages'
:class:`task.training_settings.TrainingSettings` all read a raw value through
:func:`coerce`, so a value means the same on either side of a message: strings
are stripped (but for :data:`VERBATIM` keys), a number must be finite, an
integer may be written as an integral float, a bool is only ``true`` / ``false``.
"""

from __future__ import annotations

import math
import sys

import numpy as np

INT64_MAX = 2**63 - 1  # Flower's protobuf carries ints as int64
_FLOAT_MAX = sys.float_info.max  # an int above it has no float

VERBATIM = frozenset({"backdoor-phrase", "backdoor-continuation"})
"""String keys kept as given, spaces included (both apps read them raw)."""


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message names key and value."""


def bad(key: str, value: object, allowed: str, source: str = "run-config") -> ConfigError:
    """The one-line error for ``key = value`` from ``source``, saying what is allowed."""
    return ConfigError(f"{source} '{key}' = {value!r} is not allowed: {allowed}")


MAX_CLIENTS = 100_000  # beyond any dataset here (MNIST: 60,000 training images);
# the ServerApp refines it with the data (server_app.preflight.check_partition)
# Largest value of each integer key (sanity ceilings; local training's: LocalTraining's).
MAX_INT = {"num-rounds": 100_000, "block-size": 2**16, "client-samples": 2**31 - 1,
           "test-samples": 2**31 - 1,
           "calibration-interval": 100_000, "mia-samples": 10_000_000,
           "mia-nonmembers": 10_000_000,
           "blocks-per-shard": 100_000}
# Range of each float key (sanity ranges; lr's and momentum's: LocalTraining's).
FLOAT_RANGE = {"round-timeout": (1e-3, 1e7), "proximal-mu": (0.0, 1e6),
               "link-rate-mbps": (1e-3, 1e9), "client-gpus": (0.0, 1024.0)}


def _mistyped(key: str, raw: object, allowed: str, source: str) -> ConfigError:
    return ConfigError(f"{source} '{key}' = {raw!r} must be {allowed}")


def _is_number(raw: object) -> bool:
    """A Python or NumPy int or float; ``bool`` (an int to Python) is not."""
    return isinstance(raw, (int, float, np.integer, np.floating)) and not isinstance(
        raw, (bool, np.bool_))


def coerce(key: str, raw: object, kind: type, *, source: str = "run-config") -> object:
    """Convert a raw value of ``key`` to ``kind``, or raise ConfigError naming both.

    Parameters
    ----------
    key : str
        The kebab-case key (named in the error; :data:`VERBATIM` keys keep their
        spaces).
    raw : object
        The value as Flower hands it over (``context.run_config`` or a message's
        ``ConfigRecord``).
    kind : type
        ``bool`` (only ``True`` / ``False``), ``int`` (an integer, or a finite
        float with an integral value, within int64), ``float`` (any finite
        number) or ``str`` (stripped of surrounding whitespace).
    source : str
        Where the value came from, first words of the error (``run-config``;
        ``train-message config`` for a message's record).

    Returns
    -------
    bool, int, float or str
        ``raw`` as a plain Python value of ``kind``.

    Raises
    ------
    ConfigError
        ``raw`` is not of ``kind``; NaN and infinities are refused for every
        numeric key (NaN passes every ``<`` / ``>`` range check unnoticed).
    """
    if kind is bool:
        if isinstance(raw, (bool, np.bool_)):
            return bool(raw)
        raise _mistyped(key, raw, "true or false", source)
    # an int is finite however large (math.isfinite(10**400) would overflow)
    infinite = isinstance(raw, (float, np.floating)) and not math.isfinite(raw)
    if kind is int:
        if not _is_number(raw) or infinite or int(raw) != raw:
            raise _mistyped(key, raw, "an integer", source)
        if abs(int(raw)) > INT64_MAX:
            raise _mistyped(key, raw, f"an integer within int64 (|value| <= "
                            f"{INT64_MAX})", source)
        return int(raw)
    if kind is float:
        if not _is_number(raw):
            raise _mistyped(key, raw, "a number", source)
        if infinite or abs(raw) > _FLOAT_MAX:
            raise _mistyped(key, raw, "a finite number", source)
        return float(raw)
    if not isinstance(raw, str):
        raise _mistyped(key, raw, "a string", source)
    return raw if key in VERBATIM else raw.strip()
