"""The lock a live run holds on its folder: one run per folder at a time.

A run takes an exclusive ``flock`` on ``<run folder>/run.lock`` when it starts
and holds it while it lives. The kernel drops the lock when the process ends,
however it ends (also SIGKILL), so a second start of a live run is refused
while a killed run can be resumed. The file says who holds it (pid, host,
start time) for the error message.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

LOCK_NAME = "run.lock"
# locks this process holds, by folder: a run that failed in this process and is
# started again here (the in-process engine, tests) takes its lock over
_HELD: dict[str, RunLock] = {}


class RunLockedError(RuntimeError):
    """Another live process holds the run folder's lock.

    Attributes
    ----------
    holder : str
        Who holds it, as written in the lock file (e.g. ``pid 42 on host``).
    """

    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(f"{folder} is in use by a live run ({holder})")
        self.holder = holder


class RunLock:
    """An exclusive lock on a run folder, held until :meth:`release` or exit."""

    def __init__(self, folder: Path, fd: int) -> None:
        self.folder = Path(folder)
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, folder: Path) -> RunLock:
        """Lock ``folder`` (which must exist) without waiting.

        Raises
        ------
        RunLockedError
            Another process holds the lock.
        """
        key = str(Path(folder).resolve())
        if key in _HELD:
            _HELD.pop(key).release()
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read(fd)
            os.close(fd)
            raise RunLockedError(Path(folder), holder) from None
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n"
                  .encode(), 0)
        lock = cls(folder, fd)
        _HELD[key] = lock
        return lock

    @staticmethod
    def holder(folder: Path) -> str | None:
        """Who holds ``folder``'s lock now, or None when no live process does.

        Only probes: takes the lock and drops it at once if it is free. A lock
        this process holds counts as free (:meth:`acquire` takes it over).
        """
        if str(Path(folder).resolve()) in _HELD:
            return None
        try:
            fd = os.open(Path(folder) / LOCK_NAME, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read(fd)
        finally:
            os.close(fd)  # closing drops a probe lock
        return None

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            key = str(self.folder.resolve())
            if _HELD.get(key) is self:
                del _HELD[key]


def _read(fd: int) -> str:
    text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    return text or "holder unknown"
