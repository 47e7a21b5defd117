"""A damaged file in a SuperNode's node-dir costs exactly what it holds.

The client stores rounds 0, 1, 2 of a coded store under ``node-dir``, one file
is damaged, the node restarts (a fresh ``context.state``) and a shard server
fetches: the intact rounds come back, the damage is reported in the reply.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from coding import PRIME, access_key, key_proof, new_key, new_nonce, slice_tag
from history.files import DamagedFileError, decode_arrays, encode_arrays

STORE = "abc123"
PID = 5


def _context(node_dir, node_id=7):
    return Context(run_id=1, node_id=node_id,
                   node_config={"partition-id": PID, "num-partitions": 8,
                                "node-dir": str(node_dir)},
                   state=RecordDict(), run_config={})


def _store(context, keys, rnd, data):
    from client_app.app import app as client_app

    parts = np.split(data, len(keys))  # tag s covers shard s's part
    tags = [slice_tag(k, s, rnd, PID, parts[s]) for s, k in enumerate(keys)]
    content = RecordDict({
        "slice": ArrayRecord({"slice": Array(data)}),
        "config": ConfigRecord({"store": STORE, "round": rnd, "slice-index": PID,
                                "tags": tags,
                                "access-keys": [access_key(k, PID) for k in keys]})})
    reply = client_app(Message(content, dst_node_id=7, message_type="query.store_slice"),
                       context)
    assert not reply.has_error(), reply.error
    return tags


def _fetch(context, keys, shard=0, rounds=(0, 1, 2), nonce=None, proof_key=None):
    from client_app.app import app as client_app

    nonce = nonce or new_nonce()
    key = proof_key or access_key(keys[shard], PID)
    request = RecordDict({"request": ConfigRecord({
        "store": STORE, "shard": shard, "rounds": list(rounds), "nonce": nonce,
        "proof": key_proof(key, nonce)})})
    return client_app(Message(request, dst_node_id=7,
                              message_type="query.fetch_slices"), context)


@pytest.fixture
def stored(tmp_path):
    """Rounds 0, 1, 2 stored under node-dir by a first incarnation of the node."""
    keys = [new_key(), new_key()]
    context = _context(tmp_path)
    rng = np.random.default_rng(0)
    sent = {}
    for rnd in (0, 1, 2):
        data = rng.integers(0, PRIME, 500 + 2 * rnd, dtype=np.int64).astype(np.uint32)
        sent[rnd] = (data, _store(context, keys, rnd, data))
    return tmp_path / "slices" / STORE, keys, sent


def _assert_served(reply, sent, rounds, shard=0):
    assert not reply.has_error(), reply.error
    assert sorted(reply.content["slices"]) == sorted(f"r{r}" for r in rounds)
    assert reply.content["info"]["held"] == len(rounds)
    for rnd in rounds:
        data, tags = sent[rnd]  # only the requested shard's part comes back
        part = np.split(data, len(tags))[shard]
        assert reply.content["slices"][f"r{rnd}"].numpy().tobytes() == part.tobytes()
        assert reply.content["tags"][f"r{rnd}"] == tags[shard]


def _npz(**arrays):
    return encode_arrays(arrays)


def _garble(raw: bytes) -> bytes:
    out = bytearray(raw)
    for i in range(100, len(out), 97):
        out[i] ^= 0x5A
    return bytes(out)


def _wrong_member(raw: bytes) -> bytes:
    """The zip intact, one member's bytes replaced (a bad CRC)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as src, zipfile.ZipFile(buffer, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
    data = bytearray(buffer.getvalue())
    at = data.index(b"\x93NUMPY") + 200
    data[at] ^= 0xFF
    return bytes(data)


DAMAGES = {
    "truncated": lambda raw, _: raw[:len(raw) // 2],
    "empty": lambda raw, _: b"",
    "garbage bytes": lambda raw, _: np.random.default_rng(1).bytes(len(raw)),
    "garbled": lambda raw, _: _garble(raw),
    "bad crc": lambda raw, _: _wrong_member(raw),
    "bare npy": lambda raw, sent: _npy(sent),
    "wrong dtype": lambda raw, sent: _npz(slice=sent.astype(np.float64),
                                          tags=np.zeros((2, 32), np.uint8)),
    "2-d slice": lambda raw, sent: _npz(slice=sent.reshape(1, -1),
                                        tags=np.zeros((2, 32), np.uint8)),
    "no slice": lambda raw, _: _npz(tags=np.zeros((2, 32), np.uint8)),
    "short tags": lambda raw, sent: _npz(slice=sent, tags=np.zeros((2, 31), np.uint8)),
    "one tag": lambda raw, sent: _npz(slice=sent, tags=np.zeros((1, 32), np.uint8)),
}


def _npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_round_file_costs_that_round_only(stored, damage):
    folder, keys, sent = stored
    path = folder / "round-1.npz"
    path.write_bytes(DAMAGES[damage](path.read_bytes(), sent[1][0]))
    restarted = _context(folder.parents[1], node_id=9)  # fresh state, same node-dir
    reply = _fetch(restarted, keys, shard=1)
    _assert_served(reply, sent, [0, 2], shard=1)
    damaged = reply.content["damaged"]
    assert list(damaged) == ["r1"] and damaged["r1"].startswith("round-1.npz: ")
    assert "missing" not in reply.content["info"]


def test_a_missing_round_file_is_reported_missing(stored):
    folder, keys, sent = stored
    (folder / "round-1.npz").unlink()
    reply = _fetch(_context(folder.parents[1], node_id=9), keys, rounds=(0, 1, 2, 3))
    _assert_served(reply, sent, [0, 2])
    assert reply.content["info"]["missing"] == [1, 3]
    assert dict(reply.content["damaged"]) == {}


@pytest.mark.parametrize("damage", ["truncated", "garbage bytes", "wrong dtype",
                                    "missing"])
def test_a_damaged_access_file_costs_no_round(stored, damage):
    folder, keys, sent = stored
    path = folder / "access.npz"
    if damage == "missing":
        path.unlink()
    elif damage == "wrong dtype":
        path.write_bytes(_npz(keys=np.zeros((2, 32), np.int16), slice_index=np.int64(5)))
    else:
        path.write_bytes(DAMAGES[damage](path.read_bytes(), None))
    restarted = _context(folder.parents[1], node_id=9)
    reply = _fetch(restarted, keys)
    _assert_served(reply, sent, [0, 1, 2])
    assert reply.content["info"]["slice-index"] == PID
    reason = reply.content["damaged"]["access"]
    assert reason.startswith("access.npz: ") and "keys taken from the round files" in reason
    # the recovered keys still demand a valid proof
    wrong = _fetch(restarted, keys, proof_key=access_key(keys[0], PID + 1))
    assert wrong.has_error() and "does not verify" in wrong.error.reason
    # the next slice stored repairs access.npz
    _store(restarted, keys, 3, np.arange(1, 9, dtype=np.uint32))
    again = _fetch(_context(folder.parents[1], node_id=11), keys)
    assert dict(again.content["damaged"]) == {}


def test_every_file_damaged_is_a_clear_refusal(stored):
    folder, keys, _ = stored
    for path in folder.iterdir():
        path.write_bytes(b"\0" * 10)
    reply = _fetch(_context(folder.parents[1], node_id=9), keys)
    assert reply.has_error() and "holds no slices" in reply.error.reason
    assert "access.npz: not a readable .npz archive" in reply.error.reason


def test_a_damaged_nonce_file_is_reported_and_rewritten(stored):
    folder, keys, sent = stored
    first = _fetch(_context(folder.parents[1], node_id=9), keys)
    assert dict(first.content["damaged"]) == {}
    (folder / "nonces.npz").write_bytes(b"PK\x03\x04 truncated")
    nonce = new_nonce()
    restarted = _context(folder.parents[1], node_id=10)
    reply = _fetch(restarted, keys, nonce=nonce)
    _assert_served(reply, sent, [0, 1, 2])
    assert "nonces.npz" in reply.content["damaged"]["nonces"]
    assert "forgotten" in reply.content["damaged"]["nonces"]
    # rewritten: readable again, and this nonce is remembered across a restart
    replay = _fetch(_context(folder.parents[1], node_id=11), keys, nonce=nonce)
    assert replay.has_error() and "used before" in replay.error.reason


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_decoding_damaged_bytes_raises_only_damaged_file_error(data):
    good = encode_arrays({"slice": np.arange(300, dtype=np.uint32),
                          "tags": np.zeros((2, 32), np.uint8)})
    mode = data.draw(st.sampled_from(["truncate", "flip", "random"]))
    if mode == "truncate":
        raw = good[:data.draw(st.integers(0, len(good) - 1))]
    elif mode == "flip":
        raw = bytearray(good)
        for at in data.draw(st.lists(st.integers(0, len(good) - 1), min_size=1,
                                     max_size=4)):
            raw[at] ^= data.draw(st.integers(1, 255))
        raw = bytes(raw)
    else:
        raw = data.draw(st.binary(max_size=400))
    try:
        out = decode_arrays(raw)
    except DamagedFileError:
        return
    assert isinstance(out, dict)  # a flip the archive format does not notice
