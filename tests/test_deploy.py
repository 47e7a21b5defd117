"""End-to-end: scripts/deploy.sh runs the app on Flower's deployment engine.

One flower-superlink and four flower-supernodes on 127.0.0.1 (free ports), one
`flwr run` (conftest.loopback_deploy), then every process the script started
must be gone.
"""

import json
import os
import re
import time
from pathlib import Path

import pytest


def _processes_matching(pattern: re.Pattern) -> list[str]:
    """Live processes (not zombies) whose command line matches ``pattern``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and pattern.search(cmdline):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.e2e
def test_deploy_sh_runs_on_supernodes_and_stops_them(loopback_deploy):
    proc, tmp_path = loopback_deploy  # the run test_hosts compares its hosts with
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    path = tmp_path / "results" / "loopback" / "summary.json"
    assert proc.stdout.strip().splitlines()[-1] == f"summary: {path}"
    assert "deploy wall time:" in proc.stdout
    # each warning at most once, Flower's fraction_evaluate notice not at all, and
    # nothing of the engine's after the result tables
    lines = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", x) for x in proc.stdout.splitlines()]
    warnings = [line for line in lines if re.search(r"WARNING\s*:|\w*Warning: ", line)]
    assert len(warnings) == len(set(warnings)), warnings
    assert "fraction_evaluate is set to 0.0" not in out
    table = next(i for i, line in enumerate(lines) if line.startswith("   model  accuracy"))
    assert not [line for line in lines[table:]
                if re.match(r"(\([^)]*\) )?(DEBUG|INFO|WARNING|ERROR)\s*:", line)]
    summary = json.loads(path.read_text())
    assert summary["config"]["num-clients"] == 4
    assert "accuracy" in summary["learning"]
    assert len(summary["learning"]["shard_accuracy"]) == 2
    assert summary["storage"]["server_bytes"] > 0

    # every process of the run is gone: found by the run folder (SuperLink
    # database, SuperNode node-dir) or by the run's 127.0.0.1 ports (SuperExec,
    # flwr-serverapp and flwr-clientapp processes name the address they serve)
    ports = re.findall(r"SuperLink pid \d+ on 127\.0\.0\.1:(\d+)", out)
    ports += re.findall(r"ports ([\d ]+)", out)[0].split()
    assert len(ports) == 5, out[-3000:]
    pattern = re.compile(re.escape(str(tmp_path)) + "|"
                         + r"127\.0\.0\.1:(" + "|".join(ports) + r")\b")
    deadline = time.time() + 15
    while (left := _processes_matching(pattern)) and time.time() < deadline:
        time.sleep(1)
    assert not left, "processes left running:\n" + "\n".join(left)

    # the connection entry was removed again; the run folder was cleaned up
    assert "se-deploy-" not in (tmp_path / "flwr_home" / "config.toml").read_text()
    assert not list((tmp_path / "runs").glob("se-deploy.*"))
