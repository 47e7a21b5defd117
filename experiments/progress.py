"""Step progress of the experiment runner: one line per step, with the time left."""

from __future__ import annotations

import sys
import time

from cli.progress import bar as progress_bar


class Progress:
    """One line per step on stderr: experiment, step i/N, elapsed, time left.

    The time left is the seconds per unit of estimated cost so far times the
    estimated cost still to run (weights from :mod:`experiments.suites`),
    divided by the ``jobs`` running side by side.  On a
    terminal a rich bar over the same weights stays below the lines
    (:func:`cli.progress.bar`); elsewhere only the lines are written.  Call
    :meth:`close` at the end.
    """

    def __init__(self, weights: list[float], stream=None, jobs: int = 1) -> None:
        self.weights = weights
        self.jobs = max(1, jobs)
        self.done_weight = 0.0
        self.spent = 0.0
        self.t0 = time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr
        self.bar = progress_bar(self.stream)
        if self.bar is not None:
            self.task = self.bar.add_task("experiments (by cost)", total=sum(weights))

    def _say(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """Stop the bar (no-op off a terminal)."""
        if self.bar is not None:
            self.bar.stop()

    def start(self, i: int, experiment: str, label: str) -> None:
        """Announce step ``i`` (0-based)."""
        self._say(f"[{experiment}] run {i + 1}/{len(self.weights)} {label}: started; "
                  f"elapsed {clock(time.perf_counter() - self.t0)}, "
                  f"left {self.left()}")

    def finish(self, i: int, experiment: str, label: str, seconds: float,
               status: str = "done") -> None:
        """Record step ``i``'s seconds and announce it."""
        self.done_weight += self.weights[i]
        self.spent += seconds
        if self.bar is not None:
            self.bar.advance(self.task, self.weights[i])
        self._say(f"[{experiment}] run {i + 1}/{len(self.weights)} {label}: {status} "
                  f"in {clock(seconds)}; elapsed "
                  f"{clock(time.perf_counter() - self.t0)}, left {self.left()}")

    def left(self) -> str:
        """Estimated time for the steps not finished yet (``?`` before any)."""
        remaining = sum(self.weights) - self.done_weight
        if remaining <= 1e-9:
            return "0s"
        if self.done_weight <= 0:
            return "?"
        return "~" + clock(self.spent / self.done_weight * remaining / self.jobs)


def clock(seconds: float) -> str:
    """Seconds as ``12s``, ``3m05s`` or ``1h02m``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
