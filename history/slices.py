"""The client's store of coded slices (coded sharding; docs/DESIGN.md).

After every learning round g (and g = 0 for the initial models W_s^0) the server
encodes the round's history of all S shards into one Lagrange-coded slice per
client (``history.coded``) and sends client i its slice u(alpha_i)
with S authentication tags (one per shard key) and S access keys
``coding.access_key(key_s, i)``. This module keeps them and hands them out again.

Where the slices live, per coded store (``store``, a server-chosen id):

- ``context.state`` within the run: ArrayRecord ``coded-slices:<store>`` (one
  uint32 array ``r<g>`` per round) and ConfigRecord ``coded-meta:<store>``
  (``slice-index``, ``access-keys``, ``r<g>.tags``, used ``nonces``);
- if the node config has ``node-dir``, also ``<node-dir>/slices/<store>/``:
  ``round-<g>.npz`` (``slice``, ``tags``) and ``access.npz`` (``keys``,
  ``slice_index``), each written to a temporary file, fsync'ed and renamed, so
  a restarted node (fresh ``context.state``) serves the same slices.

Messages (handled in ``client_app.app``):

- ``query.store_slice``: ArrayRecord ``slice`` (``slice``: uint32, shape (B,)),
  ConfigRecord ``config`` (``store``, ``round``, ``slice-index``, ``tags``: S
  bytes, ``access-keys``: S bytes). Reply: ConfigRecord ``ack`` (``round``,
  ``slice-index``, ``slice-bytes``, ``stored-bytes``: slice and tag bytes this
  client holds for the store, ``disk-bytes``: its files under ``node-dir``).
- ``query.fetch_slices``: ConfigRecord ``request`` (``store``, ``shard``,
  ``rounds``, ``nonce``, ``proof`` = ``coding.key_proof(access_key(key_s, i),
  nonce)``). The client answers only a valid proof with a nonce it has not seen
  before (:class:`SliceAccessError` otherwise): ArrayRecord ``slices`` (``r<g>``)
  and ConfigRecord ``tags`` (``r<g>``: shard s's tag) for every requested round
  it holds, and ConfigRecord ``info`` (``slice-index``).

The client never learns a shard key; it cannot check tags, the server does.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from coding import verify_key_proof
from history.files import atomic_write_arrays, read_arrays

STORE_MESSAGE = "query.store_slice"
FETCH_MESSAGE = "query.fetch_slices"
REFUSED = 403
"""``Error.code`` of a refused or malformed slice message (like HTTP 403)."""

_STORE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class SliceAccessError(PermissionError):
    """A slice request that this client refuses (no valid proof, replayed nonce)."""


class SliceFormatError(ValueError):
    """A ``query.store_slice`` / ``query.fetch_slices`` message that is malformed."""


def slices_key(store: str) -> str:
    """``context.state`` key of the ArrayRecord holding ``store``'s slices."""
    return f"coded-slices:{store}"


def meta_key(store: str) -> str:
    """``context.state`` key of the ConfigRecord holding ``store``'s tags and keys."""
    return f"coded-meta:{store}"


def _store_id(value: object) -> str:
    if not isinstance(value, str) or not _STORE_ID.match(value):
        raise SliceFormatError(f"store id {value!r} is not allowed: 1-64 characters "
                               "of A-Z, a-z, 0-9, '_' or '-'")
    return value


def _bytes_list(value: object, name: str) -> list[bytes]:
    if not isinstance(value, list) or not value or \
            not all(isinstance(v, bytes) and len(v) == 32 for v in value):
        raise SliceFormatError(f"{name} must be a non-empty list of 32-byte strings "
                               "(HMAC-SHA256 outputs)")
    return value


def _node_dir(context: Context, store: str) -> Path | None:
    root = str(context.node_config.get("node-dir", "") or "")
    return Path(root) / "slices" / store if root else None


def _meta(context: Context, store: str) -> ConfigRecord:
    key = meta_key(store)
    if key not in context.state.config_records:
        context.state[key] = ConfigRecord()
    return context.state.config_records[key]


def _slices(context: Context, store: str) -> ArrayRecord:
    key = slices_key(store)
    if key not in context.state.array_records:
        context.state[key] = ArrayRecord()
    return context.state.array_records[key]


def _disk_bytes(folder: Path | None) -> int:
    if folder is None or not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.is_file() and not p.name.startswith("."))


def store(content: RecordDict, context: Context) -> RecordDict:
    """Keep one coded slice (a ``query.store_slice`` message); return the ack.

    Parameters
    ----------
    content : RecordDict
        ArrayRecord ``slice`` and ConfigRecord ``config`` (see module docstring).
    context : Context
        The node's context: the slice goes to ``context.state`` and, with a
        ``node-dir`` in the node config, to ``<node-dir>/slices/<store>/``.

    Returns
    -------
    RecordDict
        ConfigRecord ``ack``: ``round``, ``slice-index``, ``slice-bytes`` (this
        slice and its tags), ``stored-bytes`` (all slices and tags this client
        holds for the store) and ``disk-bytes``.

    Raises
    ------
    SliceFormatError
        A missing or malformed field.
    """
    try:
        config = content.config_records["config"]
        data = content.array_records["slice"]["slice"].numpy()
        store_id = _store_id(config["store"])
        rnd, index = int(config["round"]), int(config["slice-index"])
        tags = _bytes_list(config["tags"], "tags")
        access = _bytes_list(config["access-keys"], "access-keys")
    except (KeyError, TypeError) as err:
        raise SliceFormatError(f"malformed {STORE_MESSAGE} message: {err!r}") from err
    if data.dtype != np.uint32 or data.ndim != 1 or rnd < 0 or index < 0:
        raise SliceFormatError(f"slice must be a 1-d uint32 array with round, index >= 0; "
                               f"got {data.dtype}{list(data.shape)}, round {rnd}, "
                               f"index {index}")
    meta = _meta(context, store_id)
    if int(meta.get("slice-index", index)) != index:
        raise SliceFormatError(f"this client holds slice {meta['slice-index']} of store "
                               f"{store_id}, not {index}")
    slices = _slices(context, store_id)
    previous = slices.get(f"r{rnd}")
    meta["slice-index"] = index
    meta["access-keys"] = list(access)
    meta[f"r{rnd}.tags"] = list(tags)
    slices[f"r{rnd}"] = Array(np.ascontiguousarray(data))
    tag_bytes = sum(len(t) for t in tags)
    slice_bytes = data.nbytes + tag_bytes
    # a round sent again replaces its old slice and tags
    replaced = 0 if previous is None else previous.numpy().nbytes + tag_bytes
    meta["stored-bytes"] = int(meta.get("stored-bytes", 0)) + slice_bytes - replaced
    folder = _node_dir(context, store_id)
    if folder is not None:
        keys = np.frombuffer(b"".join(access), dtype=np.uint8).reshape(len(access), -1)
        old = read_arrays(folder / "access.npz")
        if old is None or not np.array_equal(old["keys"], keys):
            atomic_write_arrays(folder / "access.npz",
                                {"keys": keys, "slice_index": np.int64(index)})
        tag_array = np.frombuffer(b"".join(tags), dtype=np.uint8).reshape(len(tags), -1)
        atomic_write_arrays(folder / f"round-{rnd}.npz",
                            {"slice": data, "tags": tag_array})
    ack = ConfigRecord({"round": rnd, "slice-index": index,
                        "slice-bytes": slice_bytes,
                        "stored-bytes": int(meta["stored-bytes"]),
                        "disk-bytes": _disk_bytes(folder)})
    return RecordDict({"ack": ack})


def _load_access(context: Context, store_id: str) -> tuple[int, list[bytes]] | None:
    meta = context.state.config_records.get(meta_key(store_id))
    if meta is not None and "access-keys" in meta:
        return int(meta["slice-index"]), list(meta["access-keys"])
    folder = _node_dir(context, store_id)
    saved = read_arrays(folder / "access.npz") if folder else None
    if saved is None:
        return None
    return int(saved["slice_index"]), [bytes(row) for row in saved["keys"]]


def _load_round(context: Context, store_id: str, rnd: int
                ) -> tuple[np.ndarray, list[bytes]] | None:
    slices = context.state.array_records.get(slices_key(store_id))
    meta = context.state.config_records.get(meta_key(store_id))
    if slices is not None and meta is not None and f"r{rnd}" in slices:
        return slices[f"r{rnd}"].numpy(), list(meta[f"r{rnd}.tags"])
    folder = _node_dir(context, store_id)
    saved = read_arrays(folder / f"round-{rnd}.npz") if folder else None
    if saved is None:
        return None
    return saved["slice"], [bytes(row) for row in saved["tags"]]


def _remember_nonce(context: Context, store_id: str, nonce: bytes) -> None:
    """Refuse a nonce seen before; remember its SHA-256 (state and node-dir)."""
    digest = hashlib.sha256(nonce).digest()
    meta = _meta(context, store_id)
    seen = set(meta.get("nonces", []))
    folder = _node_dir(context, store_id)
    saved = read_arrays(folder / "nonces.npz") if folder else None
    if saved is not None:
        seen |= {bytes(row) for row in saved["nonces"]}
    if digest in seen:
        raise SliceAccessError("refused: this nonce was used before (a replayed request)")
    seen.add(digest)
    meta["nonces"] = sorted(seen)
    if folder is not None:
        atomic_write_arrays(folder / "nonces.npz", {"nonces": np.frombuffer(
            b"".join(sorted(seen)), dtype=np.uint8).reshape(len(seen), 32)})


def fetch(content: RecordDict, context: Context) -> RecordDict:
    """Answer a ``query.fetch_slices`` request that proves the shard's key.

    Parameters
    ----------
    content : RecordDict
        ConfigRecord ``request``: ``store``, ``shard``, ``rounds``, ``nonce``
        (>= 16 bytes, never reused), ``proof``.
    context : Context
        The node's context (slices from ``context.state``, else from ``node-dir``).

    Returns
    -------
    RecordDict
        ArrayRecord ``slices`` (``r<g>``: uint32 slice), ConfigRecord ``tags``
        (``r<g>``: the tag for the requested shard) for every requested round
        held, ConfigRecord ``info`` (``slice-index``, ``held``: how many rounds).

    Raises
    ------
    SliceAccessError
        No slices of this store, a shard without an access key, a replayed
        nonce, or a proof that does not verify.
    SliceFormatError
        A missing or malformed field.
    """
    try:
        request = content.config_records["request"]
        store_id = _store_id(request["store"])
        shard = int(request["shard"])
        rounds = [int(r) for r in request["rounds"]]
        nonce, proof = request["nonce"], request["proof"]
    except (KeyError, TypeError, ValueError) as err:
        raise SliceFormatError(f"malformed {FETCH_MESSAGE} message: {err!r}") from err
    if not isinstance(nonce, bytes) or len(nonce) < 16 or not isinstance(proof, bytes):
        raise SliceFormatError("nonce (>= 16 bytes) and proof must be byte strings")
    access = _load_access(context, store_id)
    if access is None:
        raise SliceAccessError(f"refused: this client holds no slices of store {store_id}")
    index, keys = access
    if not 0 <= shard < len(keys):
        raise SliceAccessError(f"refused: no access key for shard {shard}")
    if not verify_key_proof(keys[shard], nonce, proof):
        raise SliceAccessError(f"refused: the proof for shard {shard} does not verify")
    _remember_nonce(context, store_id, nonce)
    arrays, tags = ArrayRecord(), ConfigRecord()
    for rnd in rounds:
        held = _load_round(context, store_id, rnd)
        if held is not None and shard < len(held[1]):
            arrays[f"r{rnd}"] = Array(np.ascontiguousarray(held[0]))
            tags[f"r{rnd}"] = held[1][shard]
    info = ConfigRecord({"slice-index": index, "held": len(arrays)})
    return RecordDict({"slices": arrays, "tags": tags, "info": info})
