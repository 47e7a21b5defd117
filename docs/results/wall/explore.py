"""Fewer client rounds: SE and SE-R schedules side by side on one cell (issue 42, item 3).

Usage: ``.venv/bin/python docs/results/wall/explore.py SEED CELL [NAME,...] [FOLDER]``
reruns ``CELL`` (as ``breakdown.py`` finds it) once: learning, then FR, SISA (the
exact shard reference), SE with the shipped defaults and every NAME: a schedule
variant below (default: all of them), each registered for this run as a method
of its own (:func:`variant`, registered with
:func:`server_app.config.methods.register`: the built-in's build with some
settings changed), or a built-in method as it ships; every one forgets
from the same learned shards. Writes ``[FOLDER/]explore-<CELL>-s<SEED>.json``
here (commit, machine, each framework's accuracy, loss, client-epochs, rounds,
modelled wall time and its breakdown), then redraws
``explore.md`` and ``docs/figures/pareto_<dataset>.png`` from every such file
(:mod:`experiments.pareto`) and writes ``rule.md``: docs/DESIGN.md's rule applied
to the tuning files and its check on the confirming ones. Without arguments it
only redraws.

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

SE = "server_app.unlearning.builtin.sharding_eraser:ShardingEraserMethod"
SER = "server_app.unlearning.builtin.recovery:ShardRecoveryMethod"
# name -> (the built-in's class, settings changed: its own (method.<key>.*) or the
# run's (calibration_interval, retrain_ratio), FedRecover's schedule changed)
VARIANTS = {
    # the paper's SE: no exact final round, no refilled slot
    "SE-paper": (SE, {"replay_refill": False, "calibration_final": 0}, {}),
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
    "SER-lean": (SER, {"refill": False},
                 {"warmup": 0, "correction": 0, "final": 2}),
    # the same with 1 exact final round
    "SER-f1": (SER, {"refill": False},
               {"warmup": 0, "correction": 0, "final": 1}),
    # the same with refilled slots in every replayed round
    "SER-lean-refill": (SER, {"refill": True},
                        {"warmup": 0, "correction": 0, "final": 2}),
}
KEYS = ("accuracy", "loss", "client_epochs", "client_rounds", "modelled_wall_s",
        "wall_breakdown", "retrain_compute_s", "server_storage_bytes", "comm_time_s",
        "rounds_replayed", "shard_accuracy", "replay", "requests")
"""What each framework's summary entry keeps in a file (the tables read the first six)."""


def variant(name: str) -> type:
    """The schedule variant ``name`` of :data:`VARIANTS` as a method of its own.

    Its description is the base :class:`~server_app.config.methods.UnlearningMethod`'s
    (a method of one's own on SE's shards); it builds with its built-in's ``build``
    on the changed settings.
    """
    from server_app.config.methods import UnlearningMethod

    return type(name, (UnlearningMethod,), {"name": name, "build": classmethod(build)})


def build(cls, call):
    """The variant ``cls.name``: its built-in's build on changed settings."""
    from task.registry import import_object

    builder, fields, recovery = VARIANTS[cls.name]
    base = import_object(builder, "frameworks", builtin=True)
    cfg = call.stage.cfg
    own = cfg.methods.get(base.name) or base.Settings()
    mine = {f.name for f in dataclasses.fields(own)}
    changed = {**fields, **recovery}
    run = {k: v for k, v in changed.items() if k not in mine}
    stage = dataclasses.replace(call.stage, cfg=cfg.replace(**run) if run else cfg)
    own = dataclasses.replace(own, **{k: v for k, v in changed.items() if k in mine})
    return base.build(dataclasses.replace(call, stage=stage, settings=own))


def run(seed: int, cell: str, names: list[str], folder: str = "") -> dict:
    """One seeded run of ``cell``: FR, SISA, SE and ``names``.

    A name of :data:`VARIANTS` is registered as a method for the run; any other
    is a registered method run as it ships (e.g. FE, RR, SE-R, FRec).
    """
    from breakdown import cell_config

    cfg = cell_config(seed, cell, ",".join(["FR", "SISA", "SE", *names]))
    command = (f".venv/bin/python docs/results/wall/explore.py {seed} {cell} "
               + ",".join(names) + (f" {folder}" if folder else ""))
    return record(cell, cfg, names, command)


def register(names: list[str]) -> list[str]:
    """Register the :data:`VARIANTS` among ``names`` (once a process); those names."""
    from server_app.config import methods

    variants = [n for n in names if n in VARIANTS]
    for name in variants:  # once a process (run.py --clients records several runs)
        if methods.registered(name) is None:
            methods.register(name, variant(name))
    return variants


def record(cell: str, cfg: dict, names: list[str], command: str,
           results_dir: Path | None = None) -> dict:
    """Run ``cfg`` in process, the :data:`VARIANTS` among ``names`` registered first.

    In a scratch folder, removed afterwards; or in ``results_dir``, kept, so
    the same call after a kill resumes the run (learning after its last finished
    round, then the frameworks not done yet). Returns the file's content:
    ``cell``, the seed, commit, the code's
    :func:`~experiments.time_saved.fingerprint`, machine, ``command``, the
    variants' settings, the config, the learned model's accuracy and loss, the
    storage, the metric and each framework's :data:`KEYS`.
    """
    from breakdown import head_commit

    from experiments.grid import run_in_process, summary_in_scratch
    from experiments.run import machine
    from experiments.time_saved import fingerprint

    variants = register(names)
    if results_dir is None:
        summary = summary_in_scratch(cfg)
    else:
        path = run_in_process({**cfg, "results-dir": str(results_dir)})
        summary = json.loads(path.read_text())
    return {"cell": cell, "seed": cfg["seed"], "commit": head_commit(),
            "fingerprint": fingerprint(),  # the code its modelled seconds came from
            "machine": machine(), "command": command,
            "variants": {n: {"builder": VARIANTS[n][0], "settings": VARIANTS[n][1],
                             "recovery": VARIANTS[n][2]} for n in variants},
            "config": cfg, "learned_accuracy": summary["learning"].get("accuracy"),
            "learned_loss": summary["learning"].get("loss"),
            # FE's / FRec's unsharded federation, where one learned beside the shards
            "baseline_learned_accuracy": (summary.get("baseline_learning") or {}).get(
                "accuracy"),
            "storage": summary.get("storage"),
            "metric": (summary.get("task") or {}).get("metric", "accuracy"),
            "frameworks": {n: {k: f.get(k) for k in KEYS}
                           for n, f in summary["frameworks"].items()}}


TUNING = ("single-mnist-noniid-s0", "concurrent-fmnist-even-concurrent-k4-with-SE-R-FRec",
          "concurrent-fmnist-adapt-concurrent-k4-with-SE-R-FRec")
CONFIRMING = ("concurrent-cifar10-even-concurrent-k4",
              "concurrent-cifar10-adapt-concurrent-k4",
              "concurrent-shakespeare-even-concurrent-k4")
FAMILIES = {"SE": ("SE", "SE-norefill", "SE-dt2", "SE-dt3", "SE-dt3-r4"),
            "SE-R": ("SER-lean", "SER-f1", "SER-lean-refill")}


def rule() -> list[str]:
    """docs/DESIGN.md's rule on the tuning files: qualifying candidates and the choice.

    A candidate qualifies when its accuracy minus SISA's, averaged over the
    seeds, is at least -1.0 point in every tuning cell; of each family's
    qualifying ones the lowest mean wall / FR (over every tuning cell and seed)
    is chosen, ties to fewer client-epochs.
    """
    from experiments.pareto import load

    runs = [r for r in load(HERE) if r["cell"] in TUNING]  # times: the cost model's
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


def confirm() -> list[str]:
    """docs/DESIGN.md's confirming check: each chosen schedule in each confirming cell.

    The chosen schedule ships when, in every confirming cell, its accuracy minus
    SISA's (mean over the seeds run) is at least -1.0 point, or its test loss
    minus SISA's at most +0.03 nats on a cell read by its loss; the shipped SE and
    SE-R are shown beside it.
    """
    from experiments.pareto import load, metric

    runs = [r for r in load(HERE) if r["cell"] in CONFIRMING]
    out = ["## The confirming runs", "",
           f"{len(runs)} of {3 * len(CONFIRMING)} confirming runs "
           f"({', '.join(CONFIRMING)}; seeds 0-2).", "",
           "| cell | seeds | framework | mean - SISA | bound | within | mean wall / FR |",
           "|---|---|---|---|---|---|---|"]
    verdict: dict[str, bool] = {}
    for cell in CONFIRMING:
        mine = [r for r in runs if r["cell"] == cell]
        if not mine:
            continue
        key, scale, unit = metric(mine[0])
        for name in ("SE", "SE-norefill", "SER-f1"):
            have = [r for r in mine if name in r["frameworks"]]
            gap = _mean([(r["frameworks"][name][key] - r["frameworks"]["SISA"][key])
                         * scale for r in have])
            wall = _mean([r["frameworks"][name]["modelled_wall_s"]
                          / r["frameworks"]["FR"]["modelled_wall_s"] for r in have])
            ok = gap <= 0.03 if key == "loss" else gap >= -1.0
            if name != "SE":
                verdict[name] = verdict.get(name, True) and ok and len(have) == 3
            bound = "<= +0.03 nats" if key == "loss" else ">= -1.0 points"
            out.append(f"| {cell} | {len(have)} | {name} | {gap:+.3f} {unit} | {bound} "
                       f"| {'yes' if ok else 'no'} | {wall:.2f} |")
    out.append("")
    done = len(runs) == 3 * len(CONFIRMING)
    for name, ok in verdict.items():
        out.append(f"- {name}: " + ("ships" if done and ok else "does not ship" if done
                                     else "pending (not every confirming run is done)"))
    return out + [""]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


if __name__ == "__main__":
    if len(sys.argv) >= 3:
        seed, cell = int(sys.argv[1]), sys.argv[2]
        names = sys.argv[3].split(",") if len(sys.argv) > 3 else list(VARIANTS)
        into = sys.argv[4] if len(sys.argv) > 4 else ""
        result = run(seed, cell, names, into)
        (HERE / into).mkdir(exist_ok=True)
        (HERE / into / f"explore-{cell}-s{seed}.json").write_text(
            json.dumps(result, indent=1) + "\n")
    from experiments.doc_tables import redraw

    redraw(HERE)
    text = "\n".join(["# The rule of docs/DESIGN.md, applied", "", *rule(), *confirm()])
    (HERE / "rule.md").write_text(text + "\n")
    print(text)
