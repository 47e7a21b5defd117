"""Requests to be forgotten that arrive while a staged run lives (its inbox).

The inbox is a table of the run's catalog ``run.sqlite``: the ``forget`` command
(:mod:`cli.forget`) adds a request with :meth:`RequestInbox.submit` while the
ServerApp runs, and the ServerApp takes every pending request at the next stage
boundary (:meth:`RequestInbox.claim`). A request moves ``pending`` -> ``claimed``
(bound to a stage) -> ``done`` or ``refused``; a finished run's request that
fails for a reason a retry cannot fix (a history that cannot be decoded or read)
goes ``pending`` -> ``failed`` with its reason, and its clients may be requested
again once the cause is repaired; all in SQLite transactions, so a
request survives a crash of either process and is handled once: a resumed run
handles the requests claimed by the stage it redoes, and no others.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from history.catalog import SQLiteCatalog
from runstore.versions import VERSIONS_SCHEMA, ModelVersion

_SCHEMA = VERSIONS_SCHEMA + """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
    clients TEXT NOT NULL, source TEXT NOT NULL, received REAL NOT NULL,
    state TEXT NOT NULL, stage INTEGER, finished REAL, note TEXT, receipt TEXT,
    erasure TEXT);
"""
STATES = ("pending", "claimed", "done", "refused", "failed")
CLOSED = ("refused", "failed")
"""States whose clients are free to be requested again (nothing was forgotten)."""


class InboxError(ValueError):
    """A request that cannot be taken; nothing was recorded."""


@dataclass(frozen=True)
class Request:
    """One request to be forgotten.

    Attributes
    ----------
    id : str
        ``r<seq>`` (e.g. ``r0003``), unique in the run.
    clients : list[int]
        Partition ids to forget.
    source : str
        ``command`` (the ``forget`` command) or ``planned`` (``requests-per-stage``).
    received : float
        UNIX time (seconds) at which it was recorded.
    state : str
        One of :data:`STATES`.
    stage : int or None
        The stage whose boundary handles it (None while pending).
    erasure : dict or None
        A records or class request (its ``clients`` empty: they stay):
        ``records``, client (str) -> the record ids erased (:mod:`task.records`),
        and ``labels``, the classes erased on every client.
    """

    id: str
    clients: list[int]
    source: str
    received: float
    state: str
    stage: int | None
    erasure: dict | None = None


class RequestInbox(SQLiteCatalog):
    """The inbox table of a run catalog (``<run folder>/run.sqlite``).

    Parameters
    ----------
    path : Path
        ``<run folder>/run.sqlite``; created with the inbox table if missing.
    read_only : bool
        Only read an existing catalog (nothing created or written).

    Raises
    ------
    history.StoreError
        The file cannot be opened as SQLite.
    """

    SCHEMA = _SCHEMA
    META_TABLE = "settings"
    KIND = "run catalog"

    def __init__(self, path: Path, read_only: bool = False) -> None:
        super().__init__(Path(path), self.connect(path, read_only=read_only))
        self._conn.execute("PRAGMA busy_timeout = 30000")  # the other process writes
        if read_only:  # the checks before a resume (server_app.stored)
            return
        try:
            self.create_schema(self._conn)
            columns = self._columns()
            for column in ("receipt", "erasure"):  # a catalog from before them
                if column not in columns:
                    with self._conn:
                        self._conn.execute(f"ALTER TABLE inbox ADD COLUMN {column} TEXT")
        except sqlite3.Error as err:
            self._conn.close()
            raise InboxError(f"{path}: the inbox cannot be opened: {err}") from None

    def settings(self) -> dict:
        """The run's settings as recorded by the ServerApp ({} if none yet)."""
        text = self.get_meta("settings")
        return json.loads(text) if text else {}

    def submit(self, clients: Sequence[int], source: str = "command",
               stage: int | None = None) -> Request:
        """Record a request (``pending``, or ``claimed`` by ``stage``); return it.

        The check that no client is named by another request (pending, claimed
        or done) and the insert are one write transaction, so two processes
        submitting at once cannot both name a client; ids stay unique.

        Raises
        ------
        InboxError
            A client already forgotten or requested (naming it and the request);
            nothing was recorded.
        """
        return self.submit_all([clients], source, stage)[0]

    def submit_records(self, records: dict[int, list[int]],
                       labels: Sequence[int] = (),
                       check: Callable[[list[Request]], str | None] | None = None
                       ) -> Request:
        """Record a records or class request (``pending``; clients stay); return it.

        ``records``: client -> record ids; ``labels``: classes erased on every
        client. No client is taken: the owners may be named by later requests of
        either kind. ``check``, given every request recorded so far, says why the
        request cannot be taken (None: it can); it runs with the insert in one
        write transaction, so a request recorded meanwhile by another process is
        seen.

        Raises
        ------
        InboxError
            ``check``'s reason; nothing was recorded.
        """
        erasure = json.dumps({"records": {str(p): sorted(map(int, ids))
                                          for p, ids in sorted(records.items())},
                              "labels": sorted({int(c) for c in labels})})
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")  # take the write lock before checking
            reason = check(self.all()) if check is not None else None
            if reason is not None:
                raise InboxError(reason)
            rid = self._insert([], "command", time.time(), "pending", None, erasure)
        return self.get(rid)

    def _insert(self, clients: Sequence[int], source: str, now: float, state: str,
                stage: int | None, erasure: str | None = None) -> str:
        """Insert one request row (inside the caller's transaction); return its id."""
        cur = self._conn.execute(
            "INSERT INTO inbox (id, clients, source, received, state, stage, erasure) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (f"tmp-{now}", json.dumps(sorted(int(p) for p in clients)), source, now,
             state, stage, erasure))
        rid = f"r{cur.lastrowid:04d}"
        self._conn.execute("UPDATE inbox SET id=? WHERE seq=?", (rid, cur.lastrowid))
        return rid

    def submit_all(self, requests: Sequence[Sequence[int]], source: str,
                   stage: int | None = None, unique: bool = True) -> list[Request]:
        """Record several requests in one transaction (all or none), as :meth:`submit`.

        A stage's seeded requests go in together: a crash between two of them
        cannot leave the stage with part of its draw. They go in with
        ``unique=False``: drawn among clients no request named, they may meet a
        command that arrived since the draw; that command waits for the next
        boundary, which refuses it if its clients are forgotten by then.
        """
        state = "pending" if stage is None else "claimed"
        now, ids = time.time(), []
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")  # take the write lock before checking
            taken = {p: r.id for r in self.all() if r.state not in CLOSED
                     for p in r.clients}
            for clients in requests:
                again = {int(p): taken[int(p)] for p in clients if int(p) in taken}
                if again and unique:
                    raise InboxError("already forgotten or requested: " + ", ".join(
                        f"{p} ({rid})" for p, rid in sorted(again.items())))
                ids.append(self._insert(clients, source, now, state, stage))
                taken.update({int(p): ids[-1] for p in clients})
        return [self.get(rid) for rid in ids]

    def claim(self, stage: int) -> list[Request]:
        """Bind every pending request to ``stage``; return the stage's requests.

        Returns the requests claimed by ``stage`` now or before (a resumed run),
        in arrival order, done ones included.
        """
        with self._conn:
            self._conn.execute("UPDATE inbox SET state='claimed', stage=? "
                               "WHERE state='pending'", (stage,))
        return self._select("WHERE stage=? ORDER BY seq", (stage,))

    def finish(self, rid: str, state: str, note: str = "",
               receipt: dict | None = None, version: ModelVersion | None = None) -> None:
        """Mark request ``rid`` ``done``, ``refused`` or ``failed`` (one-line ``note``).

        ``receipt`` (a JSON-able dict) is kept with the request in the same
        transaction: the catalog, not the receipt files, is the record that
        summary.json is built from (:meth:`receipts`). ``version``, the model
        version the request made (its file already written), is added in that
        same transaction: a request is done exactly when its version exists.

        Raises
        ------
        ValueError
            ``state`` is not one of those three.
        InboxError
            ``version``'s number exists already.
        """
        if state not in ("done", "refused", "failed"):
            raise ValueError(f"request state {state!r}: done, refused or failed")
        text = None if receipt is None else json.dumps(receipt, allow_nan=False)
        with self._conn:
            if version is not None:
                self._insert_version(version)
            self._conn.execute("UPDATE inbox SET state=?, finished=?, note=?, receipt=? "
                               "WHERE id=?", (state, time.time(), note, text, rid))

    # ---- model versions ----------------------------------------------------
    def add_version(self, version: ModelVersion) -> None:
        """Record ``version`` (its file already written).

        Raises
        ------
        InboxError
            That version number exists already.
        """
        with self._conn:
            self._insert_version(version)

    def _insert_version(self, version: ModelVersion) -> None:
        try:
            self._conn.execute(f"INSERT INTO versions VALUES ({', '.join('?' * 10)})",
                               version.row())
        except sqlite3.IntegrityError:
            raise InboxError(f"{self.catalog_path}: model version {version.version} "
                             "exists already") from None

    def versions(self) -> list[ModelVersion]:
        """Every model version, oldest first ([] for a run from before versions)."""
        rows = self._conn.execute("SELECT * FROM versions ORDER BY version").fetchall()
        return [ModelVersion.from_row(tuple(r)) for r in rows]

    def pending(self) -> list[Request]:
        """Requests not bound to a stage and not handled yet, in arrival order.

        A finished run takes these (:mod:`server_app.stages.later`).
        """
        return self._select("WHERE state = 'pending' ORDER BY seq", ())

    def receipts(self) -> list[dict]:
        """The receipts kept by :meth:`finish`, in arrival order.

        Requests not finished yet have none and are left out.
        """
        rows = self._conn.execute("SELECT receipt FROM inbox WHERE receipt IS NOT NULL "
                                  "ORDER BY seq").fetchall()
        return [json.loads(text) for (text,) in rows]

    def check(self) -> list[ModelVersion]:
        """Read back every request, receipt and model version; return the versions.

        A catalog from before receipts or versions were kept has none to read.

        Raises
        ------
        InboxError
            A row that cannot be read or parsed (naming the catalog).
        """
        self.all()
        try:
            tables = {name for (name,) in self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
            if "receipt" in self._columns():
                self.receipts()
            return self.versions() if "versions" in tables else []
        except (sqlite3.Error, ValueError, TypeError) as err:
            raise InboxError(f"{self.catalog_path}: a receipt or model version cannot "
                             f"be read: {err}") from None

    def get(self, rid: str) -> Request:
        """The request ``rid``. Raises KeyError if there is none."""
        found = self._select("WHERE id=?", (rid,))
        if not found:
            raise KeyError(rid)
        return found[0]

    def all(self) -> list[Request]:
        """Every request, in arrival order."""
        return self._select("ORDER BY seq", ())

    def named_clients(self, states: Iterable[str] = ("pending", "claimed", "done")
                      ) -> set[int]:
        """Clients named by requests in ``states`` (taken or forgotten)."""
        return {p for r in self.all() if r.state in set(states) for p in r.clients}

    def _columns(self) -> set[str]:
        """The inbox table's columns (a catalog from before a column lacks it)."""
        return {row[1] for row in self._conn.execute("PRAGMA table_info(inbox)")}

    def _select(self, where: str, args: tuple) -> list[Request]:
        try:
            rows = self._conn.execute(
                "SELECT id, clients, source, received, state, stage, "
                + ("erasure" if "erasure" in self._columns() else "NULL") + " FROM inbox "
                + where, args).fetchall()
        except sqlite3.Error as err:
            raise InboxError(f"{self.catalog_path}: the inbox cannot be read: {err}") \
                from None
        try:
            return [Request(i, json.loads(c), s, r, st, g, json.loads(e) if e else None)
                    for i, c, s, r, st, g, e in rows]
        except (TypeError, ValueError) as err:  # a row that is no request
            raise InboxError(f"{self.catalog_path}: a request cannot be read: {err}") \
                from None
