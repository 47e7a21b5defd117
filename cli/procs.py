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

A command that cannot run its stop (SIGKILL, the OOM killer) leaves nothing
running either: each child gets the kernel's parent-death signal (SIGTERM when
the command dies; Linux ``prctl(PR_SET_PDEATHSIG)``), and a watchdog process
(``python -m cli.procs watch``, in a session of its own, started with the first
child) holds the read end of a pipe whose only write end is the command's: when
the command dies, however it dies, the kernel closes it, and the watchdog stops
every marked process and every process group one is in (:class:`Groups`) as
:meth:`Children.stop` would. A
command that names its run (:func:`tag_run`) gives every child the tag
``SE_CLI_RUN=<run folder>`` too, so a later start of the same run can see
(:func:`run_processes`) and refuse processes of an earlier one still alive.
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

MARK_PREFIX = "SE_CLI_GROUP_"
RUN_TAG = "SE_CLI_RUN"
"""Environment variable naming the run folder of the command that started a process."""
GRACE_S = 5.0
PR_SET_PDEATHSIG = 1
PROJECT = Path(__file__).resolve().parents[1]


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
        self.watchdog: subprocess.Popen | None = None
        self._lifeline: int | None = None  # write end of the watchdog's pipe
        self._groups = Groups()

    def start(self, argv: Sequence[str], env: dict | None = None,
              **popen_kw) -> subprocess.Popen:
        """``subprocess.Popen(argv)`` in a new session, marked as ours.

        ``env`` defaults to ``os.environ``; other keyword arguments go to Popen
        (a ``preexec_fn`` runs after the parent-death signal is set). The first
        start also starts the watchdog.
        """
        if self.watchdog is None:
            self._start_watchdog()
        env = {**(os.environ if env is None else env), self.mark: str(os.getpid())}
        if RUN_TAG in os.environ:
            env.setdefault(RUN_TAG, os.environ[RUN_TAG])
        popen_kw["preexec_fn"] = dies_with_parent(popen_kw.get("preexec_fn"))
        proc = subprocess.Popen(list(argv), env=env, start_new_session=True, **popen_kw)
        self.procs.append(proc)
        return proc

    def _start_watchdog(self) -> None:
        """``python -m cli.procs watch FD MARK GRACE``: stops ours when we die.

        Only the watchdog gets the pipe's read end; the write end is this
        process's alone (not inheritable, PEP 446), so end of file there means
        this process is gone. It carries neither the mark nor the run's tag:
        it is not a process of the run.
        """
        read_end, self._lifeline = os.pipe()
        try:
            self.watchdog = subprocess.Popen(
                [sys.executable, "-m", "cli.procs", "watch", str(read_end), self.mark,
                 str(self.grace_s)], pass_fds=(read_end,), start_new_session=True,
                cwd=PROJECT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                env={k: v for k, v in os.environ.items() if k != RUN_TAG})
        finally:
            os.close(read_end)

    def _stop_watchdog(self) -> None:
        """Close the pipe (the watchdog finds nothing left and ends); reap it."""
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self.watchdog is not None:
            try:
                self.watchdog.wait(timeout=self.grace_s + 5)
            except subprocess.TimeoutExpired:  # pragma: no cover - stuck sweep
                self.watchdog.kill()
            self.watchdog = None

    def alive(self) -> list[int]:
        """PIDs of our live processes: children and marked descendants (no zombies)."""
        for proc in self.procs:
            proc.poll()  # reaps a child that ended
        pids = {p.pid for p in self.procs if p.returncode is None}
        pids |= set(self._groups.members(marked_processes(self.mark)))
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
        self._stop_watchdog()
        self._groups = Groups()  # all gone: a group id may be reused from now on
        return left

    def _signal(self, sig: int) -> None:
        for proc in self.procs:
            if proc.returncode is None:  # not reaped: its pid (= group id) not reused
                _quiet(os.killpg, proc.pid, sig)
        for pid in self.alive():
            _quiet(os.kill, pid, sig)
        self._groups.signal(sig)

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
    return _environ_matching(lambda environ: needle in environ)


class Groups:
    """The process groups the marked processes are in, remembered once seen.

    A process found by its mark is not enough: Ray's agents (``ray::RuntimeEnvAgent``,
    ``ray::DashboardAgent``) set their title with ``setproctitle``, which overwrites
    the memory ``/proc/<pid>/environ`` reads, so their mark cannot be read, and they
    outlive a killed raylet by up to 30 s under load. They stay in the group of the
    process that started the simulation, so stopping the groups of the marked
    processes stops them too. A group is remembered after its marked members die;
    the caller's own group is never one.
    """

    def __init__(self) -> None:
        self.pgids: set[int] = set()

    def members(self, marked: list[int]) -> list[int]:
        """``marked`` and every live process in their groups (and groups seen before)."""
        own = os.getpgrp()
        for pid in marked:
            try:
                self.pgids.add(os.getpgid(pid))
            except OSError:  # gone
                continue
        self.pgids.discard(own)
        return sorted(set(marked) | set(_group_members(self.pgids)))

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every remembered group."""
        for pgid in self.pgids:
            _quiet(os.killpg, pgid, sig)


def _group_members(pgids: set[int]) -> list[int]:
    """Live PIDs whose process group (``/proc/<pid>/stat`` field 5) is in ``pgids``."""
    if not pgids:
        return []
    return [pid for pid in _pids() if (stat := _stat(pid)) and stat[0] not in ("Z", "X")
            and int(stat[2]) in pgids]


def run_processes(run_folder: str | Path) -> list[int]:
    """Live PIDs started for the run in ``run_folder`` (tag :data:`RUN_TAG`).

    Processes of an earlier start of the same run that are still alive (its
    command was killed a moment ago and the watchdog is still stopping them).
    """
    needle = f"\0{RUN_TAG}={run_folder}\0".encode()
    return [pid for pid in _environ_matching(lambda environ: needle in environ + b"\0")
            if _running(pid)]


def command_processes(command_pid: int) -> list[int]:
    """Live PIDs marked by any :class:`Children` of the command ``command_pid``."""
    pattern = re.compile(rb"\0" + re.escape(MARK_PREFIX.encode()) + rb"[0-9a-f]+="
                         + str(command_pid).encode() + rb"\0")
    return [pid for pid in _environ_matching(lambda env: pattern.search(env + b"\0"))
            if _running(pid)]


def tag_run(run_folder: str | Path) -> None:
    """Give every child started from now on :data:`RUN_TAG` = ``run_folder``."""
    os.environ[RUN_TAG] = str(run_folder)


def _environ_matching(test: Callable[[bytes], object]) -> list[int]:
    """PIDs (not this one) whose ``/proc/<pid>/environ``, after a NUL, passes ``test``."""
    found: list[int] = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if test(b"\0" + environ):
            found.append(pid)
    return found


def _pids() -> list[int]:
    """Every PID in ``/proc`` ([] without it)."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return []
    return [int(e.name) for e in proc_root.iterdir() if e.name.isdigit()]


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after the command name (state first); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def dies_with_parent(then: Callable[[], object] | None = None) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGTERM when this process dies, then ``then``.

    Linux ``prctl(PR_SET_PDEATHSIG, SIGTERM)``; elsewhere only ``then``. The
    signal follows the death of the thread that starts the child, so it is set
    only for children started by the main thread. If this process died before
    the child set it, the child ends at once.
    """
    parent = os.getpid()
    arm = _LIBC is not None and threading.current_thread() is threading.main_thread()

    def preexec() -> None:
        if arm:
            _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # died between fork and prctl
                os._exit(1)
        if then is not None:
            then()

    return preexec


def _libc() -> ctypes.CDLL | None:
    """The C library (loaded before any fork: a forked child must not load it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no libc symbols
        return None


_LIBC = _libc()


LATE_S = 2.0
"""Seconds the watchdog keeps killing processes of the command that start late."""


def sweep(mark: str, grace_s: float = GRACE_S) -> list[int]:
    """Stop every process marked ``mark`` and their process groups; return the left.

    SIGTERM to each marked process and to each group a marked process leads,
    up to ``grace_s`` seconds, then SIGKILL. What the watchdog does when the
    command is gone. Returns the PIDs that needed SIGKILL.
    """
    groups = Groups()

    def ours() -> list[int]:
        return [p for p in groups.members(marked_processes(mark)) if _running(p)]

    def signal_all(sig: int) -> None:
        for pid in ours():
            _quiet(os.kill, pid, sig)
        groups.signal(sig)

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and ours():
        time.sleep(0.1)
    left = ours()
    # A dying parent may still start a child: SIGKILL what is ours for LATE_S, not once
    end = time.monotonic() + LATE_S
    while True:
        signal_all(signal.SIGKILL)
        if time.monotonic() >= end:
            break
        time.sleep(0.2)
        left += [p for p in ours() if p not in left]
    return left


def watch(lifeline: int, mark: str, grace_s: float = GRACE_S) -> int:
    """The watchdog: wait for end of file on ``lifeline``, then :func:`sweep`.

    Ignores SIGINT and SIGHUP (a Ctrl-C or a closed terminal reaches the
    command, which stops its children itself); returns 0.
    """
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            if not os.read(lifeline, 4096):
                break
        except InterruptedError:  # pragma: no cover - retried by Python anyway
            continue
    left = marked_processes(mark)
    if left:
        stopped = sweep(mark, grace_s)
        print(f"cli watchdog: the command is gone; stopped {len(left)} of its "
              f"processes ({len(stopped)} with SIGKILL)", file=sys.stderr, flush=True)
    return 0


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
    stat = _stat(pid)
    if stat is None:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return not Path("/proc").is_dir()
    return stat[0] not in ("Z", "X")


def _quiet(fn, *args) -> None:
    try:
        fn(*args)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":  # python -m cli.procs watch FD MARK GRACE_S
    if len(sys.argv) != 5 or sys.argv[1] != "watch":
        sys.exit("usage: python -m cli.procs watch FD MARK GRACE_S")
    sys.exit(watch(int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
