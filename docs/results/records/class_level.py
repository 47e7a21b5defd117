"""A class-level request on MNIST: is the class gone, and at what cost (issue 45).

Usage: ``.venv/bin/python docs/results/records/class_level.py [SEED]`` runs, in
process, MNIST IID at the trained suite's single-request scale (20 clients, 4
shards, 8 a round, 12 rounds x 2 local epochs, every client's whole share) with
``forget-labels = 7``: learning, then SE, SISA and FR each erase every 7 from
every client. Writes ``class-level-s<SEED>.json`` here: the commit, machine, the
config and, for the original and each framework, test accuracy, the accuracy on
the 7s (``erased_label_accuracy``) and on the other digits
(``kept_label_accuracy``), client-epochs, client rounds and modelled wall time.
"""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT)]

KEYS = ("accuracy", "loss", "erased_label_accuracy", "kept_label_accuracy", "client_epochs",
        "client_rounds", "modelled_wall_s", "retrain_compute_s")


def config(seed: int) -> dict:
    """The cell: the trained suite's MNIST single-request topology, IID, label 7."""
    return {"dataset": "mnist", "partition": "iid", "num-clients": 20, "num-shards": 4,
            "clients-per-round": 8, "num-rounds": 12, "local-epochs": 2,
            "batch-size": 32, "test-samples": 2000, "mia": False, "seed": seed,
            "frameworks": "SE,SISA,FR", "forget-labels": "7",
            "data-dir": str(ROOT.parent / "shared" / "data"), "run-name": f"s{seed}"}


def main(seed: int = 0) -> Path:
    """Run the cell and write its file."""
    from experiments.grid import summary_in_scratch
    from experiments.run import machine

    cfg = config(seed)
    summary = summary_in_scratch(cfg)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    out = {"commit": commit, "machine": machine(),
           "command": f".venv/bin/python docs/results/records/class_level.py {seed}",
           "config": cfg,
           "original": {k: summary["original"].get(k) for k in KEYS},
           "frameworks": {n: {k: f.get(k) for k in KEYS}
                          for n, f in summary["frameworks"].items()}}
    path = HERE / f"class-level-s{seed}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    return path


if __name__ == "__main__":
    print(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
