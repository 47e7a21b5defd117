"""The coded reader: a shard's history fetched from client slices and decoded.

When shard s must unlearn, :class:`CodedHistory` (the
:class:`~history.protocols.TrainingHistory` of ``storage = "coded"``, see
:mod:`history.coded.recorder` for the encoding) asks connected slice holders for
their slices of every round, proving key_s (``query.fetch_slices``); a client
returns only shard s's part of its slice (each shard is coded on its own), so
the shard's server receives and decodes only its own shard's record and never
another shard's bytes. A slice whose tag fails is an erasure, so any k = K + T
slices with valid tags decode exactly
(:func:`coding.decode_erasures`); holders are asked in waves until every round
has k. A slice a client acknowledged but no longer returns is an erasure too:
``damaged`` when the client reports its file damaged (the reply's ConfigRecord
``damaged``, see :mod:`history.coded.slices`), ``lost`` otherwise; each is recorded in
the retrieval report (``losses``) and in the run's fault log, and the client's
other rounds are used. With tag checking off (a test-only path) all holders are
asked and up to floor((m - k) / 2) wrong slices among m are corrected
(:func:`coding.decode_errors`); beyond that a :class:`CodedHistoryError` is
raised and nothing is returned.

Each reply that carries slices costs 0.1 s + bits / link rate in the
communication model (:func:`history.comm.transfer_seconds`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from coding import (
    PRIME,
    DecodingError,
    access_key,
    decode_erasures,
    decode_errors,
    dequantize,
    key_proof,
    new_nonce,
    verify_slice_tag,
)
from history.catalog import CATALOG_FILE, StoreError
from history.coded.catalog import (
    DEFAULT_TRANSFER,
    CodedCatalog,
    SliceTransfer,
    content_bytes,
    read_keys,
)
from history.coded.slices import FETCH_MESSAGE
from history.comm import transfer_seconds
from history.protocols import TrainingHistory

Arrays = dict[str, np.ndarray]


class CodedHistoryError(RuntimeError):
    """A shard's history cannot be recovered from the slices; nothing was changed."""


class HoldersUnreachableError(CodedHistoryError):
    """Too few slices, and some holders did not answer: a retry may recover it."""


class CodedHistory(CodedCatalog, TrainingHistory):
    """The sharded history read back from coded slices (a ``TrainingHistory``).

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
    transfer : SliceTransfer
        ``timeout``: seconds to wait for slice replies; ``link_rate_mbps``: link
        rate of the communication model (Mbit/s); ``faults``: where damaged and
        lost slices and refused fetches are recorded (stage ``coded-retrieval``;
        kinds ``damaged-slice``, ``lost-slice``, ``damaged-file``,
        ``refused-fetch``).
    verify_tags : bool, default True
        Check every slice's tag (a failed tag is an erasure) and erasure-decode.
        ``False`` is a test-only path: tags are ignored, every holder is asked and
        wrong slices are corrected by :func:`coding.decode_errors`.
    rng_seed : int, optional
        Seed of ``decode_errors``' projection (None: fresh entropy).
    """

    def __init__(self, root: Path, conn: sqlite3.Connection, keys: list[bytes],
                 grid: Grid, node_of: Mapping[int, int], *,
                 transfer: SliceTransfer = DEFAULT_TRANSFER, verify_tags: bool = True,
                 rng_seed: int | None = None) -> None:
        super().__init__(root, conn, keys)
        self.grid = grid
        self.node_of = dict(node_of)
        self.timeout = transfer.timeout
        self.link_rate_mbps = transfer.link_rate_mbps
        self.verify_tags = verify_tags
        self.rng_seed = rng_seed
        self.faults = transfer.faults
        self._acked: dict[int, set[int]] = {}
        self._cache: dict[int, dict[int, Arrays | dict[int, Arrays]]] = {}
        self._pending: list[dict] = []
        self._retrievals: list[dict] = []
        self._stale: dict[int, set[int]] = {}
        self._raw: dict[int, np.ndarray] | None = None

    def raw_records(self, shard: int) -> dict[int, np.ndarray]:
        """Fetch and decode ``shard``'s every round as exact field elements.

        Returns round -> the record (int64 GF(p) elements, the padding blocks
        dropped), what :mod:`history.coded.erasure` re-codes. The retrieval is
        counted as any other (:meth:`take_retrieval`).

        Raises
        ------
        CodedHistoryError
            A round cannot be recovered from the slices.
        """
        self._raw = {}
        try:
            self._retrieve(shard)
            return self._raw
        finally:
            self._raw = None

    @classmethod
    def open(cls, root: str | Path, grid: Grid, node_of: Mapping[int, int],
             **kwargs) -> CodedHistory:
        """Open a complete coded store (keyword arguments as for the class).

        Raises
        ------
        StoreError
            No catalog at ``root``, an unfinished store, a store of the older
            one-code-for-all-shards layout, or a malformed key file.
        """
        root = Path(root)
        if not (root / CATALOG_FILE).is_file():
            raise StoreError(f"no coded history store at {root}")
        conn = cls.connect(root / CATALOG_FILE)
        num_shards = cls.lookup(conn, "num_shards")
        if num_shards is None:
            raise StoreError(f"{root} is not a coded history store")
        if cls.lookup(conn, "code") != "per-shard":
            raise StoreError(f"{root} was coded as one code over all shards (an older "
                             "version); this version reads per-shard codes only")
        keys = read_keys(root / "keys", int(num_shards))
        history = cls(root, conn, keys, grid, node_of, **kwargs)
        history.migrate()
        if history.state != "complete":
            raise StoreError(f"coded history store at {root} is incomplete (state "
                             f"{history.state!r}): the run that wrote it did not finish")
        return history

    # ---- TrainingHistory -----------------------------------------------------
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
            ``transfers``, ``comm_time_s``, ``decode_s`` (measured seconds),
            ``decode_ops`` (the decoding's multiply-adds: slice values used x
            blocks decoded, what the cost model prices), ``wall_s``, and per
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
                 for key in ("bytes", "transfers", "comm_time_s", "decode_s", "wall_s",
                             "decode_ops")}
        return {**total, "shards": pending}

    def retrievals(self) -> list[dict]:
        """Every shard retrieval of this history so far, in order.

        One dict per fetched shard, as in :meth:`take_retrieval`'s ``shards``;
        kept for the run's storage report (take_retrieval does not clear it).
        """
        return list(self._retrievals)

    def verify(self) -> list[str]:
        """[]: the server keeps no parameters to check.

        Every slice is checked against its tag when it is fetched; a failed tag
        is an erasure (see :meth:`take_retrieval`).
        """
        return []

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
                 "bytes": 0, "transfers": 0, "comm_time_s": 0.0, "decode_ops": 0}
        self._acked = self.acked_rounds()
        self._stale = self.stale_holders(shard)
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
        self._retrievals.append(stats)
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
            nbytes = content_bytes(reply.content)
            stats["bytes"] += nbytes
            stats["transfers"] += 1
            stats["comm_time_s"] += transfer_seconds(nbytes, self.link_rate_mbps)
            for rnd, block_len in rounds.items():
                key = f"r{rnd}"
                if key not in slices or pid in self._stale.get(rnd, ()):
                    continue  # a stale part predates the round's re-coding
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
            missing = sorted(set(self.node_of) - set(pids))
            # holders that did not answer may answer later; damage stays damage
            error = HoldersUnreachableError if stats["absent"] + stats["silent"] \
                else CodedHistoryError
            raise error(
                f"cannot recover round {rnd} of shard {shard}: {len(pids)} usable "
                f"slices, k = {self.k} needed; slices missing: partitions "
                f"{missing[:20]}{' ...' if len(missing) > 20 else ''} "
                f"({stats['holders']} holders: "
                f"{stats['absent']} absent, {stats['silent']} silent, "
                f"{stats['refused']} refused, {stats['tag_failures']} failed tags, "
                f"{stats['malformed']} malformed, {stats['damaged']} damaged, "
                f"{stats['lost']} lost, counted over all rounds); nothing "
                "was changed")
        if self.verify_tags:  # every slice is right: any k of them decode
            pids = pids[:self.k]
        y = np.stack([got[p] for p in pids]).astype(np.int64)
        alphas = self.alphas[pids]
        stats["decode_ops"] += int(y.size) * len(self.omegas)
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
        length = self.record_length(shard, rnd)  # the T padding blocks are dropped
        record = blocks[:self.blocks_per_shard].reshape(-1)[:length]
        if self._raw is not None:  # an erasure re-codes the exact field elements
            self._raw[rnd] = record
        flat = dequantize(record, self.scale_bits)
        if rnd == 0:
            return self.layout.split(flat, self.scale_bits)
        members = self.record_members(shard, rnd)
        size = self.layout.size
        if len(members) * size != length:
            raise StoreError(f"round {rnd} of shard {shard}: record of {length} "
                             f"elements for {len(members)} updates of {size}")
        return {p: self.layout.split(flat[j * size:(j + 1) * size], self.scale_bits)
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
