"""report.md: the measured tables beside the paper's headline figures.

Every number in the report comes from the runs of this output folder (their
summary.json files, through :mod:`experiments.collect`) or from the storage
sweep of the same invocation; the paper's numbers are quoted as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cli import tables
from cli.report import NO_SIGNAL
from experiments import collect, compare

PAPER = "Lin et al., *Scalable Federated Unlearning via Isolated and Coded Sharding*, " \
        "IJCAI 2024"
# where a storage sweep's rows came from (the second: results.json of before the
# measurement moved into experiments/)
_SWEEP_SOURCES = ("experiments/storage.py", "benchmarks/storage_table.py")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _less(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{_pct(value)} less" if value >= 0 else f"{_pct(-value)} more"


def _num(value, digits: int = 3) -> str:
    if value is None or value == "":
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def _bytes(n) -> str:
    if n is None:
        return "n/a"
    if n >= 1e6:
        return f"{n / 1e6:,.2f} MB"
    return f"{n / 1e3:,.1f} kB"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (the project's one renderer, :mod:`cli.tables`)."""
    return tables.table(header, rows, style="markdown")


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def suite(results: dict) -> str:
    """The suite of ``results`` (results.json; ``preset`` before it was renamed)."""
    return str(results.get("suite") or results.get("preset") or "?")


def command(results: dict) -> str:
    """The command that regenerates this folder's experiment."""
    cmd = f"./simulate.sh experiments {results['experiment']} --suite {suite(results)}"
    if results.get("engine", "inprocess") != "inprocess":
        cmd += f" --engine {results['engine']}"
    if int(results.get("jobs", 1)) > 1:
        cmd += f" --jobs {results['jobs']}"
    if results.get("methods"):
        cmd += f" --methods {','.join(results['methods'])}"
    return cmd


def render(results: dict, rows: Sequence[dict], out: Path) -> str:
    """The whole report.md for ``results`` (results.json) and its ``rows``."""
    summaries = collect.summaries_by_run(results, out)
    store = compare.storage_block(rows, collect.storage_blocks(summaries))
    runs = results["runs"]
    failed = [r for r in runs if r["status"] == "failed"]
    m = results.get("machine", {})
    parts = [
        f"# Experiments: {results['experiment']} (suite {suite(results)})",
        "",
        f"Regenerate: `{command(results)}`",
        "",
        f"- Machine: {m.get('cpus', '?')} CPU cores ({m.get('cpu', '?')}), Python "
        f"{m.get('python', '?')}, torch {m.get('torch', '?')}.",
        f"- Wall time: {_clock(results.get('wall_s'))} for {len(runs)} app runs "
        f"({len(failed)} failed)"
        + (f" and the storage sweep ({results.get('storage_sweep_source')})"
           if results.get("storage_sweep") else "") + ".",
        "- Engine: " + (
            "every configuration is one run of the real ServerApp "
            "(`server_app.app.main`) and ClientApp (`client_app.app:app`) on an "
            "in-process Grid (`experiments/grid.py`): the same messages, delivered "
            "one after another in one process, without Ray or a SuperLink (on 2 cores "
            "Ray's start-up and message passing dominate small runs). Use "
            "`--engine flwr` to run each configuration through `./simulate.sh` "
            "(`flwr run`, Ray simulation)."
            if results.get("engine", "inprocess") == "inprocess" else
            "every configuration ran through `./simulate.sh` (`flwr run`, Flower's "
            "Ray simulation engine, one SuperNode per client)."),
        "- Compute seconds depend on what else the machine runs: client-epochs are "
        "the load-independent measure of retraining work.",
    ]
    if results.get("skipped"):
        parts += ["- Skipped datasets (not loadable here): " + "; ".join(
            f"{d}: {why}" for d, why in results["skipped"].items())]
    parts += ["", _settings(results), "", "## Headline comparison with the paper", "",
              f"Paper: {PAPER}. Reduction = 1 - SE / baseline, mean over the listed "
              "runs; retraining time in measured compute seconds (every client's "
              "training seconds summed, plus the server's aggregation and "
              "calibration), in modelled wall seconds of a real federation (per "
              "round the slowest participant's download + training + upload, plus "
              "the server's seconds; clients and shards in parallel) and in "
              "client-epochs. The paper does not define its time metric. FE runs "
              "at calibration interval 1; interval 2 is reported beside it.",
              "", _headline(rows, store)]
    parts += _quality_section(rows)
    parts += _single_sections(rows) + _lira_section(rows)
    parts += _concurrent_section(rows, summaries)
    parts += _storage_section(store, results)
    parts += _figures(results)
    parts += _notes(rows, failed)
    return "\n".join(parts) + "\n"


def _quality_section(rows: Sequence[dict]) -> list[str]:
    """The original models against the trained suite's goals (:func:`compare.quality`)."""
    table = [[q["dataset"], q["partition"], _num(q["accuracy"]), _num(q["loss"]),
              f"accuracy >= {q['bound']:.2f}" if q["metric"] == "accuracy" else
              f"loss <= {q['bound']:.2f} nats/char",
              {True: "yes", False: "no", None: "n/a"}[q["met"]]]
             for q in compare.quality(rows)]
    if not table:
        return []
    return ["", "## Model quality", "",
            "The original shard ensemble on the test set (seed 0) against what a "
            "trained model must reach (the `trained` suite's goals; `quick` and "
            "`tiny` models are not meant to).", "",
            _table(["dataset", "partition", "accuracy", "test loss", "goal", "met"],
                   table)]


def _settings(results: dict) -> str:
    s = results.get("settings", {})
    base = ", ".join(f"`{k}={v}`" for k, v in s.get("base", {}).items())
    lines = [f"Suite `{suite(results)}`: {base}."]
    for key in ("single", "concurrent", "storage"):
        if s.get(key):
            lines.append(f"- {key}: " + ", ".join(f"`{k}={v}`"
                                                   for k, v in s[key].items()))
    if s.get("client-samples"):
        lines.append("- client-samples per dataset: " + ", ".join(
            f"{k} {v}" for k, v in s["client-samples"].items()))
    else:
        lines.append("- client-samples: every client's whole share of the data")
    if s.get("text-training"):
        lines.append("- shakespeare local training (presets/shakespeare.toml): "
                     + ", ".join(f"`{k}={v}`" for k, v in s["text-training"].items()))
    for dataset, keys in (s.get("dataset") or {}).items():
        lines.append(f"- {dataset} (every experiment): " + ", ".join(
            f"`{k}={v}`" for k, v in keys.items()))
    return "\n".join(lines)


def _headline(rows, store) -> str:
    table = []
    for h in compare.headline(rows, store):
        if "storage_vs_FE" in h:
            measured = f"{_pct(h['storage_vs_FE'])} less server storage"
        else:
            measured = (
                "compute time: " + " / ".join(_pct(h[f"time_vs_{b}"])
                                              for b in collect.BASELINES)
                + "; modelled wall time: " + " / ".join(
                    _pct(h.get(f"wall_vs_{b}")) for b in collect.BASELINES)
                + "; client-epochs: " + " / ".join(_pct(h[f"epochs_vs_{b}"])
                                                   for b in collect.BASELINES)
                + " (vs FR / FE / RR)")
        table.append([h["claim"], _pct(h["paper"]), measured,
                      ", ".join(h["cells"]) or "no runs"])
    return _table(["claim", "paper", "measured here", "runs"], table)


def _to_target(row: dict) -> str:
    """FR, RR: the round whose test loss first reached the original's.

    With the compute seconds spent by then; ``not reached``; blank for others.
    """
    if row.get("framework") not in ("FR", "RR"):
        return ""
    if row.get("rounds_to_target") in (None, ""):
        return "not reached"
    return f"{row['rounds_to_target']} ({_num(row.get('target_compute_s'), 1)})"


def _lira_section(rows) -> list[str]:
    """Offline LiRA's columns (``mia-references``) of every run that has them."""
    have = [r for r in rows if r.get("mia_lira_auc") is not None]
    # a run's verdict is its original model's (mia_lira_signal): without signal
    # its scores carry none, and the table says so instead of printing them
    quiet = {r["run"] for r in have
             if r["framework"] == "original" and r.get("mia_lira_signal") is False}
    table = _table(["run", "model", *collect.LIRA_METRICS],
                   [[r["run"], r["framework"],
                     *[NO_SIGNAL if r["run"] in quiet else _num(r.get(k))
                       for k in collect.LIRA_METRICS]] for r in have])
    note = [f"\n{NO_SIGNAL}: the original model's LiRA intervals are not above chance "
            "(AUC 0.5, TPR@1%FPR 0.01) in run(s) " + ", ".join(sorted(quiet)) +
            "; `--preset memorize` has signal"] if quiet else []
    return ["", "### Offline LiRA: per example and per forgotten client", "", table,
            *note] if have else []


def _shards_accuracy(row: dict) -> str:
    """The retrained shards' accuracy with the original's same shards' in brackets.

    Blank for a single model. The ensemble's accuracy can hide a broken shard.
    """
    if row.get("impacted_shard_accuracy") in (None, ""):
        return ""
    return (f"{_num(row['impacted_shard_accuracy'])} "
            f"({_num(row.get('impacted_shard_accuracy_original'))})")


def _single_row(dataset: str, partition: str, name: str, r: dict) -> list[str]:
    """One framework's row of the single-request table."""
    return [dataset, partition, name, _num(r.get("accuracy")), _shards_accuracy(r),
            _num(r.get("loss")),
            _num(r.get("retrain_compute_s"), 1), _num(r.get("modelled_wall_s"), 1),
            _num(r.get("client_epochs"), 1), _num(r.get("client_rounds")),
            _num(r.get("comm_time_s"), 1), _to_target(r), _num(r.get("mia_f1")),
            _num(r.get("mia_auc"))]


def _single_sections(rows) -> list[str]:
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
             for name in ["original", *collect.FRAMEWORKS, *collect.methods_in(rows),
                          *sorted(n for n in fw if n.startswith("FE(dt="))]
             if (r := fw.get(name)) is not None]
    out.append(_table(["dataset", "partition", "model", "accuracy",
                       "retrained shards' accuracy (original's)", "test loss",
                       "retrain compute s", "modelled wall s", "client-epochs",
                       "client rounds", "comm s", "rounds to original loss (compute s)",
                       "MIA F1", "MIA AUC"], table))
    reds = compare.single_reductions(rows)
    if reds:
        out += ["", "SE's reduction of retraining time against each baseline "
                "(1 - SE / baseline; compute seconds, client-epochs in brackets):", ""]
        out.append(_table(
            ["dataset", "partition", "vs FR", "vs FE", "vs RR"],
            [[r["dataset"], r["partition"]] + [
                f"{_pct(r[f'time_vs_{b}'])} ({_pct(r[f'epochs_vs_{b}'])})"
                for b in collect.BASELINES] for r in reds]))
    checks = compare.mnist_mia_check(rows)
    if checks:
        out += ["", "### MNIST: does the attack see the forgotten client?", "",
                "Issue 6 asks that FR's F1 be measurably lower than the original "
                "model's and SE's within 0.05 of FR's. Seed std: the larger standard "
                "deviation of the original's and FR's F1 over the seeds of \"MIA "
                "stability\" below (n/a: no seeds ran that cell); a gap no larger "
                "is inside the noise.", ""]
        out.append(_table(
            ["partition", "F1 original", "F1 FR", "F1 SE", "F1 FE", "F1 RR",
             "seed std", "FR < original", "|SE - FR| <= 0.05"],
            [[c["partition"], _num(c["f1_original"]), _num(c["f1_FR"]),
              _num(c["f1_SE"]), _num(c["f1_FE"]), _num(c["f1_RR"]), _num(c["noise"]),
              c["fr_below_original"], _num(c["se_within_005_of_fr"])]
             for c in checks]))
    stab = compare.mia_stability(rows)
    if stab:
        out += ["", f"### MIA stability: {stab['config']} over seeds {stab['seeds']}",
                "", "Each seed is a whole run (partitions, shards, initialisation, "
                "sampling, the forgotten client and the attack all change).", ""]
        out.append(_table(
            ["model", "F1 per seed", "mean", "std", "max - min"],
            [[name, ", ".join(f"{v:.3f}" for v in s["f1"]), _num(s["mean"]),
              _num(s["std"]), _num(s["range"])] for name, s in stab["models"].items()]))
    return out


def _concurrent_section(rows, summaries) -> list[str]:
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
              _num(p["impacted_shards"]), _num(p.get("shard_retrains")),
              _num(p["measured_s"], 2),
              _num(p["expected_s"], 2),
              _num(p["measured_s"] / p["expected_s"], 2) if p["expected_s"] else "n/a",
              _num(p["client_epochs"], 1),
              _impacted(p)]
             for p in sorted(points, key=lambda p: (p["dataset"], p["mode"],
                                                    p["distribution"], p["K"]))]
    out.append(_table(["dataset", "mode", "distribution", "K", "impacted shards",
                       "shard retrains", "measured s", "expected s", "measured / expected",
                       "client-epochs", "impacted: paper / simulated"], table))
    return out + _concurrent_frameworks(rows)


def _saving(se: dict, other: dict | None) -> str:
    """``compute / modelled wall`` reductions of SE against ``other``'s row."""
    if other is None:
        return "n/a"
    return " / ".join(_pct(compare.reduction(se.get(k), other.get(k)))
                      for k in ("retrain_compute_s", "modelled_wall_s"))


def _concurrent_frameworks(rows) -> list[str]:
    """Every framework on the same concurrent batch: SE's saving against each."""
    runs: dict[str, dict[str, dict]] = {}
    for row in rows:
        if row["experiment"] == "concurrent" and row["request_mode"] == "concurrent" \
                and row["framework"] in collect.FRAMEWORKS:
            runs.setdefault(row["run"], {})[row["framework"]] = row
    table, each = [], []
    for fw in sorted(runs.values(), key=lambda f: (
            f["SE"]["dataset"], f["SE"]["request_distribution"], f["SE"]["num_requests"])
            if "SE" in f else ("", "", 0)):
        se = fw.get("SE")
        if se is None or len(fw) == 1:
            continue
        table.append([se["dataset"], se["request_distribution"], se["num_requests"]]
                     + [_saving(se, fw.get(b)) for b in collect.BASELINES])
        each += [[se["dataset"], se["request_distribution"], se["num_requests"], name,
                  _num(r.get("accuracy")), _shards_accuracy(r), _num(r.get("loss")),
                  _num(r.get("retrain_compute_s"), 1), _num(r.get("modelled_wall_s"), 1),
                  _num(r.get("client_epochs"), 1), _num(r.get("client_rounds"))]
                 for name in collect.FRAMEWORKS if (r := fw.get(name))]
    if not table:
        return []
    return ["", "SE's saving on the same concurrent batch, 1 - SE / baseline "
            "(compute seconds / modelled wall seconds; the paper: about 70% less time "
            "in the even case):", "",
            _table(["dataset", "distribution", "K", "vs FR", "vs FE", "vs RR"], table),
            "", "Every framework on the same concurrent batch (accuracy measured, of "
            "the ensemble for SE and SE-R, beside the mean accuracy of the shards "
            "they retrained, which the ensemble can hide; "
            "modelled wall s from measured training seconds; client rounds: server "
            "rounds that asked a client to train):", "",
            _table(["dataset", "distribution", "K", "framework", "accuracy",
                    "retrained shards' accuracy (original's)", "test loss", "compute s",
                    "modelled wall s", "client-epochs", "client rounds"],
                   each)]


def _impacted(point: dict) -> str:
    if "impacted_expected" not in point:
        return ""
    return (f"{_num(point['impacted_expected'], 2)} / "
            f"{_num(point['impacted_simulated'], 2)}")


def _storage_section(store, results) -> list[str]:
    out = ["", "## Storage and communication (paper Fig. 5)", ""]
    if store is None:
        return out + ["No storage run finished."]
    if not store["coded_available"]:
        out += ["Coded storage was not available (summary.json has no `SE_coded` "
                "block): FE and uncoded SE only.", ""]
    eff = store.get("efficiency") or {}
    out += [f"From run `{store['run']}`. Server bytes as measured on disk "
            "(coded SE: catalog and keys only; its slices live on the clients). "
            "Communication: modelled 0.1 s + bits / link rate per transfer, summed "
            "over unlearning (coded SE: plus fetching the slices); slice "
            "distribution during learning listed apart.", ""]
    table = []
    per_server = store.get("per_server_bytes") or {}
    system = store.get("system_bytes") or {}
    per_server_saving, system_saving = (
        compare.reduction(count.get("SE uncoded"), count.get("FE"))
        for count in (per_server, system))
    for name in ("FE", "SE uncoded", "SE coded"):
        table.append([name, _bytes(store["server_bytes"].get(name)),
                      _bytes(per_server.get(name)), _bytes(system.get(name)),
                      _bytes(store["client_bytes"].get(name)),
                      _num(store["comm_s"].get(name), 1),
                      _num(store["distribution_s"], 1) if name == "SE coded" else "0"])
    out.append(_table(["framework", "server storage", "per shard server (paper)",
                       "system (servers + clients)", "per-client storage (max)",
                       "unlearning comm s", "distribution comm s"], table))
    out += ["", "Server storage: the server's files after learning (a store keeps the "
            "updates and only the models a replay can start from: FE W^0 and the "
            "last, uncoded SE per shard W^0, the last and the model before each "
            "client's first round). Per shard server: W^0 and the updates one "
            "shard's server keeps, as the paper counts (FE: its one server). "
            "System: the same count over every server (coded SE: its catalogs and "
            "keys) plus every client's slices.", "",
            f"- Coded SE server storage vs FE: {_less(store['reduction_vs_FE'])} "
            f"(paper: ~98% less); uncoded SE vs FE: "
            f"{_less(store['uncoded_reduction_vs_FE'])} on disk (the kept shard "
            f"models and the catalog), {_less(system_saving)} over the system and "
            f"{_less(per_server_saving)} per shard server (the paper's gamma = S) "
            "by the paper's count."]
    if store.get("retrieval_s") is not None:
        out.append(f"- Coded SE slice retrieval: {_num(store['retrieval_s'], 2)} s "
                   f"modelled transfer, {_num(store['decode_s'], 2)} s decoding.")
    if eff:
        coded = eff.get("coded", {})
        out.append(f"- Storage efficiency gamma (paper Sec. 4): full 1, uncoded "
                   f"{eff.get('uncoded', {}).get('gamma')}, coded k = "
                   f"{coded.get('gamma')} (bound (1 - 2 mu) C = "
                   f"{_num(coded.get('gamma_bound'), 1)}, mu = {_num(coded.get('mu'))})"
                   + (f"; measured data / slice elements: "
                      f"{_num(store.get('gamma_measured'), 2)}"
                      if store.get("gamma_measured") is not None else "") + ".")
    return out + _sweep_section(results)


def _sweep_section(results) -> list[str]:
    """Storage against C and G (the sweep's rows), or nothing without a sweep."""
    out: list[str] = []
    sweep = results.get("storage_sweep") or []
    if sweep:
        out += ["", f"### Storage against clients C and rounds G "
                f"(source: {results.get('storage_sweep_source')})", ""]
        out.append(_table(
            ["C", "G", "FE server", "uncoded SE server", "coded SE server",
             "coded / FE", "coded SE per client (max)"],
            [[r["clients"], r["rounds"], _bytes(r.get("fe_server")),
              _bytes(r.get("se_uncoded_server")), _bytes(r.get("se_coded_server")),
              f"{100 * r['se_coded_server'] / r['fe_server']:.3f}%"
              if r.get("se_coded_server") and r.get("fe_server") else "n/a",
              _bytes(r.get("se_coded_client_max"))]
             for r in sorted(sweep, key=lambda r: (r["clients"], r["rounds"]))]))
        if results.get("storage_sweep_source") in _SWEEP_SOURCES:
            ks = ", ".join(f"{k} at C = {c}" for c, k in sorted(
                {r["clients"]: r["blocks_per_shard"] for r in sweep}.items()))
            out += ["", "The sweep uses the real stores and coder with random "
                    "updates of the MNIST CNN's shapes (no training; see "
                    f"experiments/storage.py): S = 4, K blocks a shard ({ks}), "
                    "C / 5 clients a round."]
    return out


def _figures(results) -> list[str]:
    figs = results.get("figures") or []
    if not figs:
        return []
    return ["", "## Figures", ""] + [f"![{Path(f).stem}]({f})" for f in figs]


def _notes(rows, failed) -> list[str]:
    notes = []
    for (dataset, partition), fw in compare.single_cells(rows).items():
        acc = (fw.get("original") or {}).get("accuracy")
        # a task scored by its loss (the rows' metric, e.g. a language model) is
        # not judged by its accuracy
        if compare.cell_metric(fw) == "accuracy" and acc is not None and acc >= 0.999:
            notes.append(
                f"{dataset}-{partition}: the original model's test accuracy is "
                f"{acc:.3f}, which a classification task does not reach in a few "
                "rounds: the capped test subset (`test-samples`, the first N samples) is "
                "probably one class (a class-sorted copy of the data); its "
                "accuracy and loss say nothing here.")
    for entry in failed:
        last = (entry.get("error") or "").strip().splitlines()[-1:] or ["?"]
        notes.append(f"run `{entry['spec']['name']}` failed: {last[0]}")
    if not notes:
        return []
    return ["", "## Notes", ""] + [f"- {n}" for n in notes]
