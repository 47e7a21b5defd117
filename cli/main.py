"""Dispatch: ``run`` (the default), ``test``, ``deploy`` and the rest.

The paper's experiments are a program of their own above the app
(``python -m experiments.run``; ``./simulate.sh experiments`` starts it): they drive
the app as a user does and import this package, never the other way round.
"""

from __future__ import annotations

import difflib
import os
import sqlite3
import sys

from cli.env import back_to_caller, setup_env
from cli.procs import exit_on_signals
from server_app.config import ConfigError
from server_app.failures import disk_error, expected

USAGE = """\
usage: {prog} [run] [--preset NAME] [--run-config "k=v ..."]... [--verbose]
       {prog} test [--fast] [pytest arguments]
       {prog} deploy [N] [--preset NAME] [--run-config "k=v ..."]... [--keep] [--hosts]
              [--isolation process|subprocess] [--clientapp-slots K] [--node-poll S]
              [--verbose]
       {prog} forget --run NAME (--clients 3,17 [--records IDS | --records-file PATH]
              | --labels 7 | --pending) [--record-only] [--lost-nodes IDS]
              [--federation NAME | --engine simulation] [--results-dir DIR]
       {prog} receipts --run NAME [--detail | --json] [--results-dir DIR]
       {prog} models --run NAME [--results-dir DIR]
       {prog} export --run NAME [--version N] --out FILE.safetensors|FILE.pt
       {prog} show --run NAME [--all] [--results-dir DIR]
       {prog} client-data --out DIR [--preset NAME] [--run-config "k=v ..."]...

run          learn and unlearn in Flower's simulation engine, one SuperNode per
             client; prints the result tables and, last, `summary: <path>`
test         the test suite (pytest; --fast: the fast tier, between edits)
deploy       real SuperLink + N SuperNodes (default 8) on 127.0.0.1 (--hosts:
             separate network hosts with TLS and node keys; root)
forget       ask a run to forget clients (or one client's records, or classes): a
             live staged run at its next stage boundary; a finished run at once,
             from its stored history, as a new model version (--record-only:
             later, with --pending), on the engine the run ran on (a deployed
             run: its own federation's SuperNodes)
receipts     list a run's receipts (its planned requests, each request of a staged
             run or to a finished run: versions, shards, rounds, models digests,
             what was erased, the audit's figures) and waiting requests
models       list a run's model versions (v1 after learning, one per request)
export       write a model version for serving (safetensors or torch)
show         a run's status, engine, stored settings and result tables (on the
             SuperLink host: what `flwr run`'s exit status 0 does not say)
client-data  write DIR/client-<p>/, each client's own training data, for a run's
             partition (a SuperNode reads only its folder: --node-config
             "client-data=DIR/client-<p>"; docs/DEPLOY.md)

Run settings: pyproject.toml [tool.flwr.app.config] < presets/NAME.toml <
--run-config (repeatable, later wins; "k=v ..." or a TOML file). A bad value
stops the command before anything starts: one line on stderr, exit status 2.
--verbose: also Flower's per-shard strategy lines (configure_train, aggregate_train).
`{prog} COMMAND --help` for a command's options.
"""
COMMANDS = ("run", "test", "deploy", "forget", "receipts", "models", "export", "show",
            "client-data")


def main(argv: list[str] | None = None) -> int:
    """Run a command; return its exit status.

    Exit status: 0 done, 1 the run failed, 2 bad arguments or run config
    (nothing was started or recorded), 3 a stored history or models file that
    cannot be used (a later request marked failed), 4 the run is busy with another
    command (a request recorded for it), 5 the disk is full; 128 + n terminated by
    signal n (docs/FAULTS.md, "Exit statuses").
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = os.environ.get("SE_CLI_PROG", "python -m cli")
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE.format(prog=prog), end="")
        return 0
    if argv[:1] == ["experiments"]:  # a program above the app, not one of its commands
        print(f"{prog}: experiments is not a command of {prog}: run "
              "`./simulate.sh experiments ...` or `python -m experiments.run ...`",
              file=sys.stderr)
        return 2
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        print(f"{prog}: {_unknown(argv[0])}", file=sys.stderr)
        return 2
    command, rest = (argv[0], argv[1:]) if argv[:1] and argv[0] in COMMANDS \
        else ("run", argv)
    back_to_caller(stays=command == "test")
    setup_env()
    if command == "test":  # a program of its own, signals included
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *_test_workers(rest)])
    exit_on_signals(prog)
    try:
        return _dispatch(command, rest, f"{prog} {command}" if argv[:1] == [command]
                         else prog)
    except (ConfigError, OSError, sqlite3.OperationalError) as err:
        disk = disk_error(err)  # a full or read-only disk: 5, whatever wraps it
        if disk is None and not isinstance(err, ConfigError):
            raise
        print(f"{prog}: {err if isinstance(err, ConfigError) else expected(err)[1]}",
              file=sys.stderr)
        return 2 if disk is None else 5


def _unknown(word: str) -> str:
    """The refusal of ``word`` as a command (``run`` takes no bare word)."""
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"no command {word!r}: {hint}the commands are {', '.join(COMMANDS)} "
            "(run, the default, takes options only)")


def _test_workers(args: list[str]) -> list[str]:
    """``args`` with one pytest-xdist worker per CPU, unless they choose otherwise.

    Unchanged when they name ``-n`` / ``--numprocesses`` / ``-p no:xdist``, or
    pytest-xdist is not installed; ``SE_TEST_WORKERS=0`` runs in one process.
    The suite's processes wait a lot (engine start-ups, subprocesses, network
    faults), so two workers on 2 cores take far less time than one
    (docs/DEVELOPING.md). How tests go to workers: ``tests/conftest.py``.
    """
    import importlib.util

    chosen = any(a in ("-n", "--numprocesses", "no:xdist") or a.startswith(
        ("-n", "--numprocesses=")) for a in args)
    workers = os.environ.get("SE_TEST_WORKERS", "auto")
    if chosen or workers == "0" or importlib.util.find_spec("xdist") is None:
        return args
    return ["-n", workers, *args]


def _dispatch(command: str, rest: list[str], prog: str) -> int:
    if command == "deploy":
        from cli import deploy

        return deploy.main(rest, prog)
    if command == "forget":
        from cli.forget import main_forget

        return main_forget(rest, prog)
    if command == "receipts":
        from cli.receipts import main_receipts

        return main_receipts(rest, prog)
    if command == "show":
        from cli.show import main_show

        return main_show(rest, prog)
    if command in ("models", "export"):
        from cli import models

        return (models.main_models if command == "models" else models.main_export)(
            rest, prog)
    if command == "client-data":
        from cli import client_data

        return client_data.main(rest, prog)
    from cli import simulation

    return simulation.main(rest, prog)
