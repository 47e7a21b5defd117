"""The server's training history: W^0, shard models and client updates per round.

Layout of one store (one federation of one run)::

    <root>/catalog.sqlite   clients, shards, rounds, participation, blobs, state
    <root>/blobs/*.npz      one archive per model or update (:mod:`history.files`:
                            the layer names in a manifest, any name kept)

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

from history.catalog import CATALOG_FILE, ParticipationCatalog, StoreError
from history.files import atomic_write, decode_arrays, encode_arrays
from history.protocols import RoundRecorder, TrainingHistory
from history.retention import needed_models

__all__ = ["HistoryStore", "StoreError", "CorruptBlobError"]

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


class CorruptBlobError(StoreError):
    """A stored blob does not match its checksum; the message names what it held."""


class HistoryStore(ParticipationCatalog, TrainingHistory, RoundRecorder):
    """On-disk, checksummed training history of one federation.

    Both the learning loop's :class:`~history.protocols.RoundRecorder` and a
    :class:`~history.protocols.TrainingHistory`. Use :meth:`create` to start a
    new store and :meth:`open` to read a complete one. Arrays are dicts of layer
    name -> float32 ndarray.
    """

    SCHEMA = _SCHEMA
    KIND = "history store"
    max_update: float | None = 1e4
    """Largest ``|w - w_sent|`` of one parameter in one update (sanity range).

    float32 blobs could hold more; this generous bound only keeps one client
    from pushing a shard model to overflow (NaN) with finite but absurd values.
    """

    def __init__(self, root: Path, conn: sqlite3.Connection) -> None:
        super().__init__(root / CATALOG_FILE, conn)
        self.root = root

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
        if (root / CATALOG_FILE).exists():
            raise StoreError(f"{root} already holds a history store; not overwriting")
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        conn = cls.connect(root / CATALOG_FILE)
        cls.create_catalog(conn, {"state": "writing", **meta}, client_shard)
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
        if not (root / CATALOG_FILE).is_file():
            raise StoreError(f"no history store at {root}")
        store = cls(root, cls.connect(root / CATALOG_FILE))
        if require_complete and store.state != "complete":
            raise StoreError(
                f"history store at {root} is incomplete (state {store.state!r}): "
                "the run that wrote it did not finish"
            )
        return store

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

    def prune_models(self, interval: int | None) -> int:
        """Drop every stored shard model that unlearning can no longer need.

        Keeps W^0, the last model and, with SE's calibration ``interval``, each
        W^(p - 1) a replay from a first participation can start from
        (:func:`history.retention.needed_models`; None: FedEraser's, W^0 only).
        Updates are never dropped. Returns the bytes freed.
        """
        freed = 0
        for shard in sorted({s for (s,) in self._conn.execute(
                "SELECT DISTINCT shard FROM shard_models")}):
            stored = [r for (r,) in self._conn.execute(
                "SELECT round FROM shard_models WHERE shard=? ORDER BY round", (shard,))]
            first = self.first_rounds(shard)
            keep = needed_models(self.rounds(shard), first, max(stored), interval)
            for rnd in (r for r in stored if r not in keep):
                freed += self._drop_model(shard, rnd)
        return freed

    def truncate_after(self, rnd: int) -> int:
        """Drop every update and shard model of the rounds after ``rnd``; return bytes.

        A learning resumed at round ``rnd`` + 1 (:mod:`server_app.stages.learn`)
        first removes what the killed run stored of rounds it did not finish.
        """
        freed = 0
        rows = self._conn.execute("SELECT shard, round, partition_id, blob FROM updates "
                                  "WHERE round>?", (rnd,)).fetchall()
        for shard, later, pid, blob in rows:
            freed += self._drop_blob(blob) if blob else 0
            with self._conn:
                self._conn.execute("DELETE FROM updates WHERE shard=? AND round=? AND "
                                   "partition_id=?", (shard, later, pid))
        for shard, later in self._conn.execute(
                "SELECT shard, round FROM shard_models WHERE round>?", (rnd,)).fetchall():
            freed += self._drop_model(shard, later)
        return freed

    def erasure_plan(self, forgotten: list[int], clients: list[int],
                     keep_round: int | None = None) -> dict:
        """What :meth:`erase` of ``clients`` removes, without removing anything.

        Each stored update of ``clients`` (``[shard, round, client]``), and in each
        shard holding one of ``clients`` every stored W^g with g >= the first
        round a client of ``forgotten`` (every client whose updates are gone so
        far, ``clients`` among them) trained there: those models carry its
        updates, and no replay can start from them. Shards of other clients are
        left to their own requests. ``keep_round``: the models of that round stay
        (a one-stage run's learned models, which its model version 1 holds too),
        listed under ``kept_models``.

        Returns
        -------
        dict
            ``store`` ("uncoded"), ``updates``, ``shard_models`` (``[shard,
            round]`` each), ``files`` (the blob files, under ``blobs/``, updates
            first) and ``bytes`` (their size).
        """
        gone, mine = set(forgotten) | set(clients), set(clients)
        rows = self._conn.execute(
            "SELECT shard, round, partition_id, blob FROM updates ORDER BY shard, round, "
            "partition_id").fetchall()
        updates = [[s, r, p] for s, r, p, blob in rows if p in mine and blob]
        files = [blob for _, _, p, blob in rows if p in mine and blob]
        shaped = []
        for shard in sorted({s for s, _, p, _ in rows if p in mine}):
            first = min(r for s, r, p, _ in rows if s == shard and p in gone)
            shaped += [[shard, rnd] for (rnd,) in self._conn.execute(
                "SELECT round FROM shard_models WHERE shard=? AND round>=? ORDER BY "
                "round", (shard, first)).fetchall()]
        models = [m for m in shaped if m[1] != keep_round]
        files += [f"model_s{s}_r{r}.npz" for s, r in models]
        size = sum(self._blob_bytes(name) for name in files)
        plan = {"store": "uncoded", "updates": updates, "shard_models": models,
                "files": files, "bytes": size}
        kept = [m for m in shaped if m[1] == keep_round]
        return {**plan, "kept_models": kept} if kept else plan

    def erase(self, forgotten: list[int], clients: list[int],
              plan: dict | None = None) -> dict:
        """Erase ``clients``' updates and the shard models they shaped; return the plan.

        ``plan`` (default :meth:`erasure_plan`) is carried out: each update blob
        is deleted (file and checksum row) and its participation row stays,
        marked erased, so the rounds in which a forgotten client took part are
        still known (SE replays a shard from the first of them) while
        :meth:`update` refuses it; each shard model is deleted. Carrying out a
        plan again deletes nothing more (a request killed half-way and redone
        reports the plan it saved, not what is left to delete).
        """
        plan = plan if plan is not None else self.erasure_plan(forgotten, clients)
        for shard, rnd, pid in plan["updates"]:
            row = self._conn.execute("SELECT blob FROM updates WHERE shard=? AND "
                                     "round=? AND partition_id=?", (shard, rnd, pid)
                                     ).fetchone()
            if row and row[0]:
                self._drop_blob(row[0])
                with self._conn:
                    self._conn.execute("UPDATE updates SET blob='' WHERE shard=? AND "
                                       "round=? AND partition_id=?", (shard, rnd, pid))
        for shard, rnd in plan["shard_models"]:
            self._drop_model(shard, rnd)
        return plan

    def _blob_bytes(self, name: str) -> int:
        row = self._conn.execute("SELECT nbytes FROM blobs WHERE name=?",
                                 (name,)).fetchone()
        return int(row[0]) if row else 0

    def _drop_blob(self, name: str) -> int:
        """Delete one blob (checksum row and file); return its bytes."""
        row = self._conn.execute("SELECT nbytes FROM blobs WHERE name=?",
                                 (name,)).fetchone()
        with self._conn:
            self._conn.execute("DELETE FROM blobs WHERE name=?", (name,))
        (self.root / "blobs" / name).unlink(missing_ok=True)
        return int(row[0]) if row else 0

    def _drop_model(self, shard: int, rnd: int) -> int:
        """Delete W_shard^rnd (catalog row, blob entry, file); return its bytes."""
        name = f"model_s{shard}_r{rnd}.npz"
        row = self._conn.execute("SELECT nbytes FROM blobs WHERE name=?",
                                 (name,)).fetchone()
        with self._conn:
            self._conn.execute("DELETE FROM shard_models WHERE shard=? AND round=?",
                               (shard, rnd))
            self._conn.execute("DELETE FROM blobs WHERE name=?", (name,))
        (self.root / "blobs" / name).unlink(missing_ok=True)
        return int(row[0]) if row else 0

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
        if not row[0]:
            raise StoreError(f"the update of client {partition_id} in shard {shard}, "
                             f"round {rnd} was erased (the client was forgotten)")
        return self._get_blob(
            row[0], f"update of client {partition_id}, shard {shard}, round {rnd}")

    def total_bytes(self) -> int:
        """Bytes the store holds on disk: blobs plus the catalog file."""
        blobs = self._conn.execute("SELECT COALESCE(SUM(nbytes), 0) FROM blobs")
        return int(blobs.fetchone()[0]) + self.catalog_bytes()

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

    # ---- what only coded histories fetch and decode -------------------------
    def take_retrieval(self) -> None:
        """None: an uncoded history is read from disk, nothing is fetched."""
        return None

    def accounting(self) -> None:
        """None: nothing is coded; :meth:`total_bytes` is all the store keeps."""
        return None

    def retrievals(self) -> list[dict]:
        """[]: an uncoded history is never fetched from clients."""
        return []
