"""benchmarks/proc_cpu.py: CPU seconds of a process tree by role."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from proc_cpu import PROC, TreeCpu, role  # noqa: E402

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_roles_of_the_deployment_processes():
    warm = "/v/bin/python -m cli.warm_exec --runtime-api-address 127.0.0.1:1"
    assert role(warm, "/v/bin/python -m cli deploy 4") == "warm SuperExec"
    assert role(warm, warm) == "ClientApp process (forked)"
    assert role("/v/bin/python /v/bin/flower-superlink --insecure", "x") == "SuperLink"
    assert role("/v/bin/python -m cli.supernode --insecure", "x") == "SuperNode"
    assert role("/v/bin/python /v/bin/flwr-serverapp --insecure", "x") == "ServerApp"
    assert role("/v/bin/python -m cli deploy 4", "bash") == "cli (launcher)"
    assert role("sleep 3", "bash") == "other"


@pytest.mark.subprocess
@pytest.mark.skipif(not PROC.is_dir(), reason="needs Linux /proc")
def test_counts_a_grandchild_that_burns_cpu():
    # a shell whose child burns 0.5 s of CPU: the grandchild is in the tree
    code = BURN.format(s=0.5)
    proc = subprocess.Popen([sys.executable, "-c",
                             f"import subprocess, sys; subprocess.run([sys.executable, "
                             f"'-c', {code!r}])"])
    cpu = TreeCpu(proc.pid, period_s=0.05)
    proc.wait()
    by_role = cpu.stop()
    assert 0.3 <= by_role["other"] <= 5.0, by_role


@pytest.mark.subprocess
@pytest.mark.skipif(not PROC.is_dir(), reason="needs Linux /proc")
def test_other_processes_are_not_counted():
    burner = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.5)])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    cpu = TreeCpu(idle.pid, period_s=0.05)
    idle.wait()
    burner.wait()
    by_role = cpu.stop()
    assert sum(by_role.values()) < 0.3, by_role
