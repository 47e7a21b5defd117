"""Server and client storage of FedEraser, uncoded SE and coded SE, measured.

Usage::

    .venv/bin/python benchmarks/storage_table.py [--clients 20,50,100,200]
        [--rounds 10,20,30] [--privacy-t 0,2] [--json FILE]

Prints the table of :func:`experiments.storage.measure` (the real stores and
coder on random updates of the MNIST CNN's shapes; see that module for what is
measured and how): one line per (C, T, G), K chosen from C as a default run
does (``blocks-per-shard = 0``).
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
    ap.add_argument("--privacy-t", default="0", help="T values (comma list)")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    rounds = sorted(int(g) for g in args.rounds.split(","))
    privacy = [int(t) for t in args.privacy_t.split(",")]
    rows = [{k: v for k, v in row.items() if k != "source"}
            for row in storage.sweep(clients, rounds, privacy)]
    coder = storage.coded_settings()
    print(f"S={storage.NUM_SHARDS} shards, K = floor((1 - {coder['loss_budget']:g}) C)"
          f" - T blocks a shard (each shard coded alone), C/5 clients a round, "
          f"MNIST CNN ({rows[0]['params']:,} parameters), "
          f"{coder['scale_bits']}-bit fixed point, "
          f"link {coder['link_rate_mbps']:g} Mbit/s")
    print(storage.render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
