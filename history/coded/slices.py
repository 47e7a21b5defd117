"""The client's store of coded slices (coded sharding; docs/DESIGN.md).

After every learning round g (and g = 0 for the initial models W_s^0) the server
codes each shard's record of the round on its own (``history.coded.recorder``)
and sends client i its slice: the S shard slices u_s(alpha_i) side by side, S
equal parts, with S authentication tags (tag s covers part s, under shard s's
key) and S access keys ``coding.access_key(key_s, i)``. This module keeps them
and hands them out again: a fetch that proves shard s's key gets part s only.

Where the slices live, per coded store (``store``, a server-chosen id):

- ``context.state`` within the run: ArrayRecord ``coded-slices:<store>`` (one
  uint32 array ``r<g>`` per round) and ConfigRecord ``coded-meta:<store>``
  (``slice-index``, ``access-keys``, ``r<g>.tags``, used ``nonces``);
- if the node config has ``node-dir``, also ``<node-dir>/slices/<store>/``
  (:mod:`history.coded.slice_files`): ``round-<g>.npz`` (``slice``, ``tags`` and a
  copy of the access keys), ``access.npz`` and ``nonces.npz``, each written to a
  temporary file, fsync'ed and renamed, so a restarted node (fresh
  ``context.state``) serves the same slices.

A damaged file (truncated, garbled, wrong arrays, gone) costs exactly what it
holds: a damaged ``round-<g>.npz`` loses round g for this client (an erasure for
the server) and is reported; the other rounds are served. A damaged
``access.npz`` costs nothing (the keys are recovered from the round files); a
damaged ``nonces.npz`` forgets the nonces used before it (a replay of one of them
is then answered) and is rewritten. All of it is reported in the reply.

Messages (handled in ``client_app.app``):

- ``query.store_slice``: ArrayRecord ``slice`` (``slice``: uint32, shape (B,)),
  ConfigRecord ``config`` (``store``, ``round``, ``slice-index``, ``tags``: S
  bytes, ``access-keys``: S bytes, as many as tags; B a multiple of S). Reply: ConfigRecord
  ``ack`` (``round``, ``slice-index``, ``slice-bytes``, ``stored-bytes``: slice
  and tag bytes this client holds for the store, ``disk-bytes``: its files
  under ``node-dir``).
- ``query.fetch_slices``: ConfigRecord ``request`` (``store``, ``shard``,
  ``rounds``, ``nonce``, ``proof`` = ``coding.key_proof(access_key(key_s, i),
  nonce)``). The client answers only a valid proof with a nonce it has not seen
  before (:class:`SliceAccessError` otherwise): ArrayRecord ``slices`` (``r<g>``:
  shard s's part of the slice, B / S elements) and ConfigRecord ``tags``
  (``r<g>``: shard s's tag) for every requested round it holds intact,
  ConfigRecord ``info`` (``slice-index``, ``held``: rounds returned,
  ``missing``: requested rounds it holds no copy of, if any) and
  ConfigRecord ``damaged`` (``r<g>``, ``access``, ``nonces``: why that file
  could not be used).

- ``query.replace_slice_part``: ArrayRecord ``part`` (``part``: uint32, shard s's
  new part of round g, B / S elements) and ConfigRecord ``request`` (``store``,
  ``shard``, ``round``, ``tag``: the new part's tag, ``nonce``, ``proof`` =
  ``coding.key_proof(access_key(key_s, i), nonce || SHA-256(part bytes))``). Only
  shard s's server can make the proof, and it binds the new part; the client
  replaces part s and tag s of its round-g slice (state and ``node-dir``), the
  other shards' parts untouched, and acks. An erasure re-codes a round without a
  forgotten client's update this way (:mod:`history.coded.erasure`).

The client never learns a shard key; it cannot check tags, the server does.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from coding import verify_key_proof
from history.coded.slice_files import Access, SliceFolder
from history.files import DamagedFileError

STORE_MESSAGE = "query.store_slice"
FETCH_MESSAGE = "query.fetch_slices"
REPLACE_MESSAGE = "query.replace_slice_part"
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


def node_root(context: Context) -> Path | None:
    """The node's folder: its own ``node-dir``, else ``<node-dirs>/<partition-id>``.

    A SuperNode's ``node-dir`` (node config) wins; the run config's ``node-dirs``
    gives simulated clients, which have none, a folder each, so their coded
    slices outlive the simulation (a later request decodes them). None: the
    slices live in ``context.state`` only.
    """
    root = str(context.node_config.get("node-dir", "") or "")
    if root:
        return Path(root)
    shared = str(context.run_config.get("node-dirs", "") or "")
    pid = context.node_config.get("partition-id")
    return Path(shared) / str(int(pid)) if shared and pid is not None else None


def _node_dir(context: Context, store: str) -> SliceFolder | None:
    root = node_root(context)
    return SliceFolder(root / "slices" / store) if root is not None else None


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
    if data.dtype != np.uint32 or data.ndim != 1 or data.size == 0 or rnd < 0 \
            or index < 0:
        raise SliceFormatError(f"slice must be a non-empty 1-d uint32 array with round, "
                               f"index >= 0; got {data.dtype}{list(data.shape)}, round "
                               f"{rnd}, index {index}")
    if len(tags) != len(access):
        raise SliceFormatError(f"{len(tags)} tags and {len(access)} access keys: one "
                               "of each per shard is required")
    if data.size % len(tags):
        raise SliceFormatError(f"a slice of {data.size} elements does not split into "
                               f"{len(tags)} equal shard parts (one per tag)")
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
        folder.write_access((index, list(access)))  # repairs a damaged access.npz
        folder.write_round(rnd, data, list(tags), (index, list(access)))
    ack = ConfigRecord({"round": rnd, "slice-index": index,
                        "slice-bytes": slice_bytes,
                        "stored-bytes": int(meta["stored-bytes"]),
                        "disk-bytes": folder.disk_bytes() if folder else 0})
    return RecordDict({"ack": ack})


def _access_copies(context: Context, store_id: str, damaged: ConfigRecord
                   ) -> list[Access]:
    """Candidate (slice index, keys) of this store: state, else access.npz, else rounds.

    A damaged or missing ``access.npz`` beside round files is noted in
    ``damaged["access"]``; the copies kept in the round files stand in for it.
    """
    meta = context.state.config_records.get(meta_key(store_id))
    if meta is not None and "access-keys" in meta:
        return [(int(meta["slice-index"]), list(meta["access-keys"]))]
    folder = _node_dir(context, store_id)
    if folder is None:
        return []
    try:
        saved = folder.read_access()
    except DamagedFileError as err:
        saved, damaged["access"] = None, str(err)
    if saved is not None:
        return [saved]
    copies = folder.access_from_rounds()
    if copies and "access" not in damaged:
        damaged["access"] = "access.npz: missing"
    if "access" in damaged:
        damaged["access"] += (f"; keys taken from the round files ({len(copies)} "
                              "distinct copies)")
    return copies


def _verified_access(copies: list[Access], store_id: str, shard: int, nonce: bytes,
                     proof: bytes, damaged: ConfigRecord) -> int:
    """The slice index of the copy whose key for ``shard`` verifies ``proof``."""
    if not copies:
        why = f" ({damaged['access']})" if "access" in damaged else ""
        raise SliceAccessError(f"refused: this client holds no slices of store "
                               f"{store_id}{why}")
    if not any(0 <= shard < len(keys) for _, keys in copies):
        raise SliceAccessError(f"refused: no access key for shard {shard}")
    for index, keys in copies:
        if 0 <= shard < len(keys) and verify_key_proof(keys[shard], nonce, proof):
            return index
    raise SliceAccessError(f"refused: the proof for shard {shard} does not verify")


def _load_round(context: Context, store_id: str, rnd: int, shard: int
                ) -> tuple[np.ndarray, bytes] | None:
    """Shard ``shard``'s part of round ``rnd``'s slice and its tag; None if not held.

    Raises
    ------
    DamagedFileError
        The round's file is damaged (or holds no tag for ``shard``).
    """
    slices = context.state.array_records.get(slices_key(store_id))
    meta = context.state.config_records.get(meta_key(store_id))
    if slices is not None and meta is not None and f"r{rnd}" in slices:
        return _part(slices[f"r{rnd}"].numpy(), list(meta[f"r{rnd}.tags"]), shard)
    folder = _node_dir(context, store_id)
    saved = folder.read_round(rnd) if folder else None
    if saved is None:
        return None
    data, tags = saved
    if shard >= len(tags):
        raise DamagedFileError(f"round-{rnd}.npz: {len(tags)} tags, none for shard "
                               f"{shard}")
    return _part(data, tags, shard)


def _part(data: np.ndarray, tags: list[bytes], shard: int) -> tuple[np.ndarray, bytes]:
    """Shard ``shard``'s part of a slice (S = len(tags) equal parts) and its tag.

    Raises
    ------
    DamagedFileError
        The slice does not split into S equal parts or there is no such shard.
    """
    if not 0 <= shard < len(tags) or data.ndim != 1 or data.size % len(tags):
        raise DamagedFileError(f"a slice of {data.size} elements and {len(tags)} tags "
                               f"has no part for shard {shard}")
    width = data.size // len(tags)
    return data[shard * width:(shard + 1) * width], tags[shard]


def _remember_nonce(context: Context, store_id: str, nonce: bytes,
                    damaged: ConfigRecord) -> None:
    """Refuse a nonce seen before; remember its SHA-256 (state and node-dir).

    A damaged ``nonces.npz`` is noted in ``damaged["nonces"]`` and rewritten:
    the nonces it held are forgotten (the state's are kept).
    """
    digest = hashlib.sha256(nonce).digest()
    meta = _meta(context, store_id)
    seen = set(meta.get("nonces", []))
    folder = _node_dir(context, store_id)
    if folder is not None:
        try:
            seen |= folder.read_nonces()
        except DamagedFileError as err:
            damaged["nonces"] = (f"{err}; rewritten, the nonces used before it are "
                                 "forgotten")
    if digest in seen:
        raise SliceAccessError("refused: this nonce was used before (a replayed request)")
    seen.add(digest)
    meta["nonces"] = sorted(seen)
    if folder is not None:
        folder.write_nonces(seen)


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
        held intact; ConfigRecord ``info`` (``slice-index``, ``held``: how many
        rounds, ``missing``: requested rounds with no copy here, ascending,
        present only when there are some);
        ConfigRecord ``damaged`` (``r<g>``: why round g's file is unusable;
        ``access`` / ``nonces``: the same for those files; empty when all is well).

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
    damaged = ConfigRecord()
    copies = _access_copies(context, store_id, damaged)
    index = _verified_access(copies, store_id, shard, nonce, proof, damaged)
    _remember_nonce(context, store_id, nonce, damaged)
    arrays, tags, missing = ArrayRecord(), ConfigRecord(), []
    for rnd in sorted(set(rounds)):
        try:
            held = _load_round(context, store_id, rnd, shard)
        except DamagedFileError as err:  # this round is lost, the others stand
            damaged[f"r{rnd}"] = str(err)
            continue
        if held is None:
            missing.append(rnd)
        else:
            arrays[f"r{rnd}"] = Array(np.ascontiguousarray(held[0]))
            tags[f"r{rnd}"] = held[1]
    info = ConfigRecord({"slice-index": index, "held": len(arrays)})
    if missing:  # flwr cannot size (nor type) an empty list
        info["missing"] = missing
    return RecordDict({"slices": arrays, "tags": tags, "info": info,
                       "damaged": damaged})


def part_proof_message(nonce: bytes, part: np.ndarray) -> bytes:
    """What a replacement's proof covers: the nonce and the new part's SHA-256."""
    return nonce + hashlib.sha256(np.ascontiguousarray(part, np.uint32).tobytes()).digest()


def replace(content: RecordDict, context: Context) -> RecordDict:
    """Replace shard s's part of one round's slice (``query.replace_slice_part``).

    Parameters
    ----------
    content : RecordDict
        ArrayRecord ``part`` and ConfigRecord ``request`` (module docstring).
    context : Context
        The node's context: the slice in ``context.state`` and, with a node
        folder, its file are rewritten.

    Returns
    -------
    RecordDict
        ConfigRecord ``ack``: ``round``, ``shard``, ``slice-index``.

    Raises
    ------
    SliceAccessError
        No valid proof, a replayed nonce, or no slice of that round here.
    SliceFormatError
        A missing or malformed field, or a part of the wrong size.
    """
    try:
        request = content.config_records["request"]
        part = content.array_records["part"]["part"].numpy()
        store_id, shard = _store_id(request["store"]), int(request["shard"])
        rnd, tag = int(request["round"]), request["tag"]
        nonce, proof = request["nonce"], request["proof"]
    except (KeyError, TypeError, ValueError) as err:
        raise SliceFormatError(f"malformed {REPLACE_MESSAGE} message: {err!r}") from err
    if not all(isinstance(v, bytes) for v in (nonce, proof, tag)) or len(nonce) < 16 \
            or part.dtype != np.uint32 or part.ndim != 1:
        raise SliceFormatError("nonce (>= 16 bytes), proof and tag must be byte strings "
                               "and the part a 1-d uint32 array")
    damaged = ConfigRecord()
    copies = _access_copies(context, store_id, damaged)
    index = _verified_access(copies, store_id, shard, part_proof_message(nonce, part),
                             proof, damaged)
    keys = next(k for i, k in copies if i == index)
    _remember_nonce(context, store_id, nonce, damaged)
    data, tags = _whole_round(context, store_id, rnd)
    width = data.size // len(tags)
    if not 0 <= shard < len(tags) or part.size != width:
        raise SliceFormatError(f"a part of {part.size} elements for shard {shard}: this "
                               f"slice has {len(tags)} parts of {width}")
    data = data.copy()
    data[shard * width:(shard + 1) * width] = part
    tags[shard] = tag
    _keep_round(context, store_id, rnd, (index, keys), data, tags)
    return RecordDict({"ack": ConfigRecord({"round": rnd, "shard": shard,
                                            "slice-index": index})})


def _whole_round(context: Context, store_id: str, rnd: int
                 ) -> tuple[np.ndarray, list[bytes]]:
    """Round ``rnd``'s whole slice and its tags (state, else the node folder)."""
    slices = context.state.array_records.get(slices_key(store_id))
    meta = context.state.config_records.get(meta_key(store_id))
    if slices is not None and meta is not None and f"r{rnd}" in slices:
        return slices[f"r{rnd}"].numpy(), list(meta[f"r{rnd}.tags"])
    folder = _node_dir(context, store_id)
    try:
        saved = folder.read_round(rnd) if folder else None
    except DamagedFileError as err:
        raise SliceAccessError(f"refused: round {rnd}'s slice is damaged ({err})") \
            from None
    if saved is None:
        raise SliceAccessError(f"refused: this client holds no slice of round {rnd}")
    return saved[0], list(saved[1])


def _keep_round(context: Context, store_id: str, rnd: int, access: Access,
                data: np.ndarray, tags: list[bytes]) -> None:
    """The rewritten slice into ``context.state`` and the node folder's file."""
    meta = _meta(context, store_id)
    meta["slice-index"], meta["access-keys"] = access[0], list(access[1])
    _slices(context, store_id)[f"r{rnd}"] = Array(np.ascontiguousarray(data))
    meta[f"r{rnd}.tags"] = list(tags)
    folder = _node_dir(context, store_id)
    if folder is not None:
        folder.write_round(rnd, data, list(tags), (access[0], list(access[1])))
