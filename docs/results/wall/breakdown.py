"""Where each framework's modelled wall time goes, on one cell (issue 42, item 2).

Usage: ``.venv/bin/python docs/results/wall/breakdown.py SEED CELL`` reruns
``CELL`` (a run of ``docs/results/side-by-side/*/runs`` or the trained suite, as
``docs/results/recovery/ablation.py`` finds it) on the in-process grid with the
shipped defaults of SE, SE-R, FR and SISA (the exact shard reference), writes
``breakdown-<CELL>-s<SEED>.json`` here (the commit, the machine, each framework's
accuracy, loss, client-epochs, rounds and ``wall_breakdown``) and rewrites
``breakdown.md`` from every such file (and prints it).

The parts are seconds along each round's critical path (summary key
``wall_breakdown``): the slowest participant's training and transfers, the
server's configure seconds (sampling; SE: reading the stored history) and
aggregate seconds (SE: calibration), a coded retrieval. Training and server
seconds are measured (on a shared 2-core machine they include waiting for the
core); transfers are modelled (0.1 s + bits / link rate per model).
"""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "docs/results/recovery")]

FRAMEWORKS = "SE,SE-R,FR,SISA"
PARTS = ("client_training_s", "transfer_s", "server_configure_s", "server_aggregate_s",
         "retrieval_s")
KEYS = ("accuracy", "loss", "client_epochs", "client_rounds", "modelled_wall_s",
        "wall_breakdown")


def cell_config(seed: int, cell: str, frameworks: str) -> dict:
    """``cell``'s run config (its summary's) at the shipped defaults, with ``seed``.

    The schedule keys a side-by-side run may have set are dropped, so SE and SE-R
    run with today's defaults.
    """
    from ablation import RUNS

    path = next(r / cell / "summary.json" for r in RUNS
                if (r / cell / "summary.json").is_file())
    base = json.loads(path.read_text())["config"]
    from server_app.config.methods import PREFIX, renamed_keys

    dropped = {"retrain-ratio", *renamed_keys()}  # the flat method keys of older runs
    shipped = {k: v for k, v in base.items()
               if k not in dropped and not k.startswith(PREFIX)}
    return {**shipped, "frameworks": frameworks, "seed": seed,
            "data-dir": str(ROOT.parent / "shared" / "data"), "run-name": f"s{seed}"}


def head_commit() -> str:
    """The commit the code ran at (``git rev-parse HEAD``)."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip()


def run(seed: int, cell: str) -> dict:
    """One seeded run of ``cell`` with the shipped defaults; each framework's KEYS."""
    from experiments.grid import summary_in_scratch
    from experiments.run import machine

    cfg = cell_config(seed, cell, FRAMEWORKS)
    summary = summary_in_scratch(cfg)
    commit = head_commit()
    return {"cell": cell, "seed": seed, "commit": commit, "machine": machine(),
            "command": f".venv/bin/python docs/results/wall/breakdown.py {seed} {cell}",
            "config": cfg, "learned_accuracy": summary["learning"]["accuracy"],
            "frameworks": {n: {k: f.get(k) for k in KEYS}
                           for n, f in summary["frameworks"].items()}}


def table() -> str:
    """``breakdown.md``: one table per file, seconds and shares of the modelled wall."""
    out = ["# Where the modelled wall time goes", "",
           "Made by `breakdown.py` (its docstring says how); one table per cell and "
           "seed. Shares are of the framework's modelled wall time.", ""]
    for path in sorted(HERE.glob("breakdown-*-s*.json")):
        data = json.loads(path.read_text())
        fr = data["frameworks"].get("FR", {}).get("modelled_wall_s")
        out += [f"## {data['cell']}, seed {data['seed']}", "",
                f"Commit {data['commit'][:10]}, {data['machine'].get('cpu', '')}; "
                f"original accuracy {data['learned_accuracy']:.4f}.", "",
                "| framework | accuracy | client-epochs | rounds (client) "
                "| modelled wall s | / FR | training | transfers | configure "
                "| aggregate | retrieval |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, f in data["frameworks"].items():
            parts, wall = f["wall_breakdown"], f["modelled_wall_s"]
            shares = [f"{parts[p]:.1f} ({parts[p] / wall:.0%})" if wall else "-"
                      for p in PARTS]
            out.append(f"| {name} | {f['accuracy']:.4f} | {f['client_epochs']:.0f} | "
                       f"{parts['rounds']} ({parts['client_rounds']}) | {wall:.1f} | "
                       f"{wall / fr:.2f} | " + " | ".join(shares) + " |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        seed, cell = int(sys.argv[1]), sys.argv[2]
        result = run(seed, cell)
        (HERE / f"breakdown-{cell}-s{seed}.json").write_text(
            json.dumps(result, indent=1) + "\n")
    text = table()
    (HERE / "breakdown.md").write_text(text + "\n")
    print(text)
