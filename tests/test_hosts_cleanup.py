"""Separate hosts leave nothing behind: after SIGTERM, after SIGKILL, and when refused.

tests/hosts_victim.py starts a federation of one SuperNode host (a SuperLink
and a SuperNode in namespaces of their own) and is then stopped; no namespace,
hosts file or process of it may remain. Needs root and ``ip`` (skips otherwise).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli import netns
from cli.procs import command_processes

ROOT = Path(__file__).resolve().parents[1]


def _leftovers(pid: int, tag: str) -> list[str]:
    names = [n for n in netns.namespaces() if n.startswith(tag)]
    names += [str(p) for p in Path("/etc/netns").glob(f"{tag}*")]
    return names + [f"pid {p}" for p in command_processes(pid)]


@pytest.mark.hosts
@pytest.mark.subprocess
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGTERM", "SIGKILL"])
def test_stopped_harness_leaves_nothing(tmp_path, sig):
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr_home"),
           "FLWR_TELEMETRY_ENABLED": "0",
           "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "hosts_victim.py"),
                             str(tmp_path / "run")], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready "), line
        tag = line.split()[1]
        assert len([n for n in netns.namespaces() if n.startswith(tag)]) == 3
        assert command_processes(proc.pid)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while (left := _leftovers(proc.pid, tag)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, left
    finally:
        if proc.poll() is None:
            proc.kill()


def test_deploy_hosts_without_root_is_one_line(monkeypatch):
    from cli import deploy
    from server_app.config import ConfigError

    monkeypatch.setattr(netns, "unavailable",
                        lambda: "separate hosts need root (network namespaces): run "
                        "as root")
    with pytest.raises(ConfigError) as err:
        deploy.main(["4", "--hosts"])
    assert str(err.value) == ("--hosts: separate hosts need root (network namespaces): "
                              "run as root")


def test_stale_networks_of_dead_runs_are_removed_and_only_those():
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = f"{netns.PREFIX}{dead.pid}x1sw"  # a pid that is gone
    alive = f"{netns.own_tag()}sw"  # this process: alive
    other = "sehother-keep"  # not one of ours
    for name in (mine, alive, other):
        netns.ip("netns", "add", name)
    try:
        removed = netns.remove_stale()
        names = netns.namespaces()
        assert mine in removed and mine not in names
        assert alive in names and other in names
    finally:
        for name in (mine, alive, other):
            netns.delete_namespace(name)
