"""Keys, slice tags and key proofs for coded slices (HMAC-SHA256, RFC 2104).

The shard server keeps one secret key per shard (:func:`new_key`).  When it
hands a coded slice to a client it computes :func:`slice_tag` over the slice
and its context (shard, round, slice index, dtype, shape); a slice fetched
back is accepted only if :func:`verify_slice_tag` holds, so a modified,
replayed (other round) or misplaced (other shard or slice) slice is rejected
and can be treated as an erasure.

Access control uses a challenge/response so a client hands out its slice
only to a requester that proves knowledge of a key: the client sends a fresh
nonce (:func:`new_nonce`), the requester answers ``key_proof(key, nonce)``,
the client checks :func:`verify_key_proof`.  So that clients never hold the
shard key itself, the server gives client ``i`` the derived key
``access_key(shard_key, i)`` together with its slice and proves knowledge of
that derived key (the server can always re-derive it).
"""

from __future__ import annotations

import hashlib
import hmac
import operator
import secrets
import struct
from typing import Any

import numpy as np

__all__ = [
    "KEY_BYTES",
    "new_key",
    "new_nonce",
    "access_key",
    "slice_tag",
    "verify_slice_tag",
    "key_proof",
    "verify_key_proof",
]

KEY_BYTES = 32
_MIN_KEY_BYTES = 16
_MIN_NONCE_BYTES = 16
_TAG_DOMAIN = b"coding.slice-tag.v1\x00"
_PROOF_DOMAIN = b"coding.key-proof.v1\x00"
_ACCESS_DOMAIN = b"coding.access-key.v1\x00"


def _key(key: Any) -> bytes:
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    key = bytes(key)
    if len(key) < _MIN_KEY_BYTES:
        raise ValueError(f"key must be at least {_MIN_KEY_BYTES} bytes, got {len(key)}")
    return key


def _uint(v: Any, name: str) -> int:
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}") from None
    if not 0 <= i < 2**63:
        raise ValueError(f"{name} must lie in [0, 2**63), got {i}")
    return i


def new_key() -> bytes:
    """Return a fresh 32-byte secret key from :mod:`secrets` (one per shard).

    Returns
    -------
    bytes
        32 random bytes (``secrets.token_bytes(32)``).
    """
    return secrets.token_bytes(KEY_BYTES)


def new_nonce() -> bytes:
    """Return a fresh 32-byte challenge nonce from :mod:`secrets`.

    Returns
    -------
    bytes
        32 random bytes; never reuse a nonce.
    """
    return secrets.token_bytes(32)


def access_key(key: bytes, slice_index: int) -> bytes:
    """Derive the per-slice access key ``HMAC-SHA256(key, domain || slice_index)``.

    Give it to the client storing slice ``slice_index``; that client can then
    verify :func:`key_proof` answers without learning the shard key, and a
    leaked access key opens only its own slice.

    Parameters
    ----------
    key : bytes
        The shard key (at least 16 bytes).
    slice_index : int
        Index of the slice (client), in ``[0, 2**63)``.

    Returns
    -------
    bytes
        32 bytes.

    Raises
    ------
    TypeError, ValueError
        On a malformed key or index.
    """
    msg = _ACCESS_DOMAIN + struct.pack(">Q", _uint(slice_index, "slice_index"))
    return hmac.new(_key(key), msg, hashlib.sha256).digest()


def _canonical_array(data: Any) -> np.ndarray:
    arr = np.asarray(data)
    if arr.dtype.hasobject:
        raise TypeError("data must be a numeric array, not an object array")
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr)


def slice_tag(key: bytes, shard: int, round: int, slice_index: int, data: Any) -> bytes:
    """Authentication tag of one coded slice: HMAC-SHA256 over a canonical encoding.

    The message is ``domain || shard || round || slice_index || len(dtype) ||
    dtype || ndim || shape... || raw bytes``, integers as big-endian 64-bit,
    dtype as its little-endian numpy type string (e.g. ``b"<i8"``), raw bytes in
    C order, little-endian.  Any change to the data, its shape or dtype, or to
    the shard, round or slice index changes the tag.

    Parameters
    ----------
    key : bytes
        The shard key (at least 16 bytes), from :func:`new_key`.
    shard, round, slice_index : int
        Context, each in ``[0, 2**63)``.
    data : numpy.ndarray, any shape, numeric dtype
        The slice (normally int64, shape ``(d,)``).

    Returns
    -------
    bytes
        32-byte tag.

    Raises
    ------
    TypeError, ValueError
        On a malformed key, context integer, or object array.
    """
    mac = hmac.new(_key(key), digestmod=hashlib.sha256)
    arr = _canonical_array(data)
    dt = arr.dtype.str.encode("ascii")
    mac.update(_TAG_DOMAIN)
    mac.update(
        struct.pack(
            ">QQQ",
            _uint(shard, "shard"),
            _uint(round, "round"),
            _uint(slice_index, "slice_index"),
        )
    )
    mac.update(struct.pack(">Q", len(dt)) + dt)
    mac.update(struct.pack(f">Q{arr.ndim}Q", arr.ndim, *arr.shape))
    if arr.size:
        mac.update(memoryview(arr.reshape(-1).view(np.uint8)))
    return mac.digest()


def verify_slice_tag(
    key: bytes, shard: int, round: int, slice_index: int, data: Any, tag: Any
) -> bool:
    """Check a tag made by :func:`slice_tag` in constant time (``hmac.compare_digest``).

    Parameters
    ----------
    key, shard, round, slice_index, data
        As for :func:`slice_tag`.
    tag : bytes
        The tag to check.

    Returns
    -------
    bool
        True only if ``tag`` equals ``slice_tag(key, shard, round, slice_index, data)``;
        False for any other tag, including one of the wrong type or length.

    Raises
    ------
    TypeError, ValueError
        On a malformed key, context integer, or object array.
    """
    expected = slice_tag(key, shard, round, slice_index, data)
    if not isinstance(tag, (bytes, bytearray, memoryview)):
        return False
    return hmac.compare_digest(expected, bytes(tag))


def _nonce(nonce: Any) -> bytes:
    if not isinstance(nonce, (bytes, bytearray, memoryview)):
        raise TypeError(f"nonce must be bytes, got {type(nonce).__name__}")
    nonce = bytes(nonce)
    if len(nonce) < _MIN_NONCE_BYTES:
        raise ValueError(
            f"nonce must be at least {_MIN_NONCE_BYTES} bytes, got {len(nonce)}"
        )
    return nonce


def key_proof(key: bytes, nonce: bytes) -> bytes:
    """Answer a challenge: ``HMAC-SHA256(key, domain || nonce)``.

    Parameters
    ----------
    key : bytes
        The key whose knowledge is proved (at least 16 bytes); normally
        ``access_key(shard_key, slice_index)``.
    nonce : bytes
        The verifier's fresh challenge (at least 16 bytes), e.g. :func:`new_nonce`.

    Returns
    -------
    bytes
        32-byte proof.

    Raises
    ------
    TypeError, ValueError
        On a malformed key or nonce.
    """
    return hmac.new(_key(key), _PROOF_DOMAIN + _nonce(nonce), hashlib.sha256).digest()


def verify_key_proof(key: bytes, nonce: bytes, proof: Any) -> bool:
    """Check a :func:`key_proof` answer in constant time.

    Parameters
    ----------
    key : bytes
        The key the requester must know.
    nonce : bytes
        The challenge that was sent (never reuse one).
    proof : bytes
        The requester's answer.

    Returns
    -------
    bool
        True only if ``proof == key_proof(key, nonce)``; False for a wrong
        proof, including one of the wrong type or length.

    Raises
    ------
    TypeError, ValueError
        On a malformed key or nonce.
    """
    expected = key_proof(key, nonce)
    if not isinstance(proof, (bytes, bytearray, memoryview)):
        return False
    return hmac.compare_digest(expected, bytes(proof))
