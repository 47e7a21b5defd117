"""Markdown rows for deploy_bench JSON files (``python docs/results/deploy/table.py F...``).

One row a file: seconds per round and client compute, simulation / deployment
(ratio), and the SuperLink's CPU seconds in the deployment where the file has
the CPU table (``cpu_s_by_role``); then the mean ratios over the files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(path: Path) -> tuple[str, float, float]:
    """One markdown row and its two ratios (round, compute)."""
    data = json.loads(path.read_text())
    sim, dep = data["simulation"], data["deployment"]
    r_round = dep["mean_round_s"] / sim["mean_round_s"]
    r_comp = dep["compute_s"] / sim["compute_s"]
    link = dep.get("cpu_s_by_role", {}).get("SuperLink", "-")
    text = (f"| {path.name} | {sim['mean_round_s']} / {dep['mean_round_s']} s "
            f"({r_round:.2f}) | {sim['compute_s']} / {dep['compute_s']} s ({r_comp:.2f}) "
            f"| {link} |")
    return text, r_round, r_comp


def main(paths: list[str]) -> None:
    """Print the rows and the mean ratios."""
    rows = [row(Path(p)) for p in paths]
    print("| file | per round: simulation / deployment (ratio) | client compute: "
          "simulation / deployment (ratio) | SuperLink CPU s |")
    print("|---|---|---|---|")
    for text, _, _ in rows:
        print(text)
    n = len(rows)
    print(f"\nmean ratio over {n}: round {sum(r[1] for r in rows) / n:.2f}, "
          f"client compute {sum(r[2] for r in rows) / n:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
