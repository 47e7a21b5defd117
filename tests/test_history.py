import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

from history import (
    CodedHistory,
    CodedRecorder,
    RoundRecorder,
    SQLiteCatalog,
    TrainingHistory,
    storage_summary,
)
from history.coded.catalog import CodedCatalog
from history.storage import (
    StorageSettings,
)
from history.store import CorruptBlobError, HistoryStore, StoreError
from runstore.catalog import RunLog
from strategies.unlearning import HistoryReader

ROOT = Path(__file__).resolve().parents[1]


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


# ---- one SQLite catalog base --------------------------------------------------
class _Notes(SQLiteCatalog):
    SCHEMA = "CREATE TABLE IF NOT EXISTS facts (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    PRAGMAS = ("page_size = 1024",)
    META_TABLE = "facts"
    KIND = "notes"


def test_catalog_base_connects_creates_and_keeps_facts(tmp_path):
    path = tmp_path / "notes.sqlite"
    conn = _Notes.connect(path)
    _Notes.create_schema(conn, [("a", 1), ("b", "two")])
    notes = _Notes(path, conn)
    assert notes.meta("a") == "1" and notes.get_meta("b") == "two"
    assert notes.get_meta("c") is None and notes.get_meta("c", "-") == "-"
    with pytest.raises(StoreError, match=r"notes at .* has no meta 'c'"):
        notes.meta("c")
    with notes._conn:
        notes.set_meta("a", "3")
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 1024
    assert notes.catalog_bytes() == path.stat().st_size > 0
    notes.close()
    again = _Notes(path, _Notes.connect(path))
    _Notes.create_schema(again._conn)  # IF NOT EXISTS: an existing catalog is kept
    assert again.meta("a") == "3" and _Notes.lookup(again._conn, "b") == "two"
    again.close()


def test_every_catalog_uses_the_base():
    assert all(issubclass(cls, SQLiteCatalog)
               for cls in (HistoryStore, CodedCatalog, CodedRecorder, CodedHistory, RunLog))
    connects = [str(p.relative_to(ROOT)) for folder in ("history", "server_app")
                for p in sorted((ROOT / folder).rglob("*.py"))
                if "sqlite3.connect(" in p.read_text()]
    assert connects == ["history/catalog.py"]


# ---- one typed interface -------------------------------------------------------
def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_both_histories_implement_the_training_history():
    for cls in (HistoryStore, CodedHistory):
        assert issubclass(cls, TrainingHistory) and not inspect.isabstract(cls), cls
    for cls in (HistoryStore, CodedRecorder):
        assert issubclass(cls, RoundRecorder) and not inspect.isabstract(cls), cls
    # strategies keep their own Protocol (no history import): every training
    # history serves it with the same verbs and parameters
    reader = [n for n, v in vars(HistoryReader).items()
              if inspect.isfunction(v) and not n.startswith("_")]
    assert sorted(reader) == ["participants", "rounds", "update"]
    for name in reader:
        want = _parameters(getattr(HistoryReader, name))
        assert _parameters(getattr(TrainingHistory, name)) == want
        for cls in (HistoryStore, CodedHistory):
            assert _parameters(getattr(cls, name)) == want, (cls, name)


def test_uncoded_history_fetches_nothing_and_reports_its_bytes(tmp_path):
    store = HistoryStore.create(tmp_path / "h", {0: 0})
    store.put_update(0, 1, 0, arrays(1), 10, 0.1)
    store.mark_complete()
    assert store.take_retrieval() is None
    assert store.accounting() is None and store.retrievals() == []
    cfg = StorageSettings(mode="uncoded", link_rate_mbps=100.0, num_shards=1,
                          blocks_per_shard=5, privacy_t=0, num_clients=8,
                          calibration_interval=1)
    summary = storage_summary(cfg, store, store)
    assert summary["server_bytes"] == store.total_bytes() == summary["FE"]["server_bytes"]
    assert summary["SE_uncoded"]["source"] == "store" and summary["SE_coded"] is None
    assert "comm" not in summary


# ---- atomic files ------------------------------------------------------------
_WRITERS = {"write_bytes", "write_text", "save", "savez", "savez_compressed", "dump",
            "mkstemp", "NamedTemporaryFile"}


def _file_writes(path) -> list[str]:
    """Calls in ``path`` that write a file other than through history.files."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        mode = node.args[1] if len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg == "mode"), None)
        writes_open = name == "open" and isinstance(mode, ast.Constant) and \
            any(c in str(mode.value) for c in "wax+")
        if name in _WRITERS or writes_open:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_every_file_write_is_atomic():
    """history/ and server_app/ write files only via history.files' atomic writers.

    (zip members opened for writing in a memory buffer in files.py and the run
    lock, a file locked in place, are the exceptions.)
    """
    found = [w for folder in ("history", "server_app")
             for p in sorted((ROOT / folder).rglob("*.py"))
             if p.name != "files.py" for w in _file_writes(p)]
    assert found == []
    assert sorted(w.split()[-1] for w in _file_writes(ROOT / "history" / "files.py")) \
        == ["mkstemp", "open"]
