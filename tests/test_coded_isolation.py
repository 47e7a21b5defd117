"""Coded storage keeps shards apart: a shard's server sees and decodes only its own.

Each shard's record is coded on its own (K data blocks + T padding blocks), a
client returns only the requested shard's part of its slice, so everything a
shard's server receives is a function of its own shard's parameters (and of the
padding) alone; two federations that differ only in the other shards' updates
give it byte-identical replies.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import InProcessGrid, set_task_identity

from coding import dequantize, quantize
from history import CodedHistory, CodedRecorder
from server_app.rounds.federation import Federation

SHARDS = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
NODE_OF = {p: 1000 + p for p in range(9)}


class RecordingGrid(InProcessGrid):
    """An in-process grid that keeps every reply's arrays (what the server receives)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.received: list[tuple[str, bytes]] = []

    def send_and_receive(self, messages, *args, **kwargs):  # noqa: D102 - Grid API
        replies = list(super().send_and_receive(messages, *args, **kwargs))
        for reply in replies:
            if reply.has_error():
                continue
            for name, record in reply.content.array_records.items():
                for key, array in record.items():
                    self.received.append((f"{name}/{key}", array.numpy().tobytes()))
        return replies


def _record(tmp_path, other_seed: int, privacy_t: int):
    """3 shards, rounds 0-1; shard 0's data fixed, shards 1-2 from ``other_seed``."""
    from client_app.app import app as client_app

    set_task_identity()
    grid = RecordingGrid(client_app, 9, {})
    recorder = CodedRecorder.create(tmp_path, Federation(NODE_OF, SHARDS),
                                    blocks_per_shard=3, scale_bits=20,
                                    privacy_t=privacy_t)
    recorder.padding_rng = np.random.default_rng(11)
    mine, others = np.random.default_rng(3), np.random.default_rng(other_seed)
    truth = {}
    for s in range(3):
        rng = mine if s == 0 else others
        recorder.put_shard_model(s, 0, {"w": rng.normal(size=50).astype(np.float32)})
    recorder.end_round(0, grid)
    for s, pids in enumerate(SHARDS):
        rng = mine if s == 0 else others
        for pid in pids:
            truth[(s, pid)] = {"w": rng.normal(size=50).astype(np.float32)}
            recorder.put_update(s, 1, pid, truth[(s, pid)], 10, 0.1)
    recorder.end_round(1, grid)
    recorder.mark_complete()
    recorder.close()
    grid.received.clear()  # from here on: what shard 0's server receives
    return grid, truth


@pytest.mark.parametrize("privacy_t", [0, 2])
def test_a_shard_server_receives_nothing_of_another_shard(tmp_path, privacy_t):
    views = []
    for other_seed in (5, 6):  # the other shards' parameters differ, shard 0's do not
        grid, truth = _record(tmp_path / f"s{other_seed}", other_seed, privacy_t)
        history = CodedHistory.open(tmp_path / f"s{other_seed}", grid, NODE_OF)
        for pid in SHARDS[0]:
            got = history.update(0, 1, pid)["w"]
            np.testing.assert_array_equal(got, dequantize(quantize(truth[(0, pid)]["w"],
                                                                   20), 20))
        assert list(history._cache) == [0]  # only shard 0 was decoded
        # K + T slices of each round came back, each one part of B elements
        assert len(grid.received) == 2 * (3 + privacy_t)
        whole = history.coded_rounds()
        assert sorted({len(b) // 4 for _, b in grid.received}) == \
            sorted(set(whole.values()))
        views.append(sorted(grid.received))
        history.close()
    assert views[0] == views[1]  # byte-identical: independent of shards 1 and 2


def test_a_store_of_the_older_single_code_layout_is_refused(tmp_path):
    import sqlite3

    from history import StoreError

    grid, _ = _record(tmp_path / "h", 5, 0)
    with sqlite3.connect(tmp_path / "h" / "catalog.sqlite") as conn:
        conn.execute("DELETE FROM meta WHERE key = 'code'")
    with pytest.raises(StoreError, match="one code over all shards"):
        CodedHistory.open(tmp_path / "h", grid, NODE_OF)


def test_client_bytes_stay_flat_as_clients_grow():
    """K chosen from C: one client's share of a round is S records / K, flat in C."""
    from history.coded.catalog import auto_blocks_per_shard

    shares = []
    for clients in (20, 100, 200, 1000):
        k = auto_blocks_per_shard(clients, 2, 0.5)
        assert k + 2 <= clients // 2  # half the slices may be lost
        record = clients // 5 * 80_202  # C / 5 updates a round, all shards together
        shares.append(record / k)
    assert max(shares) / min(shares) < 1.25
