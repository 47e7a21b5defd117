"""What pruning the uncoded history saves (issue 14, item 7), one in-process run.

``SE_DATA_DIR=/work/shared/data PYTHONPATH=. python docs/results/retention/measure.py OUT``
learns C = 100 MNIST clients (20 samples each), S = 4 shards, 20 a round, G = 10
rounds x 1 local epoch on the in-process grid, then prints the shard models kept
and dropped and the store's bytes (``summary.json`` under OUT/p).
"""

import json
import sys
from pathlib import Path

from experiments.grid import run_in_process

CONFIG = {"dataset": "mnist", "num-clients": 100, "num-shards": 4,
          "clients-per-round": 20, "num-rounds": 10, "local-epochs": 1,
          "client-samples": 20, "test-samples": 200, "frameworks": "none",
          "mia": False, "run-name": "p"}

if __name__ == "__main__":
    out = Path(sys.argv[1])
    run_in_process({**CONFIG, "results-dir": str(out)})
    blobs = out / "p" / "history" / "sharded" / "blobs"
    models = sorted(blobs.glob("model_*.npz"))
    size = models[0].stat().st_size
    summary = json.loads((out / "p" / "summary.json").read_text())
    kept = len(models)
    total = CONFIG["num-shards"] * (CONFIG["num-rounds"] + 1)
    print(json.dumps({"models_kept": kept, "models_before": total,
                      "bytes_dropped": (total - kept) * size,
                      "server_bytes": summary["storage"]["server_bytes"]}, indent=1))
