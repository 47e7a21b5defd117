"""Speed against accuracy, per dataset, from the committed schedule files (issue 42).

Each ``explore-<cell>-s<seed>.json`` in ``docs/results/wall/`` holds one seeded
run of a cell: learning once, then FR, SISA (the exact shard reference), SE with
the shipped defaults and the schedules explored beside it, all forgetting from the
same learned shards (``docs/results/wall/explore.py`` makes them). This module
reads those files and nothing else:

- :func:`table`: ``explore.md``, every file's frameworks against SISA and FR;
- :func:`figures`: ``pareto_<dataset>.png``, modelled wall time over FR's (x)
  against test accuracy (or loss) minus FR's (y), mean over the seeds with their
  range as bars, one marker shape per cell.

``python -m experiments.run pareto`` (``./simulate.sh experiments pareto``) redraws
both from the files, and the tables :mod:`experiments.doc_tables` writes into
docs/RESULTS.md and the README; it runs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from server_app.config import methods

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "docs" / "results" / "wall"
"""Where the schedule files live."""
FIGURES = ROOT / "docs" / "figures"
"""Where the per-dataset pictures go."""
SHIPPED = "shipped"
"""The sub-folder of runs with every framework on the shipped defaults, beside the
paper's SE and the defaults shipped before (``docs/results/wall/shipped.sh``)."""
PAPER_SCALE = ROOT / "docs" / "results" / "paper-scale"
"""The single-request non-IID cells at the paper's scale, the shipped defaults beside
the paper's SE (``docs/results/paper-scale/run.py``): the README's headline and the
first tables of the summary."""
MARKERS = "osD^v<>"
"""A marker shape per cell of a figure."""
MODELLED = "modelled"
"""The sub-folder of a results folder holding its files' times remade under the cost
model (:mod:`experiments.remodel`), one file of the same name each."""
WALL_GOAL = 0.35
"""Issue 42's goal for SE: modelled wall time at most this fraction of FR's."""


def load(folder: Path = FILES) -> list[dict]:
    """Every ``explore-*-s*.json`` of ``folder``, sorted by file name.

    Each file's times are the cost model's where ``folder/modelled/`` remade them
    (:func:`remade`); ``data["times"]`` says which.

    Raises
    ------
    ValueError
        A file lacks FR, or the key its metric is read by.
    """
    runs = []
    for path in sorted(folder.glob("explore-*-s*.json")):
        data = json.loads(path.read_text())
        key, ref = metric(data)[0], methods.reference()
        if key not in data["frameworks"].get(ref, {}):
            raise ValueError(f"{path.name}: no {ref} {key} to compare against")
        remade(data, folder / MODELLED / path.name)
        runs.append(data)
    return runs


def remade(data: dict, path: Path) -> None:
    """Put the cost model's times of ``path`` (:mod:`experiments.remodel`) into ``data``.

    In place: each framework's ``modelled_wall_s`` and ``wall_breakdown`` become
    the remade ones, where the cost-only run trained the file's schedule (the
    same client-epochs and rounds); a framework whose cost-only schedule differs
    (the code changed it since, or, like FedRecover, the method picks its rounds
    from the updates' values, which cost-only clients do not compute) keeps no
    time (``None``) and is marked ``"stale": True``, so its accuracy is not set
    beside a time of another schedule. ``data["times"]``:
    ``{"source": "cost model", "commit", "fingerprint"}``. Where ``path`` does
    not exist: the same of the file's own, if it records the ``fingerprint`` of
    the code that ran it (a run of the cost-model code, its times the model's,
    every framework's schedule its own), else ``{"source": "measured"}``
    (seconds measured on the machine that ran the file, before the cost model).
    """
    if not path.is_file():
        own = data.get("fingerprint")  # a run of the cost-model code: its own times
        data["times"] = ({"source": "cost model", "commit": data["commit"],
                          "fingerprint": own} if own else {"source": "measured"})
        return
    model = json.loads(path.read_text())
    for name, fw in data["frameworks"].items():
        new = model["frameworks"].get(name)
        fresh = bool(new and new["same_schedule"])
        fw["modelled_wall_s"] = new["modelled_wall_s"] if fresh else None
        fw["wall_breakdown"] = new["wall_breakdown"] if fresh else None
        fw["stale"] = not fresh
    data["times"] = {"source": "cost model", "commit": model["commit"],
                     "fingerprint": model["fingerprint"]}


def outdated(data: dict, name: str) -> bool:
    """Whether ``name``'s numbers in ``data`` are not today's method's.

    True where its cost-only remake trains another schedule (``stale``,
    :func:`remade`) and the file records no fingerprint of the code that ran it
    (it predates :data:`experiments.time_saved.SHAPING` fingerprints): nothing
    shows its accuracy was made by today's method, and its schedule says it was
    not. A stale framework in a fingerprinted file (FedRecover's schedule, which
    a cost-only client cannot follow) is today's and stays.
    """
    return bool(data["frameworks"][name].get("stale")) and not data.get("fingerprint")


TIMES = ("Wall / FR: the cost model's times, where `modelled/` remade the file "
         "(`python -m experiments.remodel`), else the file's own, measured on a shared "
         "machine before the cost model; *stale*: the cost-only run did not train the "
         "file's schedule for that framework (the code changed it since, or the method "
         "picks its rounds from the updates' values, as FedRecover does), so no time is "
         "set beside its accuracy.")
"""What the tables say once about their times."""


def times(data: dict) -> str:
    """Where ``data``'s times come from, in words (:func:`remade`)."""
    t = data.get("times", {})
    if t.get("source") == "cost model":
        return f"times: cost model, commit {t['commit'][:7]}"
    return "times: measured before the cost model"


def metric(data: dict) -> tuple[str, float, str]:
    """(key, scale, unit) a file is read by: accuracy in points, or loss in nats."""
    if data.get("metric") == "loss":
        return "loss", 1.0, "nats"
    return "accuracy", 100.0, "points"


def table(runs: Iterable[dict]) -> str:
    """``explore.md``: per file, each framework minus SISA's and its wall over FR's.

    A cell read by its test loss (Tiny Shakespeare) shows loss minus SISA's in nats.
    """
    out = ["# Fewer client rounds: schedules explored", "",
           "Made by `explore.py` (its docstring says how). Accuracy in points minus "
           "SISA's (the exact shard reference); modelled wall time over FR's. The "
           "original's row says how far the model before forgetting already is: a "
           "cell where it is within the bound tells little about a schedule. "
           + TIMES, ""]
    ref, exact = methods.reference(), methods.shard_reference()
    for data in runs:
        fw = data["frameworks"]
        key, scale, unit = metric(data)
        fr, sisa = fw[ref]["modelled_wall_s"], fw[exact][key]
        learned = data[f"learned_{key}"]
        out += [f"## {data['cell']}, seed {data['seed']}", "",
                f"Commit {data['commit'][:10]}, {data['machine'].get('cpu', '')}; "
                f"{times(data)}; "
                f"test {key}: original {learned:.4f}, {ref} {fw[ref][key]:.4f}, "
                f"{exact} {sisa:.4f}.", "",
                f"| framework | {key} | - {exact} ({unit}) | client-epochs "
                "| client rounds | wall / FR |", "|---|---|---|---|---|---|",
                f"| original (before forgetting) | {learned:.4f} | "
                f"{(learned - sisa) * scale:+.2f} | | | |"]
        for name, f in fw.items():
            wall = ("stale" if f["modelled_wall_s"] is None
                    else f"{f['modelled_wall_s'] / fr:.2f}")
            out.append(f"| {name} | {f[key]:.4f} | "
                       f"{(f[key] - sisa) * scale:+.2f} | {f['client_epochs']:.0f} | "
                       f"{f['client_rounds']} | {wall} |")
        out.append("")
    return "\n".join(out)


def points(runs: Iterable[dict]) -> dict[str, dict[str, dict[str, list]]]:
    """Each (wall / FR, metric minus FR's) by dataset, cell, framework; one a seed.

    FR is :func:`server_app.config.methods.reference`.
    """
    found: dict[str, dict[str, dict[str, list]]] = {}
    for data in runs:
        fw, (key, scale, _) = data["frameworks"], metric(data)
        fr = fw[methods.reference()]
        cell = found.setdefault(data["config"]["dataset"], {}).setdefault(
            data.get("label") or data["cell"], {})
        for name, f in fw.items():
            if f["modelled_wall_s"] is None:  # stale: no time of this schedule
                continue
            cell.setdefault(name, []).append((
                f["modelled_wall_s"] / fr["modelled_wall_s"],
                (f[key] - fr[key]) * scale))
    return found


def figures(runs: list[dict], folder: Path = FIGURES) -> list[Path]:
    """One picture per dataset of ``runs``: ``folder/pareto_<dataset>.png``.

    x: modelled wall time over FR's; y: test accuracy minus FR's in points (test
    loss minus FR's in nats where the task is read by its loss); the mean over
    the seeds of a cell with their range as bars, one marker shape per cell, the
    method's registered colour. A dotted line marks the goal of 0.35.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = {d["config"]["dataset"]: metric(d) for d in runs}
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for dataset, cells in points(runs).items():
        fig, ax = plt.subplots(figsize=(10, 4.8))
        colour = _colours([n for by_name in cells.values() for n in by_name])
        for marker, by_name in zip(MARKERS, cells.values(), strict=False):
            for name, xy in by_name.items():
                xs, ys = [p[0] for p in xy], [p[1] for p in xy]
                mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
                # max(0, ...): equal values can average a rounding off their min
                ax.errorbar(mx, my, xerr=[[max(0, mx - min(xs))], [max(0, max(xs) - mx)]],
                            yerr=[[max(0, my - min(ys))], [max(0, max(ys) - my)]],
                            fmt=marker,
                            color=colour[name], alpha=0.8)
        ax.axhline(0, color="#999", lw=0.8)
        ax.axvline(WALL_GOAL, color="#d62728", lw=0.8, ls=":")
        key, _, unit = units[dataset]
        ax.set_xlabel("modelled wall time / FR's")
        better = "lower" if key == "loss" else "higher"
        ax.set_ylabel(f"test {key} minus FR's ({unit}; {better} is better)")
        ax.set_title(f"{dataset}: speed against test {key} (mean, range over seeds)")
        ax.legend(handles=_legend(colour, cells), fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        out = folder / f"pareto_{dataset}.png"
        fig.savefig(out, dpi=90)
        plt.close(fig)
        written.append(out)
    return written


def _legend(colour: dict, cells: dict) -> list:
    """One entry per framework (its colour), then one per cell (its marker, seeds)."""
    from matplotlib.lines import Line2D

    return [*(Line2D([], [], color=c, marker="s", ls="", label=n)
              for n, c in colour.items()),
            *(Line2D([], [], color="#555", marker=m, ls="",
                     label=f"{cell} ({len(next(iter(by.values())))} seeds)")
              for m, (cell, by) in zip(MARKERS, cells.items(), strict=False))]


def _colours(names: list[str]) -> dict[str, str]:
    """A colour per framework: a built-in's own, others the palette's unused ones."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    own = {n: m.colour for n in names if (m := methods.registered(n)) and m.colour}
    spare = [c for c in (plt.cm.tab20(k) for k in range(20))
             if to_hex(c) not in own.values()]
    others = [n for n in dict.fromkeys(names) if n not in own]
    return {**own, **{n: spare[k % len(spare)] for k, n in enumerate(others)}}
