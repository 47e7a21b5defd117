"""Coded storage of the training history: the server keeps keys and metadata only.

With run-config ``storage = "coded"`` (coded sharding, docs/DESIGN.md; Lin et
al., IJCAI 2024, Sec. 3.3) the parameters SE needs for calibrated retraining are
spread over the clients as Lagrange / Reed-Solomon coded slices over GF(p),
p = 2^31 - 1, and the server forgets them.

Encoding, at the end of every learning round g (g = 0: the initial models):

- the *record* of shard s is the quantised (:func:`coding.quantize`, scale
  2^-b, b = ``quant-scale-bits``), flattened updates U_{s,m}^g of the round's
  participants in ascending partition id (g = 0: W_s^0), split into K =
  ``blocks-per-shard`` equal blocks (zero padding; the length is kept);
- the S K blocks of all shards, padded to one length B^g, are the k = S K data
  blocks X_1..X_k at the points omega_1..omega_k; client i (partition id i)
  stores the slice u(alpha_i), n = C slices, where
  u(z) = sum_j X_j prod_{l != j} (z - omega_l) / (omega_j - omega_l)
  (:func:`coding.encode`; Yu et al., AISTATS 2019);
- every slice carries S tags ``coding.slice_tag(key_s, s, g, i, slice)``, one per
  shard key, and client i gets the access keys ``coding.access_key(key_s, i)``.

The server keeps ``catalog.sqlite`` (participants, example counts, layer names
and shapes, record lengths, evaluation points, scale, which client acknowledged
which slice, accounting) and ``keys`` (one 32-byte secret per shard) - no
parameters of any round, not even W^0.

Decoding, when shard s must unlearn (:class:`CodedHistory`): the shard's server
asks connected slice holders for their slices of every round, proving key_s
(``query.fetch_slices``); a slice whose tag fails is an erasure, so any k slices
with valid tags decode exactly (:func:`coding.decode_erasures`); holders are
asked in waves until every round has k. A slice a client acknowledged but no
longer returns is an erasure too: ``damaged`` when the client reports its file
damaged (the reply's ConfigRecord ``damaged``, see :mod:`history.slices`),
``lost`` otherwise; each is recorded in the retrieval report (``losses``) and in
the run's fault log, and the client's other rounds are used. With tag checking
off (a test-only path) all holders are asked and up to floor((m - k) / 2) wrong
slices among m are corrected (:func:`coding.decode_errors`); beyond that a
:class:`CodedHistoryError` is raised and nothing is returned.

Communication model: each transfer that carries slices (a ``store_slice``
message, a ``fetch_slices`` reply) costs 0.1 s + bits / link rate
(:func:`history.comm.transfer_seconds`); small requests and acks are
not counted, as model-free messages are not counted elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from coding import (
    MAX_MAGNITUDE,
    PRIME,
    DecodingError,
    QuantizationRangeError,
    access_key,
    decode_erasures,
    decode_errors,
    dequantize,
    encode,
    evaluation_points,
    key_proof,
    new_key,
    new_nonce,
    quantize,
    slice_tag,
    verify_slice_tag,
)
from history.comm import transfer_seconds
from history.slices import FETCH_MESSAGE, STORE_MESSAGE
from history.store import ParticipationCatalog, StoreError, atomic_write, encode_arrays

Arrays = dict[str, np.ndarray]


class FaultSink(Protocol):
    """Where the run's faults go (``server_app.screening.FaultLog`` has this verb)."""

    def add(self, stage: str, rnd: int | None, node: int, partition: int | None,
            kind: str, reason: str) -> None:
        """Record one fault."""


class Federation(Protocol):
    """What the coded store needs to know of the federation (no server_app import).

    ``node_of`` maps partition id -> node id, ``shards`` lists each shard's
    partition ids; ``shard_of`` and ``partition_of`` are their inverses.
    """

    node_of: dict[int, int]
    shards: list[list[int]]

    @property
    def shard_of(self) -> dict[int, int]: ...  # noqa: D102

    @property
    def partition_of(self) -> dict[int, int]: ...  # noqa: D102

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
    PRIMARY KEY (shard, round, partition_id));
CREATE TABLE slices (
    round INTEGER NOT NULL, partition_id INTEGER NOT NULL, slice_bytes INTEGER NOT NULL,
    stored_bytes INTEGER NOT NULL, disk_bytes INTEGER NOT NULL,
    PRIMARY KEY (round, partition_id));
"""


class CodedStorageError(RuntimeError):
    """The history of a round cannot be coded or stored (range, too few holders)."""


class CodedHistoryError(RuntimeError):
    """A shard's history cannot be recovered from the slices; nothing was changed."""


def _content_bytes(content: RecordDict) -> int:
    return sum(r.count_bytes() for r in content.values())


class _Layout:
    """Layer names, shapes and dtypes of the model: flatten and split back."""

    def __init__(self, layers: list[tuple[str, tuple[int, ...], str]]) -> None:
        self.layers = layers
        self.size = sum(math.prod(shape) for _, shape, _ in layers)

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray]) -> _Layout:
        return cls([(k, tuple(int(n) for n in np.shape(v)), str(np.asarray(v).dtype))
                    for k, v in arrays.items()])

    def flatten(self, arrays: Mapping[str, np.ndarray], what: str) -> np.ndarray:
        if _Layout.of(arrays).layers != self.layers:
            raise CodedStorageError(f"{what}: layers {list(arrays)} differ from the "
                                    f"model's {[n for n, _, _ in self.layers]}")
        return np.concatenate([np.asarray(arrays[n], np.float32).reshape(-1)
                               for n, _, _ in self.layers])

    def split(self, flat: np.ndarray) -> Arrays:
        out, start = {}, 0
        for name, shape, dtype in self.layers:
            size = math.prod(shape)
            out[name] = flat[start:start + size].reshape(shape).astype(dtype)
            start += size
        return out


class _Catalog(ParticipationCatalog):
    """The catalog file and the key file of a coded store (shared by both sides)."""

    def __init__(self, root: Path, conn: sqlite3.Connection, keys: list[bytes]) -> None:
        self.root = root
        self._conn = conn
        self.keys = keys
        self.store_id = self.meta("store_id")
        self.num_shards = int(self.meta("num_shards"))
        self.blocks_per_shard = int(self.meta("blocks_per_shard"))
        self.scale_bits = int(self.meta("scale_bits"))
        self.omegas = np.asarray(json.loads(self.meta("omegas")), dtype=np.int64)
        self.alphas = np.asarray(json.loads(self.meta("alphas")), dtype=np.int64)
        layers = json.loads(self.meta("layers") or "null")
        self.layout = _Layout([(n, tuple(s), d) for n, s, d in layers]) \
            if layers else None

    @property
    def k(self) -> int:
        """Data blocks per round: num_shards x blocks_per_shard."""
        return self.num_shards * self.blocks_per_shard

    def meta(self, key: str) -> str:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?",
                                 (key,)).fetchone()
        if row is None:
            raise StoreError(f"coded store at {self.root} has no meta {key!r}")
        return row[0]

    def set_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    @property
    def state(self) -> str:
        """``writing`` or ``complete``."""
        return self.meta("state")

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

    def client_shard(self) -> dict[int, int]:
        """Partition id -> shard of every client."""
        return dict(self._conn.execute("SELECT partition_id, shard FROM clients"))

    def catalog_bytes(self) -> int:
        """Size of ``catalog.sqlite`` on disk."""
        return (self.root / "catalog.sqlite").stat().st_size

    def key_bytes(self) -> int:
        """Size of the ``keys`` file on disk."""
        return (self.root / "keys").stat().st_size

    def total_bytes(self) -> int:
        """Everything the server keeps for this store: catalog plus keys (bytes)."""
        return self.catalog_bytes() + self.key_bytes()

    def close(self) -> None:
        """Close the catalog connection."""
        self._conn.close()

    def accounting(self) -> dict:
        """Bytes and modelled communication of the coded store (see storage_summary)."""
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
            "rounds": int(rounds[0]), "slice_elements": int(rounds[1]),
            "data_elements": int(data), "encode_s": float(rounds[2]),
            "distribution_comm_s": float(rounds[3]),
            "distribution_transfers": int(rounds[4]),
        }


def _spread(per_client: Mapping[int, int], num_clients: int) -> dict:
    values = [int(per_client.get(i, 0) or 0) for i in range(num_clients)]
    return {"max": max(values, default=0), "min": min(values, default=0),
            "mean": sum(values) / max(len(values), 1), "total": sum(values)}


def _write_keys(path: Path, keys: list[bytes]) -> None:
    atomic_write(path, b"".join(keys))
    os.chmod(path, 0o600)


def _read_keys(path: Path, num_shards: int) -> list[bytes]:
    raw = path.read_bytes()
    if len(raw) != 32 * num_shards:
        raise StoreError(f"{path} holds {len(raw)} bytes, expected 32 per shard "
                         f"x {num_shards} shards")
    return [raw[32 * s:32 * (s + 1)] for s in range(num_shards)]


class CodedRecorder(_Catalog):
    """The learning loop's recorder for ``storage = "coded"``.

    The same verbs as :class:`history.store.HistoryStore` (``put_shard_model``,
    ``put_update``, ``end_round``, ``mark_complete``, ``total_bytes``): a round is
    buffered in memory, coded and sent to the clients in :meth:`end_round`, then
    its parameters are dropped. Use :meth:`create`.
    """

    def __init__(self, root: Path, conn: sqlite3.Connection, keys: list[bytes],
                 federation: Federation, link_rate_mbps: float,
                 timeout: float | None, faults: FaultSink | None = None) -> None:
        super().__init__(root, conn, keys)
        self.faults = faults
        self.node_of = dict(federation.node_of)
        self.partition_of = federation.partition_of
        self.link_rate_mbps = link_rate_mbps
        self.timeout = timeout
        self._access = {i: [access_key(key, i) for key in keys] for i in self.node_of}
        self._round: int | None = None
        self._records: dict[int, list[tuple[int, np.ndarray]]] = {}
        self._rows: list[tuple[int, int, int, int, float]] = []
        self._uncoded_bytes = 0

    @classmethod
    def create(cls, root: str | Path, federation: Federation, blocks_per_shard: int = 5,
               scale_bits: int = 24, link_rate_mbps: float = 100.0,
               timeout: float | None = None, faults: FaultSink | None = None
               ) -> CodedRecorder:
        """Start a new coded store at ``root`` with fresh shard keys.

        Parameters
        ----------
        root : str or Path
            A folder that must not hold a store yet.
        federation : Federation
            Partition ids 0..C-1 with their nodes and S shards; client i will hold
            slice i at the point alpha_i.
        blocks_per_shard : int
            K; k = S K data blocks per round, at most C.
        scale_bits : int
            Fractional bits of the fixed point (quantisation step 2^-scale_bits).
        link_rate_mbps : float
            Link rate of the communication model.
        timeout : float, optional
            Seconds to wait for the clients' acks.
        faults : FaultSink, optional
            Receives malformed or error acks (stage ``coded store``, kind
            ``rejected`` or ``error``); that client's slice counts as not stored.

        Raises
        ------
        StoreError
            ``root`` already holds a store.
        CodedStorageError
            Partition ids not 0..C-1, or k > C.
        """
        root = Path(root)
        if (root / "catalog.sqlite").exists():
            raise StoreError(f"{root} already holds a history store; not overwriting")
        num_clients, num_shards = len(federation.node_of), len(federation.shards)
        if sorted(federation.node_of) != list(range(num_clients)):
            raise CodedStorageError("coded storage needs partition ids 0..C-1 "
                                    "(client i holds slice i)")
        k = num_shards * blocks_per_shard
        if not 1 <= k <= num_clients:
            raise CodedStorageError(
                f"{num_shards} shards x {blocks_per_shard} blocks = {k} data blocks a "
                f"round need between 1 and num-clients = {num_clients} slice holders")
        omegas, alphas = evaluation_points(k, num_clients)
        root.mkdir(parents=True, exist_ok=True)
        keys = [new_key() for _ in range(num_shards)]
        _write_keys(root / "keys", keys)
        conn = sqlite3.connect(root / "catalog.sqlite")
        conn.execute("PRAGMA page_size = 512")  # metadata only: small pages, small file
        with conn:
            conn.executescript(_SCHEMA)
            meta = {"state": "writing", "store_id": secrets.token_hex(8),
                    "num_shards": num_shards, "blocks_per_shard": blocks_per_shard,
                    "scale_bits": scale_bits, "num_slices": num_clients,
                    "omegas": json.dumps(omegas.tolist()),
                    "alphas": json.dumps(alphas.tolist()), "layers": "null",
                    "uncoded_bytes": 0, "field": f"GF({PRIME})"}
            conn.executemany("INSERT INTO meta VALUES (?, ?)",
                             [(k_, str(v)) for k_, v in meta.items()])
            conn.executemany("INSERT INTO clients VALUES (?, ?)",
                             sorted(federation.shard_of.items()))
        return cls(root, conn, keys, federation, link_rate_mbps, timeout, faults)

    @property
    def max_update(self) -> float:
        """Largest |parameter| of an update this store can code (quantisation range).

        ``MAX_MAGNITUDE / 2**scale_bits`` less a relative 1e-6 for float32
        rounding of ``w - w_sent``; reply screening rejects larger updates, so a
        client cannot stop the run with an update that cannot be stored.
        """
        return MAX_MAGNITUDE / 2.0 ** self.scale_bits * (1 - 1e-6)

    # ---- the recorder verbs ------------------------------------------------
    def _begin(self, rnd: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Check the round; count the blob the uncoded store would write for it."""
        if self._round is None:
            self._round = rnd
        elif rnd != self._round:
            raise CodedStorageError(f"round {rnd} recorded before round "
                                    f"{self._round} was ended (end_round)")
        if self.layout is None:
            self.layout = _Layout.of(arrays)
        self._uncoded_bytes += len(encode_arrays(arrays))

    def put_shard_model(self, shard: int, rnd: int, arrays: Mapping[str, np.ndarray]
                        ) -> None:
        """W_s^0 (rnd = 0) joins the round's record; later shard models are not kept."""
        self._begin(rnd, arrays)
        if rnd == 0:
            flat = self.layout.flatten(arrays, f"shard {shard} model, round 0")
            self._records.setdefault(shard, []).append((-1, flat))

    def put_update(self, shard: int, rnd: int, partition_id: int,
                   arrays: Mapping[str, np.ndarray], num_examples: int,
                   train_seconds: float) -> None:
        """Buffer client ``partition_id``'s update U^rnd of shard ``shard``."""
        self._begin(rnd, arrays)
        flat = self.layout.flatten(arrays, f"update of client {partition_id}, round {rnd}")
        self._records.setdefault(shard, []).append((partition_id, flat))
        self._rows.append((shard, rnd, partition_id, int(num_examples),
                           float(train_seconds)))

    def end_round(self, rnd: int, grid: Grid) -> None:
        """Code round ``rnd``, send client i its slice, record the acks, forget the round.

        Raises
        ------
        CodedStorageError
            A value out of the quantisation range, or fewer than k clients
            acknowledged their slice (the round could never be decoded).
        """
        if self._round not in (None, rnd):
            raise CodedStorageError(f"end_round({rnd}) while round {self._round} "
                                    "is buffered")
        t0 = time.perf_counter()
        num_shards, per_shard = self.num_shards, self.blocks_per_shard
        records = []
        for s in range(num_shards):
            items = sorted(self._records.get(s, []), key=lambda item: item[0])
            flat = np.concatenate([f for _, f in items]) if items \
                else np.zeros(0, np.float32)
            try:
                records.append(quantize(flat, self.scale_bits))
            except QuantizationRangeError as err:
                raise CodedStorageError(f"round {rnd}, shard {s}: {err}") from err
        block_len = max(1, max(math.ceil(q.size / per_shard) for q in records))
        blocks = np.zeros((self.k, block_len), dtype=np.int64)
        for s, q in enumerate(records):
            blocks[s * per_shard:(s + 1) * per_shard].reshape(-1)[:q.size] = q
        slices = encode(blocks, self.omegas, self.alphas).astype(np.uint32)
        del blocks
        encode_s = time.perf_counter() - t0
        messages, comm = [], 0.0
        for i, node in sorted(self.node_of.items()):
            tags = [slice_tag(key, s, rnd, i, slices[i]) for s, key in enumerate(self.keys)]
            content = RecordDict({
                "slice": ArrayRecord({"slice": Array(slices[i])}),
                "config": ConfigRecord({"store": self.store_id, "round": rnd,
                                        "slice-index": i, "tags": tags,
                                        "access-keys": self._access[i]})})
            comm += transfer_seconds(_content_bytes(content), self.link_rate_mbps)
            messages.append(Message(content, dst_node_id=node,
                                    message_type=STORE_MESSAGE))
        del slices
        acks: dict[int, tuple[int, int, int]] = {}
        for reply in grid.send_and_receive(messages, timeout=self.timeout):
            pid = self.partition_of.get(reply.metadata.src_node_id)
            if pid is None or pid in acks:
                continue
            sizes = ack_sizes(reply, rnd, pid)
            if isinstance(sizes, str):  # a malformed ack: that slice is not held
                log(WARNING, "coded round %d: partition %d's slice is not counted as "
                    "stored: %s", rnd, pid, sizes)
                if self.faults is not None:
                    self.faults.add("coded store", rnd, reply.metadata.src_node_id, pid,
                                    "error" if reply.has_error() else "rejected",
                                    f"store_slice ack: {sizes}")
            else:
                acks[pid] = sizes
        if len(acks) < self.k:
            raise CodedStorageError(
                f"round {rnd}: only {len(acks)} of {len(self.node_of)} clients stored "
                f"their slice; decoding needs at least k = {self.k}")
        with self._conn:
            self._conn.execute("INSERT INTO rounds VALUES (?, ?, ?, ?, ?)",
                               (rnd, block_len, encode_s, comm, len(messages)))
            self._conn.executemany("INSERT INTO records VALUES (?, ?, ?)",
                                   [(s, rnd, q.size) for s, q in enumerate(records)])
            self._conn.executemany("INSERT INTO updates VALUES (?, ?, ?, ?, ?)",
                                   self._rows)
            self._conn.executemany("INSERT INTO slices VALUES (?, ?, ?, ?, ?)",
                                   [(rnd, i, *a) for i, a in sorted(acks.items())])
            self.set_meta("uncoded_bytes", str(self._uncoded_bytes))
            self.set_meta("layers", json.dumps(self.layout.layers if self.layout else None))
        missing = sorted(set(self.node_of) - set(acks))
        log(INFO, "coded round %d: %d blocks of %d elements -> %d slices, %d acked%s, "
            "%.2f s", rnd, self.k, block_len, len(self.node_of), len(acks),
            f" (no ack from partitions {missing})" if missing else "",
            time.perf_counter() - t0)
        self._round, self._records, self._rows = None, {}, []

    def mark_complete(self) -> None:
        """Declare the store finished; only then can :meth:`CodedHistory.open` read it."""
        if self._round is not None:
            raise CodedStorageError(f"round {self._round} was recorded but never ended")
        with self._conn:
            self.set_meta("state", "complete")


MAX_ACK_BYTES = 2**53
"""Largest byte count an ack may report (exact in a float64, fits SQLite)."""


def ack_sizes(reply: Message, rnd: int, pid: int) -> tuple[int, int, int] | str:
    """(slice-bytes, stored-bytes, disk-bytes) of a ``store_slice`` ack, or why not.

    Never raises on any reply content: an ack counts only if the reply has no
    error, holds a ConfigRecord ``ack`` for round ``rnd`` and slice ``pid``,
    and its byte counts are ints (not bools) in 0..2^53 (``disk-bytes`` may be
    absent: 0).

    Returns
    -------
    tuple of int or str
        The three byte counts, or a one-line reason.
    """
    if reply.has_error():
        return f"error reply: {reply.error.reason}"
    content = reply.content
    ack = content.get("ack") if isinstance(content, RecordDict) else None
    if not isinstance(ack, ConfigRecord):
        return "no ConfigRecord 'ack'"
    if ack.get("round") != rnd or ack.get("slice-index") != pid:
        return (f"ack of round {ack.get('round')!r}, slice {ack.get('slice-index')!r}; "
                f"expected round {rnd}, slice {pid}")
    sizes = []
    for key, default in (("slice-bytes", None), ("stored-bytes", None),
                         ("disk-bytes", 0)):
        value = ack.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or \
                not 0 <= value <= MAX_ACK_BYTES:
            return f"{key} = {value!r}: must be an integer in [0, 2^53]"
        sizes.append(value)
    return sizes[0], sizes[1], sizes[2]


class CodedHistory(_Catalog):
    """The sharded history read back from coded slices (a ``HistoryReader``).

    ``participants`` and ``rounds`` come from the catalog; ``update`` and
    ``shard_model(s, 0)`` decode shard s's whole history on first use (fetching
    slices over ``grid``) and keep it until :meth:`take_retrieval`, so
    :class:`strategies.unlearning.ShardingEraser` runs unchanged on top.

    Parameters
    ----------
    root, conn, keys
        Use :meth:`open`.
    grid : Grid
        Where the slice holders are.
    node_of : Mapping[int, int]
        partition id -> node id now (a restarted node may have a new id).
    timeout : float, optional
        Seconds to wait for slice replies.
    link_rate_mbps : float
        Link rate of the communication model.
    verify_tags : bool, default True
        Check every slice's tag (a failed tag is an erasure) and erasure-decode.
        ``False`` is a test-only path: tags are ignored, every holder is asked and
        wrong slices are corrected by :func:`coding.decode_errors`.
    rng_seed : int, optional
        Seed of ``decode_errors``' projection (None: fresh entropy).
    faults : FaultSink, optional
        Where damaged and lost slices and refused fetches are recorded (stage
        ``coded-retrieval``; kinds ``damaged-slice``, ``lost-slice``,
        ``damaged-file``, ``refused-fetch``).
    """

    def __init__(self, root: Path, conn: sqlite3.Connection, keys: list[bytes],
                 grid: Grid, node_of: Mapping[int, int], timeout: float | None = None,
                 link_rate_mbps: float = 100.0, verify_tags: bool = True,
                 rng_seed: int | None = None, faults: FaultSink | None = None) -> None:
        super().__init__(root, conn, keys)
        self.grid = grid
        self.node_of = dict(node_of)
        self.timeout = timeout
        self.link_rate_mbps = link_rate_mbps
        self.verify_tags = verify_tags
        self.rng_seed = rng_seed
        self.faults = faults
        self._acked: dict[int, set[int]] = {}
        self._cache: dict[int, dict[int, Arrays | dict[int, Arrays]]] = {}
        self._pending: list[dict] = []
        self.retrievals: list[dict] = []

    @classmethod
    def open(cls, root: str | Path, grid: Grid, node_of: Mapping[int, int],
             **kwargs) -> CodedHistory:
        """Open a complete coded store (keyword arguments as for the class).

        Raises
        ------
        StoreError
            No catalog at ``root``, an unfinished store, or a malformed key file.
        """
        root = Path(root)
        if not (root / "catalog.sqlite").is_file():
            raise StoreError(f"no coded history store at {root}")
        conn = sqlite3.connect(root / "catalog.sqlite")
        row = conn.execute("SELECT value FROM meta WHERE key='num_shards'").fetchone()
        if row is None:
            raise StoreError(f"{root} is not a coded history store")
        keys = _read_keys(root / "keys", int(row[0]))
        history = cls(root, conn, keys, grid, node_of, **kwargs)
        if history.state != "complete":
            raise StoreError(f"coded history store at {root} is incomplete (state "
                             f"{history.state!r}): the run that wrote it did not finish")
        return history

    # ---- HistoryReader -------------------------------------------------------
    def update(self, shard: int, rnd: int, partition_id: int) -> Arrays:
        """U^rnd of client ``partition_id``, decoded and dequantised (float32)."""
        updates = self._decoded(shard).get(rnd)
        if not isinstance(updates, dict) or partition_id not in updates:
            raise StoreError(
                f"no update of client {partition_id} in shard {shard}, round {rnd}")
        return updates[partition_id]

    def shard_model(self, shard: int, rnd: int) -> Arrays:
        """W_s^0 decoded and dequantised; coded storage keeps no later shard models."""
        if rnd != 0:
            raise StoreError(f"coded storage keeps only W^0 of shard {shard}, "
                             f"not round {rnd}")
        return self._decoded(shard)[0]

    def take_retrieval(self) -> dict | None:
        """Costs of the retrievals since the last call, and forget what they decoded.

        Returns
        -------
        dict or None
            None if nothing was fetched; else ``shards``, ``bytes``,
            ``transfers``, ``comm_time_s``, ``decode_s``, ``wall_s``, and per
            shard the counts of ``absent``, ``refused``, ``silent``,
            ``tag_failures``, ``malformed``, ``damaged`` (acknowledged slices
            whose file the client reports damaged), ``lost`` (acknowledged,
            neither returned nor reported), ``corrected`` slices, and
            ``losses``: one dict (``partition``, ``round`` or None for a file
            that holds no round, ``kind``, ``reason``) per damaged or lost slice,
            damaged file or refused fetch.
        """
        self._cache.clear()
        pending, self._pending = self._pending, []
        if not pending:
            return None
        total = {key: sum(p[key] for p in pending)
                 for key in ("bytes", "transfers", "comm_time_s", "decode_s", "wall_s")}
        return {**total, "shards": pending}

    def check_slice(self, shard: int, rnd: int, index: int, data: np.ndarray,
                    tag: object) -> bool:
        """True if ``data`` is slice ``index`` of round ``rnd`` under shard's key.

        Checks the dtype (uint32), the length B^rnd and the tag
        ``coding.slice_tag(key_shard, shard, rnd, index, data)``.
        """
        return self._well_formed(data, self.coded_rounds().get(rnd)) and \
            verify_slice_tag(self.keys[shard], shard, rnd, index, data, tag)

    @staticmethod
    def _well_formed(data: object, block_len: int | None) -> bool:
        return block_len is not None and isinstance(data, np.ndarray) and \
            data.dtype == np.uint32 and data.shape == (block_len,)

    # ---- retrieval -----------------------------------------------------------
    def _decoded(self, shard: int) -> dict:
        if not 0 <= shard < self.num_shards:
            raise StoreError(f"no shard {shard} in a store of {self.num_shards} shards")
        if shard not in self._cache:
            self._cache[shard] = self._retrieve(shard)
        return self._cache[shard]

    def _ask(self, shard: int, pids: list[int], rounds: list[int]) -> list[Message]:
        messages = []
        for pid in pids:
            nonce = new_nonce()
            request = ConfigRecord({
                "store": self.store_id, "shard": shard, "rounds": rounds,
                "nonce": nonce,
                "proof": key_proof(access_key(self.keys[shard], pid), nonce)})
            messages.append(Message(RecordDict({"request": request}),
                                    dst_node_id=self.node_of[pid],
                                    message_type=FETCH_MESSAGE))
        return list(self.grid.send_and_receive(messages, timeout=self.timeout)) \
            if messages else []

    def _retrieve(self, shard: int) -> dict:
        """Fetch and decode every round of ``shard``; raise CodedHistoryError if short."""
        t0 = time.perf_counter()
        rounds = self.coded_rounds()
        live = set(self.grid.get_node_ids())
        holders = self.holders()
        reachable = [p for p in holders if self.node_of.get(p) in live]
        stats = {"shard": shard, "holders": len(holders),
                 "absent": len(holders) - len(reachable), "refused": 0,
                 "silent": 0, "tag_failures": 0, "malformed": 0, "corrected": 0,
                 "damaged": 0, "lost": 0, "losses": [],
                 "bytes": 0, "transfers": 0, "comm_time_s": 0.0}
        self._acked = self.acked_rounds()
        received: dict[int, dict[int, np.ndarray]] = {r: {} for r in rounds}
        waiting = list(reachable)
        while waiting:
            short = {r: n for r, n in rounds.items() if len(received[r]) < self.k}
            if not short:
                break
            if self.verify_tags:  # any k valid slices decode: ask only the deficit
                need = max(self.k - len(received[r]) for r in short)
                wave, waiting = waiting[:need], waiting[need:]
            else:  # error correction needs every slice there is
                wave, waiting, short = waiting, [], rounds
            self._collect(shard, wave, short, received, stats)
        t1 = time.perf_counter()
        decoded = {rnd: self._decode(shard, rnd, received[rnd], stats) for rnd in rounds}
        stats["decode_s"] = time.perf_counter() - t1
        stats["wall_s"] = time.perf_counter() - t0
        self._pending.append(stats)
        self.retrievals.append(stats)
        log(INFO, "coded history of shard %d: %d rounds decoded from %d holders "
            "(%d absent, %d refused, %d silent, %d failed tags, %d damaged, %d lost, "
            "%d corrected), %.2f s", shard, len(rounds), len(holders), stats["absent"],
            stats["refused"], stats["silent"], stats["tag_failures"], stats["damaged"],
            stats["lost"], stats["corrected"], stats["wall_s"])
        return decoded

    def _collect(self, shard: int, pids: list[int], rounds: Mapping[int, int],
                 received: dict[int, dict[int, np.ndarray]], stats: dict) -> None:
        """Ask ``pids`` for ``rounds`` (round -> block length); keep usable slices."""
        asked = {self.node_of[p]: p for p in pids}
        answered = set()
        for reply in self._ask(shard, pids, list(rounds)):
            pid = asked.get(reply.metadata.src_node_id)
            if pid is None or pid in answered:
                continue
            answered.add(pid)
            if reply.has_error():
                stats["refused"] += 1
                self._note(shard, pid, None, "refused-fetch", reply.error.reason, stats)
                continue
            content = reply.content
            slices = content.get("slices") if isinstance(content, RecordDict) else None
            tags = content.get("tags") if isinstance(content, RecordDict) else None
            if not isinstance(slices, ArrayRecord) or not isinstance(tags, ConfigRecord):
                stats["malformed"] += 1
                continue
            self._note_losses(shard, pid, rounds, slices,
                              reply.content.config_records.get("damaged"), stats)
            nbytes = _content_bytes(reply.content)
            stats["bytes"] += nbytes
            stats["transfers"] += 1
            stats["comm_time_s"] += transfer_seconds(nbytes, self.link_rate_mbps)
            for rnd, block_len in rounds.items():
                key = f"r{rnd}"
                if key not in slices:
                    continue
                data = _decode_slice(slices[key], block_len)
                if not self._well_formed(data, block_len) or \
                        int(data.max(initial=0)) >= PRIME:
                    stats["malformed"] += 1
                elif self.verify_tags and not verify_slice_tag(
                        self.keys[shard], shard, rnd, pid, data, tags.get(key)):
                    stats["tag_failures"] += 1  # a failed tag is an erasure
                else:
                    received[rnd][pid] = data
        stats["silent"] += len(set(pids) - answered)

    def _note_losses(self, shard: int, pid: int, rounds: Mapping[int, int],
                     slices: ArrayRecord, damaged: ConfigRecord | None,
                     stats: dict) -> None:
        """Record rounds ``pid`` acknowledged but did not return, and damaged files."""
        damaged = damaged or ConfigRecord()
        for key, reason in damaged.items():  # files that hold no round
            if not (key.startswith("r") and key[1:].isdigit()):
                self._note(shard, pid, None, "damaged-file", reason, stats)
        for rnd in rounds:
            key = f"r{rnd}"
            if key in slices:
                continue
            if key in damaged:
                stats["damaged"] += 1
                self._note(shard, pid, rnd, "damaged-slice", damaged[key], stats)
            elif rnd in self._acked.get(pid, ()):
                stats["lost"] += 1
                self._note(shard, pid, rnd, "lost-slice", "acknowledged its slice, "
                           "returned none and reported no damage", stats)

    def _note(self, shard: int, pid: int, rnd: int | None, kind: str, reason: object,
              stats: dict) -> None:
        """One entry of the retrieval report's ``losses`` and of the fault log."""
        reason = str(reason)[:500]  # the client's words: bounded, never parsed
        stats["losses"].append({"partition": pid, "round": rnd, "kind": kind,
                                "reason": reason})
        if self.faults is not None:
            self.faults.add(f"coded-retrieval shard {shard}", rnd, self.node_of[pid], pid,
                            kind, reason)

    def _decode(self, shard: int, rnd: int, got: dict[int, np.ndarray],
                stats: dict) -> Arrays | dict[int, Arrays]:
        pids = sorted(got)
        if len(pids) < self.k:
            raise CodedHistoryError(
                f"cannot recover round {rnd} of shard {shard}: {len(pids)} usable "
                f"slices, k = {self.k} needed ({stats['holders']} holders: "
                f"{stats['absent']} absent, {stats['silent']} silent, "
                f"{stats['refused']} refused, {stats['tag_failures']} failed tags, "
                f"{stats['malformed']} malformed, {stats['damaged']} damaged, "
                f"{stats['lost']} lost, counted over all rounds); nothing "
                "was changed")
        if self.verify_tags:  # every slice is right: any k of them decode
            pids = pids[:self.k]
        y = np.stack([got[p] for p in pids]).astype(np.int64)
        alphas = self.alphas[pids]
        if self.verify_tags:
            blocks = decode_erasures(y, alphas, self.omegas)
        else:
            try:
                blocks, bad = decode_errors(y, alphas, self.omegas, self.rng_seed)
            except DecodingError as err:
                raise CodedHistoryError(
                    f"cannot recover round {rnd} of shard {shard}: more than "
                    f"floor((m - k) / 2) = {(len(pids) - self.k) // 2} wrong slices "
                    f"among m = {len(pids)} (k = {self.k}); nothing was changed "
                    f"({err})") from err
            stats["corrected"] += int(bad.size)
        per = self.blocks_per_shard
        length = self.record_length(shard, rnd)
        record = blocks[shard * per:(shard + 1) * per].reshape(-1)[:length]
        flat = dequantize(record, self.scale_bits)
        if rnd == 0:
            return self.layout.split(flat)
        members = [p for p, _ in self.participants(shard, rnd)]
        size = self.layout.size
        if len(members) * size != length:
            raise StoreError(f"round {rnd} of shard {shard}: record of {length} "
                             f"elements for {len(members)} updates of {size}")
        return {p: self.layout.split(flat[j * size:(j + 1) * size])
                for j, p in enumerate(members)}


def _decode_slice(value: object, block_len: int) -> np.ndarray | None:
    """A fetched slice as uint32 (block_len,), or None if it is not one.

    The declared dtype and shape are checked before the bytes are decoded, and
    any decoding failure of the untrusted bytes gives None (a malformed slice).
    """
    if not isinstance(value, Array) or value.dtype != "uint32" or \
            tuple(value.shape) != (block_len,):
        return None
    try:
        return value.numpy()
    except Exception:  # untrusted bytes: a malformed slice, never a crash
        return None


def efficiency(num_shards: int, blocks_per_shard: int, num_clients: int) -> dict:
    """Storage efficiency gamma and throughput lambda (Lin et al., IJCAI 2024, Sec. 4).

    gamma = size of the whole history / storage per node; lambda = histories
    served per unit time, relative to full storage. Full storage (one server
    keeps everything, FedEraser): gamma = lambda = 1. Uncoded sharding (each of S
    shard servers keeps its own shard): gamma = lambda = S. Coded sharding: each
    of the n = C clients keeps one slice of 1/k of a round, k = S K, so
    gamma_c = k; any k slices decode and up to t = floor((C - k) / 2) wrong ones
    are corrected, so with mu = t / C the tolerated wrong fraction,
    gamma_c = k <= (1 - 2 mu) C (the paper's bound). The paper's throughput is
    lambda_c = S / O(C^2 log^2 C log log C) (the decoding cost); it is an order,
    reported as the formula.
    """
    k = num_shards * blocks_per_shard
    t = max(num_clients - k, 0) // 2
    mu = t / num_clients
    return {
        "source": "Lin et al., IJCAI 2024, Sec. 4",
        "full": {"gamma": 1, "lambda": 1},
        "uncoded": {"gamma": num_shards, "lambda": num_shards},
        "coded": {
            "gamma": k, "k": k, "n": num_clients, "tolerated_wrong_slices": t,
            "mu": mu, "gamma_bound": (1 - 2 * mu) * num_clients,
            "gamma_formula": "gamma_c = k = S*K <= (1 - 2 mu) C, "
                             "mu = floor((C - k) / 2) / C",
            "lambda": "S / O(C^2 log^2 C log log C)",
        },
    }


def storage_summary(cfg, sharded, baseline) -> dict:
    """The ``storage`` block of summary.json.

    Parameters
    ----------
    cfg : RunConfig
        The run's settings (S, K, C, storage mode).
    sharded : HistoryStore or CodedHistory
        What SE's server keeps.
    baseline : HistoryStore or None
        FedEraser's store (None when FE did not run).

    Returns
    -------
    dict
        ``mode``; ``server_bytes`` (what SE's server keeps); ``FE``,
        ``SE_uncoded``, ``SE_coded`` each with ``server_bytes`` and
        ``client_bytes`` (per client: max / min / mean / total; 0 for stores
        that keep nothing on clients); ``SE_coded_vs_FE`` (1 - coded / FE);
        ``comm`` (modelled seconds of slice distribution and retrieval);
        ``efficiency`` (:func:`efficiency`). Bytes are measured: FE and uncoded
        SE from their stores (uncoded SE in coded mode: the serialized records
        the uncoded store would write, blobs only), coded SE from the catalog
        and key files and from the bytes each client acknowledged.
    """
    no_clients = {"max": 0, "min": 0, "mean": 0.0, "total": 0}
    fe = baseline.total_bytes() if baseline is not None else None
    out: dict = {
        "mode": cfg.storage, "server_bytes": sharded.total_bytes(),
        "FE": {"server_bytes": fe, "client_bytes": no_clients if fe is not None
               else None, "source": "baseline store" if fe is not None else "not run"},
    }
    if isinstance(sharded, _Catalog):
        acc = sharded.accounting()
        out["SE_uncoded"] = {"server_bytes": acc["uncoded_bytes"],
                             "client_bytes": no_clients,
                             "source": "serialized records (blobs; no catalog)"}
        out["SE_coded"] = {
            "server_bytes": acc["server_bytes"], "catalog_bytes": acc["catalog_bytes"],
            "key_bytes": acc["key_bytes"], "client_bytes": acc["client_bytes"],
            "client_disk_bytes": acc["client_disk_bytes"],
            "gamma_measured": acc["data_elements"] / max(acc["slice_elements"], 1),
        }
        retrievals = getattr(sharded, "retrievals", [])
        out["comm"] = {
            "distribution_s": acc["distribution_comm_s"],
            "distribution_transfers": acc["distribution_transfers"],
            "encode_s": acc["encode_s"],
            "retrieval_s": sum(r["comm_time_s"] for r in retrievals),
            "retrieval_transfers": sum(r["transfers"] for r in retrievals),
            "retrieval_bytes": sum(r["bytes"] for r in retrievals),
            "decode_s": sum(r["decode_s"] for r in retrievals),
            "link_rate_mbps": cfg.link_rate_mbps,
        }
    else:
        out["SE_uncoded"] = {"server_bytes": sharded.total_bytes(),
                             "client_bytes": no_clients, "source": "store"}
        out["SE_coded"] = None
    coded = (out["SE_coded"] or {}).get("server_bytes")
    out["SE_coded_vs_FE"] = 1 - coded / fe if coded is not None and fe else None
    out["efficiency"] = efficiency(cfg.num_shards, cfg.blocks_per_shard,
                                   cfg.num_clients)
    return out
