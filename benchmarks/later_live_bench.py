"""A later request on the live federation against the same request in simulation.

Usage (from the project root)::

    python benchmarks/later_live_bench.py [--nodes 8] [--requests 3]
        [--run-config "k=v ..."] [--out FILE.json]

Starts a SuperLink and N SuperNodes on 127.0.0.1 (with warm executors, as
``deploy`` runs them) that stay up, learns run ``live`` on them (``flwr run`` with
``SE_FEDERATION`` set, so the run records its federation) and run ``sim`` with the
same settings in Flower's simulation engine (``python -m cli run``), then times
``python -m cli forget --run R --clients P`` for the same clients on both, one after
the other (the federation's first), each request a new model version. Prints each
request's seconds (the whole command: start-up to receipt, what an operator waits),
the means, their ratio (live / simulation) and the goal's 1.3. The two never overlap;
the load average before each is printed (a shared machine's seconds are upper bounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT = ("dataset='mnist' num-shards=2 clients-per-round=4 num-rounds=3 "
           "local-epochs=2 client-samples=500 test-samples=1000 frameworks='none' "
           "mia=false")
"""The run's settings; ``num-clients`` is ``--nodes``."""
GOAL = 1.3


def _cli(argv: list[str], label: str) -> float:
    """``python -m cli ARGV``; its wall seconds (exits on a failure)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cli", *argv], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def _federation(children, work: Path, nodes: int):
    """SuperLink, SuperNodes and executors on 127.0.0.1; the connection's context."""
    from cli.deploy_parts import (
        connection_entry,
        start_executors,
        start_superlink,
        start_supernodes,
        wait_for_nodes,
    )
    from cli.env import free_ports

    for sub in ("logs", "nodes"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    ports = free_ports(nodes + 1)
    name = f"bench-{ports[0]}"
    start_superlink(children, work, ports[0], federation=name)
    procs = start_supernodes(children, work, f"127.0.0.1:{ports[0]}", ports[1:])
    wait_for_nodes(procs, ports[1:], 120.0, work)
    start_executors(children, work, ports[1:])
    return connection_entry(Path(os.environ["FLWR_HOME"]), name, f"127.0.0.1:{ports[0]}")


def _learn_live(children, work: Path, name: str, run_config: str) -> None:
    """Learn run ``live`` on federation ``name`` with ``flwr run``."""
    from cli import config
    from cli.deploy_parts import RunWatch, follow_run, stage_app
    from task.config import fused_run_config

    values = {**config.parse_item(run_config), "run-name": "live",
              "results-dir": os.environ["SE_RESULTS_DIR"],
              "data-dir": os.environ["SE_DATA_DIR"]}
    fused_run_config(values)  # a bad key fails here, in one line
    path = work / "live.toml"
    path.write_text(config.to_toml(values))
    follow_run(children, stage_app(work / "app"), name, path, work / "logs" / "live.log",
               RunWatch(time.monotonic(), 0))
    if b"summary: /" not in (work / "logs" / "live.log").read_bytes():
        raise SystemExit(f"learning on the federation failed: {work / 'logs'}")


def main() -> int:
    """Run the benchmark; print the table and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--run-config", default=DEFAULT)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.run_config += f" num-clients={args.nodes}"  # one client per SuperNode
    from cli.procs import Children

    with tempfile.TemporaryDirectory(prefix="se-later-bench.") as tmp:
        work = Path(tmp)
        os.environ.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                   f"{os.environ['PATH']}",  # flower-superlink, flwr
                           "FLWR_HOME": str(work / "flwr_home"),
                           "SE_RESULTS_DIR": str(work / "results"),
                           "SE_DATA_DIR": os.environ.get("SE_DATA_DIR") or
                           str(ROOT.parent / "shared" / "data"),
                           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                           "FLWR_TELEMETRY_ENABLED": "0"})
        (work / "flwr_home").mkdir()
        rows = []
        with Children() as children, _federation(children, work / "fed",
                                                 args.nodes) as name:
            _learn_live(children, work / "fed", name, args.run_config)
            _cli(["run", "--run-config", args.run_config, "--run-config",
                  "run-name='sim'"], "learning in simulation")
            for client in range(1, args.requests + 1):
                row = {"client": client}
                for run, label in (("live", "federation"), ("sim", "simulation")):
                    row[f"{label}_load"] = os.getloadavg()[0]
                    row[label] = _cli(["forget", "--run", run, "--clients", str(client)],
                                      f"forget on {label}")
                rows.append(row)
    live = statistics.mean(r["federation"] for r in rows)
    sim = statistics.mean(r["simulation"] for r in rows)
    print("| client | live federation (s) | simulation (s) | load before (1 min) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['client']} | {r['federation']:.1f} | {r['simulation']:.1f} | "
              f"{r['federation_load']:.2f} / {r['simulation_load']:.2f} |")
    ratio = live / sim
    print(f"mean: live {live:.1f} s, simulation {sim:.1f} s (n = {len(rows)} each); "
          f"ratio {ratio:.2f} (goal: at most {GOAL}; "
          f"{'reached' if ratio <= GOAL else 'not reached'})")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                                capture_output=True).stdout.strip()
        Path(args.out).write_text(json.dumps({
            "command": " ".join(["python", *sys.argv]), "commit": commit,
            "machine": f"{os.cpu_count()} cores", "rows": rows, "mean_live_s": live,
            "mean_simulation_s": sim,
            "ratio": ratio, "goal": GOAL, "nodes": args.nodes,
            "run_config": args.run_config}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
