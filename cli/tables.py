"""The one table renderer: aligned plain text for terminals, or markdown.

Used by the run summary (:mod:`cli.report`), the experiment report
(:mod:`experiments.report`) and the benchmarks' printed tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

STYLES = ("text", "markdown")


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *,
          style: str = "text", cell: Callable[[object], str] = str,
          align: str = "") -> str:
    """Render ``rows`` under ``header`` as one string (no trailing newline).

    Parameters
    ----------
    header : Sequence[str]
        Column titles.
    rows : Sequence[Sequence[object]]
        One sequence per row, as many cells as ``header``.
    style : str
        ``text``: every column padded to its widest cell, columns two spaces
        apart, a line of dashes under the header. ``markdown``: a pipe table
        (``| a | b |`` rows, ``|---|---|`` under the header), cells unpadded.
    cell : Callable[[object], str]
        Formats a row's cell (the header is taken as it is).
    align : str
        ``text`` only: one character a column, ``<`` (left) or ``>`` (right);
        columns past its end are right-aligned.

    Returns
    -------
    str
        The table, one line a row (and the rule under the header).

    Raises
    ------
    ValueError
        An unknown ``style``, an ``align`` character other than ``<`` / ``>``
        or longer than the header, or a row whose length differs from the
        header's.
    """
    if style not in STYLES:
        raise ValueError(f"table style {style!r}: one of {', '.join(STYLES)}")
    if set(align) - {"<", ">"} or len(align) > len(header):
        raise ValueError(f"table align {align!r}: one '<' or '>' per column, "
                         f"at most {len(header)}")
    cells = [[str(c) for c in header]]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"table row {i} has {len(row)} cells, the header "
                             f"{len(header)}")
        cells.append([cell(c) for c in row])
    if style == "markdown":
        lines = ["| " + " | ".join(r) + " |" for r in cells]
        lines.insert(1, "|" + "|".join("---" for _ in header) + "|")
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    sides = align.ljust(len(header), ">")
    lines = ["  ".join(c.ljust(w) if side == "<" else c.rjust(w)
                       for c, w, side in zip(r, widths, sides, strict=True))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
