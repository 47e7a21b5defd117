"""Tests for coding.auth: slice tags and key proofs."""

from __future__ import annotations

import numpy as np
import pytest

from coding import (
    access_key,
    key_proof,
    new_key,
    new_nonce,
    slice_tag,
    verify_key_proof,
    verify_slice_tag,
)


@pytest.fixture
def slice_data():
    return np.random.default_rng(0).integers(0, 2**31 - 1, 257, dtype=np.int64)


def test_new_key_is_random_32_bytes():
    a, b = new_key(), new_key()
    assert isinstance(a, bytes) and len(a) == 32 and a != b
    assert len(new_nonce()) == 32


def test_tag_accepts_the_exact_slice(slice_data):
    key = new_key()
    tag = slice_tag(key, 1, 7, 42, slice_data)
    assert isinstance(tag, bytes) and len(tag) == 32
    assert tag == slice_tag(key, 1, 7, 42, slice_data.copy())
    assert verify_slice_tag(key, 1, 7, 42, slice_data, tag)


def test_tag_rejects_a_flipped_bit(slice_data):
    key = new_key()
    tag = slice_tag(key, 1, 7, 42, slice_data)
    for pos in (0, 100, 256):
        for bit in (0, 30):
            bad = slice_data.copy()
            bad[pos] ^= 1 << bit
            assert not verify_slice_tag(key, 1, 7, 42, bad, tag)
    flipped = bytearray(tag)
    flipped[5] ^= 0x01
    assert not verify_slice_tag(key, 1, 7, 42, slice_data, bytes(flipped))


def test_tag_rejects_other_shard_round_slice_key(slice_data):
    key = new_key()
    tag = slice_tag(key, 1, 7, 42, slice_data)
    assert not verify_slice_tag(key, 2, 7, 42, slice_data, tag)  # other shard
    assert not verify_slice_tag(key, 1, 8, 42, slice_data, tag)  # other round (replay)
    assert not verify_slice_tag(key, 1, 7, 43, slice_data, tag)  # other slice
    assert not verify_slice_tag(new_key(), 1, 7, 42, slice_data, tag)  # other key
    other_shard_tag = slice_tag(key, 2, 7, 42, slice_data)
    assert not verify_slice_tag(key, 1, 7, 42, slice_data, other_shard_tag)
    other_round_tag = slice_tag(key, 1, 6, 42, slice_data)
    assert not verify_slice_tag(key, 1, 7, 42, slice_data, other_round_tag)


def test_tag_binds_dtype_and_shape(slice_data):
    key = new_key()
    data = slice_data[:256]
    tag = slice_tag(key, 0, 0, 0, data)
    assert not verify_slice_tag(key, 0, 0, 0, data.reshape(16, 16), tag)
    assert not verify_slice_tag(key, 0, 0, 0, data.view(np.uint64), tag)
    assert not verify_slice_tag(key, 0, 0, 0, data.view(np.int32), tag)
    # byte order is canonicalised: same values, same tag
    assert verify_slice_tag(key, 0, 0, 0, data.astype(">i8"), tag)
    # non-contiguous views are tagged by value
    assert slice_tag(key, 0, 0, 0, data[::2]) == slice_tag(
        key, 0, 0, 0, data[::2].copy()
    )


def test_tag_rejects_malformed_tags(slice_data):
    key = new_key()
    tag = slice_tag(key, 1, 1, 1, slice_data)
    assert not verify_slice_tag(key, 1, 1, 1, slice_data, tag[:-1])
    assert not verify_slice_tag(key, 1, 1, 1, slice_data, None)
    assert not verify_slice_tag(key, 1, 1, 1, slice_data, tag.hex())


def test_tag_argument_errors(slice_data):
    with pytest.raises(ValueError):
        slice_tag(b"short", 0, 0, 0, slice_data)
    with pytest.raises(TypeError):
        slice_tag("not bytes" * 4, 0, 0, 0, slice_data)
    with pytest.raises(ValueError):
        slice_tag(new_key(), -1, 0, 0, slice_data)
    with pytest.raises(TypeError):
        slice_tag(new_key(), 1.5, 0, 0, slice_data)
    with pytest.raises(TypeError):
        slice_tag(new_key(), 0, 0, 0, np.array([object()]))
    assert slice_tag(bytes(32), np.int64(1), 2, 3, slice_data) == slice_tag(
        bytes(32), 1, 2, 3, slice_data
    )


def test_key_proof_accept_and_reject():
    key = new_key()
    nonce = new_nonce()
    proof = key_proof(key, nonce)
    assert len(proof) == 32
    assert verify_key_proof(key, nonce, proof)
    assert not verify_key_proof(new_key(), nonce, proof)  # wrong key
    assert not verify_key_proof(
        key, new_nonce(), proof
    )  # replay against a new challenge
    bad = bytearray(proof)
    bad[0] ^= 0x80
    assert not verify_key_proof(key, nonce, bytes(bad))
    assert not verify_key_proof(key, nonce, None)
    assert not verify_key_proof(key, nonce, proof[:16])
    with pytest.raises(ValueError):
        key_proof(key, b"short nonce")


def test_access_key_challenge_response_between_server_and_client():
    shard_key = new_key()
    client_key = access_key(shard_key, 17)  # handed to client 17 with its slice
    assert len(client_key) == 32 and client_key != shard_key
    assert client_key != access_key(shard_key, 18)
    nonce = new_nonce()  # client's challenge
    answer = key_proof(access_key(shard_key, 17), nonce)  # server re-derives
    assert verify_key_proof(client_key, nonce, answer)
    assert not verify_key_proof(
        client_key, nonce, key_proof(access_key(shard_key, 18), nonce)
    )
    assert not verify_key_proof(
        client_key, nonce, key_proof(access_key(new_key(), 17), nonce)
    )
    # domain separation: a slice tag or proof cannot stand in for the other
    assert key_proof(shard_key, nonce) != key_proof(client_key, nonce)
