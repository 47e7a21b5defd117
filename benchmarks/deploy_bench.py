"""Deployment against simulation: the same run config, one after the other.

Usage (from the project root)::

    python benchmarks/deploy_bench.py [--nodes 4] [--run-config "k=v ..."]
        [--isolation process|subprocess] [--out FILE.json]

Runs ``python -m cli run`` (Flower's Ray simulation engine, one CPU per
client) and then ``python -m cli deploy N`` (a real SuperLink and N SuperNodes
on 127.0.0.1) with the same settings (default: MNIST, 4 clients, 2 shards, 3
rounds x 2 local epochs, 500 samples a client, frameworks=none, mia=false) and
prints a side-by-side table from the two summary.json files: seconds per
learning round (mean of the rounds' wall ``seconds``), client compute (the
learning stage's ``compute_s``: clients' training seconds summed), the learning
stage's wall time, and the whole command's wall time (start-up to result);
then the CPU seconds each command's processes used, by role (SuperLink,
SuperNodes, ClientApp processes, ...; :mod:`proc_cpu`). The two runs never
overlap; on a shared machine the numbers are upper bounds, so the load
average before each run is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from proc_cpu import TreeCpu

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ("dataset='mnist' num-clients=4 num-shards=2 clients-per-round=4 "
           "num-rounds=3 local-epochs=2 client-samples=500 test-samples=1000 "
           "frameworks='none' mia=false")


def run(argv: list[str], label: str) -> dict:
    """Run one ``python -m cli`` command; its summary and wall seconds.

    Raises
    ------
    SystemExit
        The command failed or printed no ``summary: <path>`` line.
    """
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "cli", *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cpu = TreeCpu(proc.pid)
    stdout, stderr = proc.communicate()
    wall = time.monotonic() - t0
    cpu_by_role = cpu.stop()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("summary: ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{label} failed (exit {proc.returncode}):\n"
                         f"{stdout[-2000:]}\n{stderr[-3000:]}")
    summary = json.loads(Path(lines[-1].split(" ", 1)[1]).read_text())
    learning = summary["learning"]
    rounds = [r["seconds"] for r in learning["rounds"]]
    return {"label": label, "load_before": round(load, 2),
            "round_s": [round(s, 2) for s in rounds],
            "mean_round_s": round(sum(rounds) / len(rounds), 2),
            "compute_s": round(learning["compute_s"], 2),
            "learning_wall_s": round(learning["wall_time_s"], 2),
            "command_wall_s": round(wall, 1),
            "accuracy": [r.get("accuracy") for r in learning["rounds"]],
            "cpu_s_by_role": cpu_by_role}


def table(sim: dict, dep: dict) -> str:
    """The side-by-side markdown table (and the deployment/simulation ratios)."""
    rows = [("seconds per round (mean)", "mean_round_s"),
            ("client compute, all rounds (s)", "compute_s"),
            ("learning stage wall (s)", "learning_wall_s"),
            ("whole command, start-up to result (s)", "command_wall_s"),
            ("load average before the run", "load_before")]
    out = ["| same config | simulation | deployment | deployment / simulation |",
           "|---|---|---|---|"]
    for name, key in rows:
        ratio = dep[key] / sim[key] if sim[key] else float("nan")
        out.append(f"| {name} | {sim[key]} | {dep[key]} | {ratio:.2f} |")
    out.append(f"| per-round seconds | {sim['round_s']} | {dep['round_s']} | |")
    out += ["", "| CPU seconds of the whole command, by process | simulation "
            "| deployment |", "|---|---|---|"]
    roles = dict.fromkeys([*sim["cpu_s_by_role"], *dep["cpu_s_by_role"]])
    for name in roles:
        out.append(f"| {name} | {sim['cpu_s_by_role'].get(name, '-')} | "
                   f"{dep['cpu_s_by_role'].get(name, '-')} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run both, print the table; write the numbers as JSON with ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4, help="clients = SuperNodes")
    ap.add_argument("--run-config", default="", help="k=v ... over the default")
    ap.add_argument("--isolation", choices=("process", "subprocess"), default=None,
                    help="deploy's --isolation (default: deploy's own default)")
    ap.add_argument("--out", type=Path, default=None, help="write the numbers here")
    args = ap.parse_args(argv)
    cfg = f"{DEFAULT} num-clients={args.nodes} {args.run_config}".strip()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    sim = run(["run", "-c", cfg, "-c", f"run-name='bench-sim-{stamp}'"], "simulation")
    extra = ["--isolation", args.isolation] if args.isolation else []
    dep = run(["deploy", str(args.nodes), *extra, "-c", cfg,
               "-c", f"run-name='bench-deploy-{stamp}'"], "deployment")
    text = table(sim, dep)
    print(f"config: {cfg}\n\n{text}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": cfg, "isolation": args.isolation,
                                        "simulation": sim, "deployment": dep,
                                        "table": text}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
