"""machine.json of the paper-preset runs: whole-run wall time and peak memory.

Usage: ``python docs/results/paper-preset/machine.py LOGDIR`` with LOGDIR as
``run.sh`` wrote it (``times.log``: ``start|end NAME EPOCH`` lines;
``mem.log``: ``idle MB`` then ``EPOCH MB`` every 5 s, the machine's used
memory from ``free -m``; optional ``side_jobs.log``: ``START END LABEL`` lines,
epochs of other work that ran beside a run). Prints JSON: per run ``wall_s``,
``peak_above_idle_gb`` (largest sample during the run minus the idle sample) and,
with side jobs, ``peak_above_idle_gb_without_side_jobs`` (their samples left out).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(logdir: str) -> None:
    """Print the machine facts of the runs logged in ``logdir``."""
    folder = Path(logdir)
    times: dict[str, dict[str, int]] = {}
    for line in (folder / "times.log").read_text().split("\n"):
        if line.strip():
            what, name, epoch = line.split()[:3]
            times.setdefault(name, {})[what] = int(epoch)
    lines = (folder / "mem.log").read_text().split("\n")
    idle = int(lines[0].split()[1])
    samples = [tuple(map(int, ln.split())) for ln in lines[1:] if ln.strip()]
    out = {"idle_used_mb": idle, "sampling": "free -m used, every 5 s"}
    side = folder / "side_jobs.log"
    jobs = [tuple(map(int, ln.split()[:2])) for ln in side.read_text().split("\n")
            if ln.strip()] if side.exists() else []
    for name, t in times.items():
        during = [(epoch, mb) for epoch, mb in samples
                  if t["start"] <= epoch <= t.get("end", epoch)]
        out[name] = {"wall_s": t["end"] - t["start"] if "end" in t else None,
                     "peak_above_idle_gb": round((max(mb for _, mb in during) - idle) / 1024, 2)}
        if jobs:
            alone = [mb for epoch, mb in during if not any(a <= epoch <= b for a, b in jobs)]
            out[name]["peak_above_idle_gb_without_side_jobs"] = round(
                (max(alone) - idle) / 1024, 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
