"""End-to-end: ./simulate.sh runs the real Flower simulation engine (Ray)."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_simulate_sh_learns_and_unlearns(tmp_path, shared_data):
    env = {**os.environ, "SE_RESULTS_DIR": str(tmp_path / "results"),
           "FLWR_HOME": str(tmp_path / "flwr_home"), "SE_DATA_DIR": str(shared_data)}
    config = ("num-clients=8 num-shards=2 clients-per-round=4 num-rounds=2 "
              "local-epochs=1 client-samples=64 test-samples=500 batch-size=16 "
              "forget-clients='1' run-name='e2e'")
    proc = subprocess.run([str(ROOT / "simulate.sh"), "--run-config", config],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    path = tmp_path / "results" / "e2e" / "summary.json"
    assert last == f"summary: {path}"
    summary = json.loads(path.read_text())
    assert summary["config"]["num-clients"] == 8
    assert len(summary["learning"]["shard_accuracy"]) == 2
    assert summary["learning"]["accuracy"] > 0.2
    assert summary["storage"]["server_bytes"] > 0
    assert summary["unlearning"]["requests"] == [[1]]
    assert set(summary["frameworks"]) == {"SE", "FR", "FE", "RR"}
    assert "SE" in proc.stdout and "FR" in proc.stdout  # the comparison table
    # the SuperLink simulate.sh started is gone
    deadline = time.time() + 20
    while time.time() < deadline:
        left = subprocess.run(["pgrep", "-f", str(tmp_path / "flwr_home")],
                              capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(1)
    assert not left, f"processes left running: {left}"
