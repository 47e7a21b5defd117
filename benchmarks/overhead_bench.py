"""Per-round overhead of Flower + Ray against the same training in plain PyTorch.

Usage (from the project root, venv active or via .venv/bin/python)::

    python benchmarks/overhead_bench.py [--rounds 3] [--run-config "..."]

1. Plain PyTorch: the same learning (same data partitions, model, clients per
   round, local epochs, batch size, lr; FedAvg per shard) in one process, clients
   trained one after another with one thread each, evaluation as the ServerApp
   does it. Prints seconds per round.
2. Flower: ``./simulate.sh`` with the same settings (frameworks=none) through
   the Ray simulation engine (one SuperNode per client, two Ray workers on two
   cores); per-round wall seconds are read from summary.json.

The ideal round spreads the clients' part of the plain loop (their data and
training) over the cores Ray uses and adds the server's part (aggregation and
central evaluation), which runs after the replies in both; the overhead is
Flower's round minus that ideal. The ratio with everything divided by the cores
(the server's part too) is printed as well, so the reader can judge.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from cli import config as cli_config  # noqa: E402
from server_app.config import RunConfig  # noqa: E402
from server_app.evaluation.central import CentralEvaluator  # noqa: E402
from server_app.rounds.federation import assign_shards  # noqa: E402
from strategies.calibration import weighted_step  # noqa: E402
from task.builtin import build_model, load_task_data  # noqa: E402
from task.data import client_data  # noqa: E402
from task.train import local_train  # noqa: E402
from task.training_settings import TrainingSettings  # noqa: E402


def plain_rounds(cfg: RunConfig, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds per round of the learning stage in a plain PyTorch loop.

    Returns the clients' seconds (data, training with one thread, as the
    ClientApp; what Ray spreads over its workers) and the server's seconds
    (aggregation and central evaluation with torch's default threads, as the
    ServerApp; after the replies in both), per round.
    """
    server_threads = torch.get_num_threads()  # the ServerApp's (torch's default)
    torch.set_num_threads(1)  # a client's, as in the ClientApp
    data = cfg.data
    task = load_task_data(data.dataset, data.data_dir or None, data.block_size)
    shards = assign_shards(data.num_clients, cfg.training.num_shards, cfg.seed)
    evaluator = CentralEvaluator(cfg.task(), task, data.test_samples or None, "cpu")
    torch.manual_seed(cfg.seed)
    base = build_model(cfg.data.dataset, task.num_classes)
    models = [{k: v.numpy().copy() for k, v in base.state_dict().items()}
              for _ in shards]
    per_shard = cfg.training.clients_per_round // cfg.training.num_shards
    times, serial = [], []
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        server = 0.0
        for s, pids in enumerate(shards):
            sampled = random.Random(f"{cfg.seed}:{rnd}:{s}").sample(pids, per_shard)
            updates, weights = [], []
            for pid in sampled:
                x, y = client_data(task, pid, data.num_clients, data.partition, cfg.seed,
                                   data.partition_alpha, data.classes_per_client)
                x, y = x[:data.client_samples or None], y[:data.client_samples or None]
                model = build_model(cfg.data.dataset, task.num_classes)
                model.load_state_dict({k: torch.from_numpy(v) for k, v in
                                       models[s].items()})
                local_train(model, x, y, TrainingSettings(
                    lr=cfg.training.lr, local_epochs=cfg.training.local_epochs,
                    batch_size=cfg.training.batch_size, momentum=cfg.training.momentum),
                    seed=rnd * 1000 + pid)
                trained = {k: v.numpy() for k, v in model.state_dict().items()}
                updates.append({k: trained[k] - models[s][k] for k in trained})
                weights.append(len(x))
            t1 = time.perf_counter()
            models[s] = weighted_step(models[s], updates, weights)
            server += time.perf_counter() - t1
        from strategies.sharded import to_record
        t1 = time.perf_counter()
        torch.set_num_threads(server_threads)
        evaluator.evaluate([to_record(m) for m in models])
        torch.set_num_threads(1)
        server += time.perf_counter() - t1
        times.append(time.perf_counter() - t0 - server)
        serial.append(server)
        print(f"plain PyTorch round {rnd}: {times[-1] + server:.1f} s ({times[-1]:.1f} s "
              f"clients, {server:.1f} s server)", flush=True)
    return times, serial


def flower_rounds(run_config: str, rounds: int) -> list[float]:
    """Per-round wall seconds of the same learning through ./simulate.sh."""
    name = f"overhead-{int(time.time())}"
    config = f"{run_config} num-rounds={rounds} frameworks='none' run-name='{name}'"
    out = subprocess.run([str(ROOT / "simulate.sh"), "--run-config", config],
                         cwd=ROOT, capture_output=True, text=True, env=os.environ)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines or not lines[-1].startswith("summary: "):
        raise SystemExit(f"simulate.sh failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    summary = json.loads(Path(lines[-1].split(" ", 1)[1]).read_text())
    times = [r["seconds"] for r in summary["learning"]["rounds"]]
    for i, t in enumerate(times, 1):
        print(f"Flower + Ray round {i}: {t:.1f} s", flush=True)
    return times


def main() -> None:
    """Run both and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run-config", default="", help="extra k=v settings")
    parser.add_argument("--cores", type=int, default=2, help="Ray workers (cores)")
    args = parser.parse_args()
    # pyproject's defaults < --run-config, read as ./simulate.sh reads it
    config = cli_config.merge(cli_config.defaults(), [args.run_config]).config
    if not config["data-dir"] and os.environ.get("SE_DATA_DIR"):
        config["data-dir"] = os.environ["SE_DATA_DIR"]
    cfg = RunConfig.from_run_config(config)
    clients, server = plain_rounds(cfg, args.rounds)
    flower = flower_rounds(args.run_config, args.rounds)
    # the first Flower round includes each Ray worker's data loading: skip it
    c, v = (sum(x[1:]) / max(1, len(x) - 1) for x in (clients, server))
    f = sum(flower[1:]) / max(1, len(flower) - 1)
    ideal = c / args.cores + v
    print(f"\nrounds 2..{args.rounds} mean: plain PyTorch {c + v:.2f} s/round (1 core, "
          f"sequential: {c:.2f} s clients + {v:.2f} s server); Flower + Ray {f:.2f} "
          f"s/round ({args.cores} workers)")
    print(f"ideal: the clients' part over {args.cores} cores, the server's after it: "
          f"{ideal:.2f} s/round; Flower + Ray / ideal = {f / ideal:.2f}x "
          f"(overhead {f - ideal:.2f} s/round)")
    print(f"(all of it over {args.cores} cores, the server's part too: "
          f"{(c + v) / args.cores:.2f} s/round, {f / ((c + v) / args.cores):.2f}x)")


if __name__ == "__main__":
    main()
