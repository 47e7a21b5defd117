"""The run's results folder: ``<results-dir>/<run-name>/``.

It holds ``history/<federation>/`` (the stores) and, once the run has finished,
``summary.json``, written last and atomically: a folder without it is a run that
did not finish.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from history.files import atomic_write, atomic_write_arrays, decode_arrays
from server_app.config import ConfigError, RunConfig
from server_app.runlock import LOCK_NAME, RunLock, RunLockedError


@dataclass(frozen=True)
class RunFolder:
    """The folder one run writes into (absolute path), locked while the run lives."""

    path: Path
    lock: RunLock | None = field(default=None, compare=False, repr=False)

    @classmethod
    def start(cls, cfg: RunConfig) -> RunFolder:
        """Create or reopen the run folder and take its lock (:mod:`server_app.runlock`).

        A finished run of the same name is never overwritten, and a run that is
        still going (a live process holds the lock) is never joined. The folder
        of an unfinished run that has a run catalog (``run.sqlite``) is kept, so
        the run resumes (see :mod:`server_app.runlog`); any other unfinished
        folder is moved aside to ``<name>.failed-<time>``. The lock is held
        until :meth:`finish` or the end of the process.

        Raises
        ------
        ConfigError
            ``run-name`` names a finished run, or a run that is still going.
        """
        path = cls.check_free(cfg)
        path.mkdir(parents=True, exist_ok=True)
        lock = _lock(path)
        try:
            _refuse_finished(path)  # it may have finished meanwhile
            if not (path / "run.sqlite").exists() and any(
                    p.name != LOCK_NAME for p in path.iterdir()):
                # moved aside with its lock held; the new folder gets a new lock
                path.rename(path.with_name(f"{path.name}.failed-{int(time.time())}"))
                path.mkdir()
                old, lock = lock, _lock(path)
                old.release()
        except BaseException:
            lock.release()
            raise
        return cls(path, lock)

    @staticmethod
    def check_free(cfg: RunConfig) -> Path:
        """The run folder's path, if a run may start there (nothing is created).

        Raises
        ------
        ConfigError
            The folder holds a finished run, or a live process holds its lock.
        """
        path = cfg.resolved_results_dir() / cfg.resolved_run_name()
        _refuse_finished(path)
        holder = RunLock.holder(path)
        if holder is not None:
            raise ConfigError(_busy(path, holder))
        return path

    @property
    def runlog_path(self) -> Path:
        """The run catalog ``run.sqlite``."""
        return self.path / "run.sqlite"

    def load_models(self, name: str) -> list:
        """The shard models saved by :meth:`save_models`, as ArrayRecords."""
        from strategies.sharded import to_record, unpack_shards

        data = decode_arrays((self.path / "models" / f"{name}.npz").read_bytes())
        shards = {int(k.split("/", 1)[0][5:]) for k in data}
        return unpack_shards(to_record(data), len(shards))

    def history_dir(self, federation: str) -> Path:
        """Folder of the history store of ``federation`` (e.g. ``sharded``)."""
        return self.path / "history" / federation

    def save_models(self, name: str, models: list) -> Path:
        """Write a framework's shard models to ``models/<name>.npz`` atomically.

        ``models`` is a list of ArrayRecord; keys become ``shard<s>/<layer>``.
        """
        arrays = {f"shard{s}/{k}": v.numpy() for s, record in enumerate(models)
                  for k, v in record.items()}
        target = self.path / "models" / f"{name}.npz"
        atomic_write_arrays(target, arrays)
        return target

    def finish(self, summary: dict) -> Path:
        """Write ``summary.json`` atomically, drop the lock; return its absolute path."""
        target = self.path / "summary.json"
        atomic_write(target, json.dumps(summary, indent=2).encode())
        self.release()
        return target

    def release(self) -> None:
        """Drop the run's lock (idempotent; the end of the process drops it too)."""
        if self.lock is not None:
            self.lock.release()


def _refuse_finished(path: Path) -> None:
    if (path / "summary.json").exists():
        raise ConfigError(
            f"run-config 'run-name' = {path.name!r} is not allowed: {path} holds "
            "a finished run; choose another run-name or remove that folder")


def _lock(path: Path) -> RunLock:
    try:
        return RunLock.acquire(path)
    except RunLockedError as err:
        raise ConfigError(_busy(path, err.holder)) from None


def _busy(path: Path, holder: str) -> str:
    return (f"run-config 'run-name' = {path.name!r} is not allowed: the run in {path} "
            f"is still going ({holder}); wait for it to end, stop it, or choose "
            "another run-name")
