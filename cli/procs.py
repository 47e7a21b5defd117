"""The processes a command starts, and stopping every one of them.

Each child (``flwr run``, a SuperLink, a SuperNode) starts in its own session
(``start_new_session``: its own process group), with a mark in its environment
that its descendants inherit: the SuperLink ``flwr run`` starts in the
background, the SuperExec, ``flwr-simulation``, Ray's processes and the
ClientApp processes all carry it, although several of them start sessions of
their own. :meth:`Children.stop` sends SIGTERM to every child's group and every
marked process, waits a few seconds and sends SIGKILL to what is left.
:func:`exit_on_signals` turns SIGTERM, SIGINT and SIGHUP into
:class:`Terminated` (a ``SystemExit``) so the stop runs also when the command
is terminated (``timeout``, a CI runner, Ctrl-C).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

MARK_PREFIX = "SE_CLI_GROUP_"
GRACE_S = 5.0


class Terminated(SystemExit):
    """The command got SIGTERM, SIGINT or SIGHUP; exit status 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def exit_on_signals(prog: str = "cli") -> None:
    """Raise :class:`Terminated` on SIGTERM, SIGINT or SIGHUP (main thread only).

    The first signal raises; later ones are ignored so that the stop of the
    children (in ``finally`` / ``with`` blocks) runs to its end.
    """
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def handler(signum: int, _frame) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        print(f"{prog}: {signal.Signals(signum).name}: stopping every process this "
              "run started", file=sys.stderr, flush=True)
        raise Terminated(signum)

    for sig in signals:
        signal.signal(sig, handler)


class Children:
    """Processes started by one command, with all their descendants.

    Use as a context manager: leaving the block stops them all.
    """

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.mark = f"{MARK_PREFIX}{secrets.token_hex(6)}"
        self.grace_s = grace_s
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: Sequence[str], env: dict | None = None,
              **popen_kw) -> subprocess.Popen:
        """``subprocess.Popen(argv)`` in a new session, marked as ours.

        ``env`` defaults to ``os.environ``; other keyword arguments go to Popen.
        """
        env = {**(os.environ if env is None else env), self.mark: str(os.getpid())}
        proc = subprocess.Popen(list(argv), env=env, start_new_session=True, **popen_kw)
        self.procs.append(proc)
        return proc

    def alive(self) -> list[int]:
        """PIDs of our live processes: children and marked descendants (no zombies)."""
        for proc in self.procs:
            proc.poll()  # reaps a child that ended
        pids = {p.pid for p in self.procs if p.returncode is None}
        pids |= set(marked_processes(self.mark))
        return sorted(pid for pid in pids if _running(pid))

    def stop(self) -> list[int]:
        """SIGTERM to all, up to ``grace_s`` seconds, then SIGKILL; idempotent.

        Returns
        -------
        list[int]
            PIDs that needed SIGKILL.
        """
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.alive()
        if left:
            self._signal(signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - D state
                pass
        return left

    def _signal(self, sig: int) -> None:
        for proc in self.procs:
            if proc.returncode is None:  # not reaped: its pid (= group id) not reused
                _quiet(os.killpg, proc.pid, sig)
        for pid in self.alive():
            _quiet(os.kill, pid, sig)

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc) -> None:
        left = self.stop()
        if left:
            print(f"stopped with SIGKILL after {self.grace_s:.0f} s: pids "
                  f"{' '.join(map(str, left))}", file=sys.stderr, flush=True)


def marked_processes(mark: str) -> list[int]:
    """PIDs whose environment holds ``mark`` (Linux ``/proc``; [] elsewhere)."""
    needle = b"\0" + mark.encode() + b"="
    found = []
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return found
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in b"\0" + environ:
            found.append(int(entry.name))
    return found


def tee(stream: BinaryIO, *sinks: BinaryIO) -> threading.Thread:
    """Copy ``stream`` line by line to every sink (flushed) in a daemon thread.

    A sink that fails (a closed pipe: ``| head``) is dropped; the stream is
    still read to its end, so the writer never blocks on a full pipe.
    """

    def pump() -> None:
        live = list(sinks)
        for line in iter(stream.readline, b""):
            for sink in list(live):
                try:
                    sink.write(line)
                    sink.flush()
                except (OSError, ValueError):
                    live.remove(sink)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def _running(pid: int) -> bool:
    """True for a live process that is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return not Path("/proc").is_dir()
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _quiet(fn, *args) -> None:
    try:
        fn(*args)
    except (ProcessLookupError, PermissionError):
        pass
