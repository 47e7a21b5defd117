"""report.md's sections on unlearning requests.

Single requests (paper Fig. 3 / Table 1) with their MIA checks, offline LiRA, and
concurrent / sequential requests (paper Fig. 4) with every framework on one batch.
"""

from __future__ import annotations

from cli.report import NO_SIGNAL
from experiments import collect, compare
from experiments.report.cells import md_table, num, pct, shards_accuracy, to_target
from server_app.config import methods


def _single_row(dataset: str, partition: str, name: str, r: dict) -> list[str]:
    """One framework's row of the single-request table."""
    return [dataset, partition, name, num(r.get("accuracy")), shards_accuracy(r),
            num(r.get("loss")),
            num(r.get("retrain_compute_s"), 1), num(r.get("modelled_wall_s"), 1),
            num(r.get("client_epochs"), 1), num(r.get("client_rounds")),
            num(r.get("comm_time_s"), 1), to_target(r), num(r.get("mia_f1")),
            num(r.get("mia_auc"))]


def single_sections(rows) -> list[str]:
    """The single-request sections; ``[]`` without single-request rows.

    The table of every framework, SE's reductions, the MNIST MIA check and the MIA
    stability over seeds.
    """
    cells = compare.single_cells(rows)
    if not cells:
        return []
    out = ["", "## Single request (paper Fig. 3 / Table 1)", "",
           "One request (its clients, `clients-per-request`, all from one shard; "
           "see the settings above). Accuracy on the test set (Tiny Shakespeare: "
           "next-character accuracy; its paper metric is the test loss, nats per "
           "character); MIA F1 of the attack on the forgotten client's training "
           "samples against as many held-out samples (0.5 = chance).", ""]
    table = [_single_row(dataset, partition, name, r)
             for (dataset, partition), fw in cells.items()
             for name in ["original", *collect.frameworks(), *collect.methods_in(rows),
                          *sorted(n for n in fw if n.startswith(collect.interval_labels()))]
             if (r := fw.get(name)) is not None]
    out.append(md_table(["dataset", "partition", "model", "accuracy",
                       "retrained shards' accuracy (original's)", "test loss",
                       "retrain compute s", "modelled wall s", "client-epochs",
                       "client rounds", "comm s", "rounds to original loss (compute s)",
                       "MIA F1", "MIA AUC"], table))
    reds = compare.single_reductions(rows)
    if reds:
        out += ["", "SE's reduction of retraining time against each baseline "
                "(1 - SE / baseline; compute seconds, client-epochs in brackets):", ""]
        out.append(md_table(
            ["dataset", "partition", *(f"vs {b}" for b in collect.baselines())],
            [[r["dataset"], r["partition"]] + [
                f"{pct(r[f'time_vs_{b}'])} ({pct(r[f'epochs_vs_{b}'])})"
                for b in collect.baselines()] for r in reds]))
    checks = compare.mnist_mia_check(rows)
    if checks:
        out += ["", "### MNIST: does the attack see the forgotten client?", "",
                "Issue 6 asks that FR's F1 be measurably lower than the original "
                "model's and SE's within 0.05 of FR's. Seed std: the larger standard "
                "deviation of the original's and FR's F1 over the seeds of \"MIA "
                "stability\" below (n/a: no seeds ran that cell); a gap no larger "
                "is inside the noise.", ""]
        se, fr = methods.proposed(), methods.reference()
        shown = [fr, se, *(b for b in collect.baselines() if b != fr)]
        out.append(md_table(
            ["partition", "F1 original", *(f"F1 {n}" for n in shown),
             "seed std", f"{fr} < original", f"|{se} - {fr}| <= 0.05"],
            [[c["partition"], num(c["f1_original"]),
              *(num(c[f"f1_{n}"]) for n in shown), num(c["noise"]),
              c["fr_below_original"], num(c["se_within_005_of_fr"])]
             for c in checks]))
    stab = compare.mia_stability(rows)
    if stab:
        out += ["", f"### MIA stability: {stab['config']} over seeds {stab['seeds']}",
                "", "Each seed is a whole run (partitions, shards, initialisation, "
                "sampling, the forgotten client and the attack all change).", ""]
        out.append(md_table(
            ["model", "F1 per seed", "mean", "std", "max - min"],
            [[name, ", ".join(f"{v:.3f}" for v in s["f1"]), num(s["mean"]),
              num(s["std"]), num(s["range"])] for name, s in stab["models"].items()]))
    return out


def lira_section(rows) -> list[str]:
    """Offline LiRA's columns (``mia-references``) of every run that has them."""
    have = [r for r in rows if r.get("mia_lira_auc") is not None]
    # a run's verdict is its original model's (mia_lira_signal): without signal
    # its scores carry none, and the table says so instead of printing them
    quiet = {r["run"] for r in have
             if r["framework"] == "original" and r.get("mia_lira_signal") is False}
    table = md_table(["run", "model", *collect.LIRA_METRICS],
                   [[r["run"], r["framework"],
                     *[NO_SIGNAL if r["run"] in quiet else num(r.get(k))
                       for k in collect.LIRA_METRICS]] for r in have])
    note = [f"\n{NO_SIGNAL}: the original model's LiRA intervals are not above chance "
            "(AUC 0.5, TPR@1%FPR 0.01) in run(s) " + ", ".join(sorted(quiet)) +
            "; `--preset memorize` has signal"] if quiet else []
    return ["", "### Offline LiRA: per example and per forgotten client", "", table,
            *note] if have else []


def concurrent_section(rows, summaries) -> list[str]:
    """The concurrent-request sections; ``[]`` without concurrent rows.

    SE's measured against expected retraining seconds per K (paper Sec. 4.2), then
    every framework on the same batch.
    """
    points = compare.concurrent_points(rows, collect.se_requests(summaries))
    if not points:
        return []
    out = ["", "## Concurrent and sequential requests (paper Fig. 4)", "",
           "SE's shards (every framework on the same batch: the table after). "
           "Measured: the clients' training seconds of SE's retrained "
           "shards (summed over shards and, sequentially, over requests). Expected "
           "(paper Sec. 4.2, K requests uniform over S shards, c = the mean "
           "retraining seconds of one shard for one client's request, taken from the "
           "other single-request runs of the dataset): concurrent S c "
           "(1 - (1 - 1/S)^K), "
           "sequential K c. `even` spreads the requests over shards (min(K, S) "
           "shards asked), `adapt` puts them all in one shard. A shard is impacted "
           "only if one of its requested clients took part in a round: a client "
           "never sampled changes nothing, and its shard is not retrained (the "
           "run's `replay.unchanged_shards`). "
           "Sequential rows are the first K requests of one sequential run; "
           "`shard retrains` counts the shards retrained, summed over its requests "
           "(the paper's K c assumes one per request). Impacted shards, expected: "
           "the paper's S (1 - (1 - 1/S)^K) beside the mean over 10,000 seeded "
           "draws of K distinct uniform clients (concurrent rows).", ""]
    table = [[p["dataset"], p["mode"], p["distribution"], p["K"],
              num(p["impacted_shards"]), num(p.get("shard_retrains")),
              num(p["measured_s"], 2),
              num(p["expected_s"], 2),
              num(p["measured_s"] / p["expected_s"], 2) if p["expected_s"] else "n/a",
              num(p["client_epochs"], 1),
              _impacted(p)]
             for p in sorted(points, key=lambda p: (p["dataset"], p["mode"],
                                                    p["distribution"], p["K"]))]
    out.append(md_table(["dataset", "mode", "distribution", "K", "impacted shards",
                       "shard retrains", "measured s", "expected s", "measured / expected",
                       "client-epochs", "impacted: paper / simulated"], table))
    return out + _concurrent_frameworks(rows)


def _concurrent_frameworks(rows) -> list[str]:
    """Every framework on the same concurrent batch: SE's saving against each."""
    runs: dict[str, dict[str, dict]] = {}
    for row in rows:
        if row["experiment"] == "concurrent" and row["request_mode"] == "concurrent" \
                and row["framework"] in collect.frameworks():
            runs.setdefault(row["run"], {})[row["framework"]] = row
    table, each, name = [], [], methods.proposed()
    for fw in sorted(runs.values(), key=lambda f: (
            f[name]["dataset"], f[name]["request_distribution"], f[name]["num_requests"])
            if name in f else ("", "", 0)):
        se = fw.get(name)
        if se is None or len(fw) == 1:
            continue
        table.append([se["dataset"], se["request_distribution"], se["num_requests"]]
                     + [_saving(se, fw.get(b)) for b in collect.baselines()])
        each += [[se["dataset"], se["request_distribution"], se["num_requests"], other,
                  num(r.get("accuracy")), shards_accuracy(r), num(r.get("loss")),
                  num(r.get("retrain_compute_s"), 1), num(r.get("modelled_wall_s"), 1),
                  num(r.get("client_epochs"), 1), num(r.get("client_rounds"))]
                 for other in collect.frameworks() if (r := fw.get(other))]
    if not table:
        return []
    return ["", "SE's saving on the same concurrent batch, 1 - SE / baseline "
            "(compute seconds / modelled wall seconds; the paper: about 70% less time "
            "in the even case):", "",
            md_table(["dataset", "distribution", "K",
                      *(f"vs {b}" for b in collect.baselines())], table),
            "", "Every framework on the same concurrent batch (accuracy measured, of "
            "the ensemble for SE and SE-R, beside the mean accuracy of the shards "
            "they retrained, which the ensemble can hide; "
            "modelled wall s from measured training seconds; client rounds: server "
            "rounds that asked a client to train):", "",
            md_table(["dataset", "distribution", "K", "framework", "accuracy",
                    "retrained shards' accuracy (original's)", "test loss", "compute s",
                    "modelled wall s", "client-epochs", "client rounds"],
                   each)]


def _saving(se: dict, other: dict | None) -> str:
    """``compute / modelled wall`` reductions of SE against ``other``'s row."""
    if other is None:
        return "n/a"
    return " / ".join(pct(compare.reduction(se.get(k), other.get(k)))
                      for k in ("retrain_compute_s", "modelled_wall_s"))


def _impacted(point: dict) -> str:
    if "impacted_expected" not in point:
        return ""
    return (f"{num(point['impacted_expected'], 2)} / "
            f"{num(point['impacted_simulated'], 2)}")
