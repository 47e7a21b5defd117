"""cli.report: the unlearning table's membership-inference columns, signal or not."""

from __future__ import annotations

from cli.report import frameworks_table, render
from runstore.summary import (
    FrameworkSummary,
    LearningSummary,
    ModelScores,
    RunSummary,
    UnlearningPlan,
)

CONFIG = {"dataset": "mnist", "partition": "iid", "num-clients": 8, "num-shards": 2,
          "clients-per-round": 4, "num-rounds": 2, "local-epochs": 1,
          "shard-strategy": "FedAvg"}


def _summary(original_audit: dict) -> RunSummary:
    learning = LearningSummary(0.9, 0.3, [0.88, 0.89], [0.3, 0.31], 10.0, 8.0, 16.0)
    audit = {"f1": 0.5123, "auc": 0.4871, "precision": 0.5, "recall": 0.52}
    return RunSummary(
        config=CONFIG, data_dir="/d", shards=[[0, 1, 2, 3], [4, 5, 6, 7]],
        shard_strategy={"name": "FedAvg"}, notes=[], learning=learning,
        storage={"server_bytes": 1000}, unlearning=UnlearningPlan([[3]], [], "sequential"),
        frameworks={"SE": FrameworkSummary(accuracy=0.9, audit={**audit, "auc": 0.4712}),
                    "FR": FrameworkSummary(accuracy=0.89, audit=dict(audit))},
        original=ModelScores(0.9, 0.3, audit={**audit, **original_audit}))


def test_no_signal_replaces_the_scores_and_says_what_to_run():
    text = frameworks_table(_summary({"signal": False, "auc_low": 0.4544,
                                      "auc_high": 0.5198}))
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("framework"))
    assert "MIA F1" not in text and "MIA AUC" not in text and "0.4871" not in text
    assert lines[header].split()[-1] == "MIA"
    for row in lines[header + 2:header + 5]:  # original, SE, FR
        assert row.endswith("no signal")
    note = lines[header + 5]
    assert note.startswith("MIA: no signal") and "0.487" in note
    assert "0.454-0.520" in note and "--preset memorize" in note and \
        "--preset verify" in note


def test_with_signal_the_scores_stay():
    text = frameworks_table(_summary({"signal": True, "auc_low": 0.51,
                                      "auc_high": 0.55}))
    assert "MIA F1" in text and "MIA AUC" in text and "0.4871" in text
    assert "no signal" not in text and "--preset memorize" not in text


def test_a_summary_written_before_mia_signal_shows_its_scores():
    summary = _summary({})
    text = render(RunSummary.from_json(summary.to_json()))
    assert "MIA AUC" in text and "0.4712" in text and "no signal" not in text


def test_mia_signal_is_written_and_read_back_beside_the_other_keys():
    data = _summary({"signal": False, "auc_low": 0.45, "auc_high": 0.52}).to_json()
    assert data["original"]["mia_signal"] is False
    assert data["original"]["mia_auc"] == 0.4871  # the existing keys as they were
    assert "mia_signal" not in data["frameworks"]["SE"]
    assert "no signal" in render(data)


def test_the_storage_table_says_what_recovery_costs():
    from cli.report import RECOVERY_STORAGE, storage_table

    storage = {"mode": "uncoded",
               "FE": {"server_bytes": 900, "client_bytes": {"max": 0}, "source": "store"},
               "SE_uncoded": {"server_bytes": 1000, "client_bytes": {"max": 0},
                              "source": "store"},
               "SE_coded": None}
    text = storage_table(storage).splitlines()
    assert RECOVERY_STORAGE in text
    assert any(line.strip().startswith("SE coded") and "not measured" in line
               for line in text)


def _lira(auc_ci, tpr_ci, signal):
    return {"lira_auc": sum(auc_ci) / 2, "lira_auc_ci": auc_ci,
            "lira_tpr_at_1fpr": 0.01, "lira_tpr_at_1fpr_ci": tpr_ci,
            "lira_signal": signal, "lira_client_pvalues": [0.2]}


def test_lira_without_signal_says_so_instead_of_its_scores():
    from audits.audit import lira_signal
    from cli.report import lira_table

    quiet = _lira([0.46, 0.55], [0.0, 0.03], False)
    assert lira_signal(quiet) is False
    summary = _summary(quiet)
    summary.frameworks["SE"].audit.update(_lira([0.45, 0.54], [0.0, 0.02], None))
    text = lira_table(summary)
    assert "LiRA: no signal (original model's AUC 0.5050 [0.4600, 0.5500]" in text
    assert "--preset memorize" in text and "0.4950" not in text
    assert "p-value" not in text


def test_a_run_with_the_memorize_settings_is_not_told_to_use_them():
    from cli.config import preset_values
    from cli.report import signal_hint

    summary = _summary(_lira([0.46, 0.55], [0.0, 0.03], False))
    summary.config = {"num-rounds": 3}
    assert "--preset memorize" in signal_hint(summary)
    summary.config = {**preset_values("memorize"), "forget-clients": "2"}
    hint = signal_hint(summary)
    assert "--preset memorize" not in hint and "settings already" in hint


def test_lira_with_signal_shows_its_scores():
    from audits.audit import lira_signal
    from cli.report import lira_table

    loud = _lira([0.46, 0.55], [0.015, 0.07], True)  # TPR above chance alone
    assert lira_signal(loud) is True
    text = lira_table(_summary(loud))
    assert "no signal" not in text and "0.5050 [0.4600, 0.5500]" in text
    assert "p-value against the pseudo-clients: 0.200" in text


def test_a_u_lira_not_run_says_why_in_the_tables():
    from cli.report import ulira_table

    summary = _summary({})
    summary.verification = {"mia": {"ulira": {"skipped": "a reference needs 70 "
                                              "shadow-pool samples and the pool has 40"}}}
    assert ulira_table(summary) == ("U-LiRA not run: a reference needs 70 shadow-pool "
                                    "samples and the pool has 40")
    summary.verification = {}
    assert ulira_table(summary) == ""


def test_the_retrained_shards_accuracy_shows_what_the_ensemble_hides():
    from runstore.summary import RequestCost

    summary = _summary({"signal": True, "auc_low": 0.51, "auc_high": 0.55})
    summary.frameworks["SE"].shard_accuracy = [0.88, 0.1]  # shard 1: broken
    summary.frameworks["SE"].requests = [RequestCost(0, [3], impacted_shards=[1])]
    summary.frameworks["FR"].shard_accuracy = [0.89]  # one model: nothing to add
    summary.frameworks["FR"].requests = [RequestCost(0, [3], impacted_shards=[0])]
    se = summary.frameworks["SE"]
    assert se.retrained_shard_accuracy() == 0.1
    assert se.retrained_shard_accuracy(summary.learning.shard_accuracy) == 0.89
    assert summary.frameworks["FR"].retrained_shard_accuracy() is None
    lines = frameworks_table(RunSummary.from_json(summary.to_json())).splitlines()
    header = next(line for line in lines if line.startswith("framework"))
    assert header.split("  ")[:3] == ["framework", "accuracy", "retrained shards' acc"]
    span = slice(header.index("retrained"), header.index("retrained") + 21)
    rows = {line.split()[0]: line for line in lines if line.startswith(" ")}
    assert rows["SE"].split()[1] == "0.9000"  # the ensemble reads fine
    assert rows["SE"][span].strip() == "0.1000"  # its retrained shard does not
    assert rows["FR"][span].strip() == rows["original"][span].strip() == ""


def test_client_epochs_read_as_counts_in_one_format():
    summary = _summary({"signal": True, "auc_low": 0.51, "auc_high": 0.55})
    summary.frameworks["SE"].client_epochs = 11.0
    summary.frameworks["FR"].client_epochs = 12.5
    summary.frameworks["SISA"] = FrameworkSummary(accuracy=0.8, client_epochs=1200.0)
    lines = frameworks_table(RunSummary.from_json(summary.to_json())).splitlines()
    header = next(line for line in lines if line.startswith("framework"))
    col = header.index("client-epochs")
    cells = {line.split()[0]: line[col:].split()[0] for line in lines
             if line.startswith(" ") and line.split()[0] != "original"}
    assert cells == {"SISA": "1,200", "SE": "11", "FR": "12.5"}
