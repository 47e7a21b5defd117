"""SQLite catalogs: one way to connect, create a schema and keep key/value facts.

Every catalog file of the project is a :class:`SQLiteCatalog`: the uncoded
history store's and the coded store's ``catalog.sqlite``
(:class:`ParticipationCatalog`, who took part in which round) and the run's
progress log ``run.sqlite`` (``runstore.catalog``). A subclass names its schema
(``SCHEMA``, which creates the key/value table ``META_TABLE`` among its tables)
and the pragmas every connection runs first (``PRAGMAS``); the base connects,
creates the schema and reads and writes the key/value facts.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path

CATALOG_FILE = "catalog.sqlite"
"""File name of a history store's catalog inside its folder."""


class StoreError(RuntimeError):
    """The store cannot be used: missing, incomplete, or inconsistent."""


class SQLiteCatalog:
    """One SQLite catalog file: connection, schema and a key/value table.

    Parameters
    ----------
    path : Path
        The catalog file.
    conn : sqlite3.Connection
        An open connection to ``path`` (from :meth:`connect`).
    """

    SCHEMA: str = ""
    """``CREATE TABLE`` statements; among them the key/value ``META_TABLE``."""
    PRAGMAS: tuple[str, ...] = ()
    """``PRAGMA`` statements (without the keyword) run on every new connection."""
    META_TABLE: str = "meta"
    """Table of (key TEXT PRIMARY KEY, value TEXT NOT NULL) facts."""
    KIND: str = "catalog"
    """What the catalog is, for error messages (``<KIND> at <folder>``)."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.catalog_path = Path(path)
        self._conn = conn

    @classmethod
    def connect(cls, path: str | Path, read_only: bool = False) -> sqlite3.Connection:
        """A connection to ``path`` (created if missing) with :attr:`PRAGMAS` set.

        With ``read_only`` the file must exist and is only read (SQLite's
        ``mode=ro``; no pragma runs), and every page is checked (``PRAGMA
        quick_check``): a truncated or garbled file fails here, not halfway
        through a run. A file left with a hot journal by a process killed
        mid-transaction is opened for writing instead, so that SQLite rolls the
        interrupted transaction back, as the next writer would.

        Raises
        ------
        StoreError
            ``path`` cannot be opened or is not an SQLite database (one line,
            naming the file).
        """
        try:
            if read_only:
                return _checked(_read_only(path))
            conn = sqlite3.connect(path)
            for pragma in cls.PRAGMAS:
                conn.execute(f"PRAGMA {pragma}")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as err:
            reason = str(err).splitlines()[0] if str(err) else repr(err)
            raise StoreError(f"{cls.KIND} {path} cannot be read: {reason}; restore or "
                             "remove it") from None
        return conn

    @classmethod
    def create_schema(cls, conn: sqlite3.Connection,
                      meta: Iterable[tuple[str, object]] = ()) -> None:
        """Run :attr:`SCHEMA` on ``conn``, then insert the ``meta`` facts (as text).

        Raises
        ------
        sqlite3.IntegrityError
            A key of ``meta`` is already stored.
        """
        with conn:
            conn.executescript(cls.SCHEMA)
            conn.executemany(f"INSERT INTO {cls.META_TABLE} VALUES (?, ?)",
                             [(key, str(value)) for key, value in meta])

    @classmethod
    def lookup(cls, conn: sqlite3.Connection, key: str) -> str | None:
        """The fact ``key`` of the catalog behind ``conn``, or None if not stored."""
        row = conn.execute(f"SELECT value FROM {cls.META_TABLE} WHERE key=?",
                           (key,)).fetchone()
        return None if row is None else row[0]

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        """A stored fact (text), or ``default`` if there is none."""
        value = self.lookup(self._conn, key)
        return default if value is None else value

    def meta(self, key: str) -> str:
        """A stored fact (text).

        Raises
        ------
        StoreError
            No fact ``key``; the message names the catalog's folder.
        """
        value = self.lookup(self._conn, key)
        if value is None:
            raise StoreError(f"{self.KIND} at {self.catalog_path.parent} has no meta "
                             f"{key!r}")
        return value

    def set_meta(self, key: str, value: str) -> None:
        """Store or replace a fact; the caller commits (``with self._conn``)."""
        self._conn.execute(f"INSERT OR REPLACE INTO {self.META_TABLE} VALUES (?, ?)",
                           (key, value))

    def catalog_bytes(self) -> int:
        """Size of the catalog file on disk (bytes)."""
        return self.catalog_path.stat().st_size

    def close(self) -> None:
        """Close the catalog connection."""
        self._conn.close()


SQLITE_READONLY_ROLLBACK = 776
"""SQLite's error code for a read-only connection that meets a hot journal."""


def _read_only(path: str | Path) -> sqlite3.Connection:
    """``path`` opened with ``mode=ro``, or for writing if a hot journal needs rolling back.

    Raises
    ------
    sqlite3.Error
        The file is missing, unreadable or no database.
    """
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as err:
        conn.close()
        if getattr(err, "sqlite_errorcode", None) != SQLITE_READONLY_ROLLBACK:
            raise
        conn = sqlite3.connect(path)  # the rollback the next writer would make
    return conn


def _checked(conn: sqlite3.Connection) -> sqlite3.Connection:
    """``conn`` if ``PRAGMA quick_check`` finds every page sound (else closed, raised)."""
    try:
        found = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
        if found != ["ok"]:
            raise sqlite3.DatabaseError(found[0] if found else "quick_check failed")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


class ParticipationCatalog(SQLiteCatalog):
    """A history store's catalog: its state and who took part in which round.

    Shared by the uncoded store and the coded store (both keep shard, round,
    partition id and example count per participant in ``updates``, each
    client's shard in ``clients``, and ``state`` in ``meta``).
    """

    @classmethod
    def create_catalog(cls, conn: sqlite3.Connection, meta: Mapping[str, object],
                       client_shard: Mapping[int, int]) -> None:
        """A new catalog on ``conn``: the schema, ``meta`` and every client's shard.

        ``meta`` should set ``state`` (``writing`` until :meth:`mark_complete`).
        """
        cls.create_schema(conn, meta.items())
        with conn:
            conn.executemany("INSERT INTO clients VALUES (?, ?)",
                             sorted(client_shard.items()))

    @property
    def state(self) -> str:
        """``writing`` or ``complete``."""
        return self.meta("state")

    def mark_complete(self) -> None:
        """Declare the store finished; only then can it be opened for reading."""
        with self._conn:
            self.set_meta("state", "complete")

    def first_rounds(self, shard: int) -> list[int]:
        """Each client's first round with an update in ``shard`` (one per client)."""
        return [r for (r,) in self._conn.execute(
            "SELECT MIN(round) FROM updates WHERE shard=? GROUP BY partition_id",
            (shard,))]

    def participants(self, shard: int, rnd: int) -> list[tuple[int, int]]:
        """(partition id, example count) of round ``rnd``'s participants."""
        return [tuple(r) for r in self._conn.execute(
            "SELECT partition_id, num_examples FROM updates WHERE shard=? AND round=?"
            " ORDER BY partition_id", (shard, rnd))]

    def rounds(self, shard: int) -> list[int]:
        """Rounds (>= 1) with stored updates for ``shard``, ascending."""
        return [r[0] for r in self._conn.execute(
            "SELECT DISTINCT round FROM updates WHERE shard=? ORDER BY round",
            (shard,))]

    def client_shard(self) -> dict[int, int]:
        """Partition id -> shard of every client."""
        return dict(self._conn.execute("SELECT partition_id, shard FROM clients"))
