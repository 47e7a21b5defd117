"""SE, SE-R, FRec and FR on one small MNIST federation, in process (issue 26's first look).

Usage: ``.venv/bin/python docs/results/recovery/compare.py SEED [SEED ...]``
writes ``docs/results/recovery/seed<SEED>.json`` (each framework's accuracy, loss,
client-epochs, compute and modelled wall seconds) and prints a table of all the
seed files there. 20 clients in 4 shards, 8 a round, 8 rounds of 2 local epochs,
300 samples each, client 3 forgotten; the in-process grid of the tests (one
process, messages one after another), so wall seconds are this machine's only.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT)]

FRAMEWORKS = ("SE", "SE-R", "FRec", "FR")
KEYS = ("accuracy", "loss", "client_epochs", "retrain_compute_s", "modelled_wall_s")


def run(seed: int) -> dict:
    """One seeded run; returns the learned accuracy and each framework's KEYS."""
    from experiments.grid import summary_in_scratch

    summary = summary_in_scratch({
        "dataset": "mnist", "num-clients": 20, "num-shards": 4, "clients-per-round": 8,
        "num-rounds": 8, "local-epochs": 2, "client-samples": 300, "test-samples": 2000,
        "batch-size": 32, "forget-clients": "3", "seed": seed, "mia": False,
        "frameworks": ",".join(FRAMEWORKS),
        "data-dir": str(ROOT.parent / "shared" / "data"), "run-name": f"s{seed}"})
    return {"seed": seed, "learned_accuracy": summary["learning"]["accuracy"],
            "config": {k: v for k, v in sorted(summary["config"].items())
                       if k.startswith("recovery-")},
            "frameworks": {n: {k: summary["frameworks"][n][k] for k in KEYS}
                           for n in FRAMEWORKS}}


def table() -> str:
    """Markdown: one row per seed and framework, from the seed files here."""
    lines = ["| seed | framework | accuracy | client-epochs | modelled wall s |",
             "|---|---|---|---|---|"]
    for path in sorted(HERE.glob("seed*.json")):
        data = json.loads(path.read_text())
        lines.append(f"| {data['seed']} | learned | {data['learned_accuracy']:.4f} | | |")
        for name, row in data["frameworks"].items():
            lines.append(f"| {data['seed']} | {name} | {row['accuracy']:.4f} | "
                         f"{row['client_epochs']:.0f} | {row['modelled_wall_s']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        result = run(int(arg))
        (HERE / f"seed{arg}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table())
