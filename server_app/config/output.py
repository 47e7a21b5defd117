"""Run-config section ``output``: where a run's folder is, and its name."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from server_app.config.values import RUN_NAME, bad
from task.section import Section


@dataclass(frozen=True)
class OutputConfig(Section):
    """The run folder ``<results-dir>/<run-name>/``.

    Attributes
    ----------
    results_dir : str
        Parent folder of run folders ('' = ``$SE_RESULTS_DIR`` or a user cache).
    run_name : str
        The run folder's name ('' = ``<dataset>-<partition>-<UTC time>``).
    """

    results_dir: str = ""
    run_name: str = ""

    def validate(self) -> None:
        """Raise :class:`ConfigError` unless ``run-name`` is a plain folder name."""
        if self.run_name and not RUN_NAME.fullmatch(self.run_name):
            raise bad("run-name", self.run_name,
                      "a plain folder name of 1..100 characters A-Z a-z 0-9 . _ - "
                      "(no leading dot)")

    def resolved_results_dir(self) -> Path:
        """Absolute results folder: ``results-dir``, ``$SE_RESULTS_DIR``, or a cache.

        ``flwr run`` may start the ServerApp in another working directory, so a
        relative path is made absolute against the current one and said in logs.
        """
        raw = self.results_dir or os.environ.get("SE_RESULTS_DIR", "")
        if not raw:
            raw = str(Path.home() / ".cache" / "sharding-eraser" / "results")
        return Path(raw).expanduser().resolve()
