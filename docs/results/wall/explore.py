"""Fewer client rounds: SE and SE-R schedules side by side on one cell (issue 42, item 3).

Usage: ``.venv/bin/python docs/results/wall/explore.py SEED CELL [VARIANT,...]``
reruns ``CELL`` (as ``breakdown.py`` finds it) once: learning, then FR, SISA (the
exact shard reference), SE with the shipped defaults and every schedule variant
below, each registered for this run as a method of its own
(:func:`server_app.config.methods.register`: the built-in's builder with some
settings changed), so every variant forgets from the same learned shards. Writes
``explore-<CELL>-s<SEED>.json`` here (commit, machine, each framework's accuracy,
loss, client-epochs, rounds, modelled wall time and its breakdown) and rewrites
``explore.md`` from every such file.

These runs explore; the shipped defaults change only by the rule written in
docs/DESIGN.md ("Choosing SE's schedule") before its confirming runs.
"""

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(HERE), str(ROOT / "docs/results/recovery")]

SE = "server_app.unlearning.builtin.sharding_eraser:build"
SER = "server_app.unlearning.builtin.recovery:build"
# name -> (the built-in builder, UnlearningSettings fields changed, "recovery" changes)
VARIANTS = {
    # SE without refilled slots: calibrated rounds train L / r epochs on the path
    "SE-norefill": (SE, {"replay_refill": False}, {}),
    # FedEraser's interval: every 3rd stored round replayed, the last 2 exact
    "SE-dt3": (SE, {"replay_refill": False, "calibration_interval": 3}, {}),
    # every 2nd stored round replayed, the last 2 exact
    "SE-dt2": (SE, {"replay_refill": False, "calibration_interval": 2}, {}),
    # the same with r = 4 (L / 4 epochs in a calibrated round)
    "SE-dt3-r4": (SE, {"replay_refill": False, "calibration_interval": 3,
                       "retrain_ratio": 4.0}, {}),
    # SE-R: stored updates as estimates (no warm-up, no correction), 2 exact finals
    "SER-lean": (SER, {"recovery_refill": False},
                 {"warmup": 0, "correction": 0, "final": 2}),
    # the same with 1 exact final round
    "SER-f1": (SER, {"recovery_refill": False},
               {"warmup": 0, "correction": 0, "final": 1}),
    # the same with refilled slots in every replayed round
    "SER-lean-refill": (SER, {"recovery_refill": True},
                        {"warmup": 0, "correction": 0, "final": 2}),
}
KEYS = ("accuracy", "loss", "client_epochs", "client_rounds", "modelled_wall_s",
        "wall_breakdown")


def build(call):
    """The variant ``call.name``: its built-in's builder on changed settings."""
    from task.registry import import_object

    builder, fields, recovery = VARIANTS[call.name]
    settings = call.stage.settings
    fields = dict(fields)
    if "retrain_ratio" in fields:  # r: calibrated rounds train L / r epochs
        fields["retrain_epochs"] = settings.local_epochs / fields.pop("retrain_ratio")
    settings = dataclasses.replace(settings, **fields,
                                   recovery={**settings.recovery, **recovery})
    stage = dataclasses.replace(call.stage, settings=settings)
    return import_object(builder, "frameworks", builtin=True)(
        dataclasses.replace(call, stage=stage))


def run(seed: int, cell: str, names: list[str]) -> dict:
    """One seeded run of ``cell``: FR, SISA, SE and the variants ``names``."""
    from breakdown import cell_config, head_commit

    from experiments.grid import summary_in_scratch
    from experiments.run import machine
    from server_app.config import methods

    for name in names:
        methods.register(methods.MethodInfo(name=name, builder="explore:build"))
    cfg = cell_config(seed, cell, ",".join(["FR", "SISA", "SE", *names]))
    summary = summary_in_scratch(cfg)
    commit = head_commit()
    return {"cell": cell, "seed": seed, "commit": commit, "machine": machine(),
            "command": f".venv/bin/python docs/results/wall/explore.py {seed} {cell} "
                       + ",".join(names),
            "variants": {n: {"builder": VARIANTS[n][0], "settings": VARIANTS[n][1],
                             "recovery": VARIANTS[n][2]} for n in names},
            "config": cfg, "learned_accuracy": summary["learning"].get("accuracy"),
            "learned_loss": summary["learning"].get("loss"),
            "metric": (summary.get("task") or {}).get("metric", "accuracy"),
            "frameworks": {n: {k: f.get(k) for k in KEYS}
                           for n, f in summary["frameworks"].items()}}


def table() -> str:
    """``explore.md``: per file, accuracy minus SISA's and modelled wall over FR's.

    A cell read by its test loss (Tiny Shakespeare) shows loss minus SISA's in nats.
    """
    out = ["# Fewer client rounds: schedules explored", "",
           "Made by `explore.py` (its docstring says how). Accuracy in points minus "
           "SISA's (the exact shard reference); modelled wall time over FR's. The "
           "original's row says how far the model before forgetting already is: a "
           "cell where it is within the bound tells little about a schedule.", ""]
    for path in sorted(HERE.glob("explore-*-s*.json")):
        data = json.loads(path.read_text())
        fw = data["frameworks"]
        key, scale, unit = _metric(data)
        fr, sisa = fw["FR"]["modelled_wall_s"], fw["SISA"][key]
        learned = data[f"learned_{key}"]
        out += [f"## {data['cell']}, seed {data['seed']}", "",
                f"Commit {data['commit'][:10]}, {data['machine'].get('cpu', '')}; "
                f"test {key}: original {learned:.4f}, FR {fw['FR'][key]:.4f}, "
                f"SISA {sisa:.4f}.", "",
                f"| framework | {key} | - SISA ({unit}) | client-epochs "
                "| client rounds | wall / FR |", "|---|---|---|---|---|---|",
                f"| original (before forgetting) | {learned:.4f} | "
                f"{(learned - sisa) * scale:+.2f} | | | |"]
        for name, f in fw.items():
            out.append(f"| {name} | {f[key]:.4f} | "
                       f"{(f[key] - sisa) * scale:+.2f} | {f['client_epochs']:.0f} | "
                       f"{f['client_rounds']} | {f['modelled_wall_s'] / fr:.2f} |")
        out.append("")
    return "\n".join(out)


TUNING = ("single-mnist-noniid-s0", "concurrent-fmnist-even-concurrent-k4-with-SE-R-FRec",
          "concurrent-fmnist-adapt-concurrent-k4-with-SE-R-FRec")
FAMILIES = {"SE": ("SE", "SE-norefill", "SE-dt2", "SE-dt3", "SE-dt3-r4"),
            "SE-R": ("SER-lean", "SER-f1", "SER-lean-refill")}


def rule() -> list[str]:
    """docs/DESIGN.md's rule on the tuning files: qualifying candidates and the choice.

    A candidate qualifies when its accuracy minus SISA's, averaged over the
    seeds, is at least -1.0 point in every tuning cell; of each family's
    qualifying ones the lowest mean wall / FR (over every tuning cell and seed)
    is chosen, ties to fewer client-epochs.
    """
    runs = [json.loads(p.read_text()) for p in sorted(HERE.glob("explore-*-s*.json"))]
    runs = [r for r in runs if r["cell"] in TUNING]
    out = ["## The rule applied to the tuning files", "",
           f"{len(runs)} tuning runs ({', '.join(TUNING)}).", "",
           "| candidate | worst cell: mean - SISA (points) | qualifies | mean wall / FR "
           "| mean client-epochs |", "|---|---|---|---|---|"]
    scored = {}
    for family in FAMILIES.values():
        for name in family:
            mine = [r for r in runs if name in r["frameworks"]]
            if not mine:
                continue
            gaps = [_mean([(r["frameworks"][name]["accuracy"]
                            - r["frameworks"]["SISA"]["accuracy"]) * 100
                           for r in mine if r["cell"] == cell]) for cell in TUNING]
            worst = min(g for g in gaps if g is not None)
            wall = _mean([r["frameworks"][name]["modelled_wall_s"]
                          / r["frameworks"]["FR"]["modelled_wall_s"] for r in mine])
            epochs = _mean([r["frameworks"][name]["client_epochs"] for r in mine])
            ok = None not in gaps and worst >= -1.0
            scored[name] = (ok, wall, epochs)
            out.append(f"| {name} | {worst:+.2f} | {'yes' if ok else 'no'} | "
                       f"{wall:.2f} | {epochs:.0f} |")
    out.append("")
    for family, names in FAMILIES.items():
        ok = sorted((scored[n][1], scored[n][2], n) for n in names
                    if n in scored and scored[n][0])
        out.append(f"- {family}: chosen **{ok[0][2]}** (mean wall / FR {ok[0][0]:.2f})"
                   if ok else f"- {family}: no candidate qualifies")
    return out + [""]


def _metric(data: dict) -> tuple[str, float, str]:
    """(key, scale, unit) a file is read by: accuracy in points, or loss in nats."""
    if data.get("metric") == "loss":
        return "loss", 1.0, "nats"
    return "accuracy", 100.0, "points"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def figures() -> list[Path]:
    """One picture per dataset: wall / FR (x) against accuracy (or loss) minus FR's (y).

    Every framework and schedule of the files, mean over the seeds with their
    range as bars, one marker per cell; written to ``docs/figures/pareto_<dataset>.png``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from server_app.config import methods

    points: dict[str, dict[str, dict[str, list[tuple[float, float]]]]] = {}
    units: dict[str, tuple[str, str]] = {}
    for path in sorted(HERE.glob("explore-*-s*.json")):
        data = json.loads(path.read_text())
        fw, (key, scale, unit) = data["frameworks"], _metric(data)
        fr = fw["FR"]
        units[data["config"]["dataset"]] = (key, unit)
        cell = points.setdefault(data["config"]["dataset"], {}).setdefault(
            data["cell"], {})
        for name, f in fw.items():
            cell.setdefault(name, []).append((
                f["modelled_wall_s"] / fr["modelled_wall_s"],
                (f[key] - fr[key]) * scale))
    written = []
    for dataset, cells in points.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for marker, (cell, by_name) in zip("osD^v", cells.items(), strict=False):
            for k, (name, xy) in enumerate(by_name.items()):
                xs, ys = [p[0] for p in xy], [p[1] for p in xy]
                mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
                described = methods.registered(name)
                ax.errorbar(mx, my, xerr=[[mx - min(xs)], [max(xs) - mx]],
                            yerr=[[my - min(ys)], [max(ys) - my]], fmt=marker,
                            color=described.colour if described else plt.cm.tab20(k),
                            label=f"{name} ({cell[:28]})", alpha=0.8)
        ax.axhline(0, color="#999", lw=0.8)
        ax.axvline(0.35, color="#d62728", lw=0.8, ls=":")
        ax.set_xlabel("modelled wall time / FR's")
        key, unit = units[dataset]
        ax.set_ylabel(f"test {key} minus FR's ({unit})")
        ax.set_title(f"{dataset}: speed against test {key} (mean, range over seeds)")
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        out = ROOT / "docs" / "figures" / f"pareto_{dataset}.png"
        fig.savefig(out, dpi=90)
        plt.close(fig)
        written.append(out)
    return written


if __name__ == "__main__":
    if len(sys.argv) >= 3:
        seed, cell = int(sys.argv[1]), sys.argv[2]
        names = sys.argv[3].split(",") if len(sys.argv) > 3 else list(VARIANTS)
        result = run(seed, cell, names)
        (HERE / f"explore-{cell}-s{seed}.json").write_text(
            json.dumps(result, indent=1) + "\n")
    text = table() + "\n" + "\n".join(rule())
    (HERE / "explore.md").write_text(text + "\n")
    figures()
    print(text)
