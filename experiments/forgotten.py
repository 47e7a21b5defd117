"""Accuracy over forgotten clients drawn before the runs (issue 52, item 3).

``docs/results/paper-scale/run.py DATASET 0 --clients K`` forgets, one run each,
the first K clients of the order ``random.Random(52)`` draws, at the paper's
scale: SISA, SE, the paper's SE and SE-R forget each from the same learned shards,
FR beside them for the first two. This module reads those files
(``docs/results/paper-scale/clients/``; each run's times are the cost model's,
the file recording the code's fingerprint, :func:`experiments.pareto.remade`)
and writes RESULTS' table (:func:`table`) and the README's goal line
(:func:`goal_line`): each method's score minus SISA's, paired per client, as
mean ± sample SD (n - 1) over the clients, and the goal (within 1 point of
SISA; 0.03 nats on a task read by its loss) reached or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import fmean, stdev

from experiments.pareto import MODELLED, PAPER_SCALE, metric, remade
from server_app.config import methods

CLIENTS = PAPER_SCALE / "clients"
"""Where the forgotten-clients files live."""
PAPER_SE = "SE-paper"
"""The paper's SE in the files (``docs/results/wall/explore.py``'s variant)."""
BOUND = {"accuracy": 1.0, "loss": 0.03}
"""Issue 52's goal: SE within this of SISA (points of accuracy; nats of loss)."""
GOAL_CLIENTS = 5
"""Issue 52's goal is judged over at least this many forgotten clients."""


def by_dataset(folder: Path = CLIENTS) -> dict[str, list[dict]]:
    """The files of ``folder`` per dataset (empty where none is committed).

    Sorted by the client forgotten; each file's times remade where
    ``folder/modelled/`` holds them (:func:`experiments.pareto.remade`). Unlike
    :func:`experiments.pareto.load` a file need not hold FR (it runs for the first
    two clients only).
    """
    import json

    out: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("explore-*-s*.json")) if folder.is_dir() else []:
        run = json.loads(path.read_text())
        remade(run, folder / MODELLED / path.name)
        out.setdefault(run["config"]["dataset"], []).append(run)
    for runs in out.values():
        runs.sort(key=lambda r: int(r["config"]["forget-clients"]))
    return out


def gaps(runs: list[dict], name: str) -> list[float]:
    """``name``'s score minus SISA's per client (points of accuracy, or nats)."""
    exact = methods.shard_reference()
    key, scale, _ = metric(runs[0])
    return [(r["frameworks"][name][key] - r["frameworks"][exact][key]) * scale
            for r in runs if name in r["frameworks"]]


def spread(values: list[float], digits: int) -> str:
    """Mean ± sample SD (n - 1) and n; the value alone for one."""
    if len(values) == 1:
        return f"{values[0]:+.{digits}f} (1)"
    return f"{fmean(values):+.{digits}f} ± {stdev(values):.{digits}f} ({len(values)})"


def table(folder: Path = CLIENTS) -> str:
    """RESULTS' table: per dataset, each framework's score and its gap to SISA."""
    rows = ["| dataset | framework | clients | test score, mean ± SD | minus SISA, "
            "mean ± SD (clients) | wall / mean FR, mean ± SD (clients) |",
            "|---|---|---|---|---|---|"]
    ref = methods.reference()
    for dataset, runs in by_dataset(folder).items():
        key, scale, unit = metric(runs[0])
        digits = 2 if key == "accuracy" else 3
        first = [ref, methods.shard_reference(), methods.proposed(), PAPER_SE]
        for name in first + [n for n in runs[0]["frameworks"] if n not in first]:
            have = [r for r in runs if name in r["frameworks"]]
            if not have:
                continue
            scores = [r["frameworks"][name][key] * scale for r in have]
            clients = ", ".join(str(r["config"]["forget-clients"]) for r in have)
            rows.append(f"| {dataset} ({'%' if key == 'accuracy' else unit}) | {name} "
                        f"| {clients} | {spread(scores, digits).lstrip('+')} "
                        f"| {spread(gaps(have, name), digits)} | {_wall(have, name)} |")
    return "\n".join(rows)


def _wall(runs: list[dict], name: str) -> str:
    """``name``'s modelled wall time over FR's, mean ± sample SD (clients).

    FR's time is the mean over the runs that hold FR (the first two clients): it
    retrains every shard's clients for every round whoever asks, so the cost
    model prices it alike for the others (issue 52, item 3).
    """
    ref = methods.reference()
    fr = [r["frameworks"][ref]["modelled_wall_s"] for r in runs if ref in r["frameworks"]]
    fr = [t for t in fr if t is not None]
    ratios = [r["frameworks"][name]["modelled_wall_s"] / fmean(fr) for r in runs
              if fr and r["frameworks"][name]["modelled_wall_s"] is not None]
    if not ratios:
        return ""
    return spread(ratios, 2).lstrip("+")


def goal_line(folder: Path = CLIENTS, datasets: Sequence[str] = ()) -> str:
    """The README's line: SE's gap to SISA over the clients, per dataset, and the goal.

    ``datasets``: those the headline shows; one without a client file is named as
    not run yet, so the line never reads as if it covered every dataset.
    """
    parts = []
    found = by_dataset(folder)
    for dataset, runs in found.items():
        key = metric(runs[0])[0]
        digits = 2 if key == "accuracy" else 3
        se = gaps(runs, methods.proposed())
        worse = -fmean(se) if key == "accuracy" else fmean(se)
        verdict = "within the bound" if worse <= BOUND[key] else "beyond the bound"
        goal = (("goal reached" if worse <= BOUND[key] else "goal missed")
                if len(se) >= GOAL_CLIENTS
                else f"{verdict} so far, {len(se)} of {GOAL_CLIENTS} clients run")
        parts.append(f"{dataset} {spread(se, digits)} "
                     f"{'points' if key == 'accuracy' else 'nats'}, {goal}")
    if not parts:
        return ""
    missing = [d for d in datasets if d not in found]
    return ("SE minus SISA over forgotten clients drawn before the runs (mean ± SD, "
            "clients): " + "; ".join(parts) + "."
            + (f" Not run yet: {', '.join(missing)}." if missing else ""))
