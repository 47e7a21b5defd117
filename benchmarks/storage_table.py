"""Server and client storage of FedEraser, uncoded SE and coded SE, measured.

Usage::

    .venv/bin/python benchmarks/storage_table.py [--clients 20,50,100,200]
        [--rounds 10,20,30] [--json FILE]

The paper's topology (Lin et al., IJCAI 2024, Sec. 5.1): S = 4 shards, 20% of
the clients a round (C / 5, spread as evenly as possible over the shards: 5 per
shard at C = 100), K = 5 blocks per shard (k = 20 data blocks a round), the
MNIST CNN (its real layers, 80,202 parameters). No training: the updates are
random float32 of the model's shapes (N(0, 0.01)), W^0 the real initial model;
they go through the real stores and coder:

- FE: ``HistoryStore`` of the unsharded federation (W^0, the C / 5 updates and
  the model of every round), bytes on disk (blobs + catalog);
- uncoded SE: ``HistoryStore`` of the S shards (W_s^0, each shard's updates and
  model every round), bytes on disk;
- coded SE: ``CodedRecorder`` (quantise, encode, tag, send); the server keeps
  ``catalog.sqlite`` + ``keys``; per-client bytes are the slice and tag bytes
  each client acknowledged, answered by the real ClientApp handler
  (``query.store_slice``). Clients here acknowledge and then drop their slices
  (a fresh node state per message) to keep this script's memory flat; the
  bytes are what a client keeps in ``context.state``.

The stores only grow, so one G = max(--rounds) run per C is measured after
round 10, 20, ... (a store after round g is the store of a g-round run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from client_app.app import app as client_app  # noqa: E402
from experiments.grid import InProcessGrid  # noqa: E402
from history.coded_recorder import CodedRecorder  # noqa: E402
from history.store import HistoryStore  # noqa: E402
from server_app.federation import Federation, assign_shards  # noqa: E402
from task.model import build_model  # noqa: E402

NUM_SHARDS = 4
BLOCKS_PER_SHARD = 5


def per_shard_counts(per_round: int, num_shards: int) -> list[int]:
    """Participants of each shard a round: ``per_round`` spread evenly."""
    return [len(part) for part in np.array_split(np.arange(per_round), num_shards)]


def measure(num_clients: int, checkpoints: list[int], work: Path, seed: int = 0
            ) -> list[dict]:
    """Run all three stores for max(checkpoints) rounds; one row per checkpoint."""
    torch.manual_seed(seed)
    w0 = {k: v.numpy().copy() for k, v in build_model("mnist", 10).state_dict().items()}
    num_params = sum(v.size for v in w0.values())
    rng = np.random.default_rng(seed)
    shards = assign_shards(num_clients, NUM_SHARDS, seed)
    node_of = {p: 1000 + p for p in range(num_clients)}
    per_round = num_clients // 5
    counts = per_shard_counts(per_round, NUM_SHARDS)
    fe = HistoryStore.create(work / "fe", {p: 0 for p in range(num_clients)})
    se = HistoryStore.create(work / "se", Federation(node_of, shards).shard_of)
    # fresh node state per message: clients acknowledge what they stored, then
    # forget it, so memory stays flat for C = 200 x 30 rounds
    grid = InProcessGrid(client_app, num_clients, {}, stateless=True)
    coded = CodedRecorder.create(work / "coded", Federation(node_of, shards),
                                 BLOCKS_PER_SHARD, 24)
    fe.put_shard_model(0, 0, w0)
    for s in range(NUM_SHARDS):
        se.put_shard_model(s, 0, w0)
        coded.put_shard_model(s, 0, w0)
    coded.end_round(0, grid)
    rows, t0 = [], time.perf_counter()
    for rnd in range(1, max(checkpoints) + 1):
        for s, pids in enumerate(shards):
            chosen = rng.choice(pids, counts[s], replace=False)
            for pid in sorted(int(p) for p in chosen):
                update = {k: rng.normal(0, 0.01, v.shape).astype(np.float32)
                          for k, v in w0.items()}
                fe.put_update(0, rnd, pid, update, 600, 1.0)
                se.put_update(s, rnd, pid, update, 600, 1.0)
                coded.put_update(s, rnd, pid, update, 600, 1.0)
            model = {k: v + rng.normal(0, 0.01, v.shape).astype(np.float32)
                     for k, v in w0.items()}
            se.put_shard_model(s, rnd, model)
            coded.put_shard_model(s, rnd, model)
        fe.put_shard_model(0, rnd, model)
        coded.end_round(rnd, grid)
        if rnd in checkpoints:
            acc = coded.accounting()
            rows.append({
                "clients": num_clients, "rounds": rnd, "params": num_params,
                "per_round": per_round, "per_shard": counts,
                "fe_server": fe.total_bytes(), "se_uncoded_server": se.total_bytes(),
                "se_coded_server": acc["server_bytes"],
                "se_coded_catalog": acc["catalog_bytes"],
                "se_coded_client_max": acc["client_bytes"]["max"],
                "se_coded_client_mean": acc["client_bytes"]["mean"],
                "distribution_comm_s": acc["distribution_comm_s"],
                "seconds": time.perf_counter() - t0,
            })
            print(f"  C={num_clients} G={rnd}: {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    for store in (fe, se, coded):
        store.close()
    return rows


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def render(rows: list[dict]) -> str:
    """The table: one line per (C, G)."""
    head = ["C", "G", "FE server", "uncoded SE server", "coded SE server",
            "coded/FE", "coded SE per client", "FE, uncoded SE per client",
            "distribution comm"]
    lines = [head]
    for r in rows:
        lines.append([
            str(r["clients"]), str(r["rounds"]), _mb(r["fe_server"]),
            _mb(r["se_uncoded_server"]), _mb(r["se_coded_server"]),
            f"{100 * r['se_coded_server'] / r['fe_server']:.3f}%",
            _mb(r["se_coded_client_max"]), "0",
            f"{r['distribution_comm_s']:,.0f} s"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True))
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="20,50,100,200")
    ap.add_argument("--rounds", default="10,20,30")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    rounds = sorted(int(g) for g in args.rounds.split(","))
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    rows = []
    for num_clients in clients:
        work = Path(tempfile.mkdtemp(prefix="storage-table-"))
        try:
            rows += measure(num_clients, rounds, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"S={NUM_SHARDS} shards, K={BLOCKS_PER_SHARD} blocks a shard "
          f"(k={NUM_SHARDS * BLOCKS_PER_SHARD}), C/5 clients a round, MNIST CNN "
          f"({rows[0]['params']:,} parameters), 24-bit fixed point, link 100 Mbit/s")
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
