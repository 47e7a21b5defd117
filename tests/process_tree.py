"""Shared by the tests of stopping a command's processes (test_cli, test_killed_command)."""

from __future__ import annotations

from pathlib import Path

GROUP_CHILD = '''
import signal, subprocess, sys, time
a = subprocess.Popen(["sleep", "300"])                          # same group
b = subprocess.Popen(["sleep", "300"], start_new_session=True)  # left the group
c = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print(1, flush=True); time.sleep(300)"],
                     stdout=subprocess.PIPE, text=True)          # ignores SIGTERM
c.stdout.readline()
print(a.pid, b.pid, c.pid, flush=True)
time.sleep(300)
'''
"""A command's child with three grandchildren: one in its process group, one that
left the group, one that ignores SIGTERM; prints their pids, then sleeps."""


def running(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead (``/proc/<pid>/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def in_groups(pgids: set[int]) -> list[int]:
    """Live PIDs whose process group (``/proc/<pid>/stat`` field 5) is in ``pgids``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and running(int(entry.name)):
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) in pgids:
                found.append(int(entry.name))
    return found
