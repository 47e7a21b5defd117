"""Fault injection: hostile replies and dropouts are rejected, recorded, skipped."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from history.store import HistoryStore


def replace_arrays(reply, fn):
    arrays = reply.content["arrays"]
    new = ArrayRecord({k: Array(fn(k, v.numpy())) for k, v in arrays.items()})
    content = RecordDict({"arrays": new, "metrics": reply.content["metrics"]})
    return Message(content, reply_to=_original(reply))


def replace_examples(reply, n):
    metrics = MetricRecord(dict(reply.content["metrics"]))
    metrics["num-examples"] = n
    content = RecordDict({"arrays": reply.content["arrays"], "metrics": metrics})
    return Message(content, reply_to=_original(reply))


def _original(reply):
    """A stand-in for the message the reply answers (same src/dst)."""
    sent = Message(RecordDict(), dst_node_id=reply.metadata.src_node_id,
                   message_type=reply.metadata.message_type)
    return sent


def nan(k, v):
    v = v.copy()
    v.flat[0] = np.nan
    return v


HOSTILE = {
    "nan": lambda r: replace_arrays(r, nan),
    "inf": lambda r: replace_arrays(r, lambda k, v: np.full_like(v, np.inf)),
    "shape": lambda r: replace_arrays(r, lambda k, v: v.reshape(-1)[:-1]),
    "dtype": lambda r: replace_arrays(r, lambda k, v: v.astype(np.float64)),
    "zero-examples": lambda r: replace_examples(r, 0),
    "negative-examples": lambda r: replace_examples(r, -5),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_reply_is_rejected_recorded_and_excluded(run_server, tmp_path, kind):
    # every client of the run is sampled (2 shards x 2 of 4... all 8 take part)
    summary, _ = run_server({"frameworks": "none", "num-rounds": 1,
                             "clients-per-round": 8}, tamper={1002: HOSTILE[kind]})
    rejected = [e for e in summary["faults"]["entries"] if e["kind"] == "rejected"]
    assert [(e["partition"], e["round"]) for e in rejected] == [(2, 1)]
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    shard = next(s for s, pids in enumerate(summary["shards"]) if 2 in pids)
    assert 2 not in [p for p, _ in store.participants(shard, 1)]
    assert len(store.participants(shard, 1)) == 3  # the others were aggregated
    assert np.isfinite(summary["learning"]["loss"])


def test_dropout_is_recorded_and_the_round_goes_on(run_server, tmp_path):
    summary, _ = run_server({"frameworks": "none", "num-rounds": 2,
                             "clients-per-round": 8}, silent={1005})
    dropouts = [e for e in summary["faults"]["entries"] if e["kind"] == "dropout"]
    assert [(e["partition"], e["round"]) for e in dropouts] == [(5, 1), (5, 2)]
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    assert all(5 not in [p for p, _ in store.participants(s, r)]
               for s in (0, 1) for r in (1, 2))


def test_shard_round_without_any_answer_keeps_the_model(run_server, tmp_path):
    from server_app.federation import assign_shards

    # nobody of shard 0 answers (a learning run where no shard moves fails:
    # tests/test_strategies.py::test_learning_that_moves_no_model_fails)
    silent = {1000 + p for p in assign_shards(8, 2, 0)[0]}
    summary, _ = run_server({"frameworks": "none", "num-rounds": 1}, silent=silent)
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    assert store.participants(0, 1) == [] and len(store.participants(1, 1)) == 2
    w0, w1 = store.shard_model(0, 0), store.shard_model(0, 1)
    assert all(w0[k].tobytes() == w1[k].tobytes() for k in w0)
    assert summary["faults"]["counts"] == {"dropout": 2}
    assert "shard 0 accepted no reply" in summary["learning"]["rounds"][0]["warnings"][0]


def test_unlearning_with_a_silent_retained_client(run_server):
    # client 4 trains normally, then does not answer unlearning messages
    def lose_unlearning(reply):
        return None if reply.metadata.message_type == "train.unlearn" else reply

    summary, _ = run_server({"forget-clients": "3", "frameworks": "SE",
                             "num-rounds": 2, "clients-per-round": 8},
                            tamper={1004: lose_unlearning})
    assert any(4 in pids and 3 in pids for pids in summary["shards"])  # same shard
    assert np.isfinite(summary["frameworks"]["SE"]["loss"])
    lost = [(e["stage"], e["partition"], e["kind"]) for e in summary["faults"]["entries"]]
    # asked in calibration round 2 (round 1 is preparation from storage)
    assert lost == [("SE request 0", 4, "dropout")]
