"""The run's results folder: ``<results-dir>/<run-name>/``.

It holds ``history/<federation>/`` (the stores) and, once the run has finished,
``summary.json``, written last and atomically: a folder without it is a run that
did not finish.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from history.files import atomic_write, atomic_write_arrays, decode_arrays, readable_mode
from runstore.lock import LOCK_NAME, RunLock, RunLockedError
from task.values import ConfigError

COMMAND_LOGS = "logs"
"""The folder of the command line's logs in a run folder (``logs/run-<pid>.log``);
the only entry besides the lock that a run folder may hold before its catalog."""


class ModelsFileError(RuntimeError):
    """A saved models file is missing, damaged or not the one the run saved."""


@dataclass(frozen=True)
class RunFolder:
    """The folder one run writes into (absolute path), locked while the run lives."""

    path: Path
    lock: RunLock | None = field(default=None, compare=False, repr=False)

    @classmethod
    def start(cls, results_dir: Path, run_name: str) -> RunFolder:
        """Create or reopen ``results_dir/run_name`` and take its lock (:mod:`.lock`).

        A finished run of the same name is never overwritten, and a run that is
        still going (a live process holds the lock) is never joined. The folder
        of an unfinished run that has a run catalog (``run.sqlite``) is kept, so
        the run resumes (see :mod:`runstore.catalog`); a folder that is not a
        run folder of this app is never touched (:meth:`check_free`). The lock
        is held until :meth:`finish` or the end of the process.

        Raises
        ------
        ConfigError
            ``run-name`` names a finished run, or a run that is still going.
        """
        path = cls.check_free(results_dir, run_name)
        path.mkdir(parents=True, exist_ok=True)
        lock = _lock(path)
        try:
            _refuse_finished(path)  # it may have finished meanwhile
            _refuse_foreign(path)
        except BaseException:
            lock.release()
            raise
        return cls(path, lock)

    @classmethod
    def reopen(cls, path: Path) -> RunFolder:
        """Lock the finished run's folder ``path`` for later requests (nothing is removed).

        Raises
        ------
        ConfigError
            No finished run of that name (no ``summary.json`` or no
            ``run.sqlite``), or a live process holds its lock.
        """
        if not (path / "summary.json").is_file() or not (path / "run.sqlite").is_file():
            raise ConfigError(f"run-config 'later-requests' = True is not allowed: "
                              f"{path} holds no finished run (summary.json and "
                              "run.sqlite)")
        return cls(path, _lock(path))

    @staticmethod
    def check_free(results_dir: Path, run_name: str) -> Path:
        """The run folder ``results_dir/run_name``, if a run may start there.

        Nothing is created. ``results_dir``: the resolved run-config ``results-dir``.

        Raises
        ------
        ConfigError
            The folder holds a finished run, or a live process holds its lock;
            ``results-dir`` is not a folder or lies inside a run folder; or the
            folder exists, is not empty and is no run folder of this app.
        """
        _check_results_dir(results_dir)
        path = results_dir / run_name
        _refuse_finished(path)
        _refuse_foreign(path)
        if (path / LOCK_NAME).exists() and not (path / LOCK_NAME).is_file():
            raise ConfigError(f"run-config 'run-name' = {path.name!r} is not allowed: "
                              f"{path / LOCK_NAME} is not a lock file")
        holder = RunLock.holder(path)
        if holder is not None:
            raise ConfigError(_busy(path, holder))
        return path

    @property
    def runlog_path(self) -> Path:
        """The run catalog ``run.sqlite``."""
        return self.path / "run.sqlite"

    def load_models(self, name: str, record: dict | None) -> list:
        """The shard models saved by :meth:`save_models`, as ArrayRecords.

        ``record`` is what :meth:`save_models` returned (SHA-256 and shard
        count); the file must match it.

        Raises
        ------
        ModelsFileError
            The file is missing, unreadable, not the one saved, or holds another
            number of shards (one line, naming the file).
        """
        from strategies.sharded import to_record, unpack_shards

        data = decode_arrays(self.verify_models(name, record))
        return unpack_shards(to_record(data), int(record["shards"]))

    def verify_models(self, name: str, record: dict | None) -> bytes:
        """The bytes of ``models/<name>.npz`` if they are the file ``record`` names.

        Raises
        ------
        ModelsFileError
            As :meth:`load_models`.
        """
        target = self.path / "models" / f"{name}.npz"
        try:
            raw = target.read_bytes()
        except OSError as err:
            raise ModelsFileError(f"{target}: cannot be read ({err.strerror}); restore "
                                  "it or remove the run folder to start again") from None
        if not isinstance(record, dict) or \
                hashlib.sha256(raw).hexdigest() != record.get("sha256"):
            raise ModelsFileError(f"{target} is not the file this run saved (SHA-256 "
                                  "differs or none recorded); restore it or remove the "
                                  "run folder to start again")
        return raw

    def history_dir(self, federation: str) -> Path:
        """Folder of the history store of ``federation`` (e.g. ``sharded``)."""
        return self.path / "history" / federation

    def save_models(self, name: str, models: list) -> dict:
        """Write a framework's shard models to ``models/<name>.npz`` atomically.

        ``models`` is a list of ArrayRecord; keys become ``shard<s>/<layer>``
        (:func:`strategies.sharded.pack_shards`), kept exactly with their dtypes
        and shapes whatever the layer names (:mod:`history.files`).
        Returns ``{"sha256": hex digest of the file, "shards": len(models)}``,
        for :meth:`load_models` to check.
        """
        from strategies.sharded import pack_shards

        arrays = {k: v.numpy() for k, v in pack_shards(models).items()}
        target = self.path / "models" / f"{name}.npz"
        atomic_write_arrays(target, arrays)
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        return {"sha256": digest, "shards": len(models)}

    def finish(self, summary: dict) -> Path:
        """Write ``summary.json`` atomically, drop the lock; return its absolute path.

        The file is strict JSON (:func:`strict_json`): a NaN or infinite number
        is written as null and named in ``summary["warnings"]``.
        """
        target = self.path / "summary.json"
        clean, bad = strict_json(summary)
        if bad:
            clean.setdefault("warnings", [])
            clean["warnings"] = list(clean["warnings"]) + [
                f"{where} was {value} (not a finite number), written as null"
                for where, value in bad]
        atomic_write(target, json.dumps(clean, indent=2, allow_nan=False).encode(),
                     readable_mode())
        self.release()
        return target

    def release(self) -> None:
        """Drop the run's lock (idempotent; the end of the process drops it too)."""
        if self.lock is not None:
            self.lock.release()


def strict_json(value: object, where: str = "summary") -> tuple[object, list]:
    """``value`` with every non-finite float replaced by None, and where they were.

    Returns
    -------
    tuple
        The cleaned copy (dicts and lists rebuilt) and a list of
        ``(path, value)`` pairs, path like ``summary.frameworks.SE.loss``.
    """
    bad: list = []

    def clean(item: object, at: str) -> object:
        if isinstance(item, float) and not math.isfinite(item):
            bad.append((at, item))
            return None
        if isinstance(item, dict):
            return {k: clean(v, f"{at}.{k}") for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [clean(v, f"{at}[{i}]") for i, v in enumerate(item)]
        return item

    return clean(value, where), bad


def _is_run_folder(path: Path) -> bool:
    return (path / "run.sqlite").exists() or (path / "summary.json").exists()


def _check_results_dir(root: Path) -> None:
    """``results-dir`` is a folder (or absent) and not inside a run folder."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"run-config 'results-dir' = {str(root)!r} is not allowed: "
                          "it is a file, not a folder")
    for parent in (root, *root.parents):
        if _is_run_folder(parent):
            raise ConfigError(
                f"run-config 'results-dir' = {str(root)!r} is not allowed: it is "
                f"inside the run folder {parent}; choose a folder outside any run")


def _refuse_foreign(path: Path) -> None:
    """Refuse an existing, non-empty folder that is not a run folder of this app."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run-config 'run-name' = {path.name!r} is not allowed: "
                          f"{path} is a file, not a run folder")
    if not path.is_dir() or (path / "run.sqlite").exists():
        return
    if any(p.name not in (LOCK_NAME, COMMAND_LOGS) for p in path.iterdir()):
        raise ConfigError(
            f"run-config 'run-name' = {path.name!r} is not allowed: {path} exists, "
            "is not empty and is not a run folder of this app (no run.sqlite); "
            "choose another run-name or results-dir")


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
    except OSError as err:  # e.g. run.lock is a folder, or not writable
        raise ConfigError(f"run-config 'run-name' = {path.name!r} is not allowed: "
                          f"cannot lock {path / LOCK_NAME} ({err.strerror})") from None


def _busy(path: Path, holder: str) -> str:
    return (f"run-config 'run-name' = {path.name!r} is not allowed: the run in {path} "
            f"is still going ({holder}); wait for it to end, stop it, or choose "
            "another run-name")
