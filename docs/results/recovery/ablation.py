"""Where SE's accuracy goes on CIFAR-10 under concurrent requests (issue 26, item 1).

Usage: ``.venv/bin/python docs/results/recovery/ablation.py VARIANT [SEED]`` writes
``docs/results/recovery/ablation-<VARIANT>-s<SEED>.json`` and prints the table of
every ablation file there.

The cell is the trained suite's ``concurrent-cifar10-even-concurrent-k4`` (its
summary's config: 40 clients, 4 shards, 8 a round, 8 rounds x 2 local epochs, 4
requests of one client each, spread evenly over the shards, handled together),
run on the in-process grid of the tests. Variants:

- ``default``: SE (r = 2, calibrated replay), SE-R with its defaults (2 warm-up
  rounds, an exact round every 4th, 1 final), FR;
- ``exact``: r = 1 for SE, and SE-R with ``recovery-warmup`` = 100, i.e. every
  replayed round exact: the impacted shards retrained from their replay start on
  the retained clients, the exact reference calibration approximates.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT)]

CELL = ROOT / "docs/results/trained-suite/runs/concurrent-cifar10-even-concurrent-k4"
VARIANTS = {
    "default": {"frameworks": "SE,SE-R,FR"},
    "exact": {"frameworks": "SE,SE-R", "retrain-ratio": 1.0, "recovery-warmup": 100},
}
KEYS = ("accuracy", "loss", "client_epochs", "retrain_compute_s", "modelled_wall_s")


def run(variant: str, seed: int) -> dict:
    """One seeded run of the cell with ``variant``'s settings; each framework's KEYS."""
    from experiments.grid import run_in_process

    base = json.loads((CELL / "summary.json").read_text())["config"]
    out = Path(tempfile.mkdtemp(prefix="se-ablation."))
    cfg = {**base, **VARIANTS[variant], "seed": seed,
           "data-dir": str(ROOT.parent / "shared" / "data"),
           "results-dir": str(out), "run-name": f"{variant}-s{seed}"}
    try:
        summary = json.loads(run_in_process(cfg).read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    names = cfg["frameworks"].split(",")
    return {"variant": variant, "seed": seed, "overrides": VARIANTS[variant],
            "requests": summary["unlearning"]["requests"],
            "learned_accuracy": summary["learning"]["accuracy"],
            "frameworks": {n: {k: summary["frameworks"][n][k] for k in KEYS}
                           for n in names}}


def table() -> str:
    """Markdown: one row per file and framework."""
    lines = ["| variant | seed | framework | accuracy | client-epochs | modelled wall s |",
             "|---|---|---|---|---|---|"]
    for path in sorted(HERE.glob("ablation-*.json")):
        data = json.loads(path.read_text())
        lines.append(f"| {data['variant']} | {data['seed']} | original | "
                     f"{data['learned_accuracy']:.4f} | | |")
        for name, row in data["frameworks"].items():
            lines.append(f"| {data['variant']} | {data['seed']} | {name} | "
                         f"{row['accuracy']:.4f} | {row['client_epochs']:.1f} | "
                         f"{row['modelled_wall_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    variant, seed = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    result = run(variant, seed)
    (HERE / f"ablation-{variant}-s{seed}.json").write_text(json.dumps(result, indent=2)
                                                           + "\n")
    print(table())
