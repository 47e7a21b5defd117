"""Shared by the typed records of ``summary.json``: JSON out and back, derived fields."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def to_json_dict(obj: Any) -> dict:
    """A dataclass as a JSON dict: None fields left out, nested dataclasses too."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        if dataclasses.is_dataclass(value):
            value = value.to_json()
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            value = [v.to_json() for v in value]
        elif isinstance(value, dict) and value and \
                dataclasses.is_dataclass(next(iter(value.values()))):
            value = {k: v.to_json() for k, v in value.items()}
        out[f.name] = value
    return out


def known_fields(cls, data: dict) -> dict:
    """The entries of ``data`` that are fields of ``cls``."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def perplexity(loss: float | None) -> float | None:
    """exp(loss) for a loss in nats (capped at exp(700)); None for None."""
    return None if loss is None else math.exp(min(loss, 700.0))
