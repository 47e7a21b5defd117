"""The paper's scale on every dataset: one single-request cell (issue 44, item 2).

Usage: ``.venv/bin/python docs/results/paper-scale/run.py DATASET [SEED [PARTITION]]``
runs the ``paper`` suite's single-request cell of ``DATASET``
(:func:`experiments.suites.single_runs`: presets/paper.toml's C = 100, S = 4, 20
clients a round, L = 10, G = 30; the task's preset training keys; one request of
one client) with the partition ``PARTITION`` (``noniid``, default, or ``iid``) and
the shipped defaults: the preset's
paper-SE schedule keys are dropped, so SE and SE-R run as they ship, and the
paper's SE runs beside them as ``SE-paper`` (``docs/results/wall/explore.py``'s
variant: no exact final round, no refilled slot). Frameworks: FR, SISA, SE,
SE-paper, SE-R, all forgetting from the same learned shards, in one process
(:func:`experiments.grid.run_in_process`). FE, RR and FRec are left out: each needs
an unsharded federation learned beside the shards, which doubles a cell's time
(the MNIST cells of ``docs/results/paper-preset/`` have them).

Writes ``explore-paper-<DATASET>-<PARTITION>-s<SEED>.json`` here, in the format of the
schedule files (:mod:`experiments.pareto` reads both); ``run.sh`` skips the files
that exist. The run itself lives in ``RUNS/<DATASET>/s<SEED>`` (``RUNS``: the
environment's ``PAPER_SCALE_RUNS``, default ``paper-scale-runs`` beside the
checkout; ``RUNS/<DATASET>-iid/s<SEED>`` for an IID cell): the same command after
a kill resumes it, learning after its last finished round and then the frameworks
not done yet, so a cell longer than a session (CIFAR-10 on CPU) finishes over
several.
"""

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WALL = ROOT / "docs/results/wall"
sys.path[:0] = [str(ROOT), str(WALL), str(ROOT / "docs/results/recovery")]

FRAMEWORKS = ("FR", "SISA", "SE", "SE-paper", "SE-R")
PAPER_SE_KEYS = ("calibration-final", "replay-refill", "recovery-refill")
"""presets/paper.toml's keys that make SE the paper's; dropped so SE ships as is."""


def cell_config(dataset: str, seed: int, partition: str = "noniid") -> dict:
    """The paper suite's single-request config of ``dataset`` at the defaults.

    Raises StopIteration where the suite has no ``partition`` cell of ``dataset``.
    """
    from experiments.suites import single_runs

    spec = next(s for s in single_runs("paper", (dataset,))
                if s.tags.get("partition") == partition and s.tags.get("seed") == 0
                and s.name.startswith("single-"))
    cfg = {k: v for k, v in spec.config.items() if k not in PAPER_SE_KEYS}
    return {**cfg, "seed": seed, "frameworks": ",".join(FRAMEWORKS),
            "data-dir": str(ROOT.parent / "shared" / "data"), "run-name": f"s{seed}"}


def main(dataset: str, seed: int = 0, partition: str = "noniid") -> Path:
    """Run the cell and write its file; returns the file's path."""
    from explore import record

    if partition not in ("noniid", "iid"):
        sys.exit(f"run.py: partition {partition!r} is not one of: noniid, iid")
    cell = f"paper-{dataset}-{partition}"
    command = f".venv/bin/python docs/results/paper-scale/run.py {dataset} {seed}"
    command += "" if partition == "noniid" else f" {partition}"
    runs = Path(os.environ.get("PAPER_SCALE_RUNS", ROOT.parent / "paper-scale-runs"))
    folder = runs / (dataset if partition == "noniid" else f"{dataset}-{partition}")
    result = record(cell, cell_config(dataset, seed, partition), ["SE-paper", "SE-R"],
                    command, results_dir=folder)
    path = HERE / f"explore-{cell}-s{seed}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


if __name__ == "__main__":
    print(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0,
               *sys.argv[3:4]))
