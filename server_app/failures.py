"""The ServerApp's one boundary for expected failures: one line, its own exit status.

A failure the operator can act on (a full disk, a store that does not read back,
a coded history beyond what the code corrects, a setting the run cannot use) is
logged as one marked line, ``ServerApp stopped (exit N): <line>``, before the
exception goes on to Flower (which logs its traceback: in the run's log file, the
full record). The commands (:class:`cli.terminal.TerminalFilter`) show the marked
line, hide what follows it, and exit with N. Other exceptions are bugs: one
marked line too (status 1, the exception's type), their traceback in the log.

Exit statuses (docs/FAULTS.md): 1 a setting or the run folder refused here
(after the engine started: 2 is for refusals before anything starts), nodes
that do not form the run's federation (a discovery error), a run that learned or
unlearned nothing or diverged (:class:`RunStoppedError`), or a bug; 3 a
stored history or models file that cannot be used (repair it), 5 the disk is
full or read-only (free space; nothing is half written: files are written
atomically and the catalog in transactions).
"""

from __future__ import annotations

import errno
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from history import CodedHistoryError, HoldersUnreachableError, StoreError
from runstore.catalog import RunLogError, SettingsMismatchError
from runstore.folder import ModelsFileError
from server_app.config import ConfigError
from server_app.rounds.federation import DiscoveryError
from server_app.rounds.stopped import RunStoppedError

MARK = re.compile(r"ServerApp stopped \(exit (\d+)\): (.*)")
"""The marked line: its exit status and its one line."""
DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_DISCOVERY_HINT = (" (discovery waits round-timeout seconds for every node's answer: "
                   "are the SuperNodes up, one per partition id?)")


def disk_error(err: BaseException) -> BaseException | None:
    """The full or read-only disk behind ``err`` (itself or a cause), or None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in DISK or (
                isinstance(err, sqlite3.OperationalError) and "disk is full" in str(err)):
            return err
        err = err.__cause__ or err.__context__
    return None


def expected(err: BaseException) -> tuple[int, str] | None:
    """``(exit status, one line)`` for an expected failure, or None (a bug)."""
    disk = disk_error(err)
    if disk is not None:  # whichever folder, and whatever error it was wrapped in
        where = f"{disk.filename}: " if getattr(disk, "filename", None) else ""
        what = getattr(disk, "strerror", None) or str(disk)
        return 5, (f"{where}{what}: free space on the results-dir (or make it "
                   "writable) and run the command again; nothing was half written")
    if isinstance(err, (ConfigError, RunStoppedError, SettingsMismatchError)):
        return 1, _first(err)  # 1, not 2: the engine had started
    if isinstance(err, HoldersUnreachableError):  # holders that may answer later
        return 1, _first(err)
    if isinstance(err, DiscoveryError):  # the nodes do not form the run's federation
        return 1, _first(err) + _DISCOVERY_HINT
    if isinstance(err, (CodedHistoryError, StoreError, ModelsFileError, RunLogError)):
        return 3, _first(err)
    return None


def _first(err: BaseException) -> str:
    text = str(err).splitlines()
    return text[0] if text else type(err).__name__


@contextmanager
def one_line(log) -> Iterator[None]:
    """Log any failure inside as its marked line (``log``: one line out).

    An expected failure gets its own status (:func:`expected`); any other
    exception is a bug: status 1 and its type, its traceback left to the log
    (Flower logs it after the marked line, which the commands do not show).
    The exception itself goes on unchanged (the caller's tests and Flower see
    it as raised).
    """
    try:
        yield
    except Exception as err:
        hit = expected(err) or (1, f"unexpected {type(err).__name__}: {_first(err)} "
                                   "(a bug: its traceback is in the run's log)")
        log(f"ServerApp stopped (exit {hit[0]}): {hit[1]}")
        raise
