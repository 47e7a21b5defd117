"""The tables the experiments command writes into docs/RESULTS.md and the README.

From the committed run files that :mod:`experiments.pareto` reads (the shipped runs,
``docs/results/wall/shipped/``, and the paper-scale cells,
``docs/results/paper-scale/``): RESULTS' summary block (:func:`summary_block`: a
table per dataset, every framework against FR) and the README's headline block
(:func:`headline_block`). :func:`redraw` rewrites both, the ``explore.md`` tables
and the figures; ``tests/test_pareto.py`` compares the blocks byte for byte.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from cli.config import toml_value
from experiments.pareto import (
    FIGURES,
    FILES,
    MODELLED,
    PAPER_SCALE,
    ROOT,
    SHIPPED,
    figures,
    load,
    metric,
    outdated,
    table,
    times,
)
from server_app.config import methods

RESULTS = ROOT / "docs" / "RESULTS.md"
"""The page whose summary block :func:`redraw` rewrites (:func:`summary_block`)."""
SUMMARY_BEGIN = ("<!-- summary: made by `./simulate.sh experiments pareto` from "
                 "docs/results/paper-scale/ and docs/results/wall/shipped/; do not edit "
                 "by hand -->")
SUMMARY_END = "<!-- end of summary -->"
README = ROOT / "README.md"
"""The page whose headline block :func:`redraw` rewrites (:func:`headline_block`)."""
HEADLINE_BEGIN = ("<!-- headline: made by `./simulate.sh experiments pareto` from "
                   "docs/results/paper-scale/ (else docs/results/wall/shipped/); do not "
                   "edit by hand -->")
HEADLINE_END = "<!-- end of headline -->"
FORGOTTEN_HEAD = (
    "### At the paper's scale, forgotten clients drawn before the runs\n\n"
    "The non-IID cell of each dataset above, forgetting in one run each the first "
    "clients of the order `random.Random(52)` draws (SISA, SE, the paper's SE and SE-R "
    "from the same learned shards; FR beside them for the first two): each score "
    "minus SISA's paired per client, mean ± sample SD (n - 1) over the clients. "
    "Command: `docs/results/paper-scale/run.py DATASET 0 --clients 5` (files "
    "`docs/results/paper-scale/clients/`; each run's times are the cost model's, its "
    "file recording the code's fingerprint; a file with `learning_copied_from` started "
    "from a copy of the cell's one learning, which gives the models a learning of its "
    "own gives: `experiments/learned.py`). Wall time over FR's: over the mean of "
    "FR's runs, which the cost model prices alike whoever asks.\n\n")
"""The caption of :func:`experiments.forgotten.table` in RESULTS' summary."""
BASELINES = PAPER_SCALE / "baselines"
"""FR, FE, RR, FRec and SE on the paper-scale cells (``run.py D 0 --baselines``)."""
BASELINES_HEAD = (
    "### At the paper's scale, the unsharded baselines (paper Fig. 3)\n\n"
    "The same non-IID cell and request, FR, FE, RR and FRec on an unsharded federation "
    "learned beside SE's shards (`baseline-shards = 1`; the original row is SE's "
    "sharded ensemble), SE beside them. Command: `docs/results/paper-scale/run.py "
    "DATASET 0 --baselines` (files `docs/results/paper-scale/baselines/`).\n\n")
"""The caption of the baselines' tables in RESULTS' summary."""
SWEEPS = ROOT / "docs" / "results" / "time-saved"
"""SE's time saved over every client, per dataset (:mod:`experiments.time_saved`)."""
NO_RUNS = "No shipped runs committed yet.\n"
SPREAD = ("Spreads, here and in every table of this page made from several seeds: mean "
          "± sample standard deviation (n - 1) over the seeds the caption lists, for the "
          "ratios over FR too (each seed's ratio first).")
"""The one spread convention of the generated tables, said once."""
"""A generated block's text while no run file is committed."""
SE = methods.proposed()
"""The proposed method (SE), as shipped."""
PAPER_SE = "SE-paper"
"""The paper's SE in the files: docs/results/wall/explore.py's variant of that name."""


def redraw(files: Path = FILES, figures_to: Path = FIGURES, results: Path = RESULTS,
           readme: Path = README, paper_scale: Path = PAPER_SCALE) -> list[Path]:
    """Rewrite ``explore.md``, the figures and the generated blocks; the paths written.

    ``files/explore.md`` tabulates the schedule files, ``files/shipped/explore.md``
    those of :data:`SHIPPED`; the figures draw both, a shipped run's cell labelled
    ``<cell>, shipped``, and those of ``paper_scale`` (:data:`PAPER_SCALE`);
    :func:`summary_block` replaces what stands between :data:`SUMMARY_BEGIN` and
    :data:`SUMMARY_END` in ``results``, :func:`headline_block` the block between
    :data:`HEADLINE_BEGIN` and :data:`HEADLINE_END` in ``readme``.

    Raises
    ------
    ValueError
        ``files`` holds no schedule file (nothing to draw), or a page lacks its
        block's markers (checked before anything is written).
    """
    pages = {results: (SUMMARY_BEGIN, SUMMARY_END), readme: (HEADLINE_BEGIN, HEADLINE_END)}
    for page, (begin, end) in pages.items():
        if begin not in page.read_text() or end not in page.read_text():
            raise ValueError(f"{page}: no generated block ({begin!r} ... {end!r}) to "
                             "rewrite")
    runs = load(files)
    if not runs:
        raise ValueError(f"{files}: no explore-*-s*.json to draw from")
    shipped, paper = load(files / SHIPPED), load(paper_scale)
    written = []
    for folder, these in ((files, runs), (files / SHIPPED, shipped), (paper_scale, paper)):
        if these:
            written.append(folder / "explore.md")
            written[-1].write_text(table(these) + "\n")
    for page, make in ((results, summary_block), (readme, headline_block)):
        replace_block(page, *pages[page], make(shipped, paper))
    for data in shipped:
        data["label"] = f"{data['cell']}, shipped"
    return [*written, results, readme, *figures(runs + shipped + paper, figures_to)]


def summary_block(shipped: list[dict], paper: list[dict]) -> str:
    """RESULTS' summary block: the paper-scale tables, then the shipped runs'.

    :func:`paper_scale_tables`, then :func:`summary_tables`; :data:`NO_RUNS` where
    both lists are empty.
    """
    from experiments import forgotten

    parts = []
    noniid, iid = _by_partition(paper)
    if noniid:
        parts.append(paper_scale_tables(noniid))
    if noniid and forgotten.by_dataset():
        parts.append(FORGOTTEN_HEAD + forgotten.table() + "\n")
    baselines = load(BASELINES)
    if noniid and baselines:
        parts.append(BASELINES_HEAD + summary_tables(baselines, suffix=", baselines"))
    if iid:
        parts.append(paper_scale_iid_tables(iid))
    if shipped:
        parts.append("### At a smaller scale, three seeds\n\n" + SPREAD + "\n\n"
                     + summary_tables(shipped))
    return "\n".join(parts) if parts else NO_RUNS


def headline_block(shipped: list[dict], paper: list[dict]) -> str:
    """README's headline block: the paper-scale table, else the shipped runs'.

    :func:`paper_headline` where a non-IID paper-scale file exists (the paper's
    headline reductions are the non-IID cells'), else
    :func:`headline_table`; :data:`NO_RUNS` where both lists are empty.
    """
    noniid = _by_partition(paper)[0]
    if noniid:
        return paper_headline(noniid)
    return headline_table(shipped) if shipped else NO_RUNS


def block(page: Path, begin: str, end: str) -> str:
    """What stands between ``begin`` and ``end`` in ``page`` (the generated block)."""
    return page.read_text().split(begin, 1)[1].split(end, 1)[0]


def replace_block(page: Path, begin: str, end: str, content: str) -> None:
    """Put ``content`` between ``begin`` and ``end`` in ``page``, a blank line around."""
    head, rest = page.read_text().split(begin, 1)
    page.write_text(f"{head}{begin}\n\n{content}\n{end}{rest.split(end, 1)[1]}")


def paper_scale_tables(runs: list[dict]) -> str:
    """The summary's first part: one table per dataset at the paper's scale.

    As :func:`summary_tables`, each followed by the time SE, as shipped and as the
    paper ran it, saves against FR beside the reduction the paper reports for that
    dataset (:attr:`experiments.facts.ExperimentFacts.paper_claim`).
    """
    missing = _not_run(runs)
    head = ["### At the paper's scale", "",
            "The paper's single-request non-IID cell of each dataset (C = 100 clients, "
            "S = 4 shards, 20 a round, G = 30 rounds, L = 10 local epochs; one request "
            "of one client), the shipped defaults beside the paper's SE, one seed. "
            + _baselines_note(runs)
            + (f" Not run yet at this scale: {', '.join(missing)}." if missing else "")
            + " SE-R as shipped is in the forgotten-clients tables. Command: "
            "`docs/results/paper-scale/run.sh` (files `docs/results/paper-scale/`).", ""]
    return "\n".join(head) + "\n" + summary_tables(runs, _claim_lines)


def _baselines_note(runs: list[dict]) -> str:
    """Where FE, RR and FRec stand at the paper's scale (:data:`BASELINES`)."""
    missing = [d for d in _datasets(runs) if d not in _datasets(load(BASELINES))]
    what = "FE, RR and FRec (each on an unsharded federation learned beside the shards)"
    if len(missing) == len(_datasets(runs)):
        return f"{what} are not run yet at this scale."
    return (f"{what} are in their own tables below"
            + (f"; not run yet on {', '.join(missing)}." if missing else "."))


def paper_scale_iid_tables(runs: list[dict]) -> str:
    """The IID cells at the paper's scale: as :func:`paper_scale_tables`.

    The time saved against FR follows each table, without a paper figure: the
    paper's reductions are for its non-IID cells.
    """
    head = ["### At the paper's scale, IID", "",
            "The same cells with an IID partition (each client's share drawn uniformly), "
            "one seed; the datasets not listed are not run IID at this scale. "
            "Command: `PARTITION=iid docs/results/paper-scale/run.sh DATASET`.", ""]
    return "\n".join(head) + "\n" + summary_tables(runs, _saved_lines, ", IID")


def _by_partition(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """``runs`` split into the non-IID ones and the IID ones."""
    return ([r for r in runs if r["config"]["partition"] != "iid"],
            [r for r in runs if r["config"]["partition"] == "iid"])


def _saved_lines(dataset: str, mine: list[dict], paper: str = "") -> list[str]:
    """Time saved against FR by SE and the paper's SE, ``paper`` after it."""
    saved = ", ".join(f"{name} {_saved(mine, name)}" for name in (SE, PAPER_SE)
                      if all(name in r["frameworks"] for r in mine))
    return [f"Modelled wall time saved against FR (1 - wall / FR): {saved}{paper}.", ""]


def _claim_lines(dataset: str, mine: list[dict]) -> list[str]:
    """Time saved against FR by SE and the paper's SE, beside the paper's figure."""
    claim = paper_claim(dataset)
    return _saved_lines(dataset, mine, f"; the paper reports {claim * 100:.4g}% less "
                        "retraining time than FR" if claim else "")


def _saved(runs: list[dict], name: str) -> str:
    """``1 - wall / FR`` of ``name``, mean over ``runs``, in %; ``stale`` without a time.

    ``not run`` where a run lacks ``name``.
    """
    if not all(name in r["frameworks"] for r in runs):
        return "not run"
    if any(r["frameworks"][name]["modelled_wall_s"] is None for r in runs):
        return "stale"
    return f"{100 * _saved_fraction(runs, name):.1f}%"


def _saved_fraction(runs: list[dict], name: str) -> float:
    """``1 - wall / FR`` of ``name`` (modelled wall times), mean over ``runs``."""
    from statistics import mean

    ref = methods.reference()
    return 1 - mean(r["frameworks"][name]["modelled_wall_s"]
                    / r["frameworks"][ref]["modelled_wall_s"] for r in runs)


def paper_claim(dataset: str) -> float | None:
    """The retraining-time reduction the paper reports for ``dataset`` (None: none).

    The dataset's own figure where its facts give one
    (:attr:`~experiments.facts.ExperimentFacts.paper_reduction`), else its claim's.
    """
    from experiments.facts import facts_of

    facts = facts_of(dataset)
    if facts and facts.paper_reduction is not None:
        return facts.paper_reduction
    return facts.paper_claim[1] if facts and facts.paper_claim else None


def _not_run(runs: list[dict]) -> list[str]:
    """The built-in datasets without a file in ``runs``."""
    from task.tasks import BUILTIN_TASKS

    have = {r["config"]["dataset"] for r in runs}
    return [d for d in BUILTIN_TASKS if d not in have]


def _per_dataset(runs: list[dict]):
    """Per dataset of ``runs``: (dataset, its runs, metric key, unit, value).

    ``value(name)`` is ``name``'s mean metric over the dataset's runs as the
    README prints it (accuracy in % to 0.01, loss in nats to 0.001), or
    ``not run`` where a run lacks it.
    """
    for dataset in _datasets(runs):
        mine = [r for r in runs if r["config"]["dataset"] == dataset]
        key, factor, unit = metric(mine[0])
        yield dataset, mine, key, unit, partial(
            _mean_value, mine, key, factor, 2 if key == "accuracy" else 3)


def _mean_value(runs: list[dict], key: str, factor: float, digits: int,
                name: str) -> str:
    """``name``'s mean ``key`` over ``runs`` times ``factor``, or ``not run``."""
    from statistics import mean

    if not all(name in r["frameworks"] for r in runs):
        return "not run"
    return f"{mean(r['frameworks'][name][key] for r in runs) * factor:.{digits}f}"


def paper_headline(runs: list[dict], sweeps: Path = SWEEPS) -> str:
    """The README's table at the paper's scale: FR, SISA, SE as shipped, the paper's SE.

    Per dataset: test accuracy in % (test loss in nats where the task is read by
    its loss) of FR, SISA, SE and the paper's SE, from ``runs`` (one learned run,
    one forgotten client); SE's modelled time saved against FR over the
    federation's clients (``sweeps/<dataset>.json``, :mod:`experiments.time_saved`:
    mean ± sample SD [min, max] over the clients swept), then each framework's
    for the file's forgotten client (:func:`experiments.pareto.remade` times);
    the paper's own reduction. Below: the price of isolation (SISA - FR) and of
    approximation (SE - SISA), and the verdicts.
    """
    ref, exact = methods.reference(), methods.shard_reference()
    forgotten = sorted({c for r in runs for c in _forgotten(r)})
    who = f"client {forgotten[0]}" if len(forgotten) == 1 else "the forgotten client"
    head = ["dataset (non-IID), metric", ref, exact, SE, "paper's SE",
            f"{SE}: time saved over the clients, mean ± SD [min, max] (clients)",
            f"time saved, {who}: {SE}", exact, "paper's SE", "the paper reports"]
    rows, prices = [], []
    for dataset, mine, key, unit, value in _per_dataset(runs):
        claim, sweep = paper_claim(dataset), _sweep(sweeps, dataset)
        shown = "accuracy %" if key == "accuracy" else f"loss ({unit}, lower is better)"
        rows.append([f"{dataset}, {shown}", value(ref), value(exact), value(SE),
                     value(PAPER_SE), _swept(sweep),
                     *(_saved(mine, n) for n in (SE, exact, PAPER_SE)),
                     f"{claim * 100:.4g}%" if claim else ""])
        prices.append(_prices(dataset, mine, key))
    commits = ", ".join(f"{commit} ({', '.join(names)})"
                        for commit, names in _commits(runs).items())
    return "\n".join([
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows), "",
        f"Accuracy: one learned run per dataset, one seed, forgetting client "
        f"{', '.join(map(str, forgotten))}; commits {commits}"
        + (f"; not run yet at this scale: {', '.join(_not_run(runs))}."
           if _not_run(runs) else "."),
        f"Times: the cost model ({_profiles(runs)}), {_time_commits(runs)}; over the "
        "clients: one cost-only run per client (`python -m experiments.time_saved "
        "DATASET`) against FR's mean over 3 of them.",
        "The price of isolation (SISA - FR) and of approximation (SE - SISA), in "
        "accuracy points (test loss in nats, lower is better, on a task read by its "
        "loss): " + "; ".join(prices) + ".",
        *_verdict(runs, sweeps), *_clients_line(_datasets(runs))]) + "\n"


def _clients_line(datasets: list[str]) -> list[str]:
    """:func:`experiments.forgotten.goal_line` over the headline's ``datasets``."""
    from experiments import forgotten

    line = forgotten.goal_line(datasets=datasets)
    return [line] if line else []


def _sweep(sweeps: Path, dataset: str) -> dict | None:
    """``dataset``'s time-saved sweep summary (:mod:`experiments.time_saved`), or None."""
    import json

    path = sweeps / f"{dataset}.json"
    return json.loads(path.read_text()).get("summary") if path.is_file() else None


def _swept(sweep: dict | None) -> str:
    """A sweep's saving as the headline prints it; ``not swept`` without one."""
    if not sweep:
        return "not swept"
    s = sweep["se_saved_pct"]
    sd = f" ± {s['sd']:.1f}" if s["sd"] is not None else ""
    return f"{s['mean']:.1f}%{sd} [{s['min']:.1f}, {s['max']:.1f}] ({s['n']})"


def _prices(dataset: str, runs: list[dict], key: str) -> str:
    """``dataset``'s SISA - FR and SE - SISA, in points (nats for a loss)."""
    from statistics import mean

    ref, exact = methods.reference(), methods.shard_reference()
    scale, digits = (100, 2) if key == "accuracy" else (1, 3)
    value = {n: mean(r["frameworks"][n][key] for r in runs) * scale
             for n in (ref, exact, SE)}
    unit = "points" if key == "accuracy" else "nats"
    return (f"{dataset} {value[exact] - value[ref]:+.{digits}f} and "
            f"{value[SE] - value[exact]:+.{digits}f}" + ("" if unit == "points"
                                                          else f" {unit}"))


def _forgotten(run: dict) -> list[int]:
    """The clients SE forgot in ``run``."""
    return [c for q in run["frameworks"][SE].get("requests") or [] for c in q["clients"]]


def _profiles(runs: list[dict]) -> str:
    """The device profiles the remade times were priced by, in words."""
    import json

    names = set()
    for r in runs:
        path = PAPER_SCALE / MODELLED / f"explore-{r['cell']}-s{r['seed']}.json"
        if path.is_file():
            names.add((json.loads(path.read_text()).get("cost_model") or {}).get("profile"))
    return "device profile " + ", ".join(sorted(str(n) for n in names))


def _time_commits(runs: list[dict]) -> str:
    """Where ``runs``' times come from: the remade files' commits, or measured."""
    made = sorted({r["times"]["commit"][:7] for r in runs
                   if r.get("times", {}).get("source") == "cost model"})
    measured = [r["cell"] for r in runs if r.get("times", {}).get("source") != "cost model"]
    return ("remade at commit " + ", ".join(made) if made else "") + (
        f"; measured before the cost model: {', '.join(measured)}" if measured else "")


def _commits(runs: list[dict]) -> dict[str, list[str]]:
    """Commit (7 hex digits) -> the datasets whose runs it made, commits sorted."""
    by: dict[str, list[str]] = {}
    for dataset in _datasets(runs):
        for commit in sorted({r["commit"][:7] for r in runs
                              if r["config"]["dataset"] == dataset}):
            by.setdefault(commit, []).append(dataset)
    return dict(sorted(by.items()))


def _verdict(runs: list[dict], sweeps: Path = SWEEPS) -> list[str]:
    """Where SE saves at least the paper's reduction: over the clients, and for one.

    SE as shipped on average over the clients swept; SE and the paper's SE for
    the files' forgotten client.
    """
    claimed = {d for d in _datasets(runs) if paper_claim(d)}
    swept = {d: s for d in claimed if (s := _sweep(sweeps, d))}
    met = [d for d, s in swept.items()
           if s["se_saved_pct"]["mean"] >= 100 * paper_claim(d) - 1e-9]
    out = [f"{SE} as shipped saves at least the paper's reduction on average over the "
           f"clients on {len(met)} of the {len(swept)} datasets swept"
           f"{' (' + ', '.join(met) + ')' if met else ''}."]
    for name, label in ((SE, f"For the forgotten client, {SE} as shipped"),
                        (PAPER_SE, "and the paper's SE")):
        have = [r for r in runs if name in r["frameworks"]]
        by = {d: [r for r in have if r["config"]["dataset"] == d]
              for d in _datasets(have) if d in claimed}
        hit = [d for d, mine in by.items()
               if _saved_fraction(mine, name) >= paper_claim(d)]
        out.append(f"{label} saves at least the paper's reduction on {len(hit)} of "
                   f"{len(by)} datasets{' (' + ', '.join(hit) + ')' if hit else ''}"
                   + ("." if name == PAPER_SE else ","))
    return [" ".join(out)]


def summary_tables(runs: list[dict], notes=None, suffix: str = "") -> str:
    """One markdown table per dataset of ``runs``: every framework against FR.

    Rows: the model before forgetting, the registered methods in the registry's
    order, then the variants a file describes (with their settings). Columns:
    test accuracy in % (test loss in nats where the task is read by its loss)
    as mean ± sample standard deviation (:data:`SPREAD`) over the seeds;
    modelled wall time and client-epochs over FR's (the per-seed ratios'
    mean ± spread); client rounds (mean); server storage of its history
    in MB. A framework :func:`~experiments.pareto.outdated` in any seed is left
    out, a line under the table naming it. The caption gives the cell, its scale,
    the seeds and the commits;
    ``notes(dataset, runs)``, where given, the lines that follow each table;
    ``suffix`` follows the dataset in each table's heading.
    """
    from statistics import mean

    out = []
    ref = methods.reference()
    for dataset in _datasets(runs):
        mine = [r for r in runs if r["config"]["dataset"] == dataset]
        key, scale, unit = metric(mine[0])
        cfg, seeds = mine[0]["config"], sorted(r["seed"] for r in mine)
        names = [n for n in methods.names() if n in mine[0]["frameworks"]]
        names += [n for n in mine[0]["frameworks"] if n not in names]
        old = [n for n in names if any(outdated(r, n) for r in mine)]
        names = [n for n in names if n not in old]
        out += [f"#### {dataset}{suffix}", "",
                f"Cell `{mine[0]['cell']}`: {cfg['partition']}, {cfg['num-clients']} "
                f"clients, {cfg['num-shards']} shards, {cfg['clients-per-round']} a round, "
                f"{cfg['num-rounds']} rounds x {cfg['local-epochs']} local epochs, "
                f"{_requests(cfg)}; seeds {', '.join(map(str, seeds))}; commit "
                f"{', '.join(sorted({r['commit'][:7] for r in mine}))}; "
                f"{_machines(mine)}; {times(mine[0])}.", "",
                f"| framework | test {key} ({'%' if key == 'accuracy' else unit}) "
                "| wall / FR | client-epochs / FR | client rounds | server storage (MB) |",
                "|---|---|---|---|---|---|"]
        learned = [r[f"learned_{key}"] * scale for r in mine]
        digits = 2 if key == "accuracy" else 4
        out.append("| original (before forgetting) | "
                   f"{spread_text(learned, digits=digits)} | | | | |")
        for name in names:
            have = [r for r in mine if name in r["frameworks"]]
            fw = [r["frameworks"][name] for r in have]
            frs = [r["frameworks"][ref] for r in have]
            values = [f[key] * scale for f in fw]
            storage = fw[0].get("server_storage_bytes")
            out.append(
                f"| {_label(name, have[0])} | {spread_text(values, digits=digits)} "
                f"| {_ratio(fw, frs, 'modelled_wall_s')} "
                f"| {_ratio(fw, frs, 'client_epochs')} "
                f"| {mean(f['client_rounds'] for f in fw):.1f} "
                f"| {'' if storage is None else f'{storage / 1e6:.1f}'} |")
        out.append("")
        out += _left_out(old)
        out += notes(dataset, mine) if notes else []
    return "\n".join(out)


def _left_out(names: list[str]) -> list[str]:
    """The line that names the frameworks a table leaves out (:func:`outdated`)."""
    if not names:
        return []
    return [f"Not shown: {', '.join(names)}. A cost-only run of today's code trains "
            "another schedule (the code changed it since, or the method picks its rounds "
            "from the updates' values) and the files predate the code fingerprint, so "
            "nothing shows these numbers are today's method's.", ""]


def _machines(runs: list[dict]) -> str:
    """The machines ``runs`` record (:func:`experiments.run.machine`), in words."""
    seen = sorted({f"{m.get('cpus')}-core {m.get('cpu') or 'CPU'}"
                   for m in (r.get("machine", {}) for r in runs)})
    return f"machine {', '.join(seen)}"


def spread_text(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    """Mean ± sample standard deviation (n - 1, :data:`SPREAD`) of ``values`` x ``scale``.

    One value alone is printed alone.
    """
    from statistics import mean, stdev

    if len(values) == 1:
        return f"{values[0] * scale:.{digits}f}"
    return f"{mean(values) * scale:.{digits}f} ± {stdev(values) * scale:.{digits}f}"


def _datasets(runs: list[dict]) -> list[str]:
    """The datasets of ``runs``: the built-in tasks' order, then the others by name."""
    from task.tasks import BUILTIN_TASKS

    present = {r["config"]["dataset"] for r in runs}
    return [d for d in BUILTIN_TASKS if d in present] + sorted(present - set(BUILTIN_TASKS))


def _requests(cfg: dict) -> str:
    """The cell's requests in words."""
    k, per = cfg.get("num-requests", 1), cfg.get("clients-per-request", 1)
    mode, spread = cfg.get("request-mode"), cfg.get("request-distribution")
    mode = mode if k != 1 else None  # one request is neither sequential nor concurrent
    return (f"{k} {mode + ' ' if mode else ''}request{'s' if k != 1 else ''} of {per} "
            f"client{'s' if per != 1 else ''}" + (f", {spread}" if spread else ""))


def _ratio(fw: list[dict], frs: list[dict], key: str) -> str:
    """Mean ± spread over the seeds of ``key`` over FR's; blank where a file lacks it."""
    pairs = [(f.get(key), r.get(key)) for f, r in zip(fw, frs, strict=True)]
    if any(a is None or not b for a, b in pairs):
        return ""
    return spread_text([a / b for a, b in pairs], digits=2)  # the ratio's spread


def _label(name: str, run: dict) -> str:
    """A framework's row name: a variant's with the settings it changes."""
    variant = run.get("variants", {}).get(name)
    if not variant:
        return name
    changed = {**{_run_key(k): v for k, v in variant.get("settings", {}).items()},
               **{_run_key(k, "recovery-"): v
                  for k, v in variant.get("recovery", {}).items()}}
    return f"{name} ({', '.join(f'{k} = {toml_value(v)}' for k, v in changed.items())})"


def _run_key(name: str, prefix: str = "") -> str:
    """A variant's setting as the run-config key a user sets (``replay-refill``)."""
    key = name.replace("_", "-")
    return key if key.startswith(prefix) else prefix + key


def headline_table(runs: list[dict]) -> str:
    """The README's table: FR, SISA and the shipped sharded methods per dataset.

    The sharded methods are the registered ones every run holds that run on SE's
    shards and are not exact (SE, SE-R). Means over the seeds: test accuracy in %
    (test loss in nats where the task is read by its loss), and each method's
    modelled wall time over FR's.
    """
    from statistics import mean

    ref, exact = methods.reference(), methods.shard_reference()
    names = [n for n in methods.names()
             if all(n in r["frameworks"] and not outdated(r, n) for r in runs)
             and not methods.has(n, "on_baseline") and not methods.has(n, "exact")]
    head = ["dataset, scale: metric (runs)", ref, exact,
            *(f"{n} (wall / {ref})" for n in names)]
    rows = []
    for dataset, mine, key, unit, value in _per_dataset(runs):

        cfg = mine[0]["config"]
        shown = "accuracy %" if key == "accuracy" else f"loss ({unit}, lower is better)"
        cells = [f"{dataset} {cfg['partition']}, C = {cfg['num-clients']}, "
                 f"{cfg['clients-per-round']} a round, G = {cfg['num-rounds']}, "
                 f"L = {cfg['local-epochs']}: {shown} ({len(mine)})",
                 value(ref), value(exact)]
        for name in names:
            wall = mean(r["frameworks"][name]["modelled_wall_s"]
                        / r["frameworks"][ref]["modelled_wall_s"] for r in mine)
            cells.append(f"{value(name)} ({wall:.2f})")
        rows.append(cells)
    return "\n".join(["| " + " | ".join(head) + " |",
                      "|" + "---|" * len(head),
                      *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"
