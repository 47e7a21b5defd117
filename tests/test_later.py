"""Forget after the run: a finished run takes a request and makes a new model version."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from cli.forget import submit
from history.files import read_arrays
from runstore.inbox import RequestInbox
from server_app.admission import lineage_shards
from server_app.app import main
from server_app.rounds.federation import assign_shards
from task.config import fused_run_config
from tests.conftest import TINY

BASE = {**TINY, "mia": False, "seed": 3}


def _run(make_grid, config: dict) -> None:
    grid = make_grid(int(config["num-clients"]), config)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))


def _config(tmp_path, shared_data, name: str, **overrides) -> dict:
    return fused_run_config({**BASE, "results-dir": str(tmp_path), "run-name": name,
                             "data-dir": str(shared_data), **overrides})


def _versions(folder):
    inbox = RequestInbox(folder / "run.sqlite")
    try:
        return inbox.versions()
    finally:
        inbox.close()


def test_a_finished_run_forgets_later_as_se_would_have(tmp_path, make_grid, shared_data):
    learned = _config(tmp_path, shared_data, "a", frameworks="none")
    _run(make_grid, learned)
    folder = tmp_path / "a"
    summary_before = (folder / "summary.json").read_bytes()
    (v1,) = _versions(folder)
    v1_bytes = (folder / v1.file).read_bytes()
    rid = submit("a", "3", str(tmp_path))
    _run(make_grid, {**learned, "later-requests": True})
    v1_again, v2 = _versions(folder)
    assert v1_again == v1 and (folder / v1.file).read_bytes() == v1_bytes
    assert (folder / "summary.json").read_bytes() == summary_before
    assert v2.version == 2 and v2.forgotten == [3] and v2.requests == [rid]
    # the same request in one run, same seed: SE's models bit for bit
    _run(make_grid, _config(tmp_path, shared_data, "b", frameworks="SE",
                            **{"forget-clients": "3"}))
    se = read_arrays(tmp_path / "b" / "models" / "SE.npz")
    new = read_arrays(folder / v2.file)
    old = read_arrays(folder / v1.file)
    receipt = json.loads((folder / "receipts" / f"{rid}.json").read_text())
    impacted = receipt["shards_retrained"]
    assert impacted == [s for s, pids in enumerate(assign_shards(8, 2, BASE["seed"]))
                        if 3 in pids]  # client 3's shard only
    for key in new:
        shard = int(key.split("/", 1)[0].removeprefix("shard"))
        want = se[key] if shard in impacted else old[key]
        assert np.array_equal(new[key], want), key
    assert receipt["models_sha256"]["before"] == v1.digests
    assert receipt["models_sha256"]["after"] == v2.digests
    assert receipt["version"] == {"before": 1, "after": 2,
                                  "after_file_sha256": v2.file_sha256}
    erased = receipt["erased"]
    assert erased["updates"] and all(c == 3 for _, _, c in erased["updates"])
    # the evidence: counts, and the blob files that are gone
    counts = erased["counts"]
    assert counts["updates"] == len(erased["updates"]) and counts["bytes"] > 0
    assert counts["files"] == len(erased["files"]) == \
        counts["updates"] + counts["shard_models"]
    blobs = folder / "history" / "sharded" / "blobs"
    assert not any((blobs / name).exists() for name in erased["files"])
    assert erased["files"][0] == "update_s{}_r{}_c3.npz".format(*erased["updates"][0])


@pytest.mark.parametrize("coded", [{}, {"storage": "coded", "blocks-per-shard": 2}])
def test_a_planned_request_erases_as_a_later_one_and_the_next_request_agrees(
        tmp_path, make_grid, shared_data, coded):
    """The planned request's erasure leaves the store a later request would have.

    Run a forgets client 3 as planned (its updates erased after the storage
    report); run b learns, then forgets 3 later. A later request for a client of
    3's shard then gives both runs the same models, bit for bit.
    """
    mate = next(p for pids in assign_shards(8, 2, BASE["seed"]) if 3 in pids
                for p in pids if p != 3)
    nodes = {"node-dirs": str(tmp_path / "{}-nodes")} if coded else {}
    runs = {"a": {"frameworks": "SE", "forget-clients": "3"}, "b": {"frameworks": "none"}}
    for name, settings in runs.items():
        config = _config(tmp_path, shared_data, name, **coded, **settings,
                         **{k: v.format(name) for k, v in nodes.items()})
        _run(make_grid, config)
        if name == "b":
            submit(name, "3", str(tmp_path))
            _run(make_grid, {**config, "later-requests": True})
        (first,) = [json.loads(p.read_text()) for p in
                    sorted((tmp_path / name / "receipts").glob("*.json"))]
        assert first["erased"]["counts"]["updates"] > 0 and "kept" not in first["erased"]
        runs[name] = (config, first["erased"])
        submit(name, str(mate), str(tmp_path))
        _run(make_grid, {**config, "later-requests": True})
    planned, later = runs["a"][1], runs["b"][1]
    if not coded:  # the planned erasure keeps the learned W^G, which v1 holds too
        learned = [m for m in later["shard_models"] if m[1] == BASE["num-rounds"]]
        assert learned and all(m not in planned["shard_models"] for m in learned)
        assert planned.pop("kept_models") == learned  # and the receipt says so
        later = {**later, "shard_models": [m for m in later["shard_models"]
                                           if m not in learned]}
        later["files"] = [f for f in later["files"]
                          if f not in {"model_s{}_r{}.npz".format(*m) for m in learned}]
        later, planned = ({k: v for k, v in d.items() if k not in ("bytes", "counts")}
                          for d in (later, planned))
    assert planned == later  # the same erasure, planned or later
    (a, b) = (_versions(tmp_path / n)[-1] for n in "ab")
    assert a.forgotten == b.forgotten == sorted([3, mate])
    assert a.digests == b.digests


def test_models_lists_versions_and_export_loads_each_in_plain_torch(
        tmp_path, make_grid, shared_data, capsys):
    import torch
    from flwr.app import Array, ArrayRecord
    from safetensors import safe_open
    from safetensors.torch import load_file

    from cli.models import main_export, main_models
    from history.files import readable_mode
    from runstore.receipts import models_sha256, utc
    from task.registry import get_task

    learned = _config(tmp_path, shared_data, "e", frameworks="none")
    _run(make_grid, learned)
    rid = submit("e", "3", str(tmp_path))
    _run(make_grid, {**learned, "later-requests": True})
    folder = tmp_path / "e"
    v1, v2 = _versions(folder)
    capsys.readouterr()
    assert main_models(["--run", "e", "--results-dir", str(tmp_path)], "models") == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2
    for row, version, forgotten, requests in ((rows[0], v1, "-", "-"),
                                              (rows[1], v2, "[3]", rid)):
        digest = version.digests["models"]
        assert len(digest) == 64  # the full SHA-256, as receipts name it
        assert row.startswith(f"v{version.version}  {utc(version.created)}  accuracy "
                              f"{version.scores['accuracy']:.4f}  forgotten "
                              f"{forgotten}  requests {requests}  models sha256 "
                              f"{digest}  {version.file}  ("), row
    receipt = json.loads((folder / "receipts" / f"{rid}.json").read_text())
    assert receipt["models_sha256"]["after"]["models"] == v2.digests["models"] in rows[1]
    assert v1.digests["models"] != v2.digests["models"]
    for version, suffix in ((v2, ".safetensors"), (v2, ".pt"), (v1, ".pt")):
        out = tmp_path / f"model-v{version.version}{suffix}"
        assert main_export(["--run", "e", "--out", str(out), "--results-dir",
                            str(tmp_path), "--version", str(version.version)],
                           "export") == 0
        printed = capsys.readouterr().out
        assert f"models sha256 {version.digests['models']}" in printed
        if suffix == ".pt":
            saved = torch.load(out, weights_only=True)
            shards, meta = saved["shards"], saved["metadata"]
        else:
            flat = load_file(out)
            shards = [{k.split("/", 1)[1]: v for k, v in flat.items()
                       if k.startswith(f"shard{s}/")} for s in range(2)]
            with safe_open(out, "pt") as f:
                meta = f.metadata()
        assert meta["architecture"] == "task.model.CNN" and meta["num_shards"] == "2"
        assert meta["version"] == str(version.version)
        assert json.loads(meta["forgotten"]) == version.forgotten
        assert out.stat().st_mode & 0o777 == readable_mode()  # a server may read it
        stored = read_arrays(folder / version.file)
        args = json.loads(meta["factory_args"])  # the recipe the metadata names
        assert meta["factory"] == "task.registry.get_task(task).model(num_classes)"
        for s, state in enumerate(shards):
            model = get_task(args["task"]).model(args["num_classes"])
            model.load_state_dict(state)  # strict: every layer, nothing else
            for key, tensor in model.state_dict().items():
                assert np.array_equal(tensor.numpy(), stored[f"shard{s}/{key}"])
        # the models digest, recomputed from the file in the metadata's layer order
        layers = json.loads(meta["layers"])
        records = [ArrayRecord({k: Array(state[k].numpy()) for k in layers})
                   for state in shards]
        assert models_sha256(records) == version.digests["models"]
        if suffix == ".safetensors":  # the same version, the same bytes
            again = tmp_path / "again.safetensors"
            main_export(["--run", "e", "--out", str(again), "--results-dir",
                         str(tmp_path), "--version", str(version.version)], "export")
            assert again.read_bytes() == out.read_bytes()
    # summary.json predates v2: show says so, and export of v1 that it is superseded
    from cli.show import main_show

    capsys.readouterr()
    assert main_show(["--run", "e", "--results-dir", str(tmp_path)], "show") == 0
    assert ("1 request carried out since (latest v2, clients [3] forgotten)"
            in capsys.readouterr().out)
    main_export(["--run", "e", "--out", str(tmp_path / "v1.pt"), "--results-dir",
                 str(tmp_path), "--version", "1"], "export")
    assert f"export: note: v1 predates {rid} (latest v2: clients [3] forgotten since)" \
        in capsys.readouterr().err


def _forget_command(argv: list[str], folder, tmp_path, capsys) -> str:
    """``forget argv`` refused: its one stderr line; no engine, the folder unchanged."""
    from tests.test_stored_state import _command, _snapshot

    before = _snapshot(folder)
    status, err, record = _command(["forget", *argv], tmp_path, capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err[-2000:]
    assert not record.exists()  # no engine was started
    assert _snapshot(folder) == before  # nothing recorded
    return lines[0]


def test_refused_later_requests_change_nothing(tmp_path, make_grid, shared_data,
                                               capsys):
    from server_app.config import ConfigError
    from server_app.rounds.federation import assign_shards

    # SE carries out the planned request: v2 has client 3 forgotten
    learned = _config(tmp_path, shared_data, "r", frameworks="SE",
                      **{"forget-clients": "3"})
    _run(make_grid, learned)
    folder = tmp_path / "r"
    v1, v2 = _versions(folder)
    assert v2.forgotten == [3]
    with pytest.raises(ConfigError, match="unknown client"):
        submit("r", "8", str(tmp_path))
    where = ["--run", "r", "--results-dir", str(tmp_path)]
    line = _forget_command([*where, "--clients", "3"], folder, tmp_path, capsys)
    assert line.endswith("--clients '3': client(s) [3] are already forgotten (model "
                         "version v2)"), line
    # the rest of client 3's shard: the shard would keep no client
    (shard,) = [s for s, pids in enumerate(assign_shards(8, 2, BASE["seed"]))
                if 3 in pids]
    rest = [p for p in assign_shards(8, 2, BASE["seed"])[shard] if p != 3]
    text = ",".join(map(str, rest))
    line = _forget_command([*where, "--clients", text], folder, tmp_path, capsys)
    assert line.endswith(f"--clients '{text}': shard(s) [{shard}] would keep no client "
                         "(model version v2); nothing was recorded"), line
    # the ServerApp refuses it too (a request recorded past the command's check)
    inbox = RequestInbox(folder / "run.sqlite")
    rid = inbox.submit(rest).id
    inbox.close()
    _run(make_grid, {**learned, "later-requests": True})
    assert _versions(folder) == [v1, v2]
    inbox = RequestInbox(folder / "run.sqlite")
    planned, receipt = inbox.receipts()  # the planned request's, then the refused one
    inbox.close()
    assert planned["source"] == "planned" and planned["clients"] == [3]
    assert receipt["request_id"] == rid and receipt["status"] == "refused"
    assert receipt["reason"] == f"shard(s) [{shard}] would keep no client"


def test_a_killed_later_request_leaves_v1_and_is_done_once_on_rerun(
        tmp_path, make_grid, shared_data, monkeypatch):
    from server_app.stages import later

    learned = _config(tmp_path, shared_data, "k", frameworks="none")
    _run(make_grid, learned)
    folder = tmp_path / "k"
    (v1,) = _versions(folder)
    v1_bytes = (folder / v1.file).read_bytes()
    rid = submit("k", "5", str(tmp_path))
    real = later.make_version

    def die(*args, **kw):  # the models file is written, the process dies
        real(*args, **kw)
        raise KeyboardInterrupt("killed")

    with monkeypatch.context() as mp:
        mp.setattr(later, "make_version", die)
        with pytest.raises(KeyboardInterrupt):
            _run(make_grid, {**learned, "later-requests": True})
    assert _versions(folder) == [v1] and (folder / v1.file).read_bytes() == v1_bytes
    inbox = RequestInbox(folder / "run.sqlite")
    assert [r.id for r in inbox.pending()] == [rid]
    inbox.close()
    _run(make_grid, {**learned, "later-requests": True})
    v1_again, v2 = _versions(folder)
    assert v1_again == v1 and v2.requests == [rid]
    inbox = RequestInbox(folder / "run.sqlite")
    assert [r["request_id"] for r in inbox.receipts()] == [rid]
    assert inbox.pending() == []
    inbox.close()


def _names_versions(receipt: dict, before, after) -> None:
    """The receipt names both versions, their models' digests and the new file's."""
    assert receipt["status"] == "done" and receipt["after_run"] is True
    assert receipt["models_sha256"]["before"] == before.digests
    assert receipt["models_sha256"]["after"] == after.digests
    assert before.digests["models"] != after.digests["models"]
    assert receipt["version"] == {"before": before.version, "after": after.version,
                                  "after_file_sha256": after.file_sha256}


def _impacted_equal(new: dict, want: dict, old: dict, impacted: list[int]) -> None:
    for key in new:
        shard = int(key.split("/", 1)[0].removeprefix("shard"))
        assert np.array_equal(new[key], want[key] if shard in impacted else old[key]), key


def test_a_coded_run_decodes_its_node_folders_for_a_later_request(
        tmp_path, make_grid, shared_data):
    coded = {"storage": "coded", "blocks-per-shard": 2}
    learned = _config(tmp_path, shared_data, "c", frameworks="none",
                      **{**coded, "node-dirs": str(tmp_path / "c-nodes")})
    _run(make_grid, learned)
    assert sorted(p.name for p in (tmp_path / "c-nodes").iterdir()) == [
        str(p) for p in sorted(range(8), key=str)]
    rid = submit("c", "3", str(tmp_path))
    _run(make_grid, {**learned, "later-requests": True})  # a fresh grid: no state
    folder = tmp_path / "c"
    v1, v2 = _versions(folder)
    _run(make_grid, _config(tmp_path, shared_data, "cb", frameworks="SE",
                            **{**coded, "forget-clients": "3"}))
    receipt = json.loads((folder / "receipts" / f"{rid}.json").read_text())
    _impacted_equal(read_arrays(folder / v2.file),
                    read_arrays(tmp_path / "cb" / "models" / "SE.npz"),
                    read_arrays(folder / v1.file), receipt["shards_retrained"])
    # client 3's shard was retrained (else the comparison proves nothing)
    assert receipt["shards_retrained"] == [
        s for s, pids in enumerate(assign_shards(8, 2, BASE["seed"])) if 3 in pids]
    _names_versions(receipt, v1, v2)
    erased = receipt["erased"]
    assert erased["store"] == "coded" and erased["stale"] == []
    assert erased["counts"]["slice_parts_replaced"] == 8 * len(erased["rounds_recoded"])
    assert erased["updates"] and {c for _, _, c in erased["updates"]} == {3}
    recoded = {tuple(r) for r in erased["rounds_recoded"]}
    assert recoded == {(s, g) for s, g, _ in erased["updates"]}
    assert all(len(nodes) == 8 for nodes in erased["nodes"].values())
    # the re-coded rounds decode without client 3, and a second request still works
    rid2 = submit("c", "5", str(tmp_path))
    _run(make_grid, {**learned, "later-requests": True})
    *_, v3 = _versions(folder)
    assert v3.forgotten == [3, 5] and v3.requests == [rid2]


STAGED = {"num-clients": 8, "num-stages": 2, "joins-per-stage": 2,
          "frameworks": "SE", "requests-per-stage": 0}


def test_a_finished_staged_run_forgets_as_its_last_boundary_would_have(
        tmp_path, make_grid, shared_data, monkeypatch):
    from server_app.stages import pipeline

    learned = _config(tmp_path, shared_data, "s", **STAGED)
    _run(make_grid, learned)
    folder = tmp_path / "s"
    v1, v2 = _versions(folder)
    assert v2.file == "models/stage2.npz"
    rid = submit("s", "1", str(tmp_path))
    _run(make_grid, {**learned, "later-requests": True})
    *_, v3 = _versions(folder)
    # the same request taken at the last boundary of the same staged run
    real = pipeline.run_stage

    def request_in_stage_2(run, member):
        if member.stage == 2:
            submit("sb", "1", str(tmp_path))
        return real(run, member)

    monkeypatch.setattr(pipeline, "run_stage", request_in_stage_2)
    _run(make_grid, _config(tmp_path, shared_data, "sb", **STAGED))
    receipt = json.loads((folder / "receipts" / f"{rid}.json").read_text())
    _impacted_equal(read_arrays(folder / v3.file),
                    read_arrays(tmp_path / "sb" / "models" / "stage2.npz"),
                    read_arrays(folder / v2.file), receipt["shards_retrained"])
    # client 1's lineage was retrained (else the comparison proves nothing)
    shards = lineage_shards(8, 6, 2, BASE["seed"])  # 6 clients in stage 1
    assert receipt["shards_retrained"] == [s for s, pids in enumerate(shards)
                                           if 1 in pids]
    assert v3.forgotten == [1]
    _names_versions(receipt, v2, v3)
    # the boundary kept client 1's stored updates; the next request erases them
    blobs = tmp_path / "sb" / "history" / "sharded" / "blobs"
    assert list(blobs.glob("update_*_c1.npz"))
    rid = submit("sb", "2", str(tmp_path))
    _run(make_grid, {**_config(tmp_path, shared_data, "sb", **STAGED),
                     "later-requests": True})
    erased = json.loads((tmp_path / "sb" / "receipts" / f"{rid}.json").read_text())
    assert {c for _, _, c in erased["erased"]["updates"]} == {1, 2}
    assert erased["erased"]["earlier_clients"] == [1]
    assert not list(blobs.glob("update_*_c1.npz"))
    from cli.receipts import receipt_line

    theirs = sum(c == 1 for _, _, c in erased["erased"]["updates"])
    assert f"({theirs} of clients forgotten before: [1])" in receipt_line(erased)


def test_a_later_records_request_replays_as_a_planned_one_and_stays_in_force(
        tmp_path, make_grid, shared_data, monkeypatch):
    """Issue 45, item 4: records of client 3 erased after the run, as in one run.

    v2 keeps client 3 (nothing forgotten); its shard's SE models are bit for bit
    those of one run with ``forget-records = "3:0-9"``, the others v1's. A later
    client request in that shard still sends client 3 its erased ids.
    """
    from cli.forget import submit_records
    from experiments.grid import InProcessGrid

    learned = _config(tmp_path, shared_data, "a", frameworks="none")
    _run(make_grid, learned)
    folder = tmp_path / "a"
    (v1,) = _versions(folder)
    rid = submit_records("a", "3", "0-9", str(tmp_path))
    _run(make_grid, {**learned, "later-requests": True})
    v2 = _versions(folder)[-1]
    assert v2.forgotten == [] and v2.requests == [rid]
    receipt = json.loads((folder / "receipts" / f"{rid}.json").read_text())
    assert receipt["status"] == "done" and receipt["clients"] == []
    assert receipt["erasure"] == {"records": {"3": list(range(10))}, "labels": []}
    shard3 = next(s for s, pids in enumerate(assign_shards(8, 2, BASE["seed"]))
                  if 3 in pids)
    erased = receipt["erased"]  # every stored update of client 3: it saw the records
    assert erased["updates"] and all(c == 3 for _, _, c in erased["updates"])
    assert erased["shard_models"] and all(s == shard3 for s, _ in erased["shard_models"])
    assert receipt["shards_retrained"] == [shard3]
    _run(make_grid, _config(tmp_path, shared_data, "b", frameworks="SE",
                            **{"forget-records": "3:0-9"}))
    se = read_arrays(tmp_path / "b" / "models" / "SE.npz")
    new, old = read_arrays(folder / v2.file), read_arrays(folder / v1.file)
    for key in new:
        shard = int(key.split("/", 1)[0].removeprefix("shard"))
        assert np.array_equal(new[key], se[key] if shard == shard3 else old[key]), key
    # a client request in client 3's shard: client 3 still drops its 10 records
    seen = []
    deliver = InProcessGrid._deliver

    def spy(grid, message, dst):
        reply = deliver(grid, message, dst)
        if message.metadata.message_type.startswith("train"):
            pid = grid.contexts[dst].node_config["partition-id"]
            seen.append((pid, list(message.content["config"].get("erased-records")
                                   or [])))
        return reply

    monkeypatch.setattr(InProcessGrid, "_deliver", spy)
    other = next(p for p in assign_shards(8, 2, BASE["seed"])[shard3] if p != 3)
    submit("a", str(other), str(tmp_path))
    _run(make_grid, {**learned, "later-requests": True})
    assert _versions(folder)[-1].forgotten == [other]
    to3 = [ids for pid, ids in seen if pid == 3]
    assert to3 and all(ids == list(range(10)) for ids in to3)
    assert not any(ids for pid, ids in seen if pid != 3)


def test_a_later_records_request_it_cannot_carry_out_is_refused_before_recording(
        tmp_path, make_grid, shared_data):
    """Ids the owner does not hold, all erased, or none kept: one line, nothing recorded.

    The ServerApp's own check (the same function) refuses in its receipt only a
    request that reached the inbox without it (one written there directly).
    """
    from cli.forget import submit_records
    from server_app.config import ConfigError

    learned = _config(tmp_path, shared_data, "a", frameworks="SE,FR",
                      **{"client-samples": 16})
    _run(make_grid, learned)
    folder = tmp_path / "a"
    versions = len(_versions(folder))
    for client, ids, words in (("2", "4-1", "--records '4-1': range '4-1' runs backwards"),
                               ("2,3", "0", "one client"), ("99", "0", "--clients"),
                               ("2", "3,40", "client 2 holds 16 records (ids 0..15); "
                                "40 is not one"),
                               ("2", "100-104", "104 is not one"),
                               ("5", "0-15", "would keep no record")):
        with pytest.raises(ConfigError) as err:  # nothing recorded
            submit_records("a", client, ids, str(tmp_path))
        assert words in str(err.value) and "\n" not in str(err.value)
    from cli.forget import main_forget  # the README's command, recorded only
    assert main_forget(["--run", "a", "--clients", "2", "--records", "0-1",
                        "--results-dir", str(tmp_path), "--record-only"], "forget") == 0
    rid_ok = submit_records("a", "5", "0-3", str(tmp_path))
    with pytest.raises(ConfigError, match="erased already"):  # by rid_ok, pending
        submit_records("a", "5", "1-2", str(tmp_path))
    inbox = RequestInbox(folder / "run.sqlite")
    try:
        assert len(inbox.all()) == 3  # the planned request, r0002 and rid_ok
        raw = inbox.submit_records({2: [3, 40]}).id  # no check: a racing writer
    finally:
        inbox.close()
    _run(make_grid, {**learned, "later-requests": True})
    assert len(_versions(folder)) == versions + 2  # the two carried out
    receipt = json.loads((folder / "receipts" / f"{raw}.json").read_text())
    assert receipt["status"] == "refused" and "40 is not one" in receipt["reason"]
    done = json.loads((folder / "receipts" / f"{rid_ok}.json").read_text())
    assert done["status"] == "done" and set(done["cost"]) == {"SE", "FR"}


def test_a_later_class_request_replays_as_a_planned_one(tmp_path, make_grid,
                                                         shared_data):
    """``forget --labels 7`` on a finished run: SE's models are one run's, bit for bit."""
    from cli.forget import submit_records

    learned = _config(tmp_path, shared_data, "a", frameworks="none")
    _run(make_grid, learned)
    folder = tmp_path / "a"
    from server_app.config import ConfigError
    with pytest.raises(ConfigError, match=r"--labels '12': label\(s\) \[12\] are not "
                       r"classes 0\.\.9; nothing was recorded"):
        submit_records("a", None, None, str(tmp_path), labels="12")
    rid = submit_records("a", None, None, str(tmp_path), labels="7")
    _run(make_grid, {**learned, "later-requests": True})
    receipt = json.loads((folder / "receipts" / f"{rid}.json").read_text())
    assert receipt["status"] == "done" and receipt["erasure"]["labels"] == [7]
    assert receipt["shards_retrained"] == [0, 1]
    _run(make_grid, _config(tmp_path, shared_data, "b", frameworks="SE",
                            **{"forget-labels": "7"}))
    se = read_arrays(tmp_path / "b" / "models" / "SE.npz")
    new = read_arrays(folder / _versions(folder)[-1].file)
    assert all(np.array_equal(new[k], se[k]) for k in new)


def test_a_later_request_killed_after_its_erasure_reports_it_when_redone(
        tmp_path, make_grid, shared_data, monkeypatch):
    """The receipt of a request redone after a kill names what it erased."""
    from server_app.stages import later

    learned = {n: _config(tmp_path, shared_data, n, frameworks="none") for n in "ab"}
    for name, config in learned.items():
        _run(make_grid, config)
        submit(name, "3", str(tmp_path))
    _run(make_grid, {**learned["a"], "later-requests": True})  # never killed
    real = later.make_version

    def killed(*args, **kwargs):  # dies once the history is erased
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(later, "make_version", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(make_grid, {**learned["b"], "later-requests": True})
    monkeypatch.setattr(later, "make_version", real)
    _run(make_grid, {**learned["b"], "later-requests": True})
    (a,), (b,) = ((tmp_path / n / "receipts").glob("*.json") for n in "ab")
    whole, redone = (json.loads(p.read_text())["erased"] for p in (a, b))
    assert redone["counts"]["updates"] > 0
    assert {k: redone[k] for k in ("updates", "shard_models", "files", "bytes")} == \
        {k: whole[k] for k in ("updates", "shard_models", "files", "bytes")}


def test_a_later_request_erases_the_clients_updates_from_the_baselines_history_too(
        tmp_path, make_grid, shared_data, capsys):
    """Found by a newcomer: after ``forget --clients 3`` the receipt said "erased 2
    updates" (SE's history) while ``history/baseline/blobs/update_s0_r*_c3.npz``, the
    updates client 3 gave FedEraser's history, were still on disk."""
    from cli.receipts import main_receipts
    from history import HistoryStore

    learned = _config(tmp_path, shared_data, "fe", frameworks="FE")
    _run(make_grid, learned)
    folder = tmp_path / "fe"
    baseline = HistoryStore.open(folder / "history" / "baseline")
    trained = sorted({p for s in baseline.client_shard().values() for g in
                      baseline.rounds(s) for p, _ in baseline.participants(s, g)})
    client = trained[0]
    assert any((folder / "history" / "baseline" / "blobs").glob(f"update_*_c{client}.npz"))
    rid = submit("fe", str(client), str(tmp_path))
    _run(make_grid, {**learned, "later-requests": True})
    receipt = json.loads((folder / "receipts" / f"{rid}.json").read_text())
    gone = receipt["erased_baseline"]
    assert gone["updates"] and all(c == client for _, _, c in gone["updates"])
    assert gone["counts"]["updates"] == len(gone["updates"])
    blobs = folder / "history" / "baseline" / "blobs"
    assert not list(blobs.glob(f"update_*_c{client}.npz"))  # and nobody else's
    assert any(blobs.glob("update_*.npz"))
    capsys.readouterr()
    assert main_receipts(["--run", "fe", "--results-dir", str(tmp_path), "--detail"],
                         "x") == 0
    out = capsys.readouterr().out
    assert f"+ {len(gone['updates'])} in the baselines' history" in out
    assert "erased from the baselines' history (uncoded): updates" in out


def test_forget_says_which_of_the_runs_frameworks_a_later_request_leaves_out():
    from cli.later import _not_run_later
    from server_app.config import RunConfig

    def line(frameworks: str) -> str:
        return _not_run_later(RunConfig.from_run_config(
            fused_run_config({**BASE, "frameworks": frameworks})))

    assert line("SE,FR,FE,SISA") == (
        "a later request is carried out by SE and FR (FR as the reference); FE, SISA "
        "of the run's frameworks ran on its planned requests only")
    assert line("SE,RR") == ("a later request is carried out by SE; RR of the run's "
                             "frameworks ran on its planned requests only")
    assert line("SE,FR") == line("SE") == ""
    assert line("FE,FR") == (
        "a later request is carried out by SE and FR (FR as the reference); FE of the "
        "run's frameworks ran on its planned requests only; the run's frameworks leave "
        "out SE, so its planned requests changed none of its model versions: the "
        "clients they named are still in its models and stores until a request names "
        "them")


def test_export_of_a_version_later_requests_superseded_says_so():
    from cli.models import superseded
    from runstore.versions import ModelVersion

    def v(n, requests, forgotten):
        return ModelVersion(n, 0.0, f"models/v{n}.npz", "", 2, {}, requests, forgotten)

    versions = [v(1, [], []), v(2, ["planned"], [3]), v(3, ["r0002"], [3, 5])]
    assert superseded(versions, versions[-1]) == ""
    assert superseded(versions, versions[1]) == (
        "v2 predates r0002 (latest v3: clients [5] forgotten since); it still holds "
        "what they removed, so serving it does not honour them")
    assert superseded(versions, versions[0]).startswith(
        "v1 predates the planned requests, r0002 (latest v3: clients [3, 5] forgotten")
