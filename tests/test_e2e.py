"""End-to-end: ./simulate.sh runs the real Flower simulation engine (Ray).

Coded storage, so the slices live in the simulated clients' node folders and a
later request decodes them from there, through the engine.
"""

import json
import os
import re
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
              "forget-clients='1' storage='coded' frameworks='SE,FR' run-name='e2e'")
    # SE and FR only: FE and RR learn a baseline federation of their own, and the
    # engine carries them as it carries these (test_unlearning runs all four)
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
    # coded storage on Ray: slices in the simulated clients' node folders
    assert summary["storage"]["mode"] == "coded"
    assert summary["storage"]["SE_coded"]["server_bytes"] > 0
    assert summary["frameworks"]["SE"]["requests"][0]["slice_retrieval"] is not None
    nodes = tmp_path / "results" / "e2e" / "nodes"
    assert sorted(int(p.name) for p in nodes.iterdir()) == list(range(8))
    assert summary["unlearning"]["requests"] == [[1]]
    assert set(summary["frameworks"]) == {"SE", "FR"}
    assert "SE" in proc.stdout and "FR" in proc.stdout  # the comparison table
    _check_terminal_output(proc.stdout, tmp_path / "results")
    _forget_later_and_export(env, tmp_path)
    # the SuperLinks simulate.sh started are gone
    deadline = time.time() + 20
    while time.time() < deadline:
        left = subprocess.run(["pgrep", "-f", str(tmp_path / "flwr_home")],
                              capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(1)
    assert not left, f"processes left running: {left}"


def _forget_later_and_export(env: dict, tmp_path: Path) -> None:
    """The operator's sequence on the finished run: forget, then export the new version."""
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(ROOT / "simulate.sh"), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)

    proc = cli("forget", "--run", "e2e", "--clients", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "done     after the run v2->v3  clients [2]" in proc.stdout, proc.stdout
    out = tmp_path / "v3.pt"
    proc = cli("export", "--run", "e2e", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    import torch

    saved = torch.load(out, weights_only=True)
    # r0001 is the planned request's receipt, r0002 the later request's
    receipt = json.loads((tmp_path / "results" / "e2e" / "receipts" / "r0002.json")
                         .read_text())
    assert receipt["after_run"] is True and receipt["clients"] == [2]
    assert saved["metadata"]["models_sha256"] == receipt["models_sha256"]["after"]["models"]
    assert f"models sha256 {saved['metadata']['models_sha256']}" in proc.stdout


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
WARNING = re.compile(r"(^|\) )WARNING\s*:|:\d+: \w*Warning: ")
LOG_LINE = re.compile(r"^(\([^)]*\) )?(DEBUG|INFO|WARNING|ERROR)\s*:")


def _check_terminal_output(stdout: str, results: Path) -> None:
    """Each of Flower's and Ray's warnings at most once, none the run can avoid, and
    no engine line after the result tables; the log file keeps all of flwr's output."""
    lines = [ANSI.sub("", line) for line in stdout.splitlines()]
    warnings = [re.sub(r"^\([^)]*\) ", "", line) for line in lines if WARNING.search(line)]
    assert len(warnings) == len(set(warnings)), warnings
    for avoidable in ("fraction_evaluate is set to 0.0", "RAY_ACCEL_ENV_VAR_OVERRIDE",
                      "default simulated SuperNodes", "Manually terminating"):
        assert avoidable not in stdout, avoidable
    table = next(i for i, line in enumerate(lines) if line.startswith("   model  accuracy"))
    assert not [line for line in lines[table:] if LOG_LINE.match(line)], lines[table:]
    log = "\n".join(p.read_text() for p in results.glob("*/logs/run-*.log"))
    assert "default simulated SuperNodes" in log and "summary: /" in log
