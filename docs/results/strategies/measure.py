"""Accuracy per round of every shard strategy, docs/RESULTS.md's "Shard strategies".

``PYTHONPATH=. .venv/bin/python docs/results/strategies/measure.py OUT > docs/results/strategies/accuracy.json``
(from the project root; data from ``$SE_DATA_DIR`` or the usual lookup). The
config is ``tests/test_strategies.py``'s: 8 MNIST clients x 64 samples, 2
shards, all 8 clients every round, 1 local epoch, 3 rounds, 500 test images,
batch 16, no unlearning, seed 0; the real ServerApp and ClientApp on the
in-process grid. Prints JSON: strategy -> shard-ensemble test accuracy per round,
and FedAdagrad with Flower's own server learning rate 0.1 over 8 rounds (the
reason in docs/CONFIG.md for the project's 0.01).
"""

import json
import sys
from pathlib import Path

from experiments.grid import run_in_process
from server_app.config import SHARD_STRATEGIES

CONFIG = {"dataset": "mnist", "num-clients": 8, "num-shards": 2, "clients-per-round": 8,
          "num-rounds": 3, "local-epochs": 1, "client-samples": 64, "test-samples": 500,
          "batch-size": 16, "frameworks": "none", "mia": False}

if __name__ == "__main__":
    out = Path(sys.argv[1])
    accuracy = {}
    for name in SHARD_STRATEGIES:
        path = run_in_process({**CONFIG, "shard-strategy": name, "run-name": name,
                               "results-dir": str(out)})
        rounds = json.loads(path.read_text())["learning"]["rounds"]
        accuracy[name] = [round(r["accuracy"], 4) for r in rounds]
    path = run_in_process({**CONFIG, "shard-strategy": "FedAdagrad", "server-lr": 0.1,
                           "num-rounds": 8, "run-name": "FedAdagrad-lr0.1",
                           "results-dir": str(out)})
    flowers = [round(r["accuracy"], 4)
               for r in json.loads(path.read_text())["learning"]["rounds"]]
    print(json.dumps({"config": CONFIG, "accuracy_per_round": accuracy,
                      "FedAdagrad_server_lr_0.1_8_rounds": flowers}, indent=1))
