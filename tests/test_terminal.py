"""What a run prints: cli.terminal's filter, and a run's output through it."""

from __future__ import annotations

import io
import logging
import re

from cli import simulation
from cli.terminal import TerminalFilter, plain
from strategies.factory import EVALUATION_OFF_NOTICE

WARNING = re.compile(r"^WARNING\s*:|:\d+: \w*Warning: ")
LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR)\s*:")
RAY_TIP = ("/x/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions "
           "of Ray, set RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0\n")


def _shown(lines: list[str]) -> tuple[TerminalFilter, list[str]]:
    terminal = TerminalFilter(io.BytesIO())
    for line in lines:
        terminal.write(line.encode())
    return terminal, terminal.out.getvalue().decode().splitlines()


def test_a_warning_is_shown_once_whatever_actor_printed_it():
    _, shown = _shown([
        "\x1b[93mWARNING \x1b[0m:   shard 1 round 2: no accepted reply\n",
        "INFO :      round 2/2\n",
        "\x1b[36m(ClientAppActor pid=7)\x1b[0m WARNING :   shard 1 round 2: no accepted "
        "reply\n",
        RAY_TIP, "  warnings.warn(\n", RAY_TIP, "  warnings.warn(\n",
        "WARNING :   another warning\n",
    ])
    assert shown == ["\x1b[93mWARNING \x1b[0m:   shard 1 round 2: no accepted reply",
                     "INFO :      round 2/2", RAY_TIP.rstrip("\n"), "  warnings.warn(",
                     "WARNING :   another warning"]


def test_flower_lines_that_do_not_apply_are_not_shown():
    _, shown = _shown([
        "WARNING :   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
        "INFO :      Federation `@none/default` (8 simulated SuperNodes)\n",
        "INFO :      To change federation size, use the following command:\n",
        "INFO :      \tflwr federation simulation-config @none/default <superlink> "
        "--num-supernodes <N>\n",
        "Flower configuration not found. Created default configuration at "
        "/root/.flwr/sim-7/config.toml\n",
        "Successfully installed sharding-eraser to /root/.flwr/sim-7/apps/"
        "sharding-eraser.sharding-eraser.0.1.0.dbce8f6b.\n",
    ])
    assert shown == ["INFO :      Federation `@none/default` (8 simulated SuperNodes)"]


def test_lines_after_the_summary_wait_for_release():
    terminal, shown = _shown([
        "INFO :      summary: /r/t/summary.json\n",
        "(ClientAppActor pid=3) WARNING :   Manually terminating ClientAppActor\n",
        "INFO :      \n", "ERROR :     the SuperLink did not stop\n",
    ])
    assert shown == ["INFO :      summary: /r/t/summary.json"]
    out = io.BytesIO()
    terminal.release(out)
    assert out.getvalue() == b"ERROR :     the SuperLink did not stop\n"
    assert terminal.held == []


def test_plain_strips_colours_and_the_actor():
    assert plain(b"\x1b[36m(ClientAppActor pid=12)\x1b[0m \x1b[93mWARNING \x1b[0m: x\n") \
        == "WARNING : x"


def test_a_run_prints_each_warning_once_and_the_tables_first(run_server, tmp_path,
                                                            capsys):
    """The ServerApp's log through the CLI's terminal filter, then the CLI's tables.

    An in-process run has no simulation engine, so the engine's lines after
    the ServerApp's last one (Ray stopping its actors, a warning of Flower's)
    are appended as flwr-simulation prints them.
    """
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s : %(message)s"))
    flower = logging.getLogger("flwr")
    flower.addHandler(handler)
    try:
        summary, _ = run_server({"forget-clients": "3", "frameworks": "SE,FR"})
    finally:
        flower.removeHandler(handler)
    engine_tail = ["(ClientAppActor pid=1) WARNING :   Manually terminating ClientAppActor",
                   "(ClientAppActor pid=2) WARNING :   Manually terminating ClientAppActor",
                   "WARNING :   a warning of the engine's", "INFO :      "]
    log = tmp_path / "run.log"
    log.write_text(stream.getvalue() + "\n".join(engine_tail) + "\n")
    assert EVALUATION_OFF_NOTICE not in log.read_text()  # removed at its cause
    terminal = TerminalFilter(io.BytesIO())
    for line in log.read_bytes().splitlines(keepends=True):
        terminal.write(line)
    assert simulation._finish(log, 0, terminal) == 0
    printed = (terminal.out.getvalue().decode() + capsys.readouterr().out).splitlines()

    warnings = [plain(line.encode()) for line in printed if WARNING.search(plain(
        line.encode()))]
    assert len(warnings) == len(set(warnings)), warnings
    assert "Manually terminating" not in "\n".join(printed)
    table = next(i for i, line in enumerate(printed) if line.startswith("framework "))
    after = [line for line in printed[table:] if LOG_LINE.match(line)]
    assert after == ["WARNING :   a warning of the engine's"]  # after the tables
    assert printed[-1] == f"summary: {tmp_path / 't' / 'summary.json'}"
    text = "\n".join(printed)
    if summary["original"]["mia_signal"]:
        assert "MIA AUC" in text and "no signal" not in text
    else:
        assert "MIA AUC" not in text and "--preset memorize" in text


def test_help_text_leaves_out_rest_marks():
    from cli import deploy
    from cli.terminal import help_text

    assert help_text("``deploy`` runs :mod:`cli.warm_exec` and :func:`~a.b`.") == \
        "deploy runs cli.warm_exec and a.b."
    shown = deploy.parser("deploy").format_help()
    assert "``" not in shown and ":mod:" not in shown and "cli.warm_exec" in shown
