"""Coded storage (storage='coded'): the sharded history as coded client slices.

The ServerApp and ClientApp run for real on the in-process grid; two runs on the
same seeds (uncoded and coded) are shared by the tests of this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3

import numpy as np
import pytest
from conftest import TINY, InProcessGrid, set_task_identity
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from coding import (
    PRIME,
    access_key,
    dequantize,
    key_proof,
    new_key,
    new_nonce,
    quantization_step,
    quantize,
    slice_tag,
)
from history import (
    CodedHistory,
    CodedHistoryError,
    CodedRecorder,
    CodedStorageError,
    HistoryStore,
    SliceTransfer,
    StoreError,
)
from history.coded import slices as client_slices
from history.files import read_arrays
from server_app.config import ConfigError, RunConfig
from server_app.rounds.federation import Federation
from server_app.rounds.loop import RoundLoop
from server_app.unlearning.driver import run_unlearning
from server_app.unlearning.frameworks import Stage
from strategies.sharded import to_record

STEP = quantization_step(24)
CONFIG = {**TINY, "blocks-per-shard": 4, "forget-clients": "3", "frameworks": "SE,FE",
          "mia": False}  # k = 4 blocks a shard of n = 8 slices; t = 2


def _identity():
    set_task_identity()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_data):
    """The ServerApp run twice on the same seeds: storage 'uncoded' and 'coded'.

    The stores stay as learning left them: the planned request's erasure of client
    3's updates (``tests/test_later.py``, ``tests/test_receipts.py``) is held
    back, so the tests below can decode and unlearn from every stored round.
    """
    from client_app.app import app as client_app
    from server_app.app import main
    from server_app.stages import planned_receipt

    _identity()
    root = tmp_path_factory.mktemp("coded")
    out = {}
    for storage in ("uncoded", "coded"):
        config = {**CONFIG, "storage": storage, "results-dir": str(root),
                  "run-name": storage, "data-dir": str(shared_data)}
        grid = InProcessGrid(client_app, 8, config)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(planned_receipt, "erase_stored", lambda *a, **k: {})
            main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                               run_config=config))
        summary = json.loads((root / storage / "summary.json").read_text())
        out[storage] = {"summary": summary, "grid": grid, "path": root / storage,
                        "config": config}
    return out


def load(path):
    return read_arrays(path)


def coded_history(run, **kwargs) -> CodedHistory:
    return CodedHistory.open(run["path"] / "history" / "sharded", run["grid"],
                             {p: 1000 + p for p in range(8)}, **kwargs)


# ---- the ServerApp in coded mode ------------------------------------------------
def test_coded_se_matches_uncoded_se(runs):
    uncoded, coded = runs["uncoded"]["summary"], runs["coded"]["summary"]
    assert coded["learning"]["accuracy"] == uncoded["learning"]["accuracy"]
    se_u, se_c = uncoded["frameworks"]["SE"], coded["frameworks"]["SE"]
    assert abs(se_c["accuracy"] - se_u["accuracy"]) <= 0.002  # 0.2 points
    a = load(runs["uncoded"]["path"] / "models" / "SE.npz")
    b = load(runs["coded"]["path"] / "models" / "SE.npz")
    impacted = se_c["requests"][0]["impacted_shards"]
    worst = 0.0
    for key in a:
        diff = float(np.max(np.abs(a[key].astype(np.float64) - b[key])))
        if int(key.split("/")[0][5:]) in impacted:
            worst = max(worst, diff)
        else:
            assert diff == 0.0, key  # untouched shards are the learned models
    # W^0 and the updates each carry half a step of rounding; both enter W'^1
    # (eq. 2), so the unlearned models differ by about one step (1.25 measured)
    assert 0 < worst <= 2 * STEP, worst / STEP


def test_decoded_history_is_the_uncoded_history_within_half_a_step(runs):
    store = HistoryStore.open(runs["uncoded"]["path"] / "history" / "sharded")
    history = coded_history(runs["coded"])
    for shard in (0, 1):
        assert history.rounds(shard) == store.rounds(shard)
        w0, w0_coded = store.shard_model(shard, 0), history.shard_model(shard, 0)
        for key, value in w0.items():
            assert np.max(np.abs(w0_coded[key] - value)) <= STEP / 2 + 1e-8
        for rnd in store.rounds(shard):
            assert history.participants(shard, rnd) == store.participants(shard, rnd)
            for pid, _ in store.participants(shard, rnd):
                got, want = history.update(shard, rnd, pid), store.update(shard, rnd, pid)
                assert list(got) == list(want)
                for key, value in want.items():
                    assert got[key].dtype == value.dtype
                    np.testing.assert_array_equal(
                        got[key], dequantize(quantize(value, 24), 24))
    with pytest.raises(StoreError, match="keeps only W\\^0"):
        history.shard_model(0, 1)


def test_coded_server_keeps_no_parameters(runs):
    run = runs["coded"]
    sharded = run["path"] / "history" / "sharded"
    assert sorted(p.name for p in sharded.iterdir()) == ["catalog.sqlite", "keys"]
    blobs = [p for p in run["path"].rglob("*.npz")
             if "models" not in p.parts and "baseline" not in p.parts]
    assert blobs == []  # only outputs (models/) and FedEraser's own store hold arrays
    conn = sqlite3.connect(sharded / "catalog.sqlite")
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master "
                                         "WHERE type='table'")]
    for table in tables:
        for row in conn.execute(f"SELECT * FROM {table}"):
            assert all(len(v) < 4096 for v in row if isinstance(v, str | bytes)), table
    summary = run["summary"]
    se, fe = summary["frameworks"]["SE"], summary["frameworks"]["FE"]
    assert se["server_storage_bytes"] == summary["storage"]["server_bytes"]
    # the tiny config shows it too: 8 kB of catalog and keys vs FedEraser's 3.6 MB
    assert se["server_storage_bytes"] <= 0.01 * fe["server_storage_bytes"]
    storage = summary["storage"]
    assert storage["mode"] == "coded" and storage["SE_coded_vs_FE"] >= 0.99
    assert storage["FE"]["server_bytes"] == fe["server_storage_bytes"]
    # uncoded SE holds W_s^0 and W_s^g of both shards besides the same updates
    uncoded = runs["uncoded"]["summary"]["storage"]
    assert storage["SE_uncoded"]["server_bytes"] > storage["FE"]["server_bytes"]
    assert uncoded["SE_uncoded"]["server_bytes"] >= storage["SE_uncoded"]["server_bytes"]
    # every client holds one slice a round, one part of B per shard: rounds 1-2
    # 2 shards x B = 2 x 80202 / 4 elements, round 0 2 x ceil(80202 / 4) = 40102
    rounds = CONFIG["num-rounds"] + 1
    per_client = storage["SE_coded"]["client_bytes"]
    assert per_client["min"] == per_client["max"] == \
        rounds * (80202 * 4 + 64) - (80202 - 40102) * 4
    comm = storage["comm"]
    assert comm["distribution_transfers"] == 8 * rounds
    assert comm["distribution_s"] > 8 * rounds * 0.1
    assert comm["retrieval_transfers"] == 4 and comm["retrieval_s"] > 0.4  # k = 4
    assert storage["efficiency"]["coded"]["gamma"] == 4
    assert storage["efficiency"]["coded"]["gamma_bound"] >= 4
    retrieval = se["requests"][0]["slice_retrieval"]
    assert retrieval["comm_time_s"] == pytest.approx(comm["retrieval_s"])
    assert se["comm_time_s"] > retrieval["comm_time_s"]


# ---- losses, corruption, tags ----------------------------------------------------
@contextlib.contextmanager
def perturbed(run, absent=(), corrupt=(), swap=()):
    """Nodes absent, slices corrupted ((pid, round)) or replaced by another round's.

    Everything is put back afterwards.
    """
    grid = run["grid"]
    store_id = coded_history(run).store_id
    saved = {}

    def state(pid):
        return grid.contexts[1000 + pid].state

    def arrays(pid):
        return state(pid)[client_slices.slices_key(store_id)]

    def meta(pid):
        return state(pid)[client_slices.meta_key(store_id)]

    try:
        for pid, rnd in list(corrupt) + list(swap):
            saved[(pid, rnd)] = (arrays(pid)[f"r{rnd}"], list(meta(pid)[f"r{rnd}.tags"]))
        for pid, rnd in corrupt:  # wrong values, still in the field, tags kept
            data = arrays(pid)[f"r{rnd}"].numpy().astype(np.int64)
            data[::3] = (data[::3] + 12345) % PRIME
            arrays(pid)[f"r{rnd}"] = Array(data.astype(np.uint32))
        for pid, rnd in swap:  # the slice and tags of round rnd - 1 in rnd's place
            arrays(pid)[f"r{rnd}"] = arrays(pid)[f"r{rnd - 1}"]
            meta(pid)[f"r{rnd}.tags"] = list(meta(pid)[f"r{rnd - 1}.tags"])
        grid.absent = {1000 + p for p in absent}
        yield
    finally:
        grid.absent = set()
        for (pid, rnd), (array, tags) in saved.items():
            arrays(pid)[f"r{rnd}"] = array
            meta(pid)[f"r{rnd}.tags"] = tags


def unlearn(runs, **history_kwargs):
    """SE unlearning of client 3 on the coded run's clients; (models, summary)."""
    from server_app.run.context import initial_model, train_config

    run = runs["coded"]
    _identity()
    cfg = RunConfig.from_run_config({**run["config"], "frameworks": "SE"})
    shards = run["summary"]["shards"]
    node_of = {p: 1000 + p for p in range(8)}
    learned = HistoryStore.open(runs["uncoded"]["path"] / "history" / "sharded")
    models = [to_record(learned.shard_model(s, 2)) for s in range(2)]  # W_s^G
    before = [m.copy() for m in models]
    history = coded_history(run, **history_kwargs)
    stage = Stage(cfg, Federation(node_of, shards),
                  Federation(node_of, [list(range(8))]),
                  history, None, models, initial_model(cfg, 10),
                  train_config(cfg, run["summary"]["data_dir"]))
    try:
        results = run_unlearning(RoundLoop(run["grid"]), stage, [[3]],
                                 lambda m: {"accuracy": 0.0, "loss": 0.0,
                                            "shard_accuracy": []}, log_fn=lambda m: None)
    finally:  # whatever happened, the models unlearning started from are untouched
        for old, new in zip(before, models, strict=True):
            assert all(old[k].numpy().tobytes() == new[k].numpy().tobytes() for k in old)
    se = results["SE"]
    return [{k: v.numpy() for k, v in m.items()} for m in se.models], se.summary.to_json()


def same(a, b):
    return all(x[k].tobytes() == y[k].tobytes() for x, y in zip(a, b, strict=True)
               for k in x)


def other_shard(runs):
    shards = runs["coded"]["summary"]["shards"]
    return next(pids for pids in shards if 3 not in pids)


def test_absent_and_corrupted_slices_give_the_same_models(runs):
    reference, summary = unlearn(runs)
    stats = summary["requests"][0]["slice_retrieval"]["shards"][0]
    assert stats["tag_failures"] == 0 and stats["absent"] == 0
    saved = load(runs["coded"]["path"] / "models" / "SE.npz")  # the ServerApp's SE
    assert same(reference, [{k.split("/", 1)[1]: v for k, v in saved.items()
                             if k.startswith(f"shard{s}/")} for s in range(2)])
    away = other_shard(runs)[:2]  # hold slices, never retrain shard 3's model
    present = [p for p in range(8) if p not in away]
    # tags checked: the corrupted slices fail their tags (erasures); the swapped
    # slice (round 1's under round 2) is rejected too
    corrupt = [(present[0], 0), (present[1], 1), (present[0], 2)]
    with perturbed(runs["coded"], absent=away, corrupt=corrupt,
                   swap=[(present[2], 2)]):
        models, summary = unlearn(runs)
    stats = summary["requests"][0]["slice_retrieval"]["shards"][0]
    assert stats["absent"] == 2 and stats["tag_failures"] == 4
    assert same(models, reference)
    # tags not checked (test-only path): the wrong slices are corrected instead,
    # one per round among m = 6 slices (t = floor((6 - 4) / 2) = 1)
    with perturbed(runs["coded"], absent=away, corrupt=corrupt):
        models, summary = unlearn(runs, verify_tags=False, rng_seed=1)
    stats = summary["requests"][0]["slice_retrieval"]["shards"][0]
    assert stats["corrected"] == 3 and stats["tag_failures"] == 0
    assert same(models, reference)


def _fingerprint(run):
    """SHA-256 of the server's catalog and of every slice and tag the clients hold."""
    digest = hashlib.sha256(
        (run["path"] / "history" / "sharded" / "catalog.sqlite").read_bytes())
    for node, ctx in sorted(run["grid"].contexts.items()):
        for name, record in sorted(ctx.state.array_records.items()):
            for key, array in sorted(record.items()):
                digest.update(f"{node}/{name}/{key}".encode() + array.numpy().tobytes())
        for name, record in sorted(ctx.state.config_records.items()):
            for key, value in sorted(record.items()):
                if key.endswith(".tags"):
                    digest.update(f"{node}/{name}/{key}".encode() + b"".join(value))
    return digest.hexdigest()


def test_beyond_the_bound_is_a_clear_error_and_changes_nothing(runs):
    away = other_shard(runs)[:2]
    present = [p for p in range(8) if p not in away]
    before = _fingerprint(runs["coded"])
    # tags checked: 3 of the 6 present slices fail their tags, k = 4 needed
    with perturbed(runs["coded"], absent=away,
                   corrupt=[(p, 1) for p in present[:3]]):
        with pytest.raises(CodedHistoryError, match="round 1 of shard .*3 usable "
                           "slices, k = 4 needed.*2 absent.*3 failed tags"):
            unlearn(runs)
    # tags not checked: 2 wrong slices among m = 6, one more than t = 1
    with perturbed(runs["coded"], absent=away,
                   corrupt=[(p, 2) for p in present[:2]]):
        with pytest.raises(CodedHistoryError, match=r"more than floor\(\(m - k\) / 2\) "
                           "= 1 wrong slices among m = 6"):
            unlearn(runs, verify_tags=False, rng_seed=1)
    assert _fingerprint(runs["coded"]) == before  # catalog and client slices intact


def test_tags_reject_other_shard_other_round_and_flipped_bit(runs):
    run = runs["coded"]
    history = coded_history(run)
    ctx = run["grid"].contexts[1005].state
    whole = ctx[client_slices.slices_key(history.store_id)]["r1"].numpy()
    tags = list(ctx[client_slices.meta_key(history.store_id)]["r1.tags"])
    data, other = np.split(whole, 2)  # shard 0's part, shard 1's part
    assert history.check_slice(0, 1, 5, data, tags[0])
    assert history.check_slice(1, 1, 5, other, tags[1])
    assert not history.check_slice(0, 1, 5, data, tags[1])  # shard 1's tag for shard 0
    assert not history.check_slice(1, 1, 5, other, tags[0])
    assert not history.check_slice(0, 1, 5, other, tags[0])  # shard 1's part as 0's
    assert not history.check_slice(0, 1, 5, whole, tags[0])  # the whole slice
    assert not history.check_slice(0, 2, 5, data, tags[0])  # round 1's slice as round 2
    assert not history.check_slice(0, 1, 4, data, tags[0])  # another client's slot
    flipped = data.copy()
    flipped[17] ^= np.uint32(1 << 5)
    assert not history.check_slice(0, 1, 5, flipped, tags[0])
    assert not history.check_slice(0, 1, 5, data.astype(np.int64), tags[0])


def _fetch(grid, node, content):
    _identity()
    message = Message(content, dst_node_id=node, message_type="query.fetch_slices")
    return grid.send_and_receive([message])[0]


def test_a_fetch_without_a_valid_proof_is_refused(runs):
    run = runs["coded"]
    history = coded_history(run)
    grid = run["grid"]

    def request(shard, proof_key, nonce, pid=2):
        return RecordDict({"request": ConfigRecord({
            "store": history.store_id, "shard": shard, "rounds": [0, 1, 2],
            "nonce": nonce, "proof": key_proof(proof_key, nonce)})})

    good = access_key(history.keys[0], 2)
    for shard, key in [(0, new_key()),  # a key that is not the shard's
                       (0, access_key(history.keys[1], 2)),  # shard 1's access key
                       (0, access_key(history.keys[0], 3)),  # another client's
                       (7, good)]:  # a shard that does not exist
        reply = _fetch(grid, 1002, request(shard, key, new_nonce()))
        assert reply.has_error() and "refused" in reply.error.reason
        assert reply.error.code == client_slices.REFUSED
    nonce = new_nonce()
    reply = _fetch(grid, 1002, request(0, good, nonce))
    assert not reply.has_error()
    assert sorted(reply.content["slices"]) == ["r0", "r1", "r2"]
    assert history.check_slice(0, 2, 2, reply.content["slices"]["r2"].numpy(),
                               reply.content["tags"]["r2"])
    replay = _fetch(grid, 1002, request(0, good, nonce))  # the same nonce again
    assert replay.has_error() and "used before" in replay.error.reason


# ---- the client's store -----------------------------------------------------------
def _store_message(store, rnd, index, data, keys, node):
    """A store_slice message; tag s covers part s of the S equal parts of ``data``."""
    parts = np.split(data, len(keys))
    tags = [slice_tag(k, s, rnd, index, parts[s]) for s, k in enumerate(keys)]
    content = RecordDict({
        "slice": ArrayRecord({"slice": Array(data)}),
        "config": ConfigRecord({"store": store, "round": rnd, "slice-index": index,
                                "tags": tags,
                                "access-keys": [access_key(k, index) for k in keys]})})
    return Message(content, dst_node_id=node, message_type="query.store_slice"), tags


def test_node_dir_copy_survives_a_restart(tmp_path):
    from client_app.app import app as client_app

    _identity()
    keys = [new_key(), new_key()]
    node_config = {"partition-id": 5, "num-partitions": 8, "node-dir": str(tmp_path)}
    first = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                    run_config={})
    rng = np.random.default_rng(0)
    sent = {}
    for rnd in (0, 1, 2):
        data = rng.integers(0, PRIME, 1000 + 2 * rnd, dtype=np.int64).astype(np.uint32)
        message, tags = _store_message("abc123", rnd, 5, data, keys, 7)
        ack = client_app(message, first).content["ack"]
        assert ack["round"] == rnd and ack["slice-index"] == 5
        assert ack["slice-bytes"] == data.nbytes + 64 and ack["disk-bytes"] > 0
        sent[rnd] = (data, tags)
    assert ack["stored-bytes"] == sum(d.nbytes + 64 for d, _ in sent.values())
    files = sorted(p.name for p in (tmp_path / "slices" / "abc123").iterdir())
    assert files == ["access.npz", "round-0.npz", "round-1.npz", "round-2.npz"]
    # the node restarts: a new Context with an empty state, the same node-dir
    second = Context(run_id=2, node_id=9, node_config=node_config, state=RecordDict(),
                     run_config={})
    for shard in (0, 1):
        nonce = new_nonce()
        request = RecordDict({"request": ConfigRecord({
            "store": "abc123", "shard": shard, "rounds": [0, 1, 2, 3], "nonce": nonce,
            "proof": key_proof(access_key(keys[shard], 5), nonce)})})
        reply = client_app(Message(request, dst_node_id=9,
                                   message_type="query.fetch_slices"), second)
        assert not reply.has_error(), reply.error
        assert reply.content["info"]["slice-index"] == 5
        assert sorted(reply.content["slices"]) == ["r0", "r1", "r2"]  # no round 3
        for rnd, (data, tags) in sent.items():  # only this shard's half comes back
            got = reply.content["slices"][f"r{rnd}"].numpy()
            part = np.split(data, 2)[shard]
            assert got.dtype == np.uint32 and got.tobytes() == part.tobytes()
            assert reply.content["tags"][f"r{rnd}"] == tags[shard]
    # used nonces survive the restart too: a replay to a third incarnation fails
    third = Context(run_id=3, node_id=9, node_config=node_config, state=RecordDict(),
                    run_config={})
    reply = client_app(Message(request, dst_node_id=9,
                               message_type="query.fetch_slices"), third)
    assert reply.has_error() and "used before" in reply.error.reason


# ---- the recorder on its own: random updates, no training ------------------------
def _random_arrays(rng, scale=0.1):
    return {"conv.weight": (rng.normal(size=(4, 1, 3, 3)) * scale).astype(np.float32),
            "fc.bias": (rng.normal(size=(10,)) * scale).astype(np.float32)}


def test_recorder_round_trip_without_training(tmp_path):
    from client_app.app import app as client_app

    _identity()
    grid = InProcessGrid(client_app, 9, {})
    node_of = {p: 1000 + p for p in range(9)}
    federation = Federation(node_of, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    recorder = CodedRecorder.create(tmp_path / "h", federation, blocks_per_shard=2,
                                    scale_bits=20)
    rng = np.random.default_rng(1)
    w0 = _random_arrays(rng)
    truth = {}
    for s in range(3):
        recorder.put_shard_model(s, 0, w0)
    recorder.end_round(0, grid)
    for rnd in (1, 2):
        for s, pids in enumerate(federation.shards):
            for pid in pids[rnd - 1:]:  # 3 participants in round 1, 2 in round 2
                truth[(s, rnd, pid)] = _random_arrays(rng)
                recorder.put_update(s, rnd, pid, truth[(s, rnd, pid)], 10 + pid, 0.1)
            recorder.put_shard_model(s, rnd, _random_arrays(rng))
        recorder.end_round(rnd, grid)
    recorder.mark_complete()
    recorder.close()
    history = CodedHistory.open(tmp_path / "h", grid, node_of)
    assert history.participants(1, 2) == [(4, 14), (5, 15)]
    assert history.rounds(2) == [1, 2] and history.client_shard()[7] == 2
    for (s, rnd, pid), arrays in truth.items():
        got = history.update(s, rnd, pid)
        for key, value in arrays.items():
            np.testing.assert_array_equal(got[key], dequantize(quantize(value, 20), 20))
    np.testing.assert_array_equal(history.shard_model(2, 0)["fc.bias"],
                                  dequantize(quantize(w0["fc.bias"], 20), 20))
    retrieval = history.take_retrieval()
    assert [r["shard"] for r in retrieval["shards"]] == [0, 1, 2]
    assert history.take_retrieval() is None  # and the decoded history is gone
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["catalog.sqlite", "keys"]


def test_recorder_refuses_out_of_range_values_and_lost_rounds(tmp_path):
    from client_app.app import app as client_app

    _identity()
    node_of = {p: 1000 + p for p in range(4)}
    federation = Federation(node_of, [[0, 1], [2, 3]])
    grid = InProcessGrid(client_app, 4, {})
    recorder = CodedRecorder.create(tmp_path / "a", federation, blocks_per_shard=1)
    huge = {"w": np.full(3, 100.0, np.float32)}  # > 64 = 2^30 / 2^24
    for s in range(2):
        recorder.put_shard_model(s, 0, huge)
    with pytest.raises(CodedStorageError, match="round 0, shard 0.*largest allowed"):
        recorder.end_round(0, grid)
    grid.absent = {1000, 1001, 1002}  # only one client to hold a slice; k = 2
    recorder = CodedRecorder.create(tmp_path / "b", federation, blocks_per_shard=2)
    for s in range(2):
        recorder.put_shard_model(s, 0, {"w": np.ones(3, np.float32)})
    with pytest.raises(CodedStorageError, match="only 1 of 4 clients.*k = 2"):
        recorder.end_round(0, grid)
    with pytest.raises(CodedStorageError,
                       match="5 data blocks.*K \\+ T <= num-clients = 4"):
        CodedRecorder.create(tmp_path / "c", federation, blocks_per_shard=5)
    with pytest.raises(CodedStorageError, match="3 data blocks \\+ privacy-t = 2"):
        CodedRecorder.create(tmp_path / "d", federation, blocks_per_shard=3, privacy_t=2)


@pytest.mark.parametrize("key, value, words", [
    ("storage", "tape", "uncoded, coded"),
    ("blocks-per-shard", -1, "0 (chosen from num-clients) or a positive integer"),
    ("privacy-t", -1, "an integer >= 0"),
    ("coded-loss-budget", 1.0, "a number in [0, 1)"),
    ("coded-loss-budget", float("nan"), "a finite number"),
    ("quant-scale-bits", 31, "[16, 30]"),
    ("quant-scale-bits", 15, "[16, 30]"),
])
def test_bad_storage_settings_are_named(key, value, words):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({key: value})
    assert f"'{key}'" in str(err.value) and repr(value) in str(err.value)
    assert words in str(err.value)


def test_coded_storage_needs_a_holder_per_decoding_slice():
    with pytest.raises(ConfigError, match="'blocks-per-shard' = 101.*at most "
                       "num-clients - privacy-t = 100"):
        RunConfig.from_run_config({"storage": "coded", "blocks-per-shard": 101})
    with pytest.raises(ConfigError, match="'blocks-per-shard' = 95.*at most "
                       "num-clients - privacy-t = 90.*= 105 slices"):
        RunConfig.from_run_config({"storage": "coded", "blocks-per-shard": 95,
                                   "privacy-t": 10})
    with pytest.raises(ConfigError, match="'coded-loss-budget' = 0.5.*= -10 blocks"):
        RunConfig.from_run_config({"storage": "coded", "privacy-t": 60})
    cfg = RunConfig.from_run_config({"storage": "coded"})
    assert cfg.storage.blocks_per_shard == 0 and cfg.coded_blocks_per_shard == 50  # C = 100
    cfg = RunConfig.from_run_config({"storage": "coded", "privacy-t": 10,
                                     "coded-loss-budget": 0.2})
    assert cfg.coded_blocks_per_shard == 70  # floor(0.8 x 100) - 10


# ---- damaged files on restarted SuperNodes, through the server's decoder ----------
def _recorded_on_disk(tmp_path):
    """9 nodes with a node-dir each, 3 shards, k = 6: rounds 0-2 coded, then every
    node restarts (fresh state, same node-dir). Returns (grid, node_of, truth, dirs)."""
    from client_app.app import app as client_app

    _identity()
    grid = InProcessGrid(client_app, 9, {})
    for node, ctx in grid.contexts.items():
        ctx.node_config["node-dir"] = str(tmp_path / f"node{node - 1000}")
    node_of = {p: 1000 + p for p in range(9)}
    federation = Federation(node_of, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    recorder = CodedRecorder.create(tmp_path / "h", federation, blocks_per_shard=6,
                                    scale_bits=20)
    rng = np.random.default_rng(2)
    truth = {}
    for s in range(3):
        recorder.put_shard_model(s, 0, _random_arrays(rng))
    recorder.end_round(0, grid)
    for rnd in (1, 2):
        for s, pids in enumerate(federation.shards):
            for pid in pids:
                truth[(s, rnd, pid)] = _random_arrays(rng)
                recorder.put_update(s, rnd, pid, truth[(s, rnd, pid)], 10, 0.1)
        recorder.end_round(rnd, grid)
    recorder.mark_complete()
    store_id = recorder.store_id
    recorder.close()
    for node, ctx in list(grid.contexts.items()):
        grid.contexts[node] = Context(run_id=1, node_id=node, node_config=ctx.node_config,
                                      state=RecordDict(), run_config={})
    dirs = {p: tmp_path / f"node{p}" / "slices" / store_id for p in range(9)}
    return grid, node_of, truth, dirs


def test_damaged_node_files_cost_exactly_their_rounds(tmp_path):
    from server_app.rounds.screening import FaultLog

    grid, node_of, truth, dirs = _recorded_on_disk(tmp_path)
    grid.absent = {1007, 1008}  # 7 reachable holders, k = 6: every good round counts
    path = dirs[0] / "round-1.npz"
    path.write_bytes(path.read_bytes()[:100])  # truncated
    (dirs[1] / "round-0.npz").write_bytes(np.random.default_rng(0).bytes(4000))
    (dirs[2] / "round-2.npz").unlink()  # acknowledged, now gone
    (dirs[3] / "access.npz").write_bytes(b"garbage")  # holds no round: costs none
    faults = FaultLog()
    history = CodedHistory.open(tmp_path / "h", grid, node_of,
                                transfer=SliceTransfer(faults=faults))
    for (s, rnd, pid), arrays in truth.items():  # rounds 0-2 of every shard decode
        got = history.update(s, rnd, pid)
        for key, value in arrays.items():
            np.testing.assert_array_equal(got[key], dequantize(quantize(value, 20), 20))
    report = history.take_retrieval()["shards"]
    assert [(r["damaged"], r["lost"], r["refused"], r["absent"]) for r in report] == \
        [(2, 1, 0, 2)] * 3
    kinds = sorted((e["partition"], e["round"], e["kind"]) for e in report[0]["losses"])
    assert kinds == [(0, 1, "damaged-slice"), (1, 0, "damaged-slice"),
                     (2, 2, "lost-slice"), (3, None, "damaged-file")]
    reasons = {e["partition"]: e["reason"] for e in report[0]["losses"]}
    assert reasons[0].startswith("round-1.npz: not a readable .npz archive")
    assert reasons[3].startswith("access.npz: ")
    assert faults.counts() == {"damaged-slice": 6, "lost-slice": 3, "damaged-file": 3}
    assert {e["stage"] for e in faults.entries} == \
        {f"coded-retrieval shard {s}" for s in range(3)}
    # one more damaged file of round 1 leaves 5 usable slices: a clear error
    (dirs[4] / "round-1.npz").write_bytes(b"")
    history = CodedHistory.open(tmp_path / "h", grid, node_of)
    with pytest.raises(CodedHistoryError, match="round 1 of shard 0: 5 usable slices, "
                       "k = 6 needed.*3 damaged, 1 lost"):
        history.update(0, 1, 0)


def test_summary_reports_a_damaged_slice_file(tmp_path, shared_data, runs):
    """Through the ServerApp: node 1 (in the first wave of k holders asked) restarts
    before unlearning with round 1's file truncated; SE still unlearns, and
    summary.json names the damage; the models are those of the undamaged run."""
    from client_app.app import app as client_app
    from server_app.app import main

    _identity()
    config = {**CONFIG, "storage": "coded", "frameworks": "SE", "results-dir":
              str(tmp_path), "run-name": "damaged", "data-dir": str(shared_data)}
    restarted = []

    def node_app(message, context):
        if message.metadata.message_type == "query.fetch_slices" and \
                context.node_config["partition-id"] == 1 and not restarted:
            folder = next((tmp_path / "node1" / "slices").iterdir())
            path = folder / "round-1.npz"
            path.write_bytes(path.read_bytes()[:64])
            context = Context(run_id=1, node_id=context.node_id,
                              node_config=context.node_config, state=RecordDict(),
                              run_config=context.run_config)
            grid.contexts[context.node_id] = context
            restarted.append(context.node_id)
        return client_app(message, context)

    grid = InProcessGrid(node_app, 8, config)
    for node, ctx in grid.contexts.items():
        ctx.node_config["node-dir"] = str(tmp_path / f"node{node - 1000}")
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))
    summary = json.loads((tmp_path / "damaged" / "summary.json").read_text())
    assert restarted == [1001]
    entries = [e for e in summary["faults"]["entries"] if e["partition"] == 1]
    # seen by SE's retrieval, and again by the planned request's erasure, which
    # fetches the rounds client 3 took part in to code them again without it
    assert [(e["round"], e["kind"]) for e in entries] == [(1, "damaged-slice")] * 2
    assert entries[0]["reason"].startswith("round-1.npz: not a readable .npz archive")
    assert summary["faults"]["counts"] == {"damaged-slice": 2}
    retrieval = summary["frameworks"]["SE"]["requests"][0]["slice_retrieval"]
    (shard,) = retrieval["shards"]
    assert shard["damaged"] == 1 and shard["losses"][0]["partition"] == 1
    # any k intact slices decode exactly: SE unlearns as in the undamaged coded run
    got = load(tmp_path / "damaged" / "models" / "SE.npz")
    want = load(runs["coded"]["path"] / "models" / "SE.npz")
    assert list(got) == list(want)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
