import numpy as np
import pytest

from history.store import CorruptBlobError, HistoryStore, StoreError


def arrays(seed):
    rng = np.random.default_rng(seed)
    return {"conv.weight": rng.normal(size=(4, 1, 3, 3)).astype(np.float32),
            "fc.bias": rng.normal(size=(10,)).astype(np.float32)}


def test_round_trip_and_catalog(tmp_path):
    store = HistoryStore.create(tmp_path / "h", {0: 0, 1: 0, 2: 1}, num_shards=2)
    store.put_shard_model(0, 0, arrays(0))
    store.put_update(0, 1, 1, arrays(1), num_examples=60, train_seconds=0.5)
    store.put_update(0, 1, 0, arrays(2), num_examples=40, train_seconds=0.25)
    store.put_shard_model(0, 1, arrays(3))
    store.mark_complete()
    store.close()
    again = HistoryStore.open(tmp_path / "h")
    for key, value in arrays(1).items():
        np.testing.assert_array_equal(again.update(0, 1, 1)[key], value)
    assert list(again.shard_model(0, 0)) == ["conv.weight", "fc.bias"]
    assert again.participants(0, 1) == [(0, 40), (1, 60)]
    assert again.rounds(0) == [1] and again.rounds(1) == []
    assert again.client_shard() == {0: 0, 1: 0, 2: 1}
    assert again.meta("num_shards") == "2"
    blob_bytes = sum(p.stat().st_size for p in (tmp_path / "h" / "blobs").iterdir())
    assert again.total_bytes() > blob_bytes > 0
    assert again.verify() == []


def test_checksum_failure_names_round_and_client(tmp_path):
    store = HistoryStore.create(tmp_path / "h", {5: 0})
    store.put_update(0, 3, 5, arrays(1), 10, 0.1)
    store.mark_complete()
    blob = tmp_path / "h" / "blobs" / "update_s0_r3_c5.npz"
    data = bytearray(blob.read_bytes())
    data[-20] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(CorruptBlobError, match="client 5, shard 0, round 3"):
        store.update(0, 3, 5)
    assert store.verify() == ["update_s0_r3_c5.npz: checksum mismatch"]


def test_incomplete_store_is_refused(tmp_path):
    store = HistoryStore.create(tmp_path / "h", {0: 0})
    store.put_shard_model(0, 0, arrays(0))
    with pytest.raises(StoreError, match="incomplete"):
        HistoryStore.open(tmp_path / "h")
    assert HistoryStore.open(tmp_path / "h", require_complete=False).state == "writing"


def test_existing_store_is_not_overwritten(tmp_path):
    HistoryStore.create(tmp_path / "h", {0: 0}).mark_complete()
    with pytest.raises(StoreError, match="not overwriting"):
        HistoryStore.create(tmp_path / "h", {0: 0})


def test_missing_entries_raise(tmp_path):
    store = HistoryStore.create(tmp_path / "h", {0: 0})
    with pytest.raises(StoreError, match="no update of client 0"):
        store.update(0, 1, 0)
    with pytest.raises(StoreError, match="no model of shard 0"):
        store.shard_model(0, 1)
