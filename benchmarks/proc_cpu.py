"""CPU seconds of a process tree, summed by role (Linux ``/proc``).

Used by ``deploy_bench.py`` to show where a deployment's CPU went: the
SuperLink, the SuperNodes, the warm SuperExecs, their forked ClientApp
processes, the ServerApp. A background thread reads every descendant's
``utime + stime`` every ``period_s`` seconds and keeps each process's last
reading; a process that ends between two readings loses at most ``period_s``
of CPU from the total. On a system without ``/proc`` it records nothing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")
TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
ROLES = (("flower-superlink", "SuperLink"), ("cli.supernode", "SuperNode"),
         ("flower-supernode", "SuperNode"), ("flwr-serverapp", "ServerApp"),
         ("flwr-clientapp", "ClientApp process"), ("flwr run", "flwr run"),
         ("flower-superexec", "SuperExec (starts the ServerApp)"),
         ("flwr-simulation", "simulation (ServerApp + Ray driver)"),
         ("ray::", "Ray worker (clients)"), ("/ray/", "Ray (raylet, GCS, monitors)"))


def role(cmdline: str, parent_cmdline: str) -> str:
    """A readable role for a process from its and its parent's command line."""
    if "cli.warm_exec" in cmdline:
        return ("ClientApp process (forked)" if "cli.warm_exec" in parent_cmdline
                else "warm SuperExec")
    for needle, name in ROLES:
        if needle in cmdline:
            return name
    if " -m cli " in f"{cmdline} ":
        return "cli (launcher)"
    return "other"


def _read(pid: int) -> tuple[int, float, str] | None:
    """(parent pid, CPU seconds, command line) of ``pid``; None if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        cmd = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return (int(fields[1]), ticks * TICK_S,
            cmd.replace(b"\0", b" ").decode(errors="replace").strip())


class TreeCpu:
    """Sample the CPU of ``root`` and its descendants until :meth:`stop`.

    ``root`` is a pid (int). :meth:`by_role` returns ``{role: seconds}``.
    """

    def __init__(self, root: int, period_s: float = 0.3) -> None:
        self.root = root
        self.period_s = period_s
        self.last: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU s)
        self.cmd: dict[int, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        if PROC.is_dir():
            self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        """Read every process below ``root`` once."""
        info = {}
        for entry in PROC.iterdir():
            if entry.name.isdigit() and (got := _read(int(entry.name))) is not None:
                info[int(entry.name)] = got
        tree, grew = {self.root}, True
        while grew:
            more = {pid for pid, (ppid, _, _) in info.items()
                    if ppid in tree and pid not in tree}
            tree |= more
            grew = bool(more)
        for pid in tree & info.keys():  # the newest command line: fork, then exec
            if info[pid][2]:  # a zombie's is empty
                self.cmd[pid] = info[pid][2]
        for pid in tree & info.keys():
            ppid, cpu, _ = info[pid]
            self.last[pid] = (role(self.cmd.get(pid, ""), self.cmd.get(ppid, "")), cpu)

    def stop(self) -> dict[str, float]:
        """Stop sampling; the CPU seconds by role."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.by_role()

    def by_role(self) -> dict[str, float]:
        """``{role: CPU seconds}``, largest first, rounded to 0.1 s."""
        out: dict[str, float] = {}
        for name, cpu in self.last.values():
            out[name] = out.get(name, 0.0) + cpu
        return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
