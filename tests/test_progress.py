"""Progress bars: time left on a terminal, nothing extra elsewhere."""

import io
import sys

from rich.console import Console
from rich.progress import Progress

from cli.progress import RoundProgress, bar, output_sink, wait_bar
from experiments.run import Progress as StepProgress


def test_no_bar_when_the_output_is_not_a_terminal():
    stream = io.StringIO()
    assert bar(stream) is None
    assert wait_bar("SuperNodes up", 8, stream) == (None, None)
    with output_sink() as sink:  # pytest captures stdout: not a terminal
        assert sink is sys.stdout.buffer
    steps = StepProgress([1.0, 2.0], stream)
    steps.start(0, "single", "a")
    steps.finish(0, "single", "a", 3.0)
    steps.close()
    lines = stream.getvalue().splitlines()  # the step lines only, no bar drawing
    assert len(lines) == 2 and "left ~6s" in lines[1] and "\x1b" not in stream.getvalue()


def test_a_terminal_gets_bars_with_time_left():
    shown = io.StringIO()
    console = Console(file=shown, force_terminal=True, width=120)
    progress = Progress(console=console, speed_estimate_period=3600.0)
    sink = RoundProgress(progress)
    for line in (b"INFO :      sharded round 1/10: accuracy 0.5\n",
                 b"INFO :      sharded round 2/10: accuracy 0.6\n",
                 b"\x1b[92mINFO \x1b[0m:      SE request 1 round 1/3: accuracy 0.7\n",
                 b"INFO :      results: /tmp/x\n"):
        assert sink.write(line) == len(line)
    tasks = {t.description: (t.completed, t.total) for t in progress.tasks}
    assert tasks == {"sharded rounds": (2, 10), "SE request 1 rounds": (1, 3)}
    assert "results: /tmp/x" in shown.getvalue()  # lines pass through
    progress.stop()
