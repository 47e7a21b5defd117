"""The coded store's catalog: what the server keeps of a coded history.

With run-config ``storage = "coded"`` (coded sharding, docs/DESIGN.md; Lin et
al., IJCAI 2024, Sec. 3.3) the parameters SE needs for calibrated retraining are
spread over the clients as Lagrange / Reed-Solomon coded slices over GF(p),
p = 2^31 - 1 (written by :mod:`history.coded.recorder`, read back by
:mod:`history.coded.reader`), and the server forgets them.

The server keeps ``catalog.sqlite`` (participants, example counts, layer names
and shapes, record lengths, evaluation points, scale, which client acknowledged
which slice, accounting) and ``keys`` (one 32-byte secret per shard) - no
parameters of any round, not even W^0. :class:`CodedCatalog` reads and writes
both, for the recorder and the reader alike.

Communication model: each transfer that carries slices (a ``store_slice``
message, a ``fetch_slices`` reply) costs 0.1 s + bits / link rate
(:func:`history.comm.transfer_seconds`); small requests and acks are
not counted, as model-free messages are not counted elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.app import RecordDict

from history.catalog import CATALOG_FILE, ParticipationCatalog, StoreError
from history.files import atomic_write
from history.protocols import FaultSink
from history.retention import needed_models

Arrays = dict[str, np.ndarray]

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE clients (partition_id INTEGER PRIMARY KEY, shard INTEGER NOT NULL);
CREATE TABLE rounds (
    round INTEGER PRIMARY KEY, block_len INTEGER NOT NULL, encode_s REAL NOT NULL,
    comm_s REAL NOT NULL, transfers INTEGER NOT NULL);
CREATE TABLE records (
    shard INTEGER NOT NULL, round INTEGER NOT NULL, length INTEGER NOT NULL,
    PRIMARY KEY (shard, round));
CREATE TABLE updates (
    shard INTEGER NOT NULL, round INTEGER NOT NULL, partition_id INTEGER NOT NULL,
    num_examples INTEGER NOT NULL, train_seconds REAL NOT NULL,
    erased INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (shard, round, partition_id));
CREATE TABLE IF NOT EXISTS stale (
    shard INTEGER NOT NULL, round INTEGER NOT NULL, partition_id INTEGER NOT NULL,
    PRIMARY KEY (shard, round, partition_id));
CREATE TABLE slices (
    round INTEGER NOT NULL, partition_id INTEGER NOT NULL, slice_bytes INTEGER NOT NULL,
    stored_bytes INTEGER NOT NULL, disk_bytes INTEGER NOT NULL,
    PRIMARY KEY (round, partition_id));
"""

class CodedStorageError(RuntimeError):
    """The history of a round cannot be coded or stored (range, too few holders)."""


@dataclass(frozen=True)
class SliceTransfer:
    """How the server exchanges slices with their holders (recorder and reader alike).

    Attributes
    ----------
    timeout : float, optional
        Seconds to wait for the clients' replies (acks or slices); None: no limit.
    link_rate_mbps : float
        Link rate of the communication model, Mbit/s.
    faults : FaultSink, optional
        Where refused, malformed, damaged or lost slices are recorded (the
        recorder's and the reader's own stages and kinds).
    """

    timeout: float | None = None
    link_rate_mbps: float = 100.0
    faults: FaultSink | None = None


DEFAULT_TRANSFER = SliceTransfer()
"""No time limit, 100 Mbit/s, no fault log."""


def content_bytes(content: RecordDict) -> int:
    """Bytes of the records of a message's content (what a transfer carries)."""
    return sum(r.count_bytes() for r in content.values())


EXACT_INTEGER = 2**24
"""Largest |value| of an integer layer coded exactly (float32 holds every integer
up to 2^24; e.g. BatchNorm's ``num_batches_tracked`` and its updates)."""


def _exact(dtype: str) -> bool:
    """Whether a layer of ``dtype`` is coded exactly (integers, booleans)."""
    return not np.issubdtype(np.dtype(dtype), np.inexact)


class Layout:
    """Layer names, shapes and dtypes of the model: flatten and split back.

    Floating-point layers enter the fixed point of GF(2^31 - 1) as they are
    (step 2^-b); integer layers (counters such as BatchNorm's
    ``num_batches_tracked``) enter as v 2^-b, so the fixed point quantises each
    to the integer v itself and they come back exactly (|v| <= 2^24).

    Parameters
    ----------
    layers : list of (name, shape, dtype)
        In the model's order; ``size`` is the total number of parameters.
    """

    def __init__(self, layers: list[tuple[str, tuple[int, ...], str]]) -> None:
        self.layers = layers
        self.size = sum(math.prod(shape) for _, shape, _ in layers)

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray]) -> Layout:
        """The layout of named arrays, in their order."""
        return cls([(k, tuple(int(n) for n in np.shape(v)), str(np.asarray(v).dtype))
                    for k, v in arrays.items()])

    def flatten(self, arrays: Mapping[str, np.ndarray], what: str,
                scale_bits: int) -> np.ndarray:
        """All layers as one float32 vector of ``size`` elements, in layout order.

        ``scale_bits`` b is the fixed point's: integer layers enter as v 2^-b.

        Raises
        ------
        CodedStorageError
            ``arrays`` (named ``what`` in the message) have another layout, or
            an integer layer holds a value beyond :data:`EXACT_INTEGER`.
        """
        if Layout.of(arrays).layers != self.layers:
            raise CodedStorageError(f"{what}: layers {list(arrays)} differ from the "
                                    f"model's {[n for n, _, _ in self.layers]}")
        parts = []
        for name, _, dtype in self.layers:
            values = np.asarray(arrays[name])
            if not _exact(dtype):
                parts.append(np.asarray(values, np.float32).reshape(-1))
                continue
            values = values.astype(np.float64)
            if values.size and np.abs(values).max() > EXACT_INTEGER:
                raise CodedStorageError(f"{what}: integer layer {name!r} holds "
                                        f"{np.abs(values).max():.0f}, beyond the "
                                        f"{EXACT_INTEGER} coded exactly")
            parts.append((values * 2.0 ** -scale_bits).astype(np.float32).reshape(-1))
        return np.concatenate(parts)

    def split(self, flat: np.ndarray, scale_bits: int) -> Arrays:
        """Inverse of :meth:`flatten`: (size,) -> layer name -> array (layer dtype)."""
        out, start = {}, 0
        for name, shape, dtype in self.layers:
            size = math.prod(shape)
            part = flat[start:start + size].reshape(shape)
            if _exact(dtype):
                part = np.rint(part.astype(np.float64) * 2.0 ** scale_bits)
            out[name] = part.astype(dtype)
            start += size
        return out


class CodedCatalog(ParticipationCatalog):
    """The catalog file and the key file of a coded store (shared by both sides).

    Parameters
    ----------
    root : Path
        The store's folder (``catalog.sqlite`` and ``keys``).
    conn : sqlite3.Connection
        An open connection to the catalog (:meth:`connect`).
    keys : list of bytes
        One 32-byte secret per shard.

    Raises
    ------
    StoreError
        The catalog lacks one of the coded store's facts.
    """

    SCHEMA = _SCHEMA
    PRAGMAS = ("page_size = 512",)  # metadata only: small pages, small file
    KIND = "coded store"

    def __init__(self, root: Path, conn: sqlite3.Connection, keys: list[bytes]) -> None:
        super().__init__(root / CATALOG_FILE, conn)
        self.root = root
        self.keys = keys
        self.store_id = self.meta("store_id")
        self.num_shards = int(self.meta("num_shards"))
        self.blocks_per_shard = int(self.meta("blocks_per_shard"))
        self.privacy_t = int(self.get_meta("privacy_t", "0"))
        self.scale_bits = int(self.meta("scale_bits"))
        self.omegas = np.asarray(json.loads(self.meta("omegas")), dtype=np.int64)
        self.alphas = np.asarray(json.loads(self.meta("alphas")), dtype=np.int64)
        layers = json.loads(self.meta("layers") or "null")
        self.layout = Layout([(n, tuple(s), d) for n, s, d in layers]) \
            if layers else None

    @property
    def k(self) -> int:
        """Slices that decode one shard's round: blocks_per_shard K + privacy_t T.

        Each shard's record is coded on its own (K data blocks and T random
        padding blocks, one Lagrange polynomial of degree K + T - 1 per shard).
        """
        return self.blocks_per_shard + self.privacy_t

    def coded_rounds(self) -> dict[int, int]:
        """Round -> block length B^g of every coded round (0 = initial models)."""
        return dict(self._conn.execute("SELECT round, block_len FROM rounds"
                                       " ORDER BY round"))

    def record_length(self, shard: int, rnd: int) -> int:
        """Elements in shard ``shard``'s record of round ``rnd``."""
        row = self._conn.execute("SELECT length FROM records WHERE shard=? AND round=?",
                                 (shard, rnd)).fetchone()
        if row is None:
            raise StoreError(f"no record of shard {shard} at round {rnd}")
        return int(row[0])

    def record_members(self, shard: int, rnd: int) -> list[int]:
        """Partition ids whose updates round ``rnd``'s record of ``shard`` holds.

        The round's participants less those erased since (their updates were
        re-coded out of the record, :mod:`history.coded.erasure`), ascending.
        """
        return [r[0] for r in self._conn.execute(
            "SELECT partition_id FROM updates WHERE shard=? AND round=? AND erased=0 "
            "ORDER BY partition_id", (shard, rnd))]

    def stale_holders(self, shard: int) -> dict[int, set[int]]:
        """Round -> holders whose part of ``shard`` predates a re-coding of the round.

        Their part still holds erased updates: it is never fetched again.
        """
        out: dict[int, set[int]] = {}
        for rnd, pid in self._conn.execute(
                "SELECT round, partition_id FROM stale WHERE shard=?", (shard,)):
            out.setdefault(int(rnd), set()).add(int(pid))
        return out

    def mark_recoded(self, shard: int, rnd: int, length: int, erased: list[int],
                     stale: list[int]) -> None:
        """Record that round ``rnd`` of ``shard`` was coded again (one transaction).

        Its new record ``length``, the ``erased`` partition ids' updates and the
        ``stale`` holders, whose part still holds the old record.
        """
        with self._conn:
            self._conn.execute("UPDATE records SET length=? WHERE shard=? AND round=?",
                               (length, shard, rnd))
            self._conn.executemany(
                "UPDATE updates SET erased=1 WHERE shard=? AND round=? AND "
                "partition_id=?", [(shard, rnd, p) for p in erased])
            self._conn.executemany("INSERT OR IGNORE INTO stale VALUES (?, ?, ?)",
                                   [(shard, rnd, p) for p in stale])

    def migrate(self) -> None:
        """Give a catalog from before erasure its ``erased`` column and ``stale`` table."""
        columns = {r[1] for r in self._conn.execute("PRAGMA table_info(updates)")}
        with self._conn:
            if "erased" not in columns:
                self._conn.execute("ALTER TABLE updates ADD COLUMN erased INTEGER NOT "
                                   "NULL DEFAULT 0")
            self._conn.execute("CREATE TABLE IF NOT EXISTS stale (shard INTEGER NOT "
                               "NULL, round INTEGER NOT NULL, partition_id INTEGER NOT "
                               "NULL, PRIMARY KEY (shard, round, partition_id))")

    def holders(self) -> list[int]:
        """Partition ids that acknowledged at least one slice, ascending."""
        return [r[0] for r in self._conn.execute(
            "SELECT DISTINCT partition_id FROM slices ORDER BY partition_id")]

    def acked_rounds(self) -> dict[int, set[int]]:
        """Partition id -> the rounds whose slice it acknowledged."""
        out: dict[int, set[int]] = {}
        for rnd, pid in self._conn.execute("SELECT round, partition_id FROM slices"):
            out.setdefault(int(pid), set()).add(int(rnd))
        return out

    def uncoded_needed_bytes(self, interval: int | None) -> int | None:
        """Blob bytes the uncoded store would keep after pruning (bytes), or None.

        Every update's blob plus the shard models
        :func:`history.retention.needed_models` keeps for ``interval`` (SE's
        calibration interval; None: FedEraser's W^0 and last only), as
        :meth:`history.HistoryStore.prune_models` leaves them. None for a
        catalog written before model blobs were counted one by one.
        """
        models = json.loads(self.get_meta("uncoded_model_bytes", "null") or "null")
        if models is None:
            return None
        by_shard: dict[int, dict[int, int]] = {}
        for shard, rnd, nbytes in models:
            by_shard.setdefault(shard, {})[rnd] = nbytes
        kept = 0
        for shard, sizes in by_shard.items():
            keep = needed_models(self.rounds(shard), self.first_rounds(shard),
                                 max(sizes), interval)
            kept += sum(n for r, n in sizes.items() if r in keep)
        every_model = sum(nbytes for _, _, nbytes in models)
        return int(self.meta("uncoded_bytes")) - every_model + kept

    def key_bytes(self) -> int:
        """Size of the ``keys`` file on disk."""
        return (self.root / "keys").stat().st_size

    def total_bytes(self) -> int:
        """Everything the server keeps for this store: catalog plus keys (bytes)."""
        return self.catalog_bytes() + self.key_bytes()

    def accounting(self) -> dict:
        """Bytes and modelled communication of the coded store.

        Returns
        -------
        dict
            ``server_bytes`` (catalog plus keys), ``catalog_bytes``,
            ``key_bytes``, ``uncoded_bytes`` (the blobs the uncoded store would
            have written), ``blocks_per_shard`` (K), ``privacy_t`` (T),
            ``client_bytes`` and ``client_disk_bytes`` (per client
            ``max`` / ``min`` / ``mean`` / ``total`` of the acknowledged slice and
            tag bytes, and of its files under ``node-dir``), ``rounds``,
            ``slice_elements`` (one client's elements: sum of S B^g),
            ``data_elements`` (sum of the record lengths), ``encode_s``
            (measured seconds), ``distribution_comm_s`` (modelled seconds)
            and ``distribution_transfers``.
        """
        per_client = dict(self._conn.execute(
            "SELECT partition_id, SUM(slice_bytes) FROM slices GROUP BY partition_id"))
        disk = dict(self._conn.execute(
            "SELECT partition_id, MAX(disk_bytes) FROM slices GROUP BY partition_id"))
        rounds = self._conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(block_len), 0), COALESCE(SUM(encode_s), 0),"
            " COALESCE(SUM(comm_s), 0), COALESCE(SUM(transfers), 0) FROM rounds"
        ).fetchone()
        data = self._conn.execute("SELECT COALESCE(SUM(length), 0) FROM records"
                                  ).fetchone()[0]
        return {
            "server_bytes": self.total_bytes(), "catalog_bytes": self.catalog_bytes(),
            "key_bytes": self.key_bytes(),
            "uncoded_bytes": int(self.meta("uncoded_bytes")),
            "client_bytes": _spread(per_client, int(self.meta("num_slices"))),
            "client_disk_bytes": _spread(disk, int(self.meta("num_slices"))),
            "blocks_per_shard": self.blocks_per_shard, "privacy_t": self.privacy_t,
            "rounds": int(rounds[0]),
            "slice_elements": int(rounds[1]) * self.num_shards,
            "data_elements": int(data), "encode_s": float(rounds[2]),
            "distribution_comm_s": float(rounds[3]),
            "distribution_transfers": int(rounds[4]),
        }


def _spread(per_client: Mapping[int, int], num_clients: int) -> dict:
    values = [int(per_client.get(i, 0) or 0) for i in range(num_clients)]
    return {"max": max(values, default=0), "min": min(values, default=0),
            "mean": sum(values) / max(len(values), 1), "total": sum(values)}


def write_keys(path: Path, keys: list[bytes]) -> None:
    """Write the shard keys (32 bytes each, in shard order) readable by the owner only."""
    atomic_write(path, b"".join(keys))
    os.chmod(path, 0o600)


def read_keys(path: Path, num_shards: int) -> list[bytes]:
    """The ``num_shards`` 32-byte shard keys of ``path``.

    Raises
    ------
    StoreError
        The file does not hold exactly 32 bytes per shard.
    """
    raw = path.read_bytes()
    if len(raw) != 32 * num_shards:
        raise StoreError(f"{path} holds {len(raw)} bytes, expected 32 per shard "
                         f"x {num_shards} shards")
    return [raw[32 * s:32 * (s + 1)] for s in range(num_shards)]


def auto_blocks_per_shard(num_clients: int, privacy_t: int, loss_budget: float) -> int:
    """K chosen from C: the most data blocks per shard the loss budget allows.

    Every client holds one slice of every shard; a shard's round decodes from
    any K + T slices with valid tags, so with a fraction ``loss_budget`` of the
    C slices lost or failing their tags K = floor((1 - loss_budget) C) - T.
    One client's share of a round is then S records / K, which stays flat as C
    grows (the records grow with the clients of a round, K with C).

    Parameters
    ----------
    num_clients : int
        C, the slice holders.
    privacy_t : int
        T, the random padding blocks per shard (T-privacy).
    loss_budget : float
        Fraction of the C slices that may be lost or wrong, in ``[0, 1)``.

    Returns
    -------
    int
        K; below 1 when the budget and T leave no room for data (the caller
        reports it).
    """
    return math.floor((1.0 - loss_budget) * num_clients + 1e-9) - privacy_t
