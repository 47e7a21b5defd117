"""A run folder named on the command line, and its catalog's inbox.

``--run NAME`` is ``<results-dir>/NAME`` (``--results-dir``, else
``$SE_RESULTS_DIR``, else the default results folder, as for a run); the folder
must hold a run catalog ``run.sqlite``. Used by ``forget``, ``receipts``,
``models`` and ``export``; client ids on their command lines (:func:`parse_clients`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from history.catalog import StoreError
from runstore.inbox import InboxError, RequestInbox
from runstore.lock import RunLock
from server_app.config import ConfigError
from server_app.config.output import OutputConfig
from server_app.config.values import RUN_NAME

SUMMARY = "summary.json"


def parse_clients(text: str, num_clients: int, flag: str = "--clients") -> list[int]:
    """``"3,17"`` -> [3, 17]: distinct partition ids in 0..num_clients-1.

    Parameters
    ----------
    text : str
        Comma-separated partition ids.
    num_clients : int
        The run's ``num-clients``.
    flag : str
        The option the text came from, for messages.

    Returns
    -------
    list[int]
        The ids, ascending.

    Raises
    ------
    ConfigError
        Empty, not integers, repeated, or out of range (naming the value).
    """
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    if not tokens or not all(t.isascii() and t.isdigit() for t in tokens):
        raise ConfigError(f"{flag} {text!r}: comma-separated partition ids in "
                          f"0..{num_clients - 1}, e.g. '3,17'")
    ids = [int(t) for t in tokens]
    unknown = [p for p in ids if p >= num_clients]
    if unknown:
        raise ConfigError(f"{flag} {text!r}: unknown client(s) {unknown}; this run's "
                          f"clients are 0..{num_clients - 1}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{flag} {text!r}: each id once")
    return sorted(ids)


def run_folder(name: str, results_dir: str | None) -> Path:
    """``<results-dir>/<name>``, which must hold a run catalog.

    Raises
    ------
    ConfigError
        No such run (no ``run.sqlite`` there) or a bad name.
    """
    root = OutputConfig(results_dir=results_dir or "").resolved_results_dir()
    if not RUN_NAME.fullmatch(name):  # what run-name allows: no path, no ..
        raise ConfigError(f"--run {name!r} is not a run name: a folder name in {root}")
    folder = root / name
    if not (folder / "run.sqlite").is_file():
        raise ConfigError(f"--run {name!r}: no run of that name in {root} (no "
                          "run.sqlite); give --results-dir if it was run elsewhere")
    return folder


@contextmanager
def open_inbox(folder: Path) -> Iterator[RequestInbox]:
    """The run catalog's inbox, closed on exit; catalog faults become one line.

    Raises
    ------
    ConfigError
        ``run.sqlite`` is not an SQLite file, is damaged, or stays locked by
        another process (naming the file); a client already requested
        (:meth:`RequestInbox.submit`).
    """
    path = folder / "run.sqlite"
    try:
        inbox = RequestInbox(path)
    except (StoreError, InboxError) as err:
        raise ConfigError(_busy(err, path)) from None
    try:
        yield inbox
    except (InboxError, sqlite3.Error) as err:
        raise ConfigError(_busy(err, path)) from None
    finally:
        inbox.close()


def _busy(err: Exception, path: Path) -> str:
    if "locked" in str(err) or "busy" in str(err):
        return (f"{path} is locked by another process (the ServerApp writing?): "
                "nothing was recorded; try again")
    return str(err) if str(path) in str(err) else f"{path}: {err}"


def unfinished(folder: Path, versions: int) -> str:
    """Why a run folder has no summary.json: running, or stopped (killed or removed)."""
    holder = RunLock.holder(folder)
    if holder is not None:
        return f"run {folder.name} is still running ({holder}): no {SUMMARY} yet"
    return (f"run {folder.name} has no {SUMMARY} and no process works on it "
            f"({versions} model version(s) recorded): it was stopped before the end "
            f"(run it again to resume), or its {SUMMARY} was removed (restore it)")
