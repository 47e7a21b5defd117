"""One run of the suite on an engine: the app in process, or ``./simulate.sh``.

:func:`run_one` merges a :class:`~experiments.suites.RunSpec`'s run config as
``./simulate.sh`` would and runs it with ``inprocess`` (the app's own
``server_app.app.main`` on an in-process Grid, :mod:`experiments.grid`) or ``flwr``
(``./simulate.sh`` in Flower's Ray simulation engine); :mod:`experiments.run`
plans and schedules the runs.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from cli import config as cli_config
from cli.procs import Children
from experiments import suites
from experiments.suites import RunSpec

ROOT = suites.ROOT


def default_data_dir() -> str:
    """``$SE_DATA_DIR``, else ``../shared/data`` beside the project, else ``""``."""
    env = os.environ.get("SE_DATA_DIR", "")
    if env:
        return env
    shared = ROOT.parent / "shared" / "data"
    return str(shared) if shared.is_dir() else ""


def dataset_available(dataset: str, data_dir: str) -> str | None:
    """None when ``dataset`` can be loaded, else why not (one line)."""
    from task.builtin import resolve_data_dir

    try:
        resolve_data_dir(dataset, data_dir or None)
    except Exception as err:  # noqa: BLE001 - any failure means: skip, say why
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return None


class QuietFlower:
    """Send Flower's log to a file for the duration of a run (console: errors)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self):
        from flwr.supercore.logger import FLOWER_LOGGER

        self.logger = FLOWER_LOGGER
        self.levels = [(h, h.level) for h in self.logger.handlers]
        for handler, _ in self.levels:
            handler.setLevel(logging.ERROR)
        self.file = logging.FileHandler(self.path, mode="w")
        self.file.setLevel(logging.DEBUG)
        self.file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.logger.addHandler(self.file)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.file)
        self.file.close()
        for handler, level in self.levels:
            handler.setLevel(level)


def run_config_toml(config: dict) -> str:
    """``config`` as a flat TOML document for ``--run-config FILE``."""
    return cli_config.to_toml(config)


def run_one(spec: RunSpec, out: Path, data_dir: str, engine: str) -> Path:
    """Run ``spec`` with ``engine``; return its summary.json.

    The run config is merged as ``./simulate.sh`` merges it
    (:func:`cli.config.merge`: pyproject defaults < the spec's keys < the output
    folder's paths), so an unknown key fails before the run.

    Raises
    ------
    RuntimeError
        The run wrote no summary.json.
    ConfigError
        A key that is not in pyproject.toml.
    """
    paths = {"results-dir": str((out / "runs").resolve()), "run-name": spec.name}
    if data_dir:
        paths["data-dir"] = str(Path(data_dir).resolve())
    merged = cli_config.merge(cli_config.defaults(), [spec.config, paths])
    log_path = out / "logs" / f"{spec.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if engine == "inprocess":
        from experiments.grid import run_in_process

        with QuietFlower(log_path):
            return run_in_process(merged.config)
    if engine == "flwr":
        return _run_with_flwr(spec, merged, out, log_path)
    raise ValueError(f"engine {engine!r}: inprocess or flwr")


def _run_with_flwr(spec: RunSpec, merged: cli_config.Merged, out: Path,
                   log_path: Path) -> Path:
    """``./simulate.sh`` for one configuration, stopped with all it started."""
    toml = out / "configs" / f"{spec.name}.toml"
    toml.parent.mkdir(parents=True, exist_ok=True)
    toml.write_text(run_config_toml(merged.overrides))
    # a FLWR_HOME of its own: the run's SuperLink and apps live there
    env = {**os.environ, "FLWR_HOME": str((out / ".flwr_home").resolve())}
    with Children() as children, open(log_path, "w") as log:
        proc = children.start(
            [str(ROOT / "simulate.sh"), "--supernodes",
             str(merged.config["num-clients"]), "--run-config", str(toml)],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        status = proc.wait()
    path = out / "runs" / spec.name / "summary.json"
    if status or not path.is_file():
        raise RuntimeError(f"simulate.sh exited {status} without "
                           f"{path} (see {log_path})")
    return path
