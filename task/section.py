"""The base of every run-config section: flat kebab-case keys in, a typed record out.

Users type flat keys (``[tool.flwr.app.config]``, ``--run-config``); each section is
a frozen dataclass whose fields are its keys (``num-clients`` -> ``num_clients``;
a field's ``metadata["key"]`` names another key, e.g. ``storage`` -> ``mode``).
:meth:`Section.from_run_config` takes the section's keys of Flower's flat mapping
and coerces each to its field's type (:func:`task.values.coerce`);
the section's own ``validate`` checks its values in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeVar

from task.values import FLOAT_RANGE, MAX_INT, bad, coerce

S = TypeVar("S", bound="Section")


class Section:
    """Mixin of the run-config sections (frozen dataclasses)."""

    @classmethod
    def keys(cls) -> dict[str, str]:
        """Run-config key -> field name, in field order."""
        return {f.metadata.get("key", f.name.replace("_", "-")): f.name
                for f in dataclasses.fields(cls)}

    @classmethod
    def from_run_config(cls: type[S], run_config: Mapping[str, object]) -> S:
        """The section's keys of ``run_config``, coerced (missing keys: defaults).

        Raises
        ------
        ConfigError
            A value of the wrong type (naming the key).
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for key, name in cls.keys().items():
            if key in run_config:
                values[name] = coerce(key, run_config[key], type(fields[name].default))
        return cls(**values)

    def as_dict(self) -> dict[str, object]:
        """The section's values under their run-config keys."""
        return {key: getattr(self, name) for key, name in self.keys().items()}

    def check_positive(self, *keys: str) -> None:
        """Each of ``keys`` (this section's) is an integer >= 1."""
        for key in keys:
            value = getattr(self, self.keys()[key])
            if value < 1:
                raise bad(key, value, "a positive integer")

    def check_bounds(self) -> None:
        """Each numeric key of this section in its sanity range.

        :data:`~task.values.MAX_INT` and
        :data:`~task.values.FLOAT_RANGE` name the ranges.
        """
        for key, name in self.keys().items():
            value = getattr(self, name)
            if key in MAX_INT and value > MAX_INT[key]:
                raise bad(key, value, f"at most {MAX_INT[key]}")
            if key in FLOAT_RANGE:
                least, most = FLOAT_RANGE[key]
                if not least <= value <= most:
                    raise bad(key, value, f"a number in [{least:g}, {most:g}]")
