"""The terminal's copy of a run's log: known noise left out, each warning once.

:func:`cli.procs.tee` writes every line of ``flwr run``'s output to the run's
log file unchanged and to a :class:`TerminalFilter`, which passes it on to the
terminal (or stdout) unless

- it is one of :data:`NOISE`: lines of Flower's that do not apply to this
  command and that no setting turns off (listed one by one, with the reason);
- it is a warning already shown: a Flower ``WARNING`` line, or a Python
  warning (``file:line: SomeWarning: text`` and its indented source line), is
  shown the first time only; a prefix such as ``(ClientAppActor pid=7)`` does
  not make it another;
- it comes after the ServerApp's ``summary: <path>`` line: the engine's
  shutdown lines are held until :meth:`TerminalFilter.release`, which the
  command calls after it printed the result tables, so the tables come first.

Warnings with a cause we can remove are removed there, not here: Flower's
``fraction_evaluate`` notice in :mod:`strategies.factory`, Ray's
``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO`` tip in :mod:`cli.simulation`.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import BinaryIO, NoReturn

from cli.progress import ANSI
from server_app.failures import MARK

SUMMARY = re.compile(rb"summary: (/[^\r\n]*summary\.json)")  # spaces allowed
"""The ServerApp's last line (``server_app.app``): the run is done."""
STOPPED = MARK
"""The ServerApp's line for an expected failure (:data:`server_app.failures.MARK`)."""

NOISE = (
    # flwr-simulation logs it at every start, whatever num-supernodes we pass
    # (flwr 1.42, flwr/simulation/app.py); our --supernodes sets the size.
    re.compile(r"WARNING\s*:\s*Since flwr 1\.32, default simulated SuperNodes changed"),
    # and its advice to resize the federation with `flwr federation
    # simulation-config`, which this command's --supernodes does instead.
    re.compile(r"INFO\s*:\s*To change federation size, use the following command:"),
    re.compile(r"INFO\s*:\s*flwr federation simulation-config "),
    # Flower's simulation stopping each Ray actor at the end of a run, one line each.
    re.compile(r"WARNING\s*:\s*Manually terminating ClientAppActor"),
    # flwr about the FLWR_HOME the command makes for each run and removes after it
    # (cli.simulation): a default configuration created there, the app installed there.
    re.compile(r"^Flower configuration not found\. Created default configuration at "),
    re.compile(r"^Successfully installed \S+ to .*/sim-\d+/apps/"),
)
"""Lines never shown on the terminal (the log file keeps them)."""

_ACTOR = re.compile(r"^\([^)]*pid=\d+\)\s*")
_FLOWER_WARNING = re.compile(r"^WARNING\s*:")
_PYTHON_WARNING = re.compile(r":\d+: \w*Warning: ")
_EMPTY_LOG_LINE = re.compile(r"^[A-Z]+\s*:\s*$")


_ROLE = re.compile(r":\w+:`~?([^`]+)`")


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing in one line: ``prog: message (...)``, exit status 2.

    argparse prints its whole usage block before the error; a command's bad
    argument is one line on stderr like a bad run config (``--help`` shows the
    usage). Option names are exact (no abbreviations: ``forget --client 3`` is
    refused, not taken as ``--clients``, on a command that cannot be undone),
    and an unknown option is named before a missing required one.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 - argparse's
        """argparse's, an unknown ``--option`` refused first (by its own name)."""
        given = sys.argv[1:] if args is None else list(args)
        known = set(self._option_string_actions)
        unknown = [a for a in given if a.startswith("--") and a != "--"
                   and a.split("=", 1)[0] not in known]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_args(given, namespace)

    def add_config_options(self) -> None:
        """``--preset`` and ``--run-config`` (repeatable), as the run commands take them."""
        self.add_argument("--preset", default=None,
                          help="presets/NAME.toml: run-config values over the defaults")
        self.add_argument("--run-config", "-c", action="append", default=[],
                          metavar='"k=v ..."|FILE.toml',
                          help="run-config values (repeatable; later wins over earlier "
                          "and over the preset)")

    def add_run_options(self) -> None:
        """``--run NAME`` (required) and ``--results-dir``: a stored run's commands."""
        self.add_argument("--run", required=True, help="the run's run-name")
        self.add_argument("--results-dir", default=None,
                          help="the folder the run's folder is in (default: the "
                          "project's results/, or $SE_RESULTS_DIR)")

    def error(self, message: str) -> NoReturn:
        """Print ``message`` and where the options are listed on one line; exit 2."""
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")


def help_text(doc: str) -> str:
    """A docstring as ``--help`` shows it: reST marks left out (``x`` and :mod:`x` -> x)."""
    return _ROLE.sub(r"\1", doc).replace("``", "")


def plain(line: bytes) -> str:
    """A log line as text without colours, the actor prefix or the newline."""
    text = ANSI.sub("", line.decode(errors="replace")).rstrip("\r\n")
    return _ACTOR.sub("", text)


class TerminalFilter:
    """A binary sink for :func:`cli.procs.tee` in front of the terminal.

    Parameters
    ----------
    out : binary file or sink, optional
        Where the kept lines go (:func:`cli.progress.output_sink`); set
        :attr:`out` again for a second ``flwr run`` (a retry).

    Attributes
    ----------
    held : list[bytes]
        Lines after the ServerApp's summary line, not yet shown.
    failure : tuple[int, str] or None
        The exit status and one line of the ServerApp's expected failure, if it
        stopped on one (nothing after it was shown).
    """

    def __init__(self, out: BinaryIO | None = None) -> None:
        self.out = out
        self.held: list[bytes] = []
        self._seen: set[str] = set()
        self._in_dropped_warning = False
        self._done = False
        self.failure: tuple[int, str] | None = None

    def write(self, line: bytes) -> int:
        """Show ``line`` (bytes, newline included) unless it is noise, seen or held.

        After the ServerApp's marked line of an expected failure
        (:data:`server_app.failures.MARK`) nothing more is shown: the traceback
        Flower logs is in the log file; :attr:`failure` keeps the line, which is
        shown too.
        """
        if self.failure is not None:
            return len(line)
        found = STOPPED.search(plain(line))
        if found:  # shown (every command that reads this stream learns why)
            self.failure = (int(found.group(1)), found.group(2).strip())
            self.out.write(line)
            return len(line)
        if self._done:
            self.held.append(line)
        elif self.keep(line):
            self.out.write(line)
        self._done = self._done or SUMMARY.search(line) is not None
        return len(line)

    def flush(self) -> None:
        """Flush :attr:`out`."""
        if self.out is not None:
            self.out.flush()

    def keep(self, line: bytes) -> bool:
        """Whether ``line`` is shown: not noise, not a warning shown before.

        An undecodable byte reads as U+FFFD.
        """
        text = plain(line)
        if self._in_dropped_warning and text[:1].isspace():
            return False  # the source line Python prints under a warning
        self._in_dropped_warning = False
        warning = _FLOWER_WARNING.search(text) or _PYTHON_WARNING.search(text)
        if any(p.search(text) for p in NOISE) or (warning and text in self._seen):
            self._in_dropped_warning = bool(_PYTHON_WARNING.search(text))
            return False
        if warning:
            self._seen.add(text)
        return True

    def release(self, out: BinaryIO) -> None:
        """Show the held lines on ``out`` (after the tables): those :meth:`keep` keeps.

        Empty log lines (a level and nothing else) are left out too.
        """
        held, self.held = self.held, []
        for line in held:
            if self.keep(line) and not _EMPTY_LOG_LINE.match(plain(line)):
                out.write(line)
        out.flush()
