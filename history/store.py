"""The server's training history: W^0, shard models and client updates per round.

Layout of one store (one federation of one run)::

    <root>/catalog.sqlite   clients, shards, rounds, participation, blobs, state
    <root>/blobs/*.npz      one numpy .npz per model or update

Every blob is written to a temporary file, fsync'ed and renamed into place before
its catalog row is committed, so a row never points at a half-written file; its
SHA-256 is stored with the row and checked on every read. The catalog's ``state``
is ``writing`` until :meth:`HistoryStore.mark_complete`; :meth:`HistoryStore.open`
refuses a store that is not complete, so a failed run is never mistaken for a
finished one. What is kept is what SE / FedEraser need for calibrated retraining
(paper eq. 2-3): each participant's update U_m^g = w_m^g - W^{g-1}, its example
count, and the shard model W^g of every round.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from history.files import atomic_write, decode_arrays, encode_arrays

__all__ = ["HistoryStore", "StoreError", "CorruptBlobError", "atomic_write",
           "decode_arrays", "encode_arrays"]

Arrays = dict[str, np.ndarray]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clients (
    partition_id INTEGER PRIMARY KEY, shard INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (
    name TEXT PRIMARY KEY, sha256 TEXT NOT NULL, nbytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS shard_models (
    shard INTEGER NOT NULL, round INTEGER NOT NULL, blob TEXT NOT NULL,
    PRIMARY KEY (shard, round));
CREATE TABLE IF NOT EXISTS updates (
    shard INTEGER NOT NULL, round INTEGER NOT NULL, partition_id INTEGER NOT NULL,
    num_examples INTEGER NOT NULL, train_seconds REAL NOT NULL, blob TEXT NOT NULL,
    PRIMARY KEY (shard, round, partition_id));
"""


class StoreError(RuntimeError):
    """The store cannot be used: missing, incomplete, or inconsistent."""


class CorruptBlobError(StoreError):
    """A stored blob does not match its checksum; the message names what it held."""


class ParticipationCatalog:
    """Who took part in which round: queries on a catalog's ``updates`` table.

    Shared by the uncoded store and the coded history's catalog (both keep
    shard, round, partition id and example count per participant).
    """

    _conn: sqlite3.Connection

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


class HistoryStore(ParticipationCatalog):
    """On-disk, checksummed training history of one federation.

    Use :meth:`create` to start a new store and :meth:`open` to read a complete
    one. Arrays are dicts of layer name -> float32 ndarray.
    """

    max_update: float | None = None
    """Largest |parameter| of an update the store can keep: no limit (float32 blobs)."""

    def __init__(self, root: Path, conn: sqlite3.Connection) -> None:
        self.root = root
        self._conn = conn

    # ---- life cycle -------------------------------------------------------
    @classmethod
    def create(
        cls, root: str | Path, client_shard: Mapping[int, int], **meta: object
    ) -> HistoryStore:
        """Start a new, empty store at ``root`` (state ``writing``).

        Parameters
        ----------
        root : str or Path
            A folder that must not hold a store yet.
        client_shard : Mapping[int, int]
            partition id -> shard of every client of the federation.
        **meta
            Extra facts to keep (e.g. ``num_shards``), stored as text.

        Raises
        ------
        StoreError
            ``root`` already holds a catalog.
        """
        root = Path(root)
        if (root / "catalog.sqlite").exists():
            raise StoreError(f"{root} already holds a history store; not overwriting")
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(root / "catalog.sqlite")
        with conn:
            conn.executescript(_SCHEMA)
            conn.execute("INSERT INTO meta VALUES ('state', 'writing')")
            conn.executemany("INSERT INTO meta VALUES (?, ?)",
                             [(k, str(v)) for k, v in meta.items()])
            conn.executemany("INSERT INTO clients VALUES (?, ?)",
                             sorted(client_shard.items()))
        return cls(root, conn)

    @classmethod
    def open(cls, root: str | Path, require_complete: bool = True) -> HistoryStore:
        """Open an existing store.

        Raises
        ------
        StoreError
            No catalog at ``root``, or (with ``require_complete``) a store whose
            writing never finished.
        """
        root = Path(root)
        if not (root / "catalog.sqlite").is_file():
            raise StoreError(f"no history store at {root}")
        store = cls(root, sqlite3.connect(root / "catalog.sqlite"))
        if require_complete and store.state != "complete":
            raise StoreError(
                f"history store at {root} is incomplete (state {store.state!r}): "
                "the run that wrote it did not finish"
            )
        return store

    def close(self) -> None:
        """Close the catalog connection."""
        self._conn.close()

    @property
    def state(self) -> str:
        """``writing`` or ``complete``."""
        return self.meta("state")

    def meta(self, key: str) -> str:
        """A stored metadata value (text)."""
        row = self._conn.execute("SELECT value FROM meta WHERE key=?",
                                 (key,)).fetchone()
        if row is None:
            raise StoreError(f"history store at {self.root} has no meta {key!r}")
        return row[0]

    def mark_complete(self) -> None:
        """Declare the store finished; only then can :meth:`open` read it."""
        with self._conn:
            self._conn.execute("UPDATE meta SET value='complete' WHERE key='state'")

    # ---- writing ----------------------------------------------------------
    def _put_blob(self, name: str, arrays: Mapping[str, np.ndarray]) -> None:
        data = encode_arrays(arrays)
        atomic_write(self.root / "blobs" / name, data)
        self._conn.execute("INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)",
                           (name, hashlib.sha256(data).hexdigest(), len(data)))

    def put_shard_model(self, shard: int, rnd: int, arrays: Mapping[str, np.ndarray]
                        ) -> None:
        """Store shard model W_s^rnd (rnd = 0 is the initial model W^0)."""
        name = f"model_s{shard}_r{rnd}.npz"
        with self._conn:
            self._put_blob(name, arrays)
            self._conn.execute("INSERT OR REPLACE INTO shard_models VALUES (?, ?, ?)",
                               (shard, rnd, name))

    def put_update(self, shard: int, rnd: int, partition_id: int,
                   arrays: Mapping[str, np.ndarray], num_examples: int,
                   train_seconds: float) -> None:
        """Store client ``partition_id``'s update U^rnd = w^rnd - W^(rnd-1)."""
        name = f"update_s{shard}_r{rnd}_c{partition_id}.npz"
        with self._conn:
            self._put_blob(name, arrays)
            self._conn.execute(
                "INSERT OR REPLACE INTO updates VALUES (?, ?, ?, ?, ?, ?)",
                (shard, rnd, partition_id, int(num_examples), float(train_seconds),
                 name))

    def end_round(self, rnd: int, grid: object = None) -> None:
        """Nothing to do: every blob is on disk when its ``put_*`` returns.

        (The learning loop calls it after each round; the coded recorder codes
        and distributes the round there.)
        """

    # ---- reading ----------------------------------------------------------
    def _get_blob(self, name: str, what: str) -> Arrays:
        row = self._conn.execute("SELECT sha256 FROM blobs WHERE name=?",
                                 (name,)).fetchone()
        path = self.root / "blobs" / name
        if row is None or not path.is_file():
            raise StoreError(f"{what}: blob {name} is missing from {self.root}")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != row[0]:
            raise CorruptBlobError(f"{what}: blob {path} fails its SHA-256 checksum")
        return decode_arrays(data)

    def shard_model(self, shard: int, rnd: int) -> Arrays:
        """W_s^rnd. Raises StoreError / CorruptBlobError."""
        row = self._conn.execute(
            "SELECT blob FROM shard_models WHERE shard=? AND round=?", (shard, rnd)
        ).fetchone()
        if row is None:
            raise StoreError(f"no model of shard {shard} at round {rnd}")
        return self._get_blob(row[0], f"shard {shard} model, round {rnd}")

    def update(self, shard: int, rnd: int, partition_id: int) -> Arrays:
        """U^rnd of client ``partition_id``. Raises StoreError / CorruptBlobError."""
        row = self._conn.execute(
            "SELECT blob FROM updates WHERE shard=? AND round=? AND partition_id=?",
            (shard, rnd, partition_id)).fetchone()
        if row is None:
            raise StoreError(
                f"no update of client {partition_id} in shard {shard}, round {rnd}")
        return self._get_blob(
            row[0], f"update of client {partition_id}, shard {shard}, round {rnd}")

    def client_shard(self) -> dict[int, int]:
        """Partition id -> shard of every client."""
        return dict(self._conn.execute("SELECT partition_id, shard FROM clients"))

    def total_bytes(self) -> int:
        """Bytes the store holds on disk: blobs plus the catalog file."""
        blobs = self._conn.execute("SELECT COALESCE(SUM(nbytes), 0) FROM blobs")
        return int(blobs.fetchone()[0]) + (self.root / "catalog.sqlite").stat().st_size

    def verify(self) -> list[str]:
        """Check every blob's checksum; return one line per bad or missing blob."""
        problems = []
        for name, digest in self._conn.execute("SELECT name, sha256 FROM blobs"):
            path = self.root / "blobs" / name
            if not path.is_file():
                problems.append(f"{name}: missing")
            elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                problems.append(f"{name}: checksum mismatch")
        return problems
