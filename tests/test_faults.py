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


def rename_records(reply):
    """The reply of the issue: records ``params`` / ``stats``, not arrays / metrics."""
    content = RecordDict({"params": reply.content["arrays"],
                          "stats": reply.content["metrics"]})
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


HOSTILE = {  # kind -> (tamper, words of the recorded reason)
    "nan": (lambda r: replace_arrays(r, nan), "has NaN or Inf values"),
    "inf": (lambda r: replace_arrays(r, lambda k, v: np.full_like(v, np.inf)),
            "has NaN or Inf values"),
    "shape": (lambda r: replace_arrays(r, lambda k, v: v.reshape(-1)[:-1]), "expected"),
    "dtype": (lambda r: replace_arrays(r, lambda k, v: v.astype(np.float64)),
              "expected float32"),
    "zero-examples": (lambda r: replace_examples(r, 0), "num-examples = 0"),
    "negative-examples": (lambda r: replace_examples(r, -5), "num-examples = -5"),
    # the inputs: each used to kill the ServerApp before summary.json
    "inf-examples": (lambda r: replace_examples(r, float("inf")),
                     "num-examples = inf: must be finite"),
    "nan-examples": (lambda r: replace_examples(r, float("nan")),
                     "num-examples = nan: must be finite"),
    "1e20-examples": (lambda r: replace_examples(r, 1e20),
                      "num-examples = 1e+20: must be an integer in [1, 64]"),
    "10**20-examples": (lambda r: replace_examples(r, 10**20),
                        "must be an integer in [1, 64] (samples held)"),
    "more-examples-than-held": (lambda r: replace_examples(r, 65),
                                "num-examples = 65: must be an integer in [1, 64]"),
    "params-stats": (rename_records, "records ['params', 'stats']: a training reply "
                                     "holds exactly ['arrays', 'metrics']"),
}


def test_each_hostile_reply_is_rejected_recorded_and_excluded(run_server, tmp_path):
    """One run in which each of 12 clients breaks its reply in its own way (6 a shard;
    every client is sampled), and each shard's 6 honest clients are aggregated."""
    from server_app.rounds.federation import assign_shards

    config = {"frameworks": "none", "num-rounds": 1, "num-clients": 24,
              "clients-per-round": 24}
    shards = assign_shards(24, 2, 0)
    first_six = [p for shard in shards for p in shard[:6]]
    hostile = dict(zip(first_six, sorted(HOSTILE), strict=True))
    summary, _ = run_server(config, tamper={1000 + p: HOSTILE[kind][0]
                                            for p, kind in hostile.items()})
    assert summary["shards"] == shards
    assert summary["faults"]["counts"] == {"rejected": 12}  # and summary.json exists
    faults = {fault["partition"]: fault for fault in summary["faults"]["entries"]}
    assert sorted(faults) == sorted(hostile)
    store = HistoryStore.open(tmp_path / "t" / "history" / "sharded")
    for p, kind in hostile.items():
        fault = faults[p]
        assert (fault["round"], fault["stage"]) == (1, "sharded"), kind
        assert HOSTILE[kind][1] in fault["reason"], (kind, fault["reason"])
    for s, pids in enumerate(shards):
        assert sorted(p for p, _ in store.participants(s, 1)) == pids[6:]  # the others
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
    from server_app.rounds.federation import assign_shards

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


def test_renamed_unlearning_replies_are_rejected_in_se_and_fr(run_server):
    # the first client SE asks to retrain answers SE, then FR, with params / stats
    chosen = {}

    def rename_after_learning(node):
        def tamper(reply):
            if reply.metadata.message_type == "train.unlearn":
                chosen.setdefault("node", node)
            return rename_records(reply) if chosen.get("node") == node else reply
        return tamper

    summary, _ = run_server({"forget-clients": "3", "frameworks": "SE,FR",
                             "num-rounds": 2, "clients-per-round": 6, "mia": False},
                            tamper={n: rename_after_learning(n) for n in range(1000, 1008)})
    pid = chosen["node"] - 1000
    lost = [(e["stage"], e["partition"], e["kind"]) for e in summary["faults"]["entries"]]
    assert set(lost) == {("FR request 0", pid, "rejected"),  # each round it was asked
                         ("SE request 0", pid, "rejected")}
    assert all("['params', 'stats']" in e["reason"] for e in summary["faults"]["entries"])
    assert all(np.isfinite(summary["frameworks"][n]["loss"]) for n in ("SE", "FR"))


def test_unlearning_that_accepts_no_reply_fails_the_run(run_server):
    from server_app.unlearning.driver import UnlearningStalledError

    def refuse_unlearning(reply):  # learning works; every unlearning reply is broken
        if reply.metadata.message_type == "train.unlearn":
            return rename_records(reply)
        return reply

    with pytest.raises(UnlearningStalledError, match=r"SE request 0: .* accepted no "
                       r"reply .*first rejection: .*\['params', 'stats'\]"):
        run_server({"forget-clients": "3", "frameworks": "SE", "num-rounds": 2,
                    "clients-per-round": 8, "mia": False},
                   tamper={n: refuse_unlearning for n in range(1000, 1008)})


def test_absurd_finite_weights_are_rejected_in_uncoded_storage(run_server):
    summary, _ = run_server({"frameworks": "none", "num-rounds": 1,
                             "clients-per-round": 8},
                            tamper={1002: lambda r: replace_arrays(
                                r, lambda k, v: np.full_like(v, 1e30))})
    (fault,) = summary["faults"]["entries"]
    assert "moves by 1e+30" in fault["reason"] and "up to 1e+04" in fault["reason"]
    assert np.isfinite(summary["learning"]["loss"])


def test_a_client_error_text_is_stored_as_one_short_line(run_server):
    from flwr.app import Error

    def fail(reply):
        return Message(error=Error(code=1, reason="\x1b[31mboom\x1b[0m\n" + "x" * 10**5),
                       reply_to=_stand_in(reply))

    summary, _ = run_server({"frameworks": "none", "num-rounds": 1,
                             "clients-per-round": 8}, tamper={1002: fail})
    (fault,) = summary["faults"]["entries"]
    assert fault["kind"] == "error" and fault["reason"].startswith("client error: boom x")
    assert len(fault["reason"]) == 500 and fault["reason"].isprintable()


def _stand_in(reply):
    return Message(RecordDict(), dst_node_id=reply.metadata.src_node_id,
                   message_type=reply.metadata.message_type)


def test_an_unlearned_model_with_nan_or_inf_is_never_reported():
    """SE-R without its abnormality check once blew its shard up (paper preset,
    recovery-threshold = 1e6) while the ensemble still scored 97.8%: such a model
    stops the run with the shard named, instead of being saved."""
    from flwr.app import Array, ArrayRecord

    from server_app.unlearning.driver import UnlearningDivergedError, _check_finite

    good = ArrayRecord({"w": Array(np.ones((2, 2), dtype=np.float32))})
    _check_finite("SE-R request 0", [good, good])  # finite: nothing happens
    for bad_value in (np.nan, np.inf, -np.inf):
        w = np.ones((2, 2), dtype=np.float32)
        w[1, 0] = bad_value
        bad = ArrayRecord({"w": Array(w), "b": Array(np.zeros(2, dtype=np.float32))})
        with pytest.raises(UnlearningDivergedError,
                           match=r"SE-R request 0: .*shard\(s\) \[1\] has NaN or inf"):
            _check_finite("SE-R request 0", [good, bad])
