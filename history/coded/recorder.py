"""The coded recorder: the learning loop codes each round into client slices.

With ``storage = "coded"`` (coded sharding, docs/DESIGN.md; Lin et al., IJCAI
2024, Sec. 3.3), at the end of every learning round g (g = 0: the initial models):

- the *record* of shard s is the quantised (:func:`coding.quantize`, scale
  2^-b, b = ``quant-scale-bits``), flattened updates U_{s,m}^g of the round's
  participants in ascending partition id (g = 0: W_s^0), split into K =
  ``blocks-per-shard`` equal blocks of B^g elements (zero padding; the length is
  kept; B^g is the longest shard's), K chosen from C when the key is 0
  (:func:`history.coded.catalog.auto_blocks_per_shard`);
- each shard is coded on its own: its K blocks and T = ``privacy-t`` uniformly
  random padding blocks (:func:`coding.random_field_elements`) sit at
  omega_1..omega_{K+T} and client i (partition id i) gets u_s(alpha_i), n = C
  slices per shard, where
  u_s(z) = sum_j X_{s,j} prod_{l != j} (z - omega_l) / (omega_j - omega_l)
  (:func:`coding.encode_quantized`, quantisation fused with the encoding; Yu
  et al., AISTATS 2019); any K + T of them decode shard s alone, any T of them
  are uniform whatever the data;
- client i's slice of round g is its S shard slices side by side (uint32, S B^g
  elements, shard s's at ``[s B^g, (s + 1) B^g)``); shard s's part carries the
  tag ``coding.slice_tag(key_s, s, g, i, part)`` under shard s's key only, and
  client i gets the access keys ``coding.access_key(key_s, i)``; a fetch proving
  key_s returns only shard s's part.

The slices go out as ``query.store_slice`` messages (:mod:`history.coded.slices` is
the client's half); the acks are recorded in the catalog
(:class:`history.coded.catalog.CodedCatalog`) and the round's parameters are
dropped. :class:`history.coded.reader.CodedHistory` reads the history back.
"""

from __future__ import annotations

import json
import math
import secrets
import sqlite3
import time
from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from coding import (
    MAX_MAGNITUDE,
    PRIME,
    QuantizationRangeError,
    access_key,
    encode_quantized,
    evaluation_points,
    new_key,
    random_field_elements,
    slice_tag,
)
from history.catalog import CATALOG_FILE, StoreError
from history.coded.catalog import (
    DEFAULT_TRANSFER,
    CodedCatalog,
    CodedStorageError,
    Layout,
    SliceTransfer,
    auto_blocks_per_shard,
    content_bytes,
    write_keys,
)
from history.coded.slices import STORE_MESSAGE
from history.comm import transfer_seconds
from history.files import encode_arrays
from history.protocols import Federation, RoundRecorder

Acks = dict[int, tuple[int, int, int]]
"""Partition id -> (slice-bytes, stored-bytes, disk-bytes) of its ack."""


class CodedRecorder(CodedCatalog, RoundRecorder):
    """The learning loop's recorder for ``storage = "coded"``.

    The same verbs as :class:`history.store.HistoryStore` (``put_shard_model``,
    ``put_update``, ``end_round``, ``mark_complete``, ``total_bytes``): a round is
    buffered in memory, coded and sent to the clients in :meth:`end_round`, then
    its parameters are dropped. Use :meth:`create`.
    """

    def __init__(self, root: Path, conn: sqlite3.Connection, keys: list[bytes],
                 federation: Federation, transfer: SliceTransfer) -> None:
        super().__init__(root, conn, keys)
        self.faults = transfer.faults
        self.node_of = dict(federation.node_of)
        self.partition_of = federation.partition_of
        self.link_rate_mbps = transfer.link_rate_mbps
        self.timeout = transfer.timeout
        self._access = {i: [access_key(key, i) for key in keys] for i in self.node_of}
        self._round: int | None = None
        self._records: dict[int, list[tuple[int, np.ndarray]]] = {}
        self._rows: list[tuple[int, int, int, int, float]] = []
        self._uncoded_bytes = 0  # every blob the uncoded store would write
        self._model_bytes: dict[tuple[int, int], int] = {}  # (shard, round) -> blob
        self.padding_rng: np.random.Generator | None = None
        """Source of the T padding blocks; None (the default) is OS randomness."""

    @classmethod
    def create(cls, root: str | Path, federation: Federation, blocks_per_shard: int = 5,
               scale_bits: int = 24, transfer: SliceTransfer = DEFAULT_TRANSFER, *,
               privacy_t: int = 0, loss_budget: float = 0.5) -> CodedRecorder:
        """Start a new coded store at ``root`` with fresh shard keys.

        Parameters
        ----------
        root : str or Path
            A folder that must not hold a store yet.
        federation : Federation
            Partition ids 0..C-1 with their nodes and S shards; client i will hold
            slice i at the point alpha_i.
        blocks_per_shard : int
            K, data blocks per shard and round; 0 chooses K from C,
            ``privacy_t`` and ``loss_budget`` (:func:`auto_blocks_per_shard`).
            K + T slices decode a shard's round, so K + T is at most C.
        scale_bits : int
            Fractional bits of the fixed point (quantisation step 2^-scale_bits).
        transfer : SliceTransfer
            ``timeout``: seconds to wait for the clients' acks; ``link_rate_mbps``:
            link rate of the communication model (Mbit/s); ``faults``: receives
            malformed or error acks (stage ``coded store``, kind ``rejected`` or
            ``error``); that client's slice counts as not stored.
        privacy_t : int
            T >= 0 random padding blocks per shard: any T colluding clients learn
            nothing of the parameters.
        loss_budget : float
            Fraction of slices that may be lost or fail their tags, in [0, 1);
            used only when ``blocks_per_shard`` is 0.

        Raises
        ------
        StoreError
            ``root`` already holds a store.
        CodedStorageError
            Partition ids not 0..C-1, T < 0, or K < 1 or K + T > C.
        """
        root = Path(root)
        if (root / CATALOG_FILE).exists():
            raise StoreError(f"{root} already holds a history store; not overwriting")
        num_clients, num_shards = len(federation.node_of), len(federation.shards)
        if sorted(federation.node_of) != list(range(num_clients)):
            raise CodedStorageError("coded storage needs partition ids 0..C-1 "
                                    "(client i holds slice i)")
        if blocks_per_shard == 0:
            blocks_per_shard = auto_blocks_per_shard(num_clients, privacy_t, loss_budget)
        k = blocks_per_shard + privacy_t
        if privacy_t < 0 or blocks_per_shard < 1 or k > num_clients:
            raise CodedStorageError(
                f"{blocks_per_shard} data blocks + privacy-t = {privacy_t} padding "
                f"blocks a shard need 1 <= K, 0 <= T and K + T <= num-clients = "
                f"{num_clients} slice holders")
        omegas, alphas = evaluation_points(k, num_clients)
        root.mkdir(parents=True, exist_ok=True)
        keys = [new_key() for _ in range(num_shards)]
        write_keys(root / "keys", keys)
        conn = cls.connect(root / CATALOG_FILE)
        cls.create_catalog(conn, {
            "state": "writing", "store_id": secrets.token_hex(8),
            "num_shards": num_shards, "blocks_per_shard": blocks_per_shard,
            "scale_bits": scale_bits, "num_slices": num_clients, "privacy_t": privacy_t,
            "code": "per-shard",
            "omegas": json.dumps(omegas.tolist()), "alphas": json.dumps(alphas.tolist()),
            "layers": "null", "uncoded_bytes": 0,
            "uncoded_model_bytes": "[]", "field": f"GF({PRIME})"},
            federation.shard_of)
        return cls(root, conn, keys, federation, transfer)

    @property
    def max_update(self) -> float:
        """Largest |parameter| of an update this store can code (quantisation range).

        ``MAX_MAGNITUDE / 2**scale_bits`` less a relative 1e-6 for float32
        rounding of ``w - w_sent``; reply screening rejects larger updates, so a
        client cannot stop the run with an update that cannot be stored.
        """
        return MAX_MAGNITUDE / 2.0 ** self.scale_bits * (1 - 1e-6)

    # ---- the recorder verbs ------------------------------------------------
    def _begin(self, rnd: int, arrays: Mapping[str, np.ndarray]) -> int:
        """Check the round; count (and return) the blob the uncoded store would write."""
        if self._round is None:
            self._round = rnd
        elif rnd != self._round:
            raise CodedStorageError(f"round {rnd} recorded before round "
                                    f"{self._round} was ended (end_round)")
        if self.layout is None:
            self.layout = Layout.of(arrays)
        nbytes = len(encode_arrays(arrays))
        self._uncoded_bytes += nbytes
        return nbytes

    def put_shard_model(self, shard: int, rnd: int, arrays: Mapping[str, np.ndarray]
                        ) -> None:
        """W_s^0 (rnd = 0) joins the round's record; later shard models are not kept."""
        self._model_bytes[(shard, rnd)] = self._begin(rnd, arrays)
        if rnd == 0:
            flat = self.layout.flatten(arrays, f"shard {shard} model, round 0",
                                       self.scale_bits)
            self._records.setdefault(shard, []).append((-1, flat))

    def put_update(self, shard: int, rnd: int, partition_id: int,
                   arrays: Mapping[str, np.ndarray], num_examples: int,
                   train_seconds: float) -> None:
        """Buffer client ``partition_id``'s update U^rnd of shard ``shard``."""
        self._begin(rnd, arrays)
        flat = self.layout.flatten(arrays, f"update of client {partition_id}, round {rnd}",
                                   self.scale_bits)
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
        lengths, slices = self._encode(rnd)
        encode_s = time.perf_counter() - t0
        block_len = slices.shape[1] // self.num_shards
        messages, comm = self._slice_messages(rnd, slices)
        del slices  # the round's parameters leave the server with the messages
        acks = self._acks(rnd, grid, messages)
        with self._conn:
            self._conn.execute("INSERT INTO rounds VALUES (?, ?, ?, ?, ?)",
                               (rnd, block_len, encode_s, comm, len(messages)))
            self._conn.executemany("INSERT INTO records VALUES (?, ?, ?)",
                                   [(s, rnd, n) for s, n in enumerate(lengths)])
            self._conn.executemany("INSERT INTO updates (shard, round, partition_id, "
                                   "num_examples, train_seconds) VALUES (?, ?, ?, ?, ?)",
                                   self._rows)
            self._conn.executemany("INSERT INTO slices VALUES (?, ?, ?, ?, ?)",
                                   [(rnd, i, *a) for i, a in sorted(acks.items())])
            self.set_meta("uncoded_bytes", str(self._uncoded_bytes))
            self.set_meta("uncoded_model_bytes", json.dumps(sorted(
                [s, r, n] for (s, r), n in self._model_bytes.items())))
            self.set_meta("layers", json.dumps(self.layout.layers if self.layout else None))
        missing = sorted(set(self.node_of) - set(acks))
        log(INFO, "coded round %d: %d shards x (K=%d + T=%d blocks of %d elements) -> "
            "%d slices, %d acked%s, %.2f s", rnd, self.num_shards, self.blocks_per_shard,
            self.privacy_t, block_len, len(self.node_of), len(acks),
            f" (no ack from partitions {missing})" if missing else "",
            time.perf_counter() - t0)
        self._round, self._records, self._rows = None, {}, []

    def _encode(self, rnd: int) -> tuple[list[int], np.ndarray]:
        """Quantise and code the buffered round, shard by shard: (lengths, slices).

        Shard s's record is its buffered arrays in ascending partition id (W^0
        first), quantised and split into K blocks of B elements (zero padding;
        B is the longest shard's), padded with T random blocks and coded alone
        (:func:`coding.encode_quantized`: quantisation fused with the encoding,
        written straight into shard s's columns). Returns the S record lengths
        and the C slices, uint32 (C, S B), client i's in row i with shard s's
        part at columns [s B, (s + 1) B).
        """
        records = []
        for s in range(self.num_shards):
            items = sorted(self._records.get(s, []), key=lambda item: item[0])
            records.append(np.concatenate([f for _, f in items]) if items
                           else np.zeros(0, np.float32))
        block_len = max(1, max(math.ceil(r.size / self.blocks_per_shard)
                               for r in records))
        slices = np.empty((len(self.alphas), self.num_shards * block_len), np.uint32)
        for s, record in enumerate(records):
            padding = random_field_elements((self.privacy_t, block_len),
                                            self.padding_rng) if self.privacy_t else None
            try:
                encode_quantized(record, self.omegas, self.alphas, self.scale_bits,
                                 block_len, padding,
                                 out=slices[:, s * block_len:(s + 1) * block_len])
            except QuantizationRangeError as err:
                raise CodedStorageError(f"round {rnd}, shard {s}: {err}") from err
        return [r.size for r in records], slices

    def _slice_messages(self, rnd: int, slices: np.ndarray
                        ) -> tuple[list[Message], float]:
        """One ``store_slice`` message per client, and their modelled seconds."""
        messages, comm = [], 0.0
        width = slices.shape[1] // self.num_shards
        for i, node in sorted(self.node_of.items()):
            tags = [slice_tag(key, s, rnd, i, slices[i, s * width:(s + 1) * width])
                    for s, key in enumerate(self.keys)]
            content = RecordDict({
                "slice": ArrayRecord({"slice": Array(slices[i])}),
                "config": ConfigRecord({"store": self.store_id, "round": rnd,
                                        "slice-index": i, "tags": tags,
                                        "access-keys": self._access[i]})})
            comm += transfer_seconds(content_bytes(content), self.link_rate_mbps)
            messages.append(Message(content, dst_node_id=node,
                                    message_type=STORE_MESSAGE))
        return messages, comm

    def _acks(self, rnd: int, grid: Grid, messages: list[Message]) -> Acks:
        """Send the slices; the well-formed acks, first per client.

        A malformed or error ack is logged and recorded in ``faults``; that
        client's slice counts as not stored. Raises CodedStorageError if fewer
        than k clients acknowledged.
        """
        acks: Acks = {}
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
        return acks

    def mark_complete(self) -> None:
        """Declare the store finished; only then can ``CodedHistory.open`` read it.

        Raises
        ------
        CodedStorageError
            A round was recorded but never ended.
        """
        if self._round is not None:
            raise CodedStorageError(f"round {self._round} was recorded but never ended")
        super().mark_complete()


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
