"""Wall time and peak memory of the simulation at C = 100, 1,000 and 10,000 clients.

Usage (from the project root)::

    python benchmarks/scale_bench.py [--clients 100,1000,10000] [--out FILE.json]

Each size is one ``python -m cli run`` (Flower's simulation engine, one
SuperNode per client, Ray workers on the machine's cores) of MNIST IID, 4 shards,
40 clients a round, 2 rounds x 2 local epochs, then one request through SE and FR
(``mia=false``: the audit's cost does not grow with C).  Peak memory is the
largest sum, sampled every 0.5 s, of the proportional set size (PSS: shared pages
split between the processes sharing them) of every process the run started (found
by a mark in their environment: the CLI, ``flwr``, the SuperLink, Ray and its
workers); the machine's own baseline is not part of it.  Prints one table row per
size and the load average before and after, which a shared machine needs beside
its numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "SE_SCALE_BENCH"


def run_config(clients: int, results: str) -> str:
    """The run config of one size (``--run-config`` text)."""
    return (f"num-clients={clients} num-shards=4 clients-per-round=40 num-rounds=2 "
            f"local-epochs=2 frameworks='SE,FR' mia=false results-dir='{results}' "
            f"run-name='scale-{clients}'")


def _pss_kib(pid: str) -> int:
    """PSS of one process in KiB (RSS where smaps_rollup is missing; 0 if gone)."""
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        try:
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return 0


def marked_pss_mib(token: str) -> float:
    """Sum of the PSS of every process whose environment holds ``MARK=token`` (MiB)."""
    needle = f"{MARK}={token}".encode()
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            total += _pss_kib(pid)
    return total / 1024


def measure(clients: int, results: str) -> dict:
    """One ``python -m cli run`` of ``clients`` clients: wall seconds, peak MiB, status."""
    token = secrets.token_hex(6)
    env = {**os.environ, MARK: token, "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    env.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="se-scale-flwr."))
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], marked_pss_mib(token))

    sampler = threading.Thread(target=sample, daemon=True)
    argv = [sys.executable, "-m", "cli", "run", "--run-config",
            run_config(clients, results)]
    start = time.perf_counter()
    sampler.start()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    summary = Path(results) / f"scale-{clients}" / "summary.json"
    found = str(summary) if summary.is_file() else None
    return {"clients": clients, "wall_s": round(wall, 1), "peak_pss_mib": round(peak[0]),
            "status": proc.returncode, "summary": found,
            "tail": proc.stderr.strip().splitlines()[-1:] if proc.returncode else []}


def main(argv: list[str] | None = None) -> int:
    """Run every size one after another, print the table; 0 when all wrote a summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="100,1000,10000",
                    help="comma-separated client counts")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    sizes = [int(c) for c in args.clients.split(",") if c.strip()]
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="se-scale.") as results:
        print("| C | wall time | peak memory (PSS) | status |\n|---|---|---|---|",
              flush=True)
        for clients in sizes:
            row = measure(clients, results)
            rows.append(row)
            print(f"| {clients:,} | {row['wall_s']:.0f} s | "
                  f"{row['peak_pss_mib'] / 1024:.2f} GiB | "
                  f"{'ok' if row['summary'] else 'failed'} |", flush=True)
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {load_before}, after: {load_after}; "
          f"{os.cpu_count()} CPUs")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "load_before": load_before,
                                        "load_after": load_after,
                                        "cpus": os.cpu_count()}, indent=1) + "\n")
    return 0 if all(r["summary"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
