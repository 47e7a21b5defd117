"""Server and client storage of FedEraser, uncoded SE and coded SE, measured.

Usage::

    .venv/bin/python benchmarks/storage_table.py [--clients 20,50,100,200]
        [--rounds 10,20,30] [--json FILE]

Prints the table of :func:`experiments.storage.measure` (the real stores and
coder on random updates of the MNIST CNN's shapes; see that module for what is
measured and how): one line per (C, G).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import storage  # noqa: E402


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
    rows = [{k: v for k, v in row.items() if k != "source"}
            for row in storage.sweep(clients, rounds)]
    shards, blocks = storage.NUM_SHARDS, storage.BLOCKS_PER_SHARD
    coder = storage.coded_settings()
    print(f"S={shards} shards, K={blocks} blocks a shard (k={shards * blocks}), C/5 "
          f"clients a round, MNIST CNN ({rows[0]['params']:,} parameters), "
          f"{coder['scale_bits']}-bit fixed point, "
          f"link {coder['link_rate_mbps']:g} Mbit/s")
    print(storage.render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
