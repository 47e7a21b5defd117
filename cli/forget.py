"""``forget`` and ``receipts``: requests to a staged run while it lives, and what was done.

``forget --run NAME --clients 3,17`` records one request (the clients' partition
ids) in the run's catalog (:class:`server_app.run.inbox.RequestInbox`) and prints its
id; the running ServerApp takes it at the next stage boundary and writes a
receipt. ``receipts --run NAME`` lists the receipts and the requests still
waiting. The run folder is ``<results-dir>/NAME`` (``--results-dir``, else
``$SE_RESULTS_DIR``, else the default results folder, as for a run). Nothing is
recorded when the run does not exist, has finished, has one stage only, or when
a client is unknown, already forgotten or already named by a request: one line
on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from history.catalog import StoreError
from server_app.config import ConfigError
from server_app.config.output import OutputConfig
from server_app.config.values import RUN_NAME
from server_app.run.inbox import InboxError, RequestInbox
from server_app.run.receipts import list_receipts, receipt_line

SUMMARY = "summary.json"


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


def parse_clients(text: str, num_clients: int) -> list[int]:
    """``"3,17"`` -> [3, 17]: distinct partition ids in 0..num_clients-1.

    Raises
    ------
    ConfigError
        Empty, not integers, repeated, or out of range (naming the value).
    """
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    if not tokens or not all(t.isascii() and t.isdigit() for t in tokens):
        raise ConfigError(f"--clients {text!r}: comma-separated partition ids in "
                          f"0..{num_clients - 1}, e.g. '3,17'")
    ids = [int(t) for t in tokens]
    unknown = [p for p in ids if p >= num_clients]
    if unknown:
        raise ConfigError(f"--clients {text!r}: unknown client(s) {unknown}; this run's "
                          f"clients are 0..{num_clients - 1}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--clients {text!r}: each id once")
    return sorted(ids)


def submit(name: str, clients: str, results_dir: str | None = None) -> str:
    """Record a request to forget ``clients`` in run ``name``; return its id.

    Raises
    ------
    ConfigError
        The run does not exist, has finished or has one stage; a client is
        unknown, forgotten or already requested. Nothing is recorded then.
    """
    folder = run_folder(name, results_dir)
    if (folder / SUMMARY).exists():
        raise ConfigError(f"--run {name!r} has finished ({folder / SUMMARY}); requests "
                          "are taken while a staged run lives")
    with open_inbox(folder) as inbox:
        settings = inbox.settings()
        if not settings:
            raise ConfigError(f"--run {name!r} has not recorded its settings yet (it "
                              "is starting, or was stopped before): try again once "
                              "it runs")
        stages = int(settings.get("num-stages", 1))
        if stages < 2:
            raise ConfigError(f"--run {name!r} has num-stages = {stages}: requests are "
                              "taken at stage boundaries, so only by a staged run")
        ids = parse_clients(clients, int(settings["num-clients"]))
        try:
            return inbox.submit(ids).id
        except InboxError as err:  # checked and recorded in one transaction
            raise ConfigError(f"--clients {clients!r}: {err}") from None


def main_forget(argv: list[str], prog: str) -> int:
    """The ``forget`` command; exit status 0 (recorded) or 2 (see :func:`submit`)."""
    parser = argparse.ArgumentParser(prog=prog, description="Ask a staged run to "
                                     "forget clients at its next stage boundary.")
    parser.add_argument("--run", required=True, help="the run's run-name")
    parser.add_argument("--clients", required=True, help="partition ids, e.g. 3,17")
    parser.add_argument("--results-dir", default=None)
    args = parser.parse_args(argv)
    rid = submit(args.run, args.clients, args.results_dir)
    print(f"request {rid} recorded: clients {args.clients} of run {args.run}; it is "
          "handled at the next stage boundary (see `receipts`)")
    return 0


def main_receipts(argv: list[str], prog: str) -> int:
    """The ``receipts`` command: one line per receipt, then requests still waiting."""
    parser = argparse.ArgumentParser(prog=prog, description="List a staged run's "
                                     "receipts and waiting requests.")
    parser.add_argument("--run", required=True, help="the run's run-name")
    parser.add_argument("--results-dir", default=None)
    args = parser.parse_args(argv)
    folder = run_folder(args.run, args.results_dir)
    try:
        receipts = list_receipts(folder)
    except ValueError as err:  # a damaged receipt file: one line naming it
        raise ConfigError(str(err)) from None
    with open_inbox(folder) as inbox:
        waiting = [r for r in inbox.all() if r.state in ("pending", "claimed")]
    for receipt in receipts:
        print(receipt_line(receipt))
    late = "not handled: it arrived after the last stage boundary" if (
        folder / SUMMARY).exists() else "not done yet"
    for request in waiting:
        print(f"{request.id}  {request.state:<8} stage {request.stage or '-'}  clients "
              f"{request.clients}  ({late})")
    if not receipts and not waiting:
        print(f"run {args.run}: no request yet")
    print(f"receipts: {folder / 'receipts'}")
    return 0
