"""The run's results folder: ``<results-dir>/<run-name>/``.

It holds ``history/<federation>/`` (the stores) and, once the run has finished,
``summary.json``, written last and atomically: a folder without it is a run that
did not finish.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from history.store import atomic_write, decode_arrays, encode_arrays
from server_app.config import ConfigError, RunConfig


@dataclass(frozen=True)
class RunFolder:
    """The folder one run writes into (absolute path)."""

    path: Path

    @classmethod
    def start(cls, cfg: RunConfig) -> RunFolder:
        """Create the run folder.

        A finished run of the same name is never overwritten. The folder of an
        unfinished run that has a run catalog (``run.sqlite``) is kept, so the run
        resumes (see :mod:`server_app.runlog`); any other unfinished folder is
        moved aside to ``<name>.failed-<time>``.

        Raises
        ------
        ConfigError
            ``run-name`` names a finished run.
        """
        path = cfg.resolved_results_dir() / cfg.resolved_run_name()
        if (path / "summary.json").exists():
            raise ConfigError(
                f"run-config 'run-name' = {path.name!r} is not allowed: {path} holds "
                "a finished run; choose another run-name or remove that folder")
        if (path / "run.sqlite").exists():
            return cls(path)
        if path.exists():
            path.rename(path.with_name(f"{path.name}.failed-{int(time.time())}"))
        path.mkdir(parents=True)
        return cls(path)

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
        target.parent.mkdir(exist_ok=True)
        atomic_write(target, encode_arrays(arrays))
        return target

    def finish(self, summary: dict) -> Path:
        """Write ``summary.json`` atomically; return its absolute path."""
        target = self.path / "summary.json"
        atomic_write(target, json.dumps(summary, indent=2).encode())
        return target
