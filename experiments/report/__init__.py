"""report.md: the measured tables beside the paper's headline figures.

Every number in the report comes from the runs of this output folder (their
summary.json files, through :mod:`experiments.collect`) or from the storage
sweep of the same invocation; the paper's numbers are quoted as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments import collect, compare
from experiments.report.cells import clock, md_table, num, pct
from experiments.report.gaps import gap_section
from experiments.report.requests import concurrent_section, lira_section, single_sections
from experiments.report.storage import storage_section

PAPER = "Lin et al., *Scalable Federated Unlearning via Isolated and Coded Sharding*, " \
        "IJCAI 2024"


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
        f"- Wall time: {clock(results.get('wall_s'))} for {len(runs)} app runs "
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
    parts += single_sections(rows) + lira_section(rows)
    parts += concurrent_section(rows, summaries)
    parts += gap_section(rows)
    parts += storage_section(store, results)
    parts += _figures(results)
    parts += _notes(rows, failed)
    return "\n".join(parts) + "\n"


def _quality_section(rows: Sequence[dict]) -> list[str]:
    """The original models against the trained suite's goals (:func:`compare.quality`)."""
    table = [[q["dataset"], q["partition"], num(q["accuracy"]), num(q["loss"]),
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
            md_table(["dataset", "partition", "accuracy", "test loss", "goal", "met"],
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
            measured = f"{pct(h['storage_vs_FE'])} less server storage"
        else:
            measured = (
                "compute time: " + " / ".join(pct(h[f"time_vs_{b}"])
                                              for b in collect.baselines())
                + "; modelled wall time: " + " / ".join(
                    pct(h.get(f"wall_vs_{b}")) for b in collect.baselines())
                + "; client-epochs: " + " / ".join(pct(h[f"epochs_vs_{b}"])
                                                   for b in collect.baselines())
                + " (vs FR / FE / RR)")
        table.append([h["claim"], pct(h["paper"]), measured,
                      ", ".join(h["cells"]) or "no runs"])
    return md_table(["claim", "paper", "measured here", "runs"], table)


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
