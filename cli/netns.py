"""Separate network hosts on one machine: Linux network namespaces on a bridge.

A :class:`Network` is one private LAN: a "switch" namespace holding a bridge,
and one namespace per host, each joined to the bridge by a veth pair (created
inside the namespaces, never in the machine's own) with its own address in
``10.231.0.0/24`` and its own loopback. Every host resolves every host's name
through ``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` bind-mounts
over ``/etc/hosts``. Nothing of the machine's own namespace is configured.

Every namespace name starts with the network's tag ``seh<pid>x<start>``: the
pid of the process that made it and that process's start time (clock ticks
since boot, ``/proc/<pid>/stat``), so a later run removes what a killed run
left (:func:`remove_stale`) and only that: a namespace whose maker still runs
(same pid, same start time) is not touched, nor one without the prefix.
Deleting a namespace deletes its veth ends; its processes are stopped first
(they would outlive it). A network that cannot run its :meth:`Network.close`
(its process got SIGKILL) is removed anyway: a watchdog (``python -m
cli.netns watch FD TAG``, in a session of its own) holds the read end of a
pipe only the network's process writes to and, at end of file, deletes every
namespace with the network's tag (as :class:`cli.procs.Children` does for
processes).

Needs root and iproute2 ``ip`` (:func:`unavailable` says why not, in one line).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PREFIX = "seh"
SUBNET = "10.231.0"
"""The private /24 of every network (each network is its own LAN: no clash)."""
NETNS_RUN = Path("/run/netns")
NETNS_ETC = Path("/etc/netns")
CLONE_NEWNET = 0x40000000
_TAG = re.compile(rf"^{PREFIX}(\d+)x(\d+)")
_NETWORKS = itertools.count(1)
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


class NetnsError(RuntimeError):
    """A namespace, link or address could not be set up (the ``ip`` error)."""


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "separate hosts need root (network namespaces): run as root"
    if shutil.which("ip") is None:
        return "separate hosts need iproute2's 'ip' on PATH (network namespaces)"
    if not NETNS_RUN.parent.is_dir():
        return "separate hosts need /run (ip netns keeps its namespaces there)"
    return None


def ip(*args: str) -> str:
    """Run ``ip ARGS``; return its stdout.

    Raises
    ------
    NetnsError
        ``ip`` exited non-zero (its stderr, one line).
    """
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def own_tag() -> str:
    """The tag of this process: ``seh<pid>x<start time>``."""
    return f"{PREFIX}{os.getpid()}x{_start_time(os.getpid()) or 0}"


def namespaces() -> list[str]:
    """Names of every network namespace ``ip netns`` knows."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Delete the namespaces (and their processes, veths, hosts files) of dead runs.

    A namespace is stale when its name has this module's tag and the process
    the tag names is gone (or another process now has its pid). Returns the
    names deleted.
    """
    stale = []
    for name in namespaces():
        match = _TAG.match(name)
        if match and _start_time(int(match.group(1))) != int(match.group(2)):
            stale.append(name)
    delete_namespaces(stale)
    for folder in NETNS_ETC.glob(f"{PREFIX}*") if NETNS_ETC.is_dir() else []:
        match = _TAG.match(folder.name)
        if match and _start_time(int(match.group(1))) != int(match.group(2)):
            shutil.rmtree(folder, ignore_errors=True)
    return stale


def namespace_pids(name: str) -> list[int]:
    """PIDs of the processes in namespace ``name`` ([] when it is gone)."""
    try:
        return [int(p) for p in ip("netns", "pids", name).split()]
    except NetnsError:
        return []


def delete_namespace(name: str, grace_s: float = 3.0) -> None:
    """Stop every process in ``name`` (SIGTERM, then SIGKILL), delete it and its files."""
    delete_namespaces([name], grace_s)


def delete_namespaces(names: list[str], grace_s: float = 3.0) -> None:
    """:func:`delete_namespace` of each, their processes stopped all at once."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for name in names:
            for pid in namespace_pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while any(map(namespace_pids, names)) and time.monotonic() < deadline:
            time.sleep(0.1)
    for name in names:
        with contextlib.suppress(NetnsError):
            ip("netns", "del", name)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


@dataclass(frozen=True)
class Host:
    """One host of a :class:`Network`: its namespace, name and address."""

    netns: str
    name: str
    address: str
    iface: str = "eth0"

    def wrap(self) -> list[str]:
        """The argv prefix that runs a command on this host (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.netns]

    def link(self, up: bool) -> None:
        """Set this host's link to the LAN up or down (a cable pulled, put back).

        Raises
        ------
        NetnsError
            The namespace is gone.
        """
        ip("-n", self.netns, "link", "set", self.iface, "up" if up else "down")

    def connect(self, host: str, port: int, timeout_s: float = 0.5) -> bool:
        """True when ``host:port`` accepts a TCP connection from this host."""
        return in_netns(self.netns, lambda: _connects(host, port, timeout_s))


def _connects(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def in_netns(netns: str, fn: Callable[[], object]) -> object:
    """``fn()`` in a thread that joined namespace ``netns`` (its sockets live there).

    Only that thread moves (``setns`` of a network namespace is per thread);
    names resolve from this process's ``/etc/hosts``, so pass addresses.

    Raises
    ------
    NetnsError
        The namespace does not exist or ``setns`` failed.
    """
    out: dict = {}

    def body() -> None:
        try:
            fd = os.open(NETNS_RUN / netns, os.O_RDONLY)
        except OSError as err:
            out["error"] = NetnsError(f"no network namespace {netns!r}: {err.strerror}")
            return
        try:
            if _LIBC.setns(fd, CLONE_NEWNET) != 0:
                out["error"] = NetnsError(
                    f"setns({netns}): {os.strerror(ctypes.get_errno())}")
                return
            out["value"] = fn()
        finally:
            os.close(fd)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


_LIBC = ctypes.CDLL(None, use_errno=True)


class Network:
    """A LAN of hosts in namespaces, removed again by :meth:`close` (or ``with``).

    ``domain``: the hosts' names are ``<name>.<domain>``. Hosts get
    ``10.231.0.1``, ``.2``, ... in the order they are added (at most 250).

    Raises
    ------
    NetnsError
        :func:`unavailable` gives a reason, or an ``ip`` command failed (what
        was made so far is removed).
    """

    def __init__(self, domain: str = "se.test") -> None:
        reason = unavailable()
        if reason:
            raise NetnsError(reason)
        remove_stale()
        k = next(_NETWORKS)  # a second network of this process gets names of its own
        self.tag = own_tag() + (f"-{k}-" if k > 1 else "")
        self.domain = domain
        self.hosts: dict[str, Host] = {}
        self.switch = f"{self.tag}sw"
        self._made: list[str] = []
        self._lifeline, self._watchdog = _start_watchdog(self.tag)
        try:
            self._namespace(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
        except NetnsError:
            self.close()
            raise

    def _namespace(self, netns: str) -> None:
        ip("netns", "add", netns)
        self._made.append(netns)
        ip("-n", netns, "link", "set", "lo", "up")

    def add_host(self, name: str) -> Host:
        """A new host ``name`` (lower-case letters, digits, '-') on the LAN.

        Raises
        ------
        ValueError
            A bad or taken name, or 250 hosts already.
        NetnsError
            An ``ip`` command failed.
        """
        if not _NAME.match(name) or name in self.hosts:
            raise ValueError(f"host name {name!r} is not allowed: 1-31 characters of "
                             "a-z, 0-9, '-', starting with a letter, not taken")
        index = len(self.hosts) + 1
        if index > 250:
            raise ValueError("a network holds at most 250 hosts")
        host = Host(f"{self.tag}{name}", f"{name}.{self.domain}", f"{SUBNET}.{index}")
        self._namespace(host.netns)
        port = f"p{index}"  # inside the switch namespace: no clash with anything
        ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
           host.iface, "netns", host.netns)
        ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.iface)
        ip("-n", host.netns, "link", "set", host.iface, "up")
        self.hosts[name] = host
        self._write_hosts_files()
        return host

    def _write_hosts_files(self) -> None:
        """Every host's ``/etc/netns/<ns>/hosts``: localhost and every host's name."""
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{h.address} {h.name}" for h in self.hosts.values()]
        for host in self.hosts.values():
            folder = NETNS_ETC / host.netns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("\n".join(lines) + "\n")

    def close(self) -> None:
        """Stop every process in the network's namespaces and delete them; idempotent."""
        delete_namespaces(self._made[::-1])
        self._made.clear()
        if self._lifeline is not None:  # the watchdog finds nothing and ends
            os.close(self._lifeline)
            self._lifeline = None
            try:
                self._watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - stuck ip
                self._watchdog.kill()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _start_watchdog(tag: str) -> tuple[int, subprocess.Popen]:
    """``python -m cli.netns watch FD TAG``; returns (write end, process)."""
    import sys

    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.netns", "watch", str(read_end), tag],
            pass_fds=(read_end,), start_new_session=True,
            cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL)
    finally:
        os.close(read_end)
    return write_end, proc


def watch(lifeline: int, tag: str) -> int:
    """Wait for end of file on ``lifeline``, then delete the namespaces tagged ``tag``."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # outlive a Ctrl-C to the whole group
    while os.read(lifeline, 4096):
        pass
    delete_namespaces([name for name in namespaces() if _tag_of(name) == tag])
    for folder in NETNS_ETC.glob(f"{tag}*") if NETNS_ETC.is_dir() else []:
        if _tag_of(folder.name) == tag:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def _tag_of(name: str) -> str | None:
    match = _TAG.match(name)
    return match.group(0) if match else None


if __name__ == "__main__":  # python -m cli.netns watch FD TAG
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "watch":
        sys.exit("usage: python -m cli.netns watch FD TAG")
    sys.exit(watch(int(sys.argv[2]), sys.argv[3]))
