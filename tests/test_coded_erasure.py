"""Erasure in coded storage: rounds re-coded without a forgotten client, part by part.

A shard's server re-codes each round a forgotten client took part in and sends every
holder its new part with a proof of the shard's key bound to the part; the client
replaces that part only. A holder that did not confirm is stale for that round and
is never read again.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import InProcessGrid, set_task_identity
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from coding import access_key, key_proof, new_nonce, slice_tag
from history import CodedHistory, CodedRecorder
from history.coded import slices as client_slices
from history.coded.erasure import erase_coded
from server_app.rounds.federation import Federation

SHARDS = [[0, 1, 2], [3, 4, 5]]
NODE_OF = {p: 1000 + p for p in range(6)}
SIZE = 40


def _history(tmp_path, privacy_t: int = 0):
    """Rounds 0-2 of 2 shards coded on 6 in-process clients; (grid, history, truth)."""
    from client_app.app import app as client_app

    set_task_identity()
    grid = InProcessGrid(client_app, 6, {})
    recorder = CodedRecorder.create(tmp_path / "h", Federation(NODE_OF, SHARDS),
                                    blocks_per_shard=2, scale_bits=20,
                                    privacy_t=privacy_t)
    rng, truth = np.random.default_rng(5), {}
    for s in range(2):
        recorder.put_shard_model(s, 0, {"w": rng.normal(size=SIZE).astype(np.float32)})
    recorder.end_round(0, grid)
    for rnd in (1, 2):
        for s, pids in enumerate(SHARDS):
            for pid in pids:
                update = {"w": rng.normal(scale=0.1, size=SIZE).astype(np.float32)}
                truth[(s, rnd, pid)] = update["w"]
                recorder.put_update(s, rnd, pid, update, 10 + pid, 0.1)
            recorder.put_shard_model(s, rnd, {"w": np.zeros(SIZE, np.float32)})
        recorder.end_round(rnd, grid)
    recorder.mark_complete()
    recorder.close()
    return grid, CodedHistory.open(tmp_path / "h", grid, NODE_OF), truth


@pytest.mark.parametrize("privacy_t", [0, 1])
def test_a_recoded_round_decodes_without_the_client_and_the_rest_exactly(
        tmp_path, privacy_t):
    grid, history, truth = _history(tmp_path, privacy_t)
    before = {g: history.update(0, g, 0) for g in (1, 2)}
    history.take_retrieval()
    other_shard = {g: history.update(1, g, 3)["w"].copy() for g in (1, 2)}
    history.take_retrieval()
    report = erase_coded(history, [1])
    assert report["updates"] == [[0, 1, 1], [0, 2, 1]] and report["stale"] == []
    assert report["rounds_recoded"] == [[0, 1], [0, 2]]
    assert all(nodes == list(range(6)) for nodes in report["nodes"].values())
    reopened = CodedHistory.open(tmp_path / "h", grid, NODE_OF)
    for g in (1, 2):
        assert reopened.record_members(0, g) == [0, 2]
        with pytest.raises(Exception, match="no update of client 1"):
            reopened.update(0, g, 1)
        assert np.array_equal(reopened.update(0, g, 0)["w"], before[g]["w"])
        assert np.allclose(reopened.update(0, g, 2)["w"], truth[(0, g, 2)], atol=2**-19)
        assert np.array_equal(reopened.update(1, g, 3)["w"], other_shard[g])
    # the participation is still known (SE replays from a forgotten client's first round)
    assert 1 in [p for p, _ in reopened.participants(0, 1)]


def test_a_holder_absent_during_the_recoding_is_stale_and_never_read_again(tmp_path):
    grid, history, truth = _history(tmp_path)
    grid.absent = {NODE_OF[4]}  # shard 1's recoding cannot reach client 4
    report = erase_coded(history, [3])
    grid.absent = set()
    assert sorted(report["stale"]) == [[1, 1, 4], [1, 2, 4]]
    reopened = CodedHistory.open(tmp_path / "h", grid, NODE_OF)
    assert reopened.stale_holders(1) == {1: {4}, 2: {4}}
    # clients 3 and 4 would be asked first: 4's old part must not be mixed in
    grid.absent = {NODE_OF[p] for p in (0, 1, 2)}
    for g in (1, 2):  # decoded from 3 and 5; client 4's old part is not used
        assert np.allclose(reopened.update(1, g, 5)["w"], truth[(1, g, 5)], atol=2**-19)


def _replace_request(key: bytes, shard: int, rnd: int, pid: int, part: np.ndarray,
                     nonce: bytes | None = None) -> RecordDict:
    nonce = nonce or new_nonce()
    request = ConfigRecord({
        "store": "s", "shard": shard, "round": rnd, "nonce": nonce,
        "tag": slice_tag(key, shard, rnd, pid, part),
        "proof": key_proof(access_key(key, pid),
                           client_slices.part_proof_message(nonce, part))})
    return RecordDict({"part": ArrayRecord({"part": Array(part)}), "request": request})


def test_a_client_replaces_only_the_part_a_valid_bound_proof_names(tmp_path):
    from flwr.app import Context

    keys = [b"k" * 32, b"j" * 32]
    context = Context(run_id=1, node_id=1, node_config={"node-dir": str(tmp_path)},
                      state=RecordDict(), run_config={})
    data = np.arange(8, dtype=np.uint32)
    tags = [slice_tag(k, s, 1, 2, data[s * 4:(s + 1) * 4]) for s, k in enumerate(keys)]
    client_slices.store(RecordDict({
        "slice": ArrayRecord({"slice": Array(data)}),
        "config": ConfigRecord({"store": "s", "round": 1, "slice-index": 2,
                                "tags": tags, "access-keys": [access_key(k, 2)
                                                              for k in keys]})}),
        context)
    new = np.array([9, 9, 9, 9], np.uint32)
    with pytest.raises(client_slices.SliceAccessError, match="does not verify"):
        client_slices.replace(_replace_request(keys[1], 0, 1, 2, new), context)
    forged = _replace_request(keys[0], 0, 1, 2, new)  # the proof names another part
    forged.array_records["part"]["part"] = Array(new + 1)
    with pytest.raises(client_slices.SliceAccessError, match="does not verify"):
        client_slices.replace(forged, context)
    with pytest.raises(client_slices.SliceFormatError, match="parts of 4"):
        client_slices.replace(_replace_request(keys[0], 0, 1, 2, new[:3]), context)
    with pytest.raises(client_slices.SliceAccessError, match="no slice of round 7"):
        client_slices.replace(_replace_request(keys[0], 0, 7, 2, new), context)
    nonce = new_nonce()
    client_slices.replace(_replace_request(keys[0], 0, 1, 2, new, nonce), context)
    with pytest.raises(client_slices.SliceAccessError, match="used before"):
        client_slices.replace(_replace_request(keys[0], 0, 1, 2, new, nonce), context)
    # a restarted node (fresh state) serves the new part 0 and the old part 1
    fresh = Context(run_id=1, node_id=1, node_config={"node-dir": str(tmp_path)},
                    state=RecordDict(), run_config={})
    for shard, want in ((0, new), (1, data[4:])):
        nonce = new_nonce()
        reply = client_slices.fetch(RecordDict({"request": ConfigRecord({
            "store": "s", "shard": shard, "rounds": [1], "nonce": nonce,
            "proof": key_proof(access_key(keys[shard], 2), nonce)})}), fresh)
        got = reply.array_records["slices"]["r1"].numpy()
        assert np.array_equal(got, want)
        assert reply.config_records["tags"]["r1"] == slice_tag(keys[shard], shard, 1, 2,
                                                               want)
