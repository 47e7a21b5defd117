"""How long the time-saved sweep takes, and that it remakes the committed files.

Usage::

    .venv/bin/python benchmarks/sweep_bench.py [DATASET ...]

For each dataset (default: every ``docs/results/time-saved/<DATASET>.json``)
it sweeps all the clients again into a scratch folder
(:func:`experiments.time_saved.main`: one cost-only learning, each client's
run from a copy of it) and prints the seconds it took, the clients swept and,
per key, whether the result equals the committed file's (``reference``,
``se``, ``summary``, ``fingerprint``, ``config``, ``reference_clients``; the
``commit`` is left out: the committed one is the sweep's first). Every sweep
starts from scratch; a committed file made by other code (another
fingerprint) differs for that reason, not because the sweep does not repeat
itself. Timing is
wall-clock on this machine, with whatever else runs beside it: read it as a
size, not a benchmark of the code.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from experiments import time_saved

KEYS = ("reference", "se", "summary", "fingerprint", "config", "reference_clients")


def main(datasets: list[str]) -> None:
    committed = time_saved.OUT
    try:
        for dataset in datasets or sorted(p.stem for p in committed.glob("*.json")):
            old = json.loads((committed / f"{dataset}.json").read_text())
            with tempfile.TemporaryDirectory() as scratch:
                time_saved.OUT = Path(scratch)
                start = time.perf_counter()
                new = json.loads(time_saved.main(dataset).read_text())
                took = time.perf_counter() - start
            same = {k: new[k] == old.get(k) for k in KEYS}
            print(f"RESULT {dataset}: {took:.0f} s, {len(new['se'])} clients; the same "
                  f"as the committed file: {same}", flush=True)
    finally:
        time_saved.OUT = committed


if __name__ == "__main__":
    main(sys.argv[1:])
