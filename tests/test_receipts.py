"""Receipts carry the evidence (issue 27 item 6): what was erased or kept, the audit.

The fields of a receipt added for issue 27: ``erased.counts`` and ``erased.files``
(:func:`erasure_counts`, :meth:`HistoryStore.erase`), ``erased.kept`` where nothing
was erased (:func:`kept_history`), ``verification`` (:func:`verification_figures`),
the one-stage run's receipt of its planned requests, and ``receipts --detail`` /
``--json``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli.main import main as cli_main
from cli.receipts import receipt_detail, receipt_line
from history import HistoryStore
from runstore.receipts import (
    erasure_counts,
    kept_history,
    list_receipts,
    verification_figures,
    write_receipt,
)


def _store(tmp_path) -> HistoryStore:
    """Shard 0 holds clients 0 and 1, shard 1 client 2; three rounds, all train."""
    store = HistoryStore.create(tmp_path / "h", {0: 0, 1: 0, 2: 1}, num_shards=2)
    layer = {"w": np.ones(4, np.float32)}
    for shard in (0, 1):
        store.put_shard_model(shard, 0, layer)
    for rnd in (1, 2, 3):
        for pid, shard in ((0, 0), (1, 0), (2, 1)):
            store.put_update(shard, rnd, pid, layer, 10, 0.1)
        for shard in (0, 1):
            store.put_shard_model(shard, rnd, layer)
    return store


def test_an_uncoded_erasure_counts_and_names_the_files_it_deleted(tmp_path):
    store = _store(tmp_path)
    assert kept_history(store, [1], "why")["kept"] == {"updates": 3}
    erased = store.erase([1], [1])
    counts = erasure_counts(erased)
    assert counts["updates"] == 3 and counts["shard_models"] == 3  # W_0^1..W_0^3
    assert counts["files"] == 6 and counts["bytes"] > 0
    assert erased["files"][:3] == [f"update_s0_r{g}_c1.npz" for g in (1, 2, 3)]
    assert erased["files"][3:] == [f"model_s0_r{g}.npz" for g in (1, 2, 3)]
    assert not any((tmp_path / "h" / "blobs" / f).exists() for f in erased["files"])
    assert (tmp_path / "h" / "blobs" / "update_s0_r1_c0.npz").exists()  # client 0 kept
    store.close()


def test_a_coded_erasure_counts_replaced_parts_and_stale_holders():
    erased = {"store": "coded", "updates": [[0, 1, 3], [0, 2, 3]],
              "rounds_recoded": [[0, 1], [0, 2]],
              "nodes": {"s0r1": [0, 1, 2], "s0r2": [0, 1]}, "stale": [[0, 2, 2]]}
    assert erasure_counts(erased) == {"updates": 2, "rounds_recoded": 2,
                                      "slice_parts_replaced": 5, "stale": 1}


def test_kept_history_counts_the_stored_updates_left_and_erases_nothing(tmp_path):
    store = _store(tmp_path)
    kept = kept_history(store, [0, 2], "a reason")
    assert kept == {"store": "uncoded", "updates": [], "counts": {"updates": 0},
                    "kept": {"updates": 6}, "note": "a reason"}
    assert len(list((tmp_path / "h" / "blobs").iterdir())) == 9 + 8  # all still there
    store.close()


def test_verification_figures_copy_each_models_audit_and_none_without_one():
    models = {"original": {"accuracy": 0.9, "backdoor_asr": 0.98,
                           "backdoor_asr_ensemble": 0.6},
              "SE": {"backdoor_asr": 0.01, "mia_auc": 0.51},
              "FR": {"backdoor_asr": 0.02, "accuracy": 0.91}}
    figures = verification_figures(models, {"backdoor": {"kind": "text"},
                                            "forgotten_rounds": {"3": 2}})
    assert figures["backdoor_asr"] == {"original": 0.98, "SE": 0.01, "FR": 0.02}
    assert figures["backdoor_asr_ensemble"] == {"original": 0.6}
    assert figures["mia_auc"] == {"SE": 0.51} and "mia_f1" not in figures
    assert figures["backdoor"] == {"kind": "text"}
    assert figures["forgotten_rounds"] == {"3": 2}
    assert verification_figures({"original": {"accuracy": 0.9}}, None) is None


RECEIPT = {"request_id": "r0001", "clients": [3], "status": "done", "stage": 1,
           "shards_retrained": [0], "rounds_replayed": 2,
           "cost": {"SE": {"client_epochs": 1.5}}, "done_at": "2026-01-01T00:00:00Z",
           "models_sha256": {"before": {"models": "a" * 64, "shards": ["b" * 64]},
                             "after": {"models": "c" * 64, "shards": ["d" * 64]}},
           "erased": {"store": "uncoded", "updates": [[0, 1, 3], [0, 2, 3]],
                      "shard_models": [[0, 1]], "files": ["update_s0_r1_c3.npz"],
                      "bytes": 10},
           "verification": {"backdoor_asr": {"original": 0.98, "SE": 0.01},
                            "mia_auc": {"original": 0.6, "SE": 0.5}}}


def test_one_line_names_the_evidence_and_the_detail_all_of_it():
    line = receipt_line(RECEIPT)
    assert "\n" not in line and "erased 2 updates" in line
    assert "backdoor ASR 0.980 -> SE 0.010" in line and "MIA AUC 0.600 -> SE 0.500" in line
    assert line.endswith(f"models sha256 {'a' * 64} -> {'c' * 64}")
    detail = "\n".join(receipt_detail(RECEIPT))
    assert f"models sha256 before: {'a' * 64}  shards {'b' * 64}" in detail
    assert "erased (uncoded): updates 2, shard_models 1, files 1, bytes 10" in detail
    assert "updates s0r1c3 s0r2c3" in detail and "files update_s0_r1_c3.npz" in detail
    assert "backdoor_asr: original 0.9800, SE 0.0100" in detail
    kept = {**RECEIPT, "erased": {"store": "uncoded", "updates": [],
                                  "counts": {"updates": 0}, "kept": {"updates": 4},
                                  "note": "because"}, "verification": None}
    assert "erased 0 updates (kept 4)" in receipt_line(kept)
    assert "kept 4 stored updates: because" in "\n".join(receipt_detail(kept))
    one = {**RECEIPT, "erased": {**RECEIPT["erased"], "updates": [[0, 1, 3]]}}
    assert "erased 1 update " in receipt_line(one)


def test_the_receipts_command_prints_the_detail_or_json(tmp_path, capsys):
    from runstore.inbox import RequestInbox

    folder = tmp_path / "run"
    folder.mkdir()
    RequestInbox(folder / "run.sqlite").close()  # a run's catalog
    write_receipt(folder, RECEIPT)
    where = ["receipts", "--run", "run", "--results-dir", str(tmp_path)]
    assert cli_main([*where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [RECEIPT] == list_receipts(folder)
    assert cli_main([*where, "--detail"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == receipt_line(RECEIPT) and out[1:4] == receipt_detail(RECEIPT)[:3]


@pytest.mark.parametrize("storage", [{}, {"storage": "coded", "blocks-per-shard": 2}])
def test_a_one_stage_run_files_a_receipt_with_the_audits_figures(run_server, tmp_path,
                                                                 capsys, storage):
    summary, _ = run_server({"backdoor-trigger": 3, "backdoor-fraction": 1.0,
                             "forget-clients": "3", "mia": False, "frameworks": "SE,FR",
                             "clients-per-round": 8, **storage}, run_name="planned")
    folder = tmp_path / "planned"
    (receipt,) = list_receipts(folder)
    assert receipt["request_id"] == "r0001" and receipt["source"] == "planned"
    assert receipt["clients"] == [3] and receipt["status"] == "done"
    assert receipt["version"]["before"] == 1 and receipt["version"]["after"] == 2
    assert receipt["models_sha256"]["before"] != receipt["models_sha256"]["after"]
    figures = receipt["verification"]
    assert figures["backdoor_asr"] == {
        "original": summary["original"]["backdoor_asr"],
        "SE": summary["frameworks"]["SE"]["backdoor_asr"],
        "FR": summary["frameworks"]["FR"]["backdoor_asr"]}
    assert figures["forgotten_rounds"] == summary["verification"]["forgotten_rounds"]
    erased = receipt["erased"]  # client 3's updates of its 2 rounds, once read
    assert erased["counts"]["updates"] == 2 and "kept" not in erased
    assert erased["store"] == storage.get("storage", "uncoded")
    if erased["store"] == "uncoded":
        assert erased["counts"]["shard_models"] == 1  # W^1; W^2, learned, is v1's
        assert not list((folder / "history").rglob("update_*_c3.npz"))
    else:
        assert erased["counts"]["rounds_recoded"] == 2 and erased["counts"]["stale"] == 0
    assert set(receipt["cost"]) == {"SE", "FR"}
    assert cli_main(["receipts", "--run", "planned", "--results-dir",
                     str(tmp_path)]) == 0
    assert "r0001  done     stage 1  clients [3]" in capsys.readouterr().out
    # a later request cannot name the planned request's client again
    from cli.forget import submit
    from server_app.config import ConfigError

    with pytest.raises(ConfigError, match="already forgotten"):
        submit("planned", "3", str(tmp_path))


def test_a_planned_erasure_that_fails_fails_no_finished_run(run_server, tmp_path,
                                                            monkeypatch):
    from history import CodedHistoryError
    from server_app.stages import stored_updates

    def unreachable(store, clients):
        raise CodedHistoryError("round 1 of shard 0: 3 usable slices, k = 4 needed")

    monkeypatch.setattr(stored_updates, "erase_coded", unreachable)
    summary, _ = run_server({"forget-clients": "3", "mia": False, "frameworks": "SE",
                             "storage": "coded", "blocks-per-shard": 2},
                            run_name="kept")
    assert summary["frameworks"]["SE"]["accuracy"] > 0  # the run finished
    (receipt,) = list_receipts(tmp_path / "kept")
    kept = receipt["erased"]
    assert kept["counts"] == {"updates": 0} and kept["kept"]["updates"] > 0
    assert kept["note"].startswith("not erased: CodedHistoryError: round 1 of shard 0")


def test_a_run_killed_after_its_planned_erasure_resumes_to_the_same_files(
        run_server, tmp_path, monkeypatch):
    """Killed once the planned clients' updates are erased, before the receipt is
    filed: the resumed run reports the storage it measured before the erasure and
    files the receipt of the erasure it planned."""
    from server_app.stages import planned_receipt

    config = {"forget-clients": "3", "mia": False, "frameworks": "SE,FE"}
    whole, _ = run_server(config, run_name="whole")

    class Killed(BaseException):
        pass

    def killed(*args, **kwargs):
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(planned_receipt, "verification_figures", killed)
        with pytest.raises(Killed):
            run_server(config, run_name="killed")
    assert not list((tmp_path / "killed" / "history").rglob("update_*_c3.npz"))
    resumed, _ = run_server(config, run_name="killed")
    assert resumed["storage"] == whole["storage"]
    (a,), (b,) = (list_receipts(tmp_path / n) for n in ("whole", "killed"))
    assert a["erased"] == b["erased"] and a["erased_baseline"] == b["erased_baseline"]
    assert b["erased"]["counts"]["updates"] > 0
