"""Erasure in coded storage: each round re-coded without the forgotten clients' updates.

A coded round of shard s holds every participant's update inside its K data
blocks, spread over every client's slice (:mod:`history.coded.recorder`). To
erase a forgotten client's updates, shard s's server (the only one holding key_s)
fetches and decodes the shard's rounds as exact field elements
(:meth:`history.coded.reader.CodedHistory.raw_records`), and for each round the
client took part in: drops its update from the record, codes the rest again with
the same evaluation points (fresh random padding when T > 0), and sends every
holder its new part of shard s with its new tag (``query.replace_slice_part``, a
proof of key_s bound to the part: :func:`history.coded.slices.replace`); the other
shards' parts of each slice are never touched, nor seen. The catalog then marks
the client's updates erased (the rounds it took part in stay known: SE replays
from the first) and records the holders that did not confirm as stale for that
round: their old part still holds the update, so it is never fetched again, and
the report names them.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from coding import (
    access_key,
    encode,
    key_proof,
    new_nonce,
    random_field_elements,
    slice_tag,
)
from history.coded.reader import CodedHistory
from history.coded.slices import REPLACE_MESSAGE, part_proof_message

__all__ = ["erase_coded"]


def erase_coded(history: CodedHistory, clients: list[int]) -> dict:
    """Re-code every round of ``clients``' shards in which they took part, without them.

    Parameters
    ----------
    history : CodedHistory
        The coded store, reaching the holders over its grid.
    clients : list[int]
        Partition ids whose updates are erased.

    Returns
    -------
    dict
        ``store`` ("coded"), ``updates`` (``[shard, round, client]`` each, erased
        from the records), ``rounds_recoded`` (``[shard, round]``), ``nodes``
        (per re-coded round ``"s<s>r<g>"``: the holders that replaced their
        part), ``stale`` (``[shard, round, holder]`` that did not: their part is
        never read again, and still holds the update).

    Raises
    ------
    CodedHistoryError
        A round cannot be decoded from the slices (nothing was changed).
    """
    gone = set(clients)
    shard_of = history.client_shard()
    out: dict = {"store": "coded", "updates": [], "rounds_recoded": [], "nodes": {},
                 "stale": []}
    for shard in sorted({shard_of[p] for p in gone if p in shard_of}):
        rounds = [g for g in history.rounds(shard)
                  if gone & set(history.record_members(shard, g))]
        if not rounds:
            continue
        raw = history.raw_records(shard)
        for rnd in rounds:
            _recode(history, shard, rnd, raw[rnd], gone, out)
    history.take_retrieval()  # nothing decoded stays on the server
    return out


def _recode(history: CodedHistory, shard: int, rnd: int, record: np.ndarray,
            gone: set[int], out: dict) -> None:
    """One round of one shard coded again without ``gone``; the catalog updated."""
    members = history.record_members(shard, rnd)
    size = history.layout.size
    kept = [record[j * size:(j + 1) * size] for j, p in enumerate(members)
            if p not in gone]
    new = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    parts = _encode(history, new, history.coded_rounds()[rnd])
    holders = [p for p, rounds in history.acked_rounds().items() if rnd in rounds]
    stale_before = history.stale_holders(shard).get(rnd, set())
    confirmed = _send(history, shard, rnd, parts, [p for p in holders
                                                   if p not in stale_before])
    dropped = [p for p in members if p in gone]
    stale = sorted(set(holders) - confirmed - stale_before)
    history.mark_recoded(shard, rnd, int(new.size), dropped, stale)
    out["updates"] += [[shard, rnd, p] for p in dropped]
    out["rounds_recoded"].append([shard, rnd])
    out["nodes"][f"s{shard}r{rnd}"] = sorted(confirmed)
    out["stale"] += [[shard, rnd, p] for p in stale]


def _encode(history: CodedHistory, record: np.ndarray, block_len: int) -> np.ndarray:
    """The record's K blocks (zero padded) and T random ones, coded: uint32 (C, B)."""
    k, t = history.blocks_per_shard, history.privacy_t
    blocks = np.zeros((k + t, block_len), np.int64)
    blocks[:k].reshape(-1)[:record.size] = record
    if t:
        blocks[k:] = random_field_elements((t, block_len), np.random.default_rng())
    return encode(blocks, history.omegas, history.alphas).astype(np.uint32)


def _send(history: CodedHistory, shard: int, rnd: int, parts: np.ndarray,
          holders: list[int]) -> set[int]:
    """Each reachable holder its new part; the holders that confirmed."""
    live = set(history.grid.get_node_ids())
    messages, asked = [], {}
    for pid in holders:
        node = history.node_of.get(pid)
        if node not in live:
            continue
        part, nonce = parts[pid], new_nonce()
        proof = key_proof(access_key(history.keys[shard], pid),
                          part_proof_message(nonce, part))
        request = ConfigRecord({"store": history.store_id, "shard": shard,
                                "round": rnd, "nonce": nonce, "proof": proof,
                                "tag": slice_tag(history.keys[shard], shard, rnd, pid,
                                                 part)})
        messages.append(Message(RecordDict({"part": ArrayRecord({"part": Array(part)}),
                                            "request": request}),
                                dst_node_id=node, message_type=REPLACE_MESSAGE))
        asked[node] = pid
    confirmed = set()
    for reply in history.grid.send_and_receive(messages, timeout=history.timeout) \
            if messages else []:
        pid = asked.get(reply.metadata.src_node_id)
        ack = None if reply.has_error() else reply.content.config_records.get("ack")
        if pid is not None and ack is not None and int(ack.get("round", -1)) == rnd:
            confirmed.add(pid)
    return confirmed
