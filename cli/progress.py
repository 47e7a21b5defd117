"""Progress bars with the time left (rich), on a terminal only.

Every bar here is a ``rich.progress.Progress`` on stderr; where stderr is not a
terminal (a log file, a pipe, CI) :func:`bar` returns ``None`` and callers print
nothing extra.  :class:`RoundProgress` turns the ServerApp's streamed round lines
(``<stage> round i/G: ...``) into one bar per stage, printing the lines above the
bars.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import BinaryIO, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

ROUND = re.compile(r"(?:^|:\s+)(?P<stage>[^:]+?) round (?P<i>\d+)/(?P<n>\d+):")
"""A round line of the ServerApp log (``server_app.rounds.learning``), after its level."""

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def bar(stream: TextIO | None = None) -> Progress | None:
    """A started rich progress display on ``stream`` (stderr), or None off a terminal.

    Columns: description, bar, done/total, elapsed, time left.  The time left is
    rich's estimate from the average speed since the start (a window of one hour,
    so rounds of minutes still count).  Stop it with ``.stop()``.

    Parameters
    ----------
    stream : text file, optional
        Where to draw (default ``sys.stderr``).

    Returns
    -------
    rich.progress.Progress or None
        None when ``stream`` is not a terminal (or ``TERM=dumb``).
    """
    console = Console(file=stream if stream is not None else sys.stderr)
    if not console.is_terminal or console.is_dumb_terminal:
        return None
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("left"),
                        TimeRemainingColumn(), console=console,
                        speed_estimate_period=3600.0, transient=False)
    progress.start()
    return progress


class RoundProgress:
    """A binary sink for :func:`cli.procs.tee`: prints log lines, tracks round lines.

    Each stage (``learning``, ``SE``, ...) that logs ``round i/G`` gets a bar
    with its time left; lines are printed above the bars, unchanged.

    Parameters
    ----------
    progress : rich.progress.Progress
        From :func:`bar` (a terminal).
    """

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}

    def write(self, line: bytes) -> int:
        """Print one log line (bytes, newline included) and update the bars."""
        text = line.decode(errors="replace").rstrip("\n")
        self.progress.console.print(Text.from_ansi(text), highlight=False, soft_wrap=True)
        match = ROUND.search(ANSI.sub("", text))
        if match:
            self.update(match["stage"], int(match["i"]), int(match["n"]))
        return len(line)

    def update(self, stage: str, done: int, total: int) -> None:
        """Set ``stage``'s bar to ``done`` of ``total`` rounds."""
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(f"{stage} rounds", total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)

    def flush(self) -> None:
        """Nothing to flush (rich writes each line)."""


@contextlib.contextmanager
def output_sink() -> Iterator[BinaryIO | RoundProgress]:
    """Where a streamed run's output goes: round bars on a terminal, else stdout as is.

    Yields
    ------
    binary sink
        A :class:`RoundProgress` drawing on stdout when stdout is a terminal,
        otherwise ``sys.stdout.buffer`` (output unchanged, no bars).
    """
    progress = bar(sys.stdout)
    if progress is None:
        yield sys.stdout.buffer
        return
    try:
        yield RoundProgress(progress)
    finally:
        progress.stop()


def wait_bar(description: str, total: int, stream: TextIO | None = None
             ) -> tuple[Progress | None, TaskID | None]:
    """A one-task bar (``description``, ``total`` steps) or ``(None, None)`` off a terminal.

    Advance with ``progress.advance(task)``; stop with ``progress.stop()``.
    """
    progress = bar(stream)
    if progress is None:
        return None, None
    return progress, progress.add_task(description, total=total)
