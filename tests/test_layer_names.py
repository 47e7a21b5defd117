"""Layer names are data, not keywords: every store and message path keeps any name.

A parameter's name is whatever a user's ``torch.nn.Module`` gives it: dotted paths
whose segments are any non-empty text without ``.`` (torch refuses ``.`` and ``''``
and nothing else but the module's own attributes). Names such as ``allow_pickle``,
``file``, ``a/b``, ``shard0/x``, ``arr_0`` or ``names.json`` once became keywords
of ``np.savez`` (lost or a TypeError); here each store and path must give back the
exact names, in order, with their dtypes, shapes and values.
"""

from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coding import dequantize, quantize
from experiments.grid import InProcessGrid, set_task_identity
from history.coded.reader import CodedHistory
from history.coded.recorder import CodedRecorder
from history.files import DamagedFileError, decode_arrays, encode_arrays, read_arrays
from history.store import HistoryStore
from runstore.folder import RunFolder
from server_app.rounds.federation import Federation
from strategies.sharded import (
    IsolationError,
    pack_shards,
    to_numpy,
    to_record,
    unpack_shards,
)

SETTINGS = settings(derandomize=True, max_examples=25, deadline=None)
STORE_SETTINGS = settings(derandomize=True, max_examples=12, deadline=None)
"""Fewer examples where each writes a store (fsync'ed files, a catalog)."""
SCALE_BITS = 16
SPECIAL = ["allow_pickle", "file", "a/b", "shard0/x", "shard1", "arr_0", "arr_1",
           "names", "json", "npy", "0", "1e3", "-1", " ", "ü ñ 東京", "\x00", "\n",
           "x" * 300, "kwds", "args", "__proto__"]
"""Segments that once broke a store (np.savez keywords, its positional names,
our manifest's name) or look like something else: numbers, blanks, controls."""
DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.bool_, np.uint8]

segments = st.one_of(st.sampled_from(SPECIAL),
                     st.text(st.characters(exclude_characters="."), min_size=1,
                             max_size=12))
names = st.one_of(st.sampled_from(["names.json", "0.npy", "bn.num_batches_tracked"]),
                  st.lists(segments, min_size=1, max_size=3).map(".".join))


@st.composite
def named_arrays(draw) -> dict[str, np.ndarray]:
    """Distinct names -> small arrays (0-d and empty too) of the DTYPES, in order."""
    keys = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    out = {}
    for key in keys:
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = draw(st.sampled_from([(), (0,), (3,), (2, 0), (2, 3)]))
        values = np.asarray(draw(st.lists(st.integers(-8, 8), min_size=6, max_size=6)))
        flat = values if dtype.kind in "iu" else values / 8.0
        flat = np.abs(flat) if dtype.kind == "u" else flat
        out[key] = flat[:int(np.prod(shape))].reshape(shape).astype(dtype)
    return out


def assert_same(got: dict, want: dict) -> None:
    """Exact names in order, dtypes, shapes and bytes."""
    assert list(got) == list(want)
    for key, value in want.items():
        value = np.asarray(value)
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert got[key].tobytes() == value.tobytes(), key


def _shifted(arrays: dict) -> dict:
    """The same names, other values: a second model or an update."""
    return {k: (v == 0) if v.dtype == np.bool_ else (v + 1).astype(v.dtype)
            for k, v in arrays.items()}


# ---- what torch allows -------------------------------------------------------
@pytest.mark.parametrize("bad", ["", "a.b"])
def test_torch_refuses_only_empty_and_dotted_names(bad):
    module = torch.nn.Module()
    with pytest.raises(KeyError):
        module.register_parameter(bad, torch.nn.Parameter(torch.ones(1)))
    with pytest.raises(KeyError):
        module.register_buffer(bad, torch.ones(1))
    with pytest.raises(KeyError):
        module.add_module(bad, torch.nn.Module())
    for name in SPECIAL:  # all of ours are names torch accepts
        module.register_buffer(name, torch.ones(1))
    assert list(module.state_dict()) == SPECIAL


def _module(arrays: dict) -> torch.nn.Module:
    """A module whose state_dict holds ``arrays`` (floats as parameters)."""
    root = torch.nn.Module()
    for name, value in arrays.items():
        *path, leaf = name.split(".")
        owner = root
        for part in path:
            if part not in owner._modules:
                owner.add_module(part, torch.nn.Module())
            owner = owner._modules[part]
        tensor = torch.from_numpy(value.copy())
        if value.dtype.kind == "f":
            owner.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))
        else:
            owner.register_buffer(leaf, tensor)
    return root


# ---- stores ------------------------------------------------------------------
@settings(derandomize=True, max_examples=60, deadline=None)
@given(named_arrays())
def test_any_names_round_trip_the_archive(arrays):
    assert_same(decode_arrays(encode_arrays(arrays)), arrays)
    assert encode_arrays(arrays) == encode_arrays(arrays)  # stable bytes, checksums


@STORE_SETTINGS
@given(named_arrays())
def test_any_names_round_trip_the_uncoded_history(arrays):
    update = _shifted(arrays)
    with tempfile.TemporaryDirectory() as tmp:
        store = HistoryStore.create(Path(tmp) / "h", {0: 0})
        store.put_shard_model(0, 0, arrays)
        store.put_update(0, 1, 0, update, 5, 0.1)
        store.mark_complete()
        store.close()
        store = HistoryStore.open(Path(tmp) / "h")
        assert_same(store.shard_model(0, 0), arrays)
        assert_same(store.update(0, 1, 0), update)
        assert store.verify() == []
        store.close()


@STORE_SETTINGS
@given(named_arrays())
def test_any_names_round_trip_saved_models_and_shard_packing(arrays):
    want = [arrays, _shifted(arrays)]
    models = [to_record(w) for w in want]
    for got, model in zip(models, want, strict=True):
        assert_same(to_numpy(got), model)
    for got, model in zip(unpack_shards(pack_shards(models), 2), want, strict=True):
        assert_same(to_numpy(got), model)
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(Path(tmp))
        record = folder.save_models("SE", models)
        for got, model in zip(folder.load_models("SE", record), want, strict=True):
            assert_same(to_numpy(got), model)


def _coded_round_trip(arrays: dict, node_dirs: Path | None) -> None:
    """Record W^0 and an update coded, read both back: names, dtypes, shapes exact.

    ``node_dirs``: the clients' slices also go to ``<node_dirs>/<p>`` (slice
    files), and a fresh grid (empty node states, as after a restart) reads them
    back from there; None: the slices live in the nodes' state only.
    """
    from client_app.app import app as client_app

    set_task_identity()
    update = _shifted(arrays)
    run_config = {"node-dirs": str(node_dirs)} if node_dirs else {}
    grid = InProcessGrid(client_app, 3, run_config)
    node_of = {p: 1000 + p for p in range(3)}
    with tempfile.TemporaryDirectory() as tmp:
        recorder = CodedRecorder.create(Path(tmp) / "h", Federation(node_of, [[0, 1, 2]]),
                                        blocks_per_shard=2, scale_bits=SCALE_BITS)
        recorder.put_shard_model(0, 0, arrays)
        recorder.end_round(0, grid)
        recorder.put_update(0, 1, 1, update, 5, 0.1)
        recorder.end_round(1, grid)
        recorder.mark_complete()
        recorder.close()
        if node_dirs:  # every client wrote both rounds; read back by fresh nodes
            for p in range(3):
                (store,) = (node_dirs / str(p) / "slices").iterdir()
                assert sorted(f.name for f in store.glob("round-*.npz")) == [
                    "round-0.npz", "round-1.npz"]
            grid = InProcessGrid(client_app, 3, run_config)
        history = CodedHistory.open(Path(tmp) / "h", grid, node_of)
        for got, want in ((history.shard_model(0, 0), arrays),
                          (history.update(0, 1, 1), update)):
            assert_same(got, {k: dequantize(quantize(v.astype(np.float32), SCALE_BITS),
                                            SCALE_BITS).astype(v.dtype)
                              for k, v in want.items()})
        if node_dirs:  # the fresh nodes hold no slice in state: they came from files
            assert not any(ctx.state.array_records for ctx in grid.contexts.values())
        history.close()


@STORE_SETTINGS
@given(named_arrays())
def test_any_names_round_trip_the_coded_history(arrays):
    """Names, dtypes and shapes exact; values on the quantisation grid."""
    _coded_round_trip(arrays, None)


@STORE_SETTINGS
@given(named_arrays())
def test_any_names_round_trip_coded_slices_in_node_folders(arrays):
    """The same with the slices in node folders, decoded from the files alone.

    Slice files hold fixed keys only (``slice``, ``tags``, ``keys``,
    ``slice_index``; :mod:`history.coded.slice_files`): the layer names live in the
    coded catalog's layout, so this checks the path names take through files.
    The node cache (:mod:`task.node_cache`) stores fixed keys too (``x``, ``y``,
    ``num_classes``) and holds no layer; it needs no case here.
    """
    with tempfile.TemporaryDirectory() as nodes:
        _coded_round_trip(arrays, Path(nodes))


# ---- messages ----------------------------------------------------------------
def _over_the_wire(record: ArrayRecord) -> ArrayRecord:
    """``record`` after Flower's protobuf serialisation (what a deployment sends)."""
    proto = recorddict_to_proto(RecordDict({"arrays": record}))
    return recorddict_from_proto(proto)["arrays"]


@SETTINGS
@given(named_arrays())
def test_any_torch_names_round_trip_flower_messages(arrays):
    """state_dict -> ArrayRecord -> wire -> state_dict, as the ClientApp does."""
    try:
        module = _module(arrays)
    except KeyError:  # torch refuses it here: 'a' and 'a.b', or an attribute name
        assume(False)
    want = {k: arrays[k] for k in module.state_dict()}  # torch's order
    assert set(want) == set(arrays)
    sent = _over_the_wire(ArrayRecord(module.state_dict()))
    fresh = _module({k: np.zeros_like(v) for k, v in arrays.items()})
    fresh.load_state_dict(sent.to_torch_state_dict(), strict=True)
    assert_same({k: v.numpy() for k, v in fresh.state_dict().items()}, want)
    packed = _over_the_wire(pack_shards([ArrayRecord(module.state_dict())] * 2))
    for shard in unpack_shards(packed, 2):
        assert_same(to_numpy(shard), want)


# ---- the names that broke np.savez ---------------------------------------------
@pytest.mark.parametrize("name", ["allow_pickle", "file"])
def test_np_savez_keywords_are_kept_in_every_store(name, tmp_path):
    arrays = {"conv.weight": np.ones((2, 2), np.float32),
              name: np.arange(3, dtype=np.float32)}
    store = HistoryStore.create(tmp_path / "h", {0: 0})
    store.put_shard_model(0, 0, arrays)
    store.mark_complete()
    assert_same(HistoryStore.open(tmp_path / "h").shard_model(0, 0), arrays)
    folder = RunFolder(tmp_path)
    record = folder.save_models("SE", [to_record(arrays)])
    assert_same(to_numpy(folder.load_models("SE", record)[0]), arrays)
    set_task_identity()
    node_of = {p: 1000 + p for p in range(2)}
    recorder = CodedRecorder.create(tmp_path / "c", Federation(node_of, [[0, 1]]),
                                    blocks_per_shard=1)
    recorder.put_shard_model(0, 0, arrays)  # raised TypeError for 'file'
    assert [n for n, _, _ in recorder.layout.layers] == list(arrays)
    recorder.close()


# ---- the older format, and damage ------------------------------------------------
def _old_format(arrays: dict) -> bytes:
    """What the project wrote before names moved into a manifest."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_files_of_the_older_format_are_still_read(tmp_path, monkeypatch):
    """A run folder written before the manifest (resume reads it): store and models."""
    arrays = {"conv.weight": np.ones((2, 3), np.float32),
              "bn.num_batches_tracked": np.int64(7), "fc.bias": np.zeros(0, np.float16)}
    assert_same(decode_arrays(_old_format(arrays)), arrays)
    with monkeypatch.context() as old:  # the writers as they were
        old.setattr("history.files.encode_arrays", _old_format)
        old.setattr("history.store.encode_arrays", _old_format)
        store = HistoryStore.create(tmp_path / "h", {0: 0})
        store.put_shard_model(0, 0, arrays)
        store.mark_complete()
        store.close()
        record = RunFolder(tmp_path).save_models("SE", [to_record(arrays)])
    with zipfile.ZipFile(tmp_path / "models" / "SE.npz") as written:
        assert "names.json" not in written.namelist()  # really the old format
    assert_same(HistoryStore.open(tmp_path / "h").shard_model(0, 0), arrays)
    assert_same(to_numpy(RunFolder(tmp_path).load_models("SE", record)[0]), arrays)


def _rezip(raw: bytes, edit) -> bytes:
    """``raw``'s members after ``edit(name, data) -> (name, data) or None``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as src, zipfile.ZipFile(buffer, "w") as dst:
        for info in src.infolist():
            kept = edit(info.filename, src.read(info))
            if kept is not None:
                dst.writestr(*kept)
    return buffer.getvalue()


@pytest.mark.parametrize("edit", [
    lambda n, d: None if n == "1.npy" else (n, d),  # a member lost
    lambda n, d: (n, b'["a", "a"]') if n == "names.json" else (n, d),  # duplicates
    lambda n, d: (n, b'{"a": 1}') if n == "names.json" else (n, d),  # not a list
    lambda n, d: (n, b'["a", "b", "c"]') if n == "names.json" else (n, d),  # too many
])
def test_a_manifest_that_disagrees_with_its_members_is_damage(edit):
    raw = encode_arrays({"a": np.ones(2), "b": np.zeros(1)})
    with pytest.raises(DamagedFileError, match="not a readable"):
        decode_arrays(_rezip(raw, edit))


def test_names_must_be_text_and_arrays_plain(tmp_path):
    with pytest.raises(TypeError, match="array name 3 is not allowed"):
        encode_arrays({3: np.ones(1)})
    with pytest.raises(ValueError, match="pickle"):
        encode_arrays({"a": np.array([None], dtype=object)})
    assert read_arrays(tmp_path / "absent.npz") is None


@pytest.mark.parametrize("key", ["shard01/x", "shard\u0663/x", "shardx/y", "shard0",
                                 "0/x", "Shard0/x"])
def test_packed_keys_name_their_shard_exactly(key):
    with pytest.raises(IsolationError, match="names no shard"):
        unpack_shards(to_record({key: np.ones(1)}), 2)


def test_a_layer_named_like_a_shard_stays_in_its_own_shard():
    packed = pack_shards([to_record({"shard1/x": np.ones(1)}),
                          to_record({"shard0/y/z": np.zeros(1)})])
    assert list(packed) == ["shard0/shard1/x", "shard1/shard0/y/z"]
    a, b = unpack_shards(packed, 2)
    assert list(a) == ["shard1/x"] and list(b) == ["shard0/y/z"]


def test_a_name_that_is_not_unicode_text_is_kept_by_the_stores_not_by_flower():
    """torch takes a lone surrogate; the stores keep it, Flower's protobuf cannot."""
    name = "layer\ud800"
    torch.nn.Module().register_buffer(name, torch.ones(1))
    arrays = {name: np.ones(2, np.float32)}
    assert_same(decode_arrays(encode_arrays(arrays)), arrays)
    with pytest.raises(UnicodeEncodeError):
        _over_the_wire(to_record(arrays))
