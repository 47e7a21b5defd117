"""Run-config merging: pyproject defaults < preset < ``--run-config`` items.

Every value goes through Flower's own parser
(:func:`flwr.common.config.parse_config_args`, the one ``flwr run
--run-config`` uses), so types are those a Flower run would see. The one source
of defaults is ``[tool.flwr.app.config]`` in ``pyproject.toml``. Errors are
:class:`server_app.config.ConfigError` with a one-line message naming the key or
the text that could not be read.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flwr.common.config import flatten_dict, parse_config_args

from server_app.config import ConfigError
from server_app.config.methods import renamed_keys
from task.config import default_run_config

PROJECT = Path(__file__).resolve().parents[1]
PRESETS = PROJECT / "presets"
# the pattern flwr.common.config.parse_config_args splits "k=v k2=v2" with
_PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


@dataclass(frozen=True)
class Merged:
    """A merged run config.

    Attributes
    ----------
    config : dict
        Every key: the defaults with the overrides applied (what the ServerApp
        will see as ``context.run_config``).
    overrides : dict
        Only the keys that were given (preset, ``--run-config``, extras), in
        the order given; what ``flwr run --run-config FILE`` needs.
    """

    config: dict
    overrides: dict


def defaults() -> dict:
    """``[tool.flwr.app.config]`` of the project's ``pyproject.toml``, flattened.

    The one source of defaults (:func:`task.config.default_run_config`).
    """
    return default_run_config()


def preset_values(name: str) -> dict:
    """``presets/<name>.toml`` as flat run-config keys.

    Dotted keys (``method.se.calibration-final = 0``) are flattened with Flower's
    :func:`flwr.common.config.flatten_dict`, as a run reads them; a script that
    sets a preset's values over the defaults must read it here, not with
    ``tomllib`` alone (which nests them).

    Raises
    ------
    ConfigError
        No such preset (:func:`preset_path`).
    """
    import tomllib

    return flatten_dict(tomllib.loads(preset_path(name).read_text()))


def preset_path(name: str) -> Path:
    """``presets/<name>.toml``.

    Raises
    ------
    ConfigError
        No such preset (the message lists those there are).
    """
    path = PRESETS / f"{name}.toml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in PRESETS.glob("*.toml")))
        raise ConfigError(f"preset {name!r} does not exist: one of {names} "
                          f"(files in {PRESETS})")
    return path


def parse_item(item: str, base: Mapping | None = None) -> dict:
    """One ``--run-config`` value: ``"k=v k2=v2"`` or the path of a TOML file.

    ``base`` (the defaults) gives a value that is not TOML an example of its
    key's type.

    Raises
    ------
    ConfigError
        A missing or malformed file, text that is no ``key=value`` pair, or a
        value that is not TOML (e.g. a string without quotes).
    """
    if item.strip().endswith(".toml"):
        try:
            return parse_config_args([item.strip()])
        except (OSError, ValueError) as err:  # TOMLDecodeError is a ValueError
            raise ConfigError(f"run-config file {item.strip()!r} cannot be read: "
                              f"{str(err).splitlines()[0] if str(err) else err!r}"
                              ) from None
    leftover = _PAIR.sub(" ", item).strip()
    if leftover:
        raise ConfigError(f"run-config {item!r}: cannot read {leftover!r}; expected "
                          "key=value pairs, e.g. \"num-rounds=5 dataset='fmnist'\"")
    values: dict = {}
    for key, raw in _PAIR.findall(item):
        if base is not None and key not in base:  # the key first, then its value
            raise ConfigError(_unknown(key, base))
        try:
            values.update(parse_config_args([f"{key}={raw}"]))
        except Exception:  # noqa: BLE001 - click.ClickException, ValueError: not TOML
            raise ConfigError(_not_toml(key, raw, (base or {}).get(key))) from None
    return values


def _not_toml(key: str, raw: str, default: object) -> str:
    """The refusal of ``raw``, with an example of the type ``key``'s default has."""
    if default is None or isinstance(default, str):
        example = f"a quoted string, e.g. {key}='{raw.strip(chr(39) + chr(34))}'"
    elif isinstance(default, bool):
        example = f"true or false, e.g. {key}={toml_value(default)}"
    else:
        kind = "an integer" if isinstance(default, int) else "a number"
        example = f"{kind}, e.g. {key}={toml_value(default)} (the default)"
    return f"run-config '{key}' = {raw} is not a TOML value: '{key}' takes {example}"


def merge(base: Mapping, layers: Iterable[Mapping | str]) -> Merged:
    """Apply ``layers`` to ``base`` in order (later wins).

    Parameters
    ----------
    base : Mapping
        Every known key with its default (:func:`defaults`).
    layers : Iterable[Mapping | str]
        Dicts of run-config keys, or strings for :func:`parse_item`.

    Returns
    -------
    Merged

    Raises
    ------
    ConfigError
        A key ``base`` does not have (with the closest known key), or a layer
        :func:`parse_item` cannot read.
    """
    overrides: dict = {}
    for layer in layers:
        values = parse_item(layer, base) if isinstance(layer, str) else dict(layer)
        for key in values:
            if key not in base:
                raise ConfigError(_unknown(key, base))
        overrides.update(values)
    return Merged({**base, **overrides}, overrides)


def resolve(preset: str | None, items: Iterable[Mapping | str] = (),
            base: Mapping | None = None) -> Merged:
    """Defaults < ``presets/<preset>.toml`` < ``items``; see :func:`merge`."""
    layers: list[Mapping | str] = [] if preset is None else [str(preset_path(preset))]
    return merge(defaults() if base is None else base, [*layers, *items])


def to_toml(config: Mapping) -> str:
    """``config`` as a flat TOML document for ``flwr run --run-config FILE``."""
    return "".join(f"{json.dumps(str(k))} = {toml_value(v)}\n" for k, v in config.items())


def describe(config: Mapping) -> str:
    """``k=v`` pairs on one line, values as TOML (for logs)."""
    return " ".join(f"{k}={toml_value(v)}" for k, v in config.items())


def toml_value(value: object) -> str:
    """``value`` as a TOML run config writes it (``true``, ``2.0``, ``"adam"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # inf, -inf and nan are TOML too
    return json.dumps(str(value), ensure_ascii=False)


def _unknown(key: str, base: Mapping) -> str:
    renamed = renamed_keys().get(key)
    if renamed:  # a method's setting that became its own, namespaced
        return f"run-config key '{key}' was renamed: set {' and '.join(renamed)}"
    close = difflib.get_close_matches(key, list(base), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return (f"run-config key '{key}' is not known{hint}: the keys are those of "
            "[tool.flwr.app.config] in pyproject.toml")
