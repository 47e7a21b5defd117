"""Records and class-level erasure requests (issue 45): ids, checks, the clients' side.

A records request (``forget-records``) erases some records of a client that stays;
no local training after the request may see them: the test of record reads every
training message the run sends and the number of examples each reply trained on.
"""

from __future__ import annotations

import numpy as np
import pytest

from server_app.config import ConfigError, RunConfig
from server_app.stages.audit import audited_run
from server_app.unlearning.erasure import Erasure
from task.config import fused_run_config
from task.records import check_against_sizes, keep_mask, parse_ids, parse_records


def test_record_ids_parse_into_sorted_distinct_ids():
    assert parse_ids("3,18,40-43, 3") == [3, 18, 40, 41, 42, 43]
    assert parse_records("17:3,18,40-42; 2:0") == {17: [3, 18, 40, 41, 42], 2: [0]}
    assert parse_records("") == {}


@pytest.mark.parametrize("spec, message", [
    ("17", "is not CLIENT:IDS"), ("a:1", "is not CLIENT:IDS"),
    ("1:5-2", "runs backwards"), ("1:x", "is not an id"),
    ("1:1; 1:2", "named twice"), ("1:", "is not an id"), (" ; ", "names no CLIENT:IDS"),
    ("3:0-99999999999", "goes past 999,999"),  # refused before it is expanded
    ("3:99999999999999999999", "goes past 999,999")])
def test_a_bad_records_spec_is_one_line_naming_the_part(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_records(spec)
    assert "\n" not in str(err.value)


def test_keep_mask_drops_the_ids_and_the_labels():
    labels = np.array([0, 1, 2, 1, 0, 2])
    keep = keep_mask(6, labels, erased_ids=[0, 5], erased_labels=[1])
    assert keep.tolist() == [False, False, True, False, True, False]
    with pytest.raises(ValueError, match=r"in 0\.\.5: got \[6\]"):
        keep_mask(6, labels, [6])


def test_sizes_bound_the_ids_and_a_client_keeps_a_record():
    assert check_against_sizes({3: [0, 9]}, {3: 10}) is None
    assert "holds 10 records (ids 0..9); 10 is not one" in check_against_sizes(
        {3: [10]}, {3: 10})
    assert "would keep no record" in check_against_sizes({3: list(range(10))}, {3: 10})


def _config(**overrides) -> RunConfig:
    return RunConfig.from_run_config(fused_run_config(
        {"num-clients": 8, "num-shards": 2, "clients-per-round": 4, **overrides}))


@pytest.mark.parametrize("overrides, key, allowed", [
    ({"forget-records": "3:0-4", "frameworks": "SE,FE"}, "frameworks",
     "FE forget whole clients only"),
    ({"forget-records": "3:0-4", "frameworks": "none"}, "frameworks", "none forget"),
    ({"forget-records": "3:0-4", "forget-clients": "2"}, "forget-records",
     "'' when forget-clients is set"),
    ({"forget-records": "9:0", "frameworks": "SE"}, "forget-records", "clients in 0..7"),
    ({"forget-records": "3:0", "forget-labels": "1", "frameworks": "SE"}, "forget-labels",
     "'' when forget-records is set"),
    ({"forget-labels": "1", "frameworks": "SE", "num-requests": 2}, "num-requests",
     "forget-labels is the one request"),
    ({"forget-records": "3:0", "frameworks": "SE", "clients-per-request": 2},
     "clients-per-request", "1 when forget-records is set"),
    ({"forget-records": "3:0", "frameworks": "SE,FR", "num-stages": 2},
     "forget-records", "num-stages > 1")])
def test_an_erasure_the_run_cannot_carry_out_is_refused_in_one_line(overrides, key,
                                                                    allowed):
    with pytest.raises(ConfigError) as err:
        _config(**overrides).validate()
    text = str(err.value)
    assert f"'{key}'" in text and allowed in text and "\n" not in text


def test_an_erasure_names_what_each_client_drops():
    erasure = Erasure({3: (0, 4)}, (), tuple(range(8)))
    assert erasure.changed == {3}
    assert erasure.message_config(3) == {"erased-records": [0, 4]}
    assert erasure.message_config(2) == {}
    labels = Erasure({}, (7,), tuple(range(8)))
    assert labels.changed == set(range(8))
    assert labels.message_config(2) == {"erased-labels": [7]}


@pytest.mark.inprocess
def test_no_training_after_a_records_request_sees_the_erased_records(run_server,
                                                                    monkeypatch):
    """Issue 45's first check: SE, SISA, FR and RR retrain client 3 without them.

    Every training message to client 3 after learning names its 10 erased ids and
    each reply trained on 64 - 10 = 54 examples; in learning it trained on 64.
    Clients other than 3 are never told to drop anything.
    """
    from experiments.grid import InProcessGrid

    seen: list[tuple[int, str, list, int]] = []
    deliver = InProcessGrid._deliver

    def spy(grid, message, dst):
        reply = deliver(grid, message, dst)
        kind = message.metadata.message_type
        if kind.startswith("train") and reply is not None and reply.has_content():
            pid = grid.contexts[dst].node_config["partition-id"]
            erased = list(message.content["config"].get("erased-records") or [])
            seen.append((pid, kind, erased, int(reply.content["metrics"]["num-examples"])))
        return reply

    monkeypatch.setattr(InProcessGrid, "_deliver", spy)
    summary, _ = run_server({"forget-records": "3:0-9", "frameworks": "SE,SISA,FR,RR",
                             "mia": False, "num-rounds": 3})
    learning = 3 * 4  # rounds x clients a round: the messages of learning come first
    before, after = seen[:learning], seen[learning:]
    assert all(not erased for _, _, erased, _ in before)
    assert [n for p, _, _, n in before if p == 3] in ([], [64] * len(
        [p for p, *_ in before if p == 3]))
    mine = [(erased, n) for p, _, erased, n in after if p == 3]
    assert mine, "client 3 never retrained"
    assert all(erased == list(range(10)) and n == 54 for erased, n in mine), mine
    assert all(not erased for p, _, erased, _ in after if p != 3), after
    assert summary["unlearning"]["erasure"] == {"records": {"3": list(range(10))},
                                                "labels": []}
    assert set(summary["frameworks"]) == {"SE", "SISA", "FR", "RR"}
    assert summary["unlearning"]["requests"] == []


@pytest.mark.inprocess
def test_a_records_request_files_a_receipt_naming_the_records(run_server, tmp_path):
    import json

    from cli.receipts import receipt_line

    summary, _ = run_server({"forget-records": "3:0-9", "frameworks": "SE", "mia": True})
    assert any("membership audit not run" in n for n in summary["notes"])
    (path,) = (tmp_path / "t" / "receipts").glob("*.json")
    receipt = json.loads(path.read_text())
    assert receipt["clients"] == [] and receipt["erasure"]["records"] == {
        "3": list(range(10))}
    assert (receipt["version"]["before"], receipt["version"]["after"]) == (1, 2)
    assert "records: 10 records of client 3" in receipt_line(receipt)


@pytest.mark.inprocess
def test_a_class_level_request_drops_the_label_on_every_client(run_server, monkeypatch):
    """``forget-labels``: no client trains on label 7 after the request; every
    shard is replayed (SE) or retrained (SISA), and each model is scored on the
    label's test samples apart."""
    from experiments.grid import InProcessGrid

    kept_sevens: list[int] = []
    deliver = InProcessGrid._deliver

    def spy(grid, message, dst):
        if message.metadata.message_type.startswith("train") and \
                message.content["config"].get("erased-labels"):
            kept_sevens.append(list(message.content["config"]["erased-labels"]))
        return deliver(grid, message, dst)

    monkeypatch.setattr(InProcessGrid, "_deliver", spy)
    summary, _ = run_server({"forget-labels": "7", "frameworks": "SE,SISA",
                             "mia": False})
    assert kept_sevens and all(labels == [7] for labels in kept_sevens)
    for name in ("SE", "SISA"):
        fw = summary["frameworks"][name]
        assert 0.0 <= fw["erased_label_accuracy"] <= 1.0
        assert 0.0 <= fw["kept_label_accuracy"] <= 1.0
        # every shard holds a 7: both shards were retrained
        assert sorted({s for r in fw["requests"] for s in r["impacted_shards"]}) == [0, 1]
    assert summary["original"]["erased_label_accuracy"] is not None
    # mia = false here: no note; with mia = true the run says the audit did not run
    assert not any("membership audit not run" in n for n in summary["notes"])


class _Late:
    """A shard's stored rounds 1-4; client 9 first trains in round 3."""

    def rounds(self, shard):
        return [1, 2, 3, 4]

    def participants(self, shard, rnd):
        return [(0, 10), (1, 10)] + ([(9, 10)] if rnd >= 3 else [])

    def update(self, shard, rnd, pid):
        return {"w": np.full(3, float(pid), np.float32)}


def test_a_changed_client_starts_the_replay_at_its_first_round_and_stays_in_it():
    """SE for a records request: g0 is the owner's first round; it is retained."""
    from strategies.replay import CalibratedRetraining, ReplaySchedule

    nodes = {p: 100 + p for p in (0, 1, 9)}
    replay = CalibratedRetraining(_Late(), 0, (), nodes, 1.0, ReplaySchedule(refill=True),
                                  changed={9}, members=(0, 1, 9))
    assert replay.start_round == 3 and replay.plan == [3, 4]
    assert [p for p, _ in replay.retained(3)] == [0, 1, 9]
    assert not any(replay.substitutes.values())  # nobody left: no slot to refill
    untouched = CalibratedRetraining(_Late(), 0, (), nodes, 1.0)
    assert untouched.start_round is None and untouched.plan == []


@pytest.mark.inprocess
def test_a_records_request_replays_from_coded_slices(run_server, monkeypatch):
    """With ``storage = 'coded'`` SE decodes the shard's history from the clients'
    slices and replays it with the owner training on what it keeps."""
    from experiments.grid import InProcessGrid

    trained: list[int] = []
    deliver = InProcessGrid._deliver

    def spy(grid, message, dst):
        reply = deliver(grid, message, dst)
        if message.metadata.message_type == "train.unlearn" and \
                grid.contexts[dst].node_config["partition-id"] == 3:
            trained.append(int(reply.content["metrics"]["num-examples"]))
        return reply

    monkeypatch.setattr(InProcessGrid, "_deliver", spy)
    summary, _ = run_server({"forget-records": "3:0-9", "frameworks": "SE",
                             "storage": "coded", "mia": False, "num-rounds": 3})
    assert summary["storage"]["mode"] == "coded"
    assert trained and set(trained) == {54}  # 64 held, 10 erased
    assert summary["frameworks"]["SE"]["client_epochs"] > 0


def test_the_audit_targets_of_a_records_request_are_the_erased_records(shared_data):
    """choose_sets with records: exactly the erased rows of each owner, in order."""
    from audits.mia_sets import choose_sets, client_rows
    from server_app.config import RunConfig
    from server_app.config.tasks import load_run_data
    from task.config import fused_run_config
    from tests.conftest import TINY

    cfg = RunConfig.from_run_config(fused_run_config({
        **TINY, "data-dir": str(shared_data), "frameworks": "SE",
        "forget-records": "3:0-9; 5:2,7"}))
    task = load_run_data(cfg, str(shared_data))
    rows = client_rows(cfg.data, cfg.seed, task)
    sets = choose_sets(audited_run(cfg), task, [3, 5], 64, {3: list(range(10)), 5: [2, 7]})
    assert sets.target.tolist() == rows[3][:10].tolist() + rows[5][[2, 7]].tolist()
    assert sets.owner.tolist() == [3] * 10 + [5] * 2
    kept = np.concatenate([rows[3][10:], rows[5][[0, 1, 3, 4, 5, 6]]])
    assert not set(sets.partner.tolist()) & set(kept.tolist())  # non-members: no client's


@pytest.mark.inprocess
def test_a_records_request_with_shadows_scores_the_erased_records(run_server, tmp_path):
    import json

    summary, _ = run_server({"forget-records": "3:0-9", "frameworks": "SE,FR",
                             "mia": True, "mia-shadows": 1, "mia-references": 2,
                             "mia-nonmembers": 40})
    assert not any("membership audit not run" in n for n in summary["notes"])
    mia = summary["verification"]["mia"]
    assert mia["n_targets"] == 10 and mia["targets"] == [3]
    assert mia["targets_are"] == "the erased records of the clients named"
    for block in (summary["original"], summary["frameworks"]["SE"],
                  summary["frameworks"]["FR"]):
        assert block["mia_n_target"] == 10 and block["mia_lira_n_member"] == 10
        assert 0.0 <= block["mia_lira_auc"] <= 1.0
    # the receipt names the records erased and carries the scores
    (path,) = (tmp_path / "t" / "receipts").glob("*.json")
    receipt = json.loads(path.read_text())
    assert receipt["erasure"]["records"] == {"3": list(range(10))}
    assert set(receipt["verification"]["mia_lira_auc"]) == {"original", "SE", "FR"}


@pytest.mark.inprocess
def test_a_staged_run_takes_a_records_request_at_its_boundary_and_keeps_it(
        tmp_path, shared_data, monkeypatch):
    """Issue 45, item 4: erased at the end of stage 1, never trained on after it.

    The request arrives while stage 1 learns; at its boundary SE replays client 3's
    shard and FR retrains, client 3 training on 54 of its 64 records; in stage 2's
    learning every message to client 3 still names the 10 ids, and no other client
    is told to drop anything.
    """
    import json

    from flwr.app import Context, RecordDict

    from cli.forget import submit_records
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity
    from server_app.app import main
    from server_app.stages import pipeline
    from task.config import fused_run_config
    from tests.conftest import TINY

    config = fused_run_config({**TINY, "num-stages": 2, "frameworks": "SE,FR",
                               "mia": False, "seed": 1, "results-dir": str(tmp_path),
                               "run-name": "r", "data-dir": str(shared_data)})
    phase, seen = {"now": "stage 1"}, []
    deliver, real_stage, real_boundary = (InProcessGrid._deliver, pipeline.run_stage,
                                          pipeline.handle_boundary)

    def spy(grid, message, dst):
        reply = deliver(grid, message, dst)
        if message.metadata.message_type.startswith("train") and reply.has_content():
            pid = grid.contexts[dst].node_config["partition-id"]
            seen.append((phase["now"], pid,
                         list(message.content["config"].get("erased-records") or []),
                         int(reply.content["metrics"]["num-examples"])))
        return reply

    def run_stage(run, member):
        if not run.members:  # the request arrives while stage 1 learns
            submit_records("r", "3", "0-9", str(tmp_path))
        phase["now"] = f"stage {len(run.members) + 1}"
        return real_stage(run, member)

    def handle_boundary(run, member, entry):
        phase["now"] = f"boundary {member.stage}"
        real_boundary(run, member, entry)
        phase["now"] = "after"

    monkeypatch.setattr(InProcessGrid, "_deliver", spy)
    monkeypatch.setattr(pipeline, "run_stage", run_stage)
    monkeypatch.setattr(pipeline, "handle_boundary", handle_boundary)
    set_task_identity()
    main(InProcessGrid(client_app, 8, config), Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    (path,) = [p for p in (tmp_path / "r" / "receipts").glob("*.json")
               if json.loads(p.read_text()).get("erasure")]
    receipt = json.loads(path.read_text())
    assert receipt["status"] == "done" and receipt["stage"] == 1
    assert receipt["erasure"]["records"] == {"3": list(range(10))}
    assert set(receipt["cost"]) == {"SE", "FR"}
    by_phase = {p: [(pid, ids, n) for ph, pid, ids, n in seen if ph == p]
                for p in ("stage 1", "boundary 1", "stage 2")}
    assert all(not ids for _, ids, _ in by_phase["stage 1"])
    for p in ("boundary 1", "stage 2"):
        to3 = [(ids, n) for pid, ids, n in by_phase[p] if pid == 3]
        assert to3 and all(ids == list(range(10)) and n == 54 for ids, n in to3), p
        assert not any(ids for pid, ids, _ in by_phase[p] if pid != 3)
