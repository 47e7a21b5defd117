"""Reply screening: any broken reply is used unchanged or recorded, never a crash.

One learning round (real ShardedStrategy of FedAvg, real history store, coded or
not) on an in-process grid whose four clients answer instantly with a valid
reply; node 1002's reply is broken by one mutation drawn by hypothesis.
"""

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.grid import InProcessGrid
from history.coded.catalog import SliceTransfer
from history.coded.recorder import CodedRecorder, ack_sizes
from history.store import HistoryStore
from server_app.rounds.federation import DiscoveryError, Federation, discover
from server_app.rounds.learning import run_learning
from server_app.rounds.loop import RoundLoop, RoundPlan
from server_app.rounds.screening import FaultLog, ReplyLimits, check_reply
from strategies import ShardedStrategy, make_stock_strategy
from strategies.sharded import to_numpy

HELD, EPOCHS, BATCH, TIMEOUT = 10, 1.0, 5, 60.0
TARGET, TARGET_PID = 1002, 2
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None  # SQLite commits: no disk
W0 = {"w": np.arange(6, dtype=np.float32).reshape(3, 2) / 10,
      "b": np.zeros(2, np.float32)}


def _set(mapping, key, value):
    """Put ``value`` under ``key`` bypassing Flower's type checks (a forged record)."""
    mapping.__dict__["_data"][key] = value


def honest_client(message, context):
    """A client that answers every training message at once with a valid reply."""
    if message.metadata.message_type.startswith("query"):
        from client_app.app import app  # coded storage: real slice handling

        return app(message, context)
    arrays = ArrayRecord({k: Array(v.numpy() + np.float32(0.01))
                          for k, v in message.content["arrays"].items()})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(GOOD))}),
                   reply_to=message)


# ---- mutations: each returns (mutate(reply) -> reply, must_reject) -------------------
# must_reject: True, False, or "coded" (only the coded store's range is exceeded)
NAMES = ["params", "stats", "array", "metric", "Arrays", "config", "x"]
VALUES = st.one_of(
    st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, HELD, HELD + 1, 10**20, 1e20, 2**63, -1, True, False, None,
                     "10", b"10", [HELD], [1.0], [], float("nan"), float("inf"),
                     -float("inf"), 0.0, 1e-300, EPOCHS * 1.5, EPOCHS * 1.5 + 1e-3]))


def metric_ok(key, value):
    """The rules of screening.py, written out for the oracle."""
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value):
        return False
    if key == "num-examples":
        return isinstance(value, int) and 1 <= value <= HELD
    if key == "train-seconds":
        return 0 <= value <= TIMEOUT
    if key == "train-loss":
        return 0 <= value <= 1e9
    return 0 < value and abs(value - EPOCHS) <= EPOCHS * 1e-6 + 1 / HELD  # epochs


def error_reply(reply):
    stand_in = Message(RecordDict(), dst_node_id=reply.metadata.src_node_id,
                       message_type=reply.metadata.message_type)
    return Message(error=Error(code=1, reason="boom"), reply_to=stand_in)


def _in_place(fn):
    def mutate(reply):
        fn(reply.content)
        return reply
    return mutate


@st.composite
def record_mutations(draw, how):
    which = draw(st.sampled_from(["arrays", "metrics"]))
    name = draw(st.sampled_from(NAMES))
    extra = draw(st.sampled_from([ArrayRecord(), MetricRecord({"n": 1}),
                                  ConfigRecord({"a": "b"})]))

    def fn(content):
        if how == "rename":
            content[name] = content.pop(which)
        elif how == "drop":
            del content[which]
        elif how == "extra":
            content[name] = extra
        elif how == "retype":  # same values, another record type
            values = dict(content[which]) if which == "metrics" else {"n": 1}
            content[which] = ConfigRecord(values) if which == "metrics" else \
                MetricRecord(values)
        else:  # not a record at all
            _set(content, which, dict(content[which]))
    return _in_place(fn), True


@st.composite
def layer_mutations(draw, how):
    key = draw(st.sampled_from(sorted(W0)))
    dtype = draw(st.sampled_from([np.float64, np.float16, np.int32, np.int64, np.uint8,
                                  np.bool_, np.complex64]))
    reshape = draw(st.sampled_from(["column", "short", "long", "scalar", "newaxis"]))
    bad_value = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    index = draw(st.integers(0, 5))
    factor = draw(st.sampled_from([1e4, 1e30, 3e38]))  # every layer moves > 64
    garbage = draw(st.binary(max_size=64))

    def fn(content):
        arrays = content["arrays"]
        v = arrays[key].numpy().copy()
        if how == "drop":
            del arrays[key]
        elif how == "extra":
            arrays["extra"] = Array(v)
        elif how == "rename":
            arrays[key + "_"] = arrays.pop(key)
        elif how == "reorder":  # the same layers, "b" before "w"
            arrays["w"] = arrays.pop("w")
        elif how == "dtype":
            arrays[key] = Array(v.astype(dtype))
        elif how == "shape":
            arrays[key] = Array({"column": v.reshape(-1, 1), "short": v.reshape(-1)[:-1],
                                 "long": np.append(v, 0), "newaxis": v[None],
                                 "scalar": np.array(1.0, np.float32)}[reshape])
        elif how == "nonfinite":
            v.flat[index % v.size] = bad_value
            arrays[key] = Array(v)
        elif how == "scale":  # finite, far from the model sent
            arrays[key] = Array((v * np.float32(factor) + 1).astype(np.float32))
        elif how == "nudge":
            arrays[key] = Array(v + np.float32(1e-3))
        elif how == "garbage":
            arrays[key] = Array(dtype="float32", shape=v.shape, stype="numpy.ndarray",
                                data=garbage)
        elif how == "lie":  # declared shape and dtype right, payload another array
            other = Array(np.zeros(7, np.float32))
            arrays[key] = Array(dtype="float32", shape=v.shape, stype=other.stype,
                                data=other.data)
        else:
            _set(arrays, key, v)  # a bare ndarray in the ArrayRecord
    # uncoded storage bounds an update at 1e4 per parameter (a sanity range)
    scale = "coded" if factor == 1e4 else True
    verdict = {"scale": scale, "nudge": False}.get(how, True)
    return _in_place(fn), verdict


@st.composite
def metric_mutations(draw, how):
    key = how if how in GOOD else draw(st.sampled_from(sorted(GOOD)))
    value = draw(VALUES)

    def fn(content):
        metrics = content["metrics"]
        if how in GOOD:
            _set(metrics, key, value)
        elif how == "drop":
            del metrics[key]
        else:
            _set(metrics, "accuracy", value)
    return _in_place(fn), (not metric_ok(key, value)) if how in GOOD else True


GOOD = {"num-examples": HELD, "train-seconds": 0.5, "train-loss": 1.0,
        "local-epochs": EPOCHS}
MUTATIONS = {
    "identity": st.just((lambda reply: reply, False)),
    "error": st.just((error_reply, True)),
    **{f"record-{how}": record_mutations(how)
       for how in ("rename", "drop", "extra", "retype", "forge")},
    **{f"layer-{how}": layer_mutations(how)
       for how in ("drop", "extra", "rename", "reorder", "dtype", "shape", "nonfinite",
                   "scale", "nudge", "garbage", "lie", "forge")},
    **{f"metric-{how}": metric_mutations(how) for how in (*GOOD, "drop", "extra")},
}
"""Kind of breakage -> strategy of (mutate(reply) -> reply, must the reply be rejected)."""


def one_round(root: Path, coded: bool, mutate) -> tuple[FaultLog, object]:
    """One learning round of 4 clients in 2 shards; node 1002's reply is mutated."""
    grid = InProcessGrid(honest_client, 4, {}, tamper={TARGET: mutate})
    node_of = {p: 1000 + p for p in range(4)}
    federation = Federation(node_of, [[0, 1], [2, 3]], {p: HELD for p in range(4)})
    faults = FaultLog()
    transfer = SliceTransfer(faults=faults)
    store = CodedRecorder.create(root, federation, 1, transfer=transfer) if coded else \
        HistoryStore.create(root, federation.shard_of, num_shards=2)
    strategy = ShardedStrategy([make_stock_strategy("FedAvg", 2, 2) for _ in range(2)],
                               federation.shard_nodes())
    loop = RoundLoop(grid, TIMEOUT, faults, federation.partition_of, federation.samples)
    run_learning(loop, strategy, federation, [ArrayRecord(
        {k: Array(v) for k, v in W0.items()})] * 2, RoundPlan(
        1, ConfigRecord({"local-epochs": EPOCHS, "batch-size": BATCH}), "learn"), store)
    return faults, store


@pytest.mark.parametrize("coded", [False, True], ids=["uncoded", "coded"])
@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_a_broken_reply_is_used_unchanged_or_recorded(coded, kind):
    """Every kind of breakage, drawn by hypothesis; coded storage, fewer draws."""
    @settings(max_examples=4 if coded else 12, deadline=None, derandomize=True)
    @given(mutation=MUTATIONS[kind])
    def check(mutation):
        _check_round(coded, mutation)

    check()


def _check_round(coded, mutation):
    """Run the round; the mutated reply is rejected (must_reject) or used as is."""
    mutate, must_reject = mutation
    if must_reject == "coded":
        must_reject = coded
    seen = {}

    def keep(reply):
        seen["reply"] = mutate(reply)
        return seen["reply"]

    with tempfile.TemporaryDirectory(dir=SCRATCH) as tmp:
        faults, store = one_round(Path(tmp) / "h", coded, keep)  # never raises
        mine = [e for e in faults.entries if e["node"] == TARGET]
        assert [e for e in faults.entries if e["node"] != TARGET] == []
        participants = {p: n for s in (0, 1) for p, n in store.participants(s, 1)}
        assert {0, 1, 3} <= set(participants)  # the others were aggregated
        if must_reject:
            assert len(mine) == 1 and mine[0]["kind"] in ("rejected", "error"), mine
            assert TARGET_PID not in participants
            return
        assert mine == []
        reply = seen["reply"]
        assert participants[TARGET_PID] == reply.content["metrics"]["num-examples"]
        if not coded:  # the stored update is exactly the reply minus the model sent
            got = store.update(1, 1, TARGET_PID)
            for key, value in to_numpy(reply.content["arrays"]).items():
                np.testing.assert_array_equal(got[key], value - W0[key])


# ---- the rules, one by one ---------------------------------------------------------
def _reply(metrics: dict, sent: Message) -> Message:
    arrays = ArrayRecord({k: Array(v) for k, v in W0.items()})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}),
                   reply_to=sent)


def _sent(epochs=EPOCHS):
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in W0.items()}),
                          "config": ConfigRecord({"local-epochs": epochs,
                                                  "batch-size": BATCH})})
    return Message(content, dst_node_id=TARGET, message_type="train")


@pytest.mark.parametrize("key, value, words", [
    ("num-examples", float("inf"), "num-examples = inf: must be finite"),
    ("num-examples", float("nan"), "num-examples = nan: must be finite"),
    ("num-examples", 1e20, "num-examples = 1e+20: must be an integer in [1, 10]"),
    ("num-examples", 10**20, "must be an integer in [1, 10] (samples held)"),
    ("num-examples", HELD + 1, "num-examples = 11: must be an integer in [1, 10]"),
    ("num-examples", 10.0, "num-examples = 10.0: must be an integer"),
    ("train-seconds", TIMEOUT + 1, "train-seconds = 61.0: must be in [0, 60]"),
    ("train-loss", -1.0, "train-loss = -1.0: must be in [0, 1e+09]"),
    ("local-epochs", 0.0, "local-epochs = 0.0: must be in [0.899999, 1.1]"),
    ("local-epochs", 5e-324, "local-epochs = 5e-324: must be in [0.899999, 1.1]"),
    ("local-epochs", 0.89, "local-epochs = 0.89: must be in [0.899999, 1.1]"),
    ("local-epochs", 1.2, "local-epochs = 1.2: must be in [0.899999, 1.1]"),
])
def test_each_number_has_a_range(key, value, words):
    sent = _sent()
    reason = check_reply(_reply({**GOOD, key: value}, sent), sent, HELD,
                         ReplyLimits(max_seconds=TIMEOUT))
    assert reason is not None and words in reason


def test_local_epochs_bound_follows_what_was_asked():
    # unlearning asks L / r = 0.5: the report is within one sample's pass (1/10)
    sent = _sent(0.5)
    for ok in (0.5, 0.4, 0.6):
        assert check_reply(_reply({**GOOD, "local-epochs": ok}, sent), sent, HELD) is None
    for bad in (0.39, 0.61, 1.0):
        reason = check_reply(_reply({**GOOD, "local-epochs": bad}, sent), sent, HELD)
        assert "must be in [0.4, 0.600001]" in reason


def test_a_zip_layer_is_a_rejected_reply_not_a_crash():
    import io

    sent = _sent()
    buffer = io.BytesIO()
    np.savez(buffer, a=W0["w"])
    reply = _reply(GOOD, sent)
    reply.content["arrays"]["w"] = Array(dtype="float32", shape=(3, 2),
                                         stype="numpy.ndarray", data=buffer.getvalue())
    assert check_reply(reply, sent, HELD) == \
        "layer 'w' decodes to a NpzFile, not an array"


def test_any_exception_while_inspecting_is_a_rejection(monkeypatch):
    import server_app.rounds.screening as screening

    def boom(*args):
        raise KeyError("odd")

    monkeypatch.setattr(screening, "_check_metrics", boom)
    sent = _sent()
    assert check_reply(_reply(GOOD, sent), sent, HELD) == \
        "reply cannot be inspected: KeyError: 'odd'"


def test_client_texts_become_one_short_clean_line():
    faults = FaultLog()
    text = "\x1b[31mred\x1b[0m\nline2\tx\x00" + "y" * 10**6
    faults.add("sharded", 1, 5, 0, "error", text)
    reason = faults.entries[0]["reason"]
    assert reason.startswith("red line2 x ") and len(reason) == 500
    assert reason.endswith("...") and reason.isprintable()


def test_renamed_records_are_rejected_by_name():
    sent = _sent()
    reply = _reply(GOOD, sent)
    content = reply.content
    content["params"], content["stats"] = content.pop("arrays"), content.pop("metrics")
    assert check_reply(reply, sent, HELD) == (
        "records ['params', 'stats']: a training reply holds exactly "
        "['arrays', 'metrics']")


# ---- discovery ---------------------------------------------------------------------
def _discovery_grid(info_of):
    """4 nodes; node 1000 + i answers ``info_of(i)`` (a record, or an Error)."""
    def client(message, context):
        i = context.node_config["partition-id"]
        info = info_of(i)
        if isinstance(info, Error):
            return Message(error=info, reply_to=message)
        return Message(RecordDict(info), reply_to=message)
    return InProcessGrid(client, 4, {})


def _info(pid):
    return {"info": ConfigRecord({"partition-id": pid, "num-partitions": 4})}


@pytest.mark.parametrize("bad, words", [
    ({}, "node 1002 answered discovery without a ConfigRecord 'info' (records: [])"),
    ({"info": MetricRecord({"partition-id": 2})}, "without a ConfigRecord 'info'"),
    ({"info": ConfigRecord({})}, "node 1002 reports partition-id = None"),
    (_info("2"), "node 1002 reports partition-id = '2': must be an integer >= 0"),
    (_info(2.0), "partition-id = 2.0: must be an integer"),
    (_info(True), "partition-id = True: must be an integer"),
    (_info(4), "3 of 4 clients answered discovery; missing partition ids include [2] "
               "(left out, partition-id >= num-clients: [4])"),
    (_info(-1), "partition-id = -1"),
    (_info(1), "nodes 1001 and 1002 both report partition-id 1"),
    (Error(code=1, reason="no data"), "node 1002 failed discovery: no data"),
])
def test_a_broken_discovery_reply_is_a_one_line_error(bad, words):
    grid = _discovery_grid(lambda i: bad if i == 2 else _info(i))
    with pytest.raises(DiscoveryError) as err:
        discover(grid, 4, timeout=1)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_server_stops_at_discovery_before_any_training(tmp_path, shared_data):
    from conftest import TINY
    from flwr.app import Context

    from client_app.app import app as client_app
    from server_app.app import main

    def client(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "query.discover" and context.node_id == 1003:
            reply.content["info"]["partition-id"] = "3"
        return reply

    config = {**TINY, "results-dir": str(tmp_path), "run-name": "d",
              "data-dir": str(shared_data)}
    grid = InProcessGrid(client, 8, config)
    with pytest.raises(DiscoveryError, match="node 1003 reports partition-id = '3'"):
        main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                           run_config=config))
    assert {kind for _, kind in grid.sent} == {"query.discover"}


def test_partition_sizes_are_what_clients_hold(shared_data):
    from task.builtin import load_task_data
    from task.data import client_data, partition_sizes

    task = load_task_data("mnist", str(shared_data))
    for scheme in ("iid", "noniid"):
        sizes = partition_sizes(task, 30, scheme, 3)
        assert sizes == [len(client_data(task, p, 30, scheme, 3)[0]) for p in range(30)]
        assert partition_sizes(task, 30, scheme, 3, cap=64) == [64] * 30


def test_a_malformed_slice_ack_is_not_counted_and_never_raises():
    stand_in = Message(RecordDict(), dst_node_id=TARGET, message_type="query.store_slice")

    def ack(**values):
        base = {"round": 1, "slice-index": 2, "slice-bytes": 40, "stored-bytes": 72}
        return Message(RecordDict({"ack": ConfigRecord({**base, **values})}),
                       reply_to=stand_in)

    assert ack_sizes(ack(), 1, 2) == (40, 72, 0)
    for bad in ({"slice-bytes": "40"}, {"slice-bytes": 2.5}, {"stored-bytes": 2**70},
                {"slice-bytes": -1}, {"disk-bytes": True}, {"round": 2},
                {"slice-index": 3}):
        assert isinstance(ack_sizes(ack(**bad), 1, 2), str), bad
    assert ack_sizes(Message(RecordDict(), reply_to=stand_in), 1, 2) == \
        "no ConfigRecord 'ack'"


def test_a_malformed_ack_in_a_round_is_a_fault_not_a_crash(tmp_path):
    from client_app.app import app

    def client(message, context):
        reply = app(message, context)
        if context.node_id == TARGET and message.metadata.message_type.endswith("slice"):
            reply.content["ack"]["slice-bytes"] = 2**70  # SQLite cannot hold it
        return reply

    node_of = {p: 1000 + p for p in range(4)}
    federation = Federation(node_of, [[0, 1], [2, 3]])
    faults = FaultLog()
    recorder = CodedRecorder.create(tmp_path / "h", federation, 1,
                                    transfer=SliceTransfer(faults=faults))
    for s in (0, 1):
        recorder.put_shard_model(s, 0, W0)
    recorder.end_round(0, InProcessGrid(client, 4, {}))
    assert recorder.holders() == [0, 1, 3]
    assert [(e["stage"], e["partition"], e["kind"]) for e in faults.entries] == [
        ("coded store", TARGET_PID, "rejected")]
    assert "slice-bytes = 1180591620717411303424" in faults.entries[0]["reason"]


@pytest.mark.parametrize("kind, epochs", [("train", 1), ("train.unlearn", 0.5)])
def test_the_client_apps_own_reply_passes_screening(make_grid, shared_data, kind, epochs):
    """TRAIN_RECORDS / TRAIN_METRICS are what client_app sends: keep them in step."""
    from conftest import TINY

    from task.builtin import build_model

    config = {**TINY, "data-dir": str(shared_data)}
    grid = make_grid(8, config)
    model = ArrayRecord(build_model("mnist", 10).state_dict())
    sent = Message(RecordDict({"arrays": model, "config": ConfigRecord({
        "lr": 0.05, "local-epochs": epochs, "batch-size": 48, "seed": 0})}),
        dst_node_id=1005, message_type=kind)
    (reply,) = grid.send_and_receive([sent])
    # 64 samples, batches of 48: the client finishes its last partial batch
    assert check_reply(reply, sent, 64, ReplyLimits(max_seconds=600)) is None
