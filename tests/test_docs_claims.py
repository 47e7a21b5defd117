"""Numbers the docs print, recomputed from the committed files that back them.

Each claim is a line the doc must contain, formatted from values computed from
its file: a number changed by hand in the doc (or a file remade without the doc)
fails here, naming the file, the line expected and the file it comes from.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

import pytest

from experiments import pareto
from server_app.config import methods

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUN = ROOT / "docs/results/default-run/summary.json"
CONFIRMING = {  # cell -> its row label in DESIGN.md and RESULTS.md
    "concurrent-cifar10-even-concurrent-k4": "CIFAR-10 even K = 4 (points)",
    "concurrent-cifar10-adapt-concurrent-k4": "CIFAR-10 adapt K = 4 (points)",
    "concurrent-shakespeare-even-concurrent-k4": "Tiny Shakespeare even K = 4 (nats)",
}


def _default_run() -> dict:
    """The default run's numbers as RESULTS.md and the README print them."""
    summary = json.loads(DEFAULT_RUN.read_text())
    fw = summary["frameworks"]
    se, fr = fw[methods.proposed()], fw[methods.reference()]
    return {"ratio": se["modelled_wall_s"] / fr["modelled_wall_s"],
            "se_wall": se["modelled_wall_s"], "fr_wall": fr["modelled_wall_s"],
            "original": summary["original"]["accuracy"] * 100, "rows": fw}


def _confirming() -> dict[str, dict[str, tuple[float, float]]]:
    """Cell -> framework -> (mean minus SISA, mean wall / FR) over the seeds."""
    sisa, ref = methods.shard_reference(), methods.reference()
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for cell in CONFIRMING:
        runs = [r for r in pareto.load() if r["cell"] == cell]
        assert len(runs) == 3, f"{cell}: {len(runs)} seeds committed, 3 expected"
        key, scale, _ = pareto.metric(runs[0])
        out[cell] = {name: (
            mean((r["frameworks"][name][key] - r["frameworks"][sisa][key]) * scale
                 for r in runs),
            mean(r["frameworks"][name]["modelled_wall_s"]
                 / r["frameworks"][ref]["modelled_wall_s"] for r in runs))
            for name in runs[0]["frameworks"]}
    return out


def _side_by_side(folder: str) -> dict:
    """SE's client-epochs and wall / FR over a side-by-side folder's concurrent cells."""
    import csv

    path = ROOT / "docs/results/side-by-side" / folder / "results.csv"
    rows = list(csv.DictReader(path.open()))
    se, ref = methods.proposed(), methods.reference()
    fr = {r["run"]: float(r["modelled_wall_s"]) for r in rows if r["framework"] == ref}
    mine = [r for r in rows if r["framework"] == se and r["request_mode"] == "concurrent"]
    epochs = [float(r["client_epochs"]) for r in mine]
    even = [float(r["client_epochs"]) for r in mine if r["request_distribution"] == "even"]
    walls = [float(r["modelled_wall_s"]) / fr[r["run"]] for r in mine]
    return {"epochs": (min(epochs), max(epochs)), "even": (min(even), max(even)),
            "wall": (min(walls), max(walls)), "source": path.relative_to(ROOT).as_posix()}


def _original_under_fr(*runs: str) -> tuple[float, float]:
    """(least, most) points the original is under FR over the trained suite's seed-0
    runs whose name starts with one of ``runs``."""
    import csv

    path = ROOT / "docs/results/trained-suite/results.csv"
    by: dict[str, dict[str, dict]] = {}
    for row in csv.DictReader(path.open()):
        by.setdefault(row["run"], {})[row["framework"]] = row
    gaps = [(float(fw[methods.reference()]["accuracy"]) - float(fw["original"]["accuracy"]))
            * 100 for run, fw in by.items() if run.startswith(runs)
            and fw["original"]["seed"] == "0" and methods.reference() in fw]
    return min(gaps), max(gaps)


def _default_run_time() -> str:
    """``time ./simulate.sh`` of the default run, as its folder's README records it."""
    import re

    text = (DEFAULT_RUN.parent / "README.md").read_text()
    found = re.search(r"`time \./simulate\.sh` gave (\d+ min \d+ s)", text)
    assert found, "docs/results/default-run/README.md no longer records the run's time"
    return found.group(1)


def _example_claims() -> list[tuple[str, str, str]]:
    """The plug-in examples' numbers in the README and docs/TASKS.md."""
    out = []
    for name in ("resnet", "digits"):
        source = f"docs/results/examples/{name}/summary.json"
        summary = json.loads((ROOT / source).read_text())
        se, fr = (summary["frameworks"][k] for k in ("SE", "FR"))
        if name == "resnet":
            shard = se["shard_accuracy"][se["requests"][0]["impacted_shards"][0]]
            out += [("README.md",
                     f"client SE {se['accuracy']:.1%}, FR {fr['accuracy']:.1%}", source),
                    ("docs/TASKS.md", f"| {se['accuracy']:.1%} (retrained shard "
                     f"{shard:.1%}) | {se['retrain_compute_s']:.0f} "
                     f"| {se['client_epochs']:.0f} |", source)]
        else:
            out.append(("docs/TASKS.md", f"SE {se['accuracy']:.1%} with "
                        f"{se['client_epochs']:.0f} client-epochs and FR "
                        f"{fr['accuracy']:.1%} with {fr['client_epochs']:.0f}", source))
    return out


def _run_minutes(path: Path) -> float:
    """A run's learning plus every framework's retraining, in wall minutes."""
    summary = json.loads(path.read_text())
    return (summary["learning"]["wall_time_s"] + sum(
        f["retrain_wall_s"] for f in summary["frameworks"].values())) / 60


def _paper_noniid() -> list[dict]:
    """The committed non-IID paper-scale files (the README's headline cells)."""
    return [r for r in pareto.load(pareto.PAPER_SCALE)
            if r["config"]["partition"] == "noniid"]


def _paper_scale_saving() -> str:
    """RESULTS' goal line: the time each SE saves at the paper's scale, per dataset."""
    from experiments.facts import facts_of
    from task.tasks import BUILTIN_TASKS

    runs = {r["config"]["dataset"]: r for r in _paper_noniid()}
    names = [d for d in BUILTIN_TASKS if d in runs]

    def saved(name: str) -> list[str]:
        walls = [(runs[d]["frameworks"][name]["modelled_wall_s"],
                  runs[d]["frameworks"][methods.reference()]["modelled_wall_s"])
                 for d in names]
        return [f"{100 * (1 - wall / fr):.1f}%" for wall, fr in walls]

    def listed(items: list[str]) -> str:
        return ", ".join(items[:-1]) + f" and {items[-1]}"

    def gap(d: str, key: str) -> float:
        fw = runs[d]["frameworks"]
        return (fw[methods.proposed()][key] - fw["SE-paper"][key]) / (
            fw[methods.reference()][key] if key == "modelled_wall_s" else 1)

    paper = [f"{facts_of(d).paper_reduction * 100:.4g}%" for d in names]
    cost = [100 * gap(d, "modelled_wall_s") for d in names]
    images = [100 * gap(d, "accuracy") for d in names if d != "shakespeare"]
    forgotten = runs[names[0]]["frameworks"][methods.proposed()]["requests"][0]["clients"]
    return (f"For client {forgotten[0]}, SE as shipped saves "
            f"{listed(saved(methods.proposed()))} of FR's modelled "
            f"wall time on {listed(names)}, against the paper's {listed(paper)} (the "
            f"paper's SE: {listed(saved('SE-paper'))}). The exact rounds and refilled "
            f"slots cost SE {min(cost):.1f}-{max(cost):.1f} points of that saving "
            f"against the paper's SE, for {min(images):.2f}-{max(images):.2f} points "
            f"of accuracy on the image datasets and {-gap('shakespeare', 'loss'):.4f} "
            "nats of test loss on Tiny Shakespeare")


def _paper_scale_recovery() -> str:
    """RESULTS' goal line: SE-R's wall time and client-epochs over FR's at the paper's
    scale, from the cost-only runs (``modelled/``) of today's SE-R schedule."""
    ref = methods.reference()
    folder = pareto.PAPER_SCALE / pareto.MODELLED
    made = [json.loads((folder / f"explore-{r['cell']}-s{r['seed']}.json").read_text())
            ["frameworks"] for r in _paper_noniid()]
    wall, epochs = ([f["SE-R"][k] / f[ref][k] for f in made]
                    for k in ("modelled_wall_s", "client_epochs"))
    share = ("-".join(dict.fromkeys(f"{e:.3f}" for e in (min(epochs), max(epochs)))))
    return (f"as shipped, {min(wall):.2f}-{max(wall):.2f} of FR's modelled wall time "
            f"and {share} of its client-epochs over the "
            f"{len(made)} non-IID cells (cost-only runs of today's schedule)")


def _paper_scale_cifar() -> str:
    """RESULTS' CIFAR-10 goal line: SE's and the original's gaps at the paper's scale."""
    run = next(r for r in _paper_noniid() if r["config"]["dataset"] == "cifar10")
    fw, ref = run["frameworks"], methods.reference()
    fr, se = fw[ref]["accuracy"], fw[methods.proposed()]["accuracy"]
    return (f"SE is {100 * (fr - se):.2f} points under FR and "
            f"{100 * (fw[methods.shard_reference()]['accuracy'] - se):.2f} under SISA on "
            f"CIFAR-10; the model before forgetting is "
            f"{100 * (fr - run['learned_accuracy']):.2f} under FR")


def _shipped_wall_range(name: str) -> str:
    """Least-most of ``name``'s mean wall / FR over the shipped cells, as RESULTS prints."""
    runs = pareto.load(pareto.FILES / pareto.SHIPPED)
    ref = methods.reference()
    ratios = [mean(r["frameworks"][name]["modelled_wall_s"]
                   / r["frameworks"][ref]["modelled_wall_s"]
                   for r in runs if r["cell"] == cell)
              for cell in {r["cell"] for r in runs}]
    return f"{min(ratios):.2f}-{max(ratios):.2f}"


def _cut(text: str, start: str, end: str) -> str:
    """``text`` from ``start`` up to the end of ``end`` (its first after ``start``)."""
    a = text.index(start)
    return text[a:text.index(end, a) + len(end)]


def _claims() -> list[tuple[str, str, str]]:
    """(doc, line it must contain, the file it comes from)."""
    run = _default_run()
    source = DEFAULT_RUN.relative_to(ROOT).as_posix()
    claims = [
        ("README.md", f"next to FR's ({run['ratio']:.3f} of it;", source),
        ("README.md", f"and SISA: {_default_run_time()} on a 2-core",
         "docs/results/default-run/README.md"),
        ("docs/RESULTS.md", f"`{methods.proposed()} / {methods.reference()} modelled wall "
         f"time: {run['ratio']:.3f} ({methods.proposed()} {run['se_wall']:.1f} s, "
         f"{methods.reference()} {run['fr_wall']:.1f} s)`", source),
        ("docs/RESULTS.md", f"| original (shard ensemble) | {run['original']:.2f}% |",
         source),
    ]
    paper = _side_by_side("concurrent-fmnist")
    shipped = _side_by_side("concurrent-fmnist-refill")
    (e0, e1), (w0, w1) = shipped["epochs"], shipped["wall"]
    claims += [
        ("docs/RESULTS.md", f"its modelled wall time is {w0:.2f}-{w1:.2f} of FR's against "
         f"{paper['wall'][0]:.2f}-{paper['wall'][1]:.2f}", shipped["source"]),
        ("docs/RESULTS.md", f"SE's client-epochs are {e0:.0f}-{e1:.0f} against the "
         f"paper's SE's {paper['epochs'][0]:.0f}-{paper['epochs'][1]:.0f} there "
         f"({paper['even'][0]:.0f}-{paper['even'][1]:.0f} in the even cells; FR: 192)",
         paper["source"])]
    claims += _example_claims()
    claims.append(("docs/RESULTS.md", _paper_scale_recovery(),
                   "docs/results/paper-scale/explore-paper-*-noniid-s0.json"))
    claims.append(("docs/RESULTS.md", f"(SISA {_shipped_wall_range('SISA')}, RR, whose "
                   f"local steps are Fisher-preconditioned, {_shipped_wall_range('RR')})",
                   "docs/results/wall/shipped/explore-*.json"))
    claims.append(("docs/RESULTS.md", _paper_scale_cifar(),
                   "docs/results/paper-scale/explore-paper-cifar10-noniid-s0.json"))
    saving = _paper_scale_saving()
    claims += [(doc, line, "docs/results/paper-scale/explore-paper-*-noniid-s0.json")
               for doc, line in (("docs/RESULTS.md", saving), ("README.md", _cut(
                   saving, "cost SE", " on the image datasets")))]
    walls = [_run_minutes(ROOT / f"docs/results/recovery/paper-noniid-seed{seed}.json")
             for seed in (0, 1, 2)]
    claims.append(("docs/results/recovery/README.md",
                   f"the three retrainings: {min(walls):.1f}-"
                   f"{max(walls):.1f} min of wall seconds a run",
                   "docs/results/recovery/paper-noniid-seed*.json"))
    single = _original_under_fr("single-")
    assert single[1] <= 0.5 + 1e-9, single  # "at most 0.5 points under FR"
    lo, hi = _original_under_fr(*(f"concurrent-cifar10-{d}-concurrent-k{k}"
                                  for d in ("even", "adapt") for k in (4, 8)))
    claims.append(("docs/RESULTS.md", f"with 4 and 8 requests it is {lo:.2f}-{hi:.2f} "
                   "under", "docs/results/trained-suite/results.csv"))
    for name, f in run["rows"].items():
        claims.append(("docs/RESULTS.md",
                       f"| {name} | {f['accuracy'] * 100:.2f}% "
                       f"| {f['retrain_compute_s']:.1f} "
                       f"| {f['client_epochs']:.0f} | {f['client_rounds']} "
                       f"| {f['modelled_wall_s']:.1f} |", source))
    for cell, by_name in _confirming().items():
        unit = 3 if "nats" in CONFIRMING[cell] else 2
        se, norefill, f1, fr = (by_name[n] for n in ("SE", "SE-norefill", "SER-f1", "FR"))
        iso = -fr[0]  # SISA - FR is minus FR - SISA
        source = f"docs/results/wall/explore-{cell}-s*.json"
        claims.append(("docs/DESIGN.md",
                       f"| {CONFIRMING[cell]} | {se[0]:+.{unit}f} (wall / FR {se[1]:.2f}) "
                       f"| {norefill[0]:+.{unit}f} ({norefill[1]:.2f}) "
                       f"| {f1[0]:+.{unit}f} ({f1[1]:.2f}) |", source))
        claims.append(("docs/RESULTS.md",
                       f"| {CONFIRMING[cell]} | {iso:+.{unit}f} | {se[0]:+.{unit}f} at "
                       f"{se[1]:.2f} | {norefill[0]:+.{unit}f} at {norefill[1]:.2f} "
                       f"| {f1[0]:+.{unit}f} at {f1[1]:.2f} |", source))
    return claims


@pytest.mark.parametrize("doc, line, source", _claims(),
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_the_docs_print_what_the_files_hold(doc, line, source):
    text = " ".join((ROOT / doc).read_text().split())  # a line may wrap
    assert " ".join(line.split()) in text, \
        f"{doc} lacks {line!r}, computed from {source}"


def test_the_records_tables_are_what_their_files_make():
    """docs/RESULTS.md's records and class tables (issue 45) are generated."""
    from experiments import erasure_tables as table

    text = (ROOT / "docs/RESULTS.md").read_text()
    assert table.BEGIN in text and table.END in text
    assert text.split(table.BEGIN, 1)[1].split(table.END, 1)[0] == \
        f"\n\n{table.block()}\n", "python -m experiments.erasure_tables --write"


def test_the_verification_tables_are_what_their_files_make_with_todays_code():
    """RESULTS' "Forgetting verified" tables (issues 13, 27) are generated, from
    runs whose code fingerprint is today's: a run of code that changed since is
    stale and fails here (remake it with the commands in that section)."""
    from experiments import time_saved
    from experiments import verified_tables as table

    text = (ROOT / "docs/RESULTS.md").read_text()
    assert table.BEGIN in text and table.END in text
    assert text.split(table.BEGIN, 1)[1].split(table.END, 1)[0] == \
        f"\n\n{table.block()}\n", "python -m experiments.verified_tables --write"
    runs = sorted(table.HERE.glob("*-seed*.json"))
    made = [p for p in runs if p.name.startswith(("verify-seed", "verify-clean-seed",
                                                  "memorize-seed"))]
    assert len(made) >= 3, "no verification runs committed"
    today = {"fingerprint": time_saved.fingerprint(),
             "audit_fingerprint": time_saved.audit_fingerprint()}
    stale = [(p.name, key) for p in made for key, value in today.items()
             if json.loads(p.read_text()).get(key) != value]
    assert not stale, f"made by other code than today's: {stale}"
    clauses = [c for line in table.block().splitlines() if line.startswith("Goal")
               for c in line.split(";")]
    for says in ("TPR at 1% FPR at least", "AUC at least 0.7", "original's AUC at least",
                 "original's ASR at least", "band on every metric"):
        clause = next(c for c in clauses if says in c)  # RESULTS' goals not reached
        assert "**not reached**" in clause, f"reached, so not a goal missed: {clause}"


def test_the_time_saved_table_is_what_its_files_make_with_todays_code():
    """RESULTS' per-client time-saved table (issue 52) is generated from files
    whose code fingerprint is today's: a file made by code that changed since is
    stale and fails here (remake it with ``python -m experiments.time_saved D``)."""
    from experiments import time_saved

    files = sorted(time_saved.OUT.glob("*.json"))
    assert files, "no docs/results/time-saved/*.json"
    today = time_saved.fingerprint()
    for path in files:
        made = json.loads(path.read_text()).get("fingerprint")
        assert made == today, f"{path.name} was made by other code ({made} != {today})"
    text = " ".join((ROOT / "docs/RESULTS.md").read_text().split())
    assert text.count(" ".join(time_saved.shortfall().split())) == 2, \
        "docs/RESULTS.md lacks time_saved.shortfall() in its section and its goals"
    for line in time_saved.table().splitlines():
        assert " ".join(line.split()) in text, f"docs/RESULTS.md lacks {line!r}"


def test_the_config_page_lists_every_run_config_key():
    """README: docs/CONFIG.md "has all of them": every key of pyproject's
    [tool.flwr.app.config] has a row (a row may name several keys)."""
    import re

    from cli.config import defaults

    first_column = re.findall(r"^\| (`[^|]+`) \|", (ROOT / "docs/CONFIG.md").read_text(),
                              re.M)
    listed = {k for cell in first_column for k in re.findall(r"`([a-z0-9.-]+)`", cell)}
    assert sorted(set(defaults()) - listed) == []
