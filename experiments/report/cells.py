"""Table cells of report.md: numbers, percentages, sizes and durations as text.

Every formatter returns ``"n/a"`` for a missing value (``None``), so a run that did
not measure a column shows it instead of failing the whole report.
"""

from __future__ import annotations

from collections.abc import Sequence

from cli import tables
from server_app.config import methods


def pct(value: float | None) -> str:
    """A fraction as a percentage with one decimal: ``0.123`` -> ``"12.3%"``."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def less(value: float | None) -> str:
    """A reduction as ``"12.3% less"``; a negative one as ``"12.3% more"``."""
    if value is None:
        return "n/a"
    return f"{pct(value)} less" if value >= 0 else f"{pct(-value)} more"


def num(value, digits: int = 3) -> str:
    """A cell value as text.

    Ints with thousands separators, floats to ``digits`` places (whole numbers from
    1,000 up), booleans as yes / no, ``None`` and ``""`` as ``"n/a"``.
    """
    if value is None or value == "":
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def size(n) -> str:
    """A byte count in kB (below 1 MB) or MB, decimal units."""
    if n is None:
        return "n/a"
    if n >= 1e6:
        return f"{n / 1e6:,.2f} MB"
    return f"{n / 1e3:,.1f} kB"


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (the project's one renderer, :mod:`cli.tables`)."""
    return tables.table(header, rows, style="markdown")


def clock(seconds: float | None) -> str:
    """Seconds as ``"M min SS s"`` (or ``"S s"`` under a minute), rounded."""
    if seconds is None:
        return "n/a"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def shards_accuracy(row: dict) -> str:
    """The retrained shards' accuracy with the original's same shards' in brackets.

    Blank for a single model. The ensemble's accuracy can hide a broken shard.
    """
    if row.get("impacted_shard_accuracy") in (None, ""):
        return ""
    return (f"{num(row['impacted_shard_accuracy'])} "
            f"({num(row.get('impacted_shard_accuracy_original'))})")


def to_target(row: dict) -> str:
    """FR, RR: the round whose test loss first reached the original's.

    With the compute seconds spent by then; ``not reached``; blank for others.
    """
    described = methods.registered(row.get("framework") or "")
    if not (described and described.from_scratch):
        return ""
    if row.get("rounds_to_target") in (None, ""):
        return "not reached"
    return f"{row['rounds_to_target']} ({num(row.get('target_compute_s'), 1)})"
