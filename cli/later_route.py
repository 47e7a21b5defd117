"""Where a finished run's later request is carried out: the engine the run ran on.

A run records where it ran (:mod:`server_app.rounds.engine`). A run learned in
Flower's simulation engine takes its later requests there, as before
(:func:`cli.later.carry_out`). A run learned on the deployment engine takes them on
its own federation: ``forget`` submits ``flwr run <app> <federation>`` with
``forget-run`` (:mod:`server_app.forget_run`), so the live SuperNodes train and
read their own data and slices; the federation is the one the run recorded
(``$SE_FEDERATION`` on its SuperLink host) or ``--federation NAME``. A deployed run
is replayed in a private simulation on this machine (from this machine's copy of
every client's data) only when the operator names it: ``--engine simulation``; the
receipt then says so.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import tomllib
from dataclasses import dataclass
from pathlib import Path

from server_app.config import ConfigError
from server_app.rounds.engine import DEPLOYMENT, SIMULATION

ENGINES = (SIMULATION, "federation")
"""``forget --engine`` values: Flower's simulation here, or the run's federation."""


@dataclass(frozen=True)
class Route:
    """Where ``forget`` carries out a finished run's requests.

    Attributes
    ----------
    engine : str
        ``simulation`` or ``federation``.
    federation : str
        The ``[superlink.NAME]`` connection for ``federation`` ('' otherwise).
    """

    engine: str
    federation: str = ""


HERE = Route(SIMULATION)
"""Flower's simulation engine on this machine."""


def recorded_engine(folder: Path) -> dict:
    """The engine the run in ``folder`` recorded (``{}``: a run from before it did).

    Raises
    ------
    ConfigError
        The catalog's entry is not such an object (one line).
    """
    try:
        conn = sqlite3.connect(f"file:{folder / 'run.sqlite'}?mode=ro", uri=True)
    except sqlite3.Error:
        return {}
    try:
        row = conn.execute("SELECT value FROM settings WHERE key='engine'").fetchone()
    except sqlite3.Error:
        row = None
    finally:
        conn.close()
    if not row:
        return {}
    try:
        engine = json.loads(row[0])
    except (TypeError, ValueError):
        engine = None
    if not (isinstance(engine, dict) and isinstance(engine.get("kind"), str)
            and isinstance(engine.get("federation", ""), str)):
        raise ConfigError(f"{folder / 'run.sqlite'}: its 'engine' entry is not "
                          f"{{\"kind\": str, \"federation\": str}} ({str(row[0])[:60]!r}): "
                          "a damaged run catalog; restore it")
    return engine


def route(folder: Path, engine: str | None, federation: str | None) -> Route:
    """The route of ``folder``'s later requests, checked before anything is recorded.

    Parameters
    ----------
    folder : Path
        The finished run's folder.
    engine : str or None
        ``--engine``: ``simulation``, ``federation``, or None (the run's own).
    federation : str or None
        ``--federation NAME`` (implies ``federation``).

    Raises
    ------
    ConfigError
        A deployed run without a federation to go to (neither recorded nor
        given), ``--federation`` with ``--engine simulation``, or a connection
        name that the Flower configuration does not hold (one line).
    """
    if engine not in (None, *ENGINES):
        raise ConfigError(f"--engine {engine!r} is not allowed: one of "
                          f"{', '.join(ENGINES)}")
    if federation and engine == SIMULATION:
        raise ConfigError(f"--federation {federation!r} with --engine simulation: "
                          "give one of them")
    recorded = recorded_engine(folder)
    if engine == SIMULATION or (engine is None and not federation
                                and recorded.get("kind") != DEPLOYMENT):
        return Route(SIMULATION)
    name = federation or recorded.get("federation") or ""
    kind = recorded.get("kind") or SIMULATION
    ran = f"--run {folder.name!r} ran on the {kind} engine" + (
        f" (federation {recorded['federation']!r})" if recorded.get("federation") else "")
    if not name:
        raise ConfigError(f"{ran} and recorded no federation: name the one its "
                          "SuperNodes are on, --federation NAME (a [superlink.NAME] "
                          "entry of the Flower configuration), or replay it on this "
                          "machine from its copy of every client's data with --engine "
                          "simulation; nothing was recorded")
    known = connections()
    if name not in known:
        raise ConfigError(f"{ran}; {name!r} is not a connection of "
                          f"{config_file()} ({', '.join(sorted(known)) or 'none'}): "
                          "give --federation NAME, or --engine simulation to replay it "
                          "on this machine; nothing was recorded")
    return Route("federation", name)


def config_file() -> Path:
    """Flower's configuration file: ``$FLWR_HOME/config.toml`` (``~/.flwr``)."""
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr") / "config.toml"


def connections() -> set[str]:
    """The ``[superlink.NAME]`` connection names of :func:`config_file` ({} if none)."""
    try:
        data = tomllib.loads(config_file().read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return set()
    return set((data.get("superlink") or {}).keys())


_BOX = re.compile(r"^[│╭╰]")


def flwr_error(text: str) -> str:
    """``flwr``'s boxed error message as one line ('' if there is none)."""
    inside = [line.strip("│ ╭╮╰╯─").strip() for line in text.splitlines()
              if _BOX.match(line.strip())]
    words = " ".join(w for w in inside if w and not w.startswith("Error"))
    return re.sub(r"\s+", " ", words).strip()



def submit_to(folder: Path, federation: str, terminal) -> tuple[Path, int | None]:
    """``flwr run <app> <federation>`` with ``forget-run``: the run's own SuperNodes train.

    Submitted from this machine (the run's SuperLink host, where its folder is);
    the ServerApp there reads the run's stored settings
    (:mod:`server_app.forget_run`). Output goes to ``terminal``
    (:class:`cli.terminal.TerminalFilter`) and to the run's command log. Returns
    the log's path and ``flwr``'s exit status (None: stopped by
    ``SE_DEPLOY_TIMEOUT``).
    """
    import tempfile
    import time

    from cli import config
    from cli.deploy_parts import RunWatch, follow_run, stage_app
    from cli.procs import Children
    from runstore.folder import COMMAND_LOGS

    logs = folder / COMMAND_LOGS
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"run-{os.getpid()}.log"
    run_config = logs / f"forget-{os.getpid()}.toml"
    run_config.write_text(config.to_toml({"forget-run": folder.name,
                                          "results-dir": str(folder.parent)}))
    with tempfile.TemporaryDirectory(prefix="se-forget.") as tmp, Children() as children:
        watch = RunWatch(time.monotonic(),
                         float(os.environ.get("SE_DEPLOY_TIMEOUT") or 0))
        status = follow_run(children, stage_app(Path(tmp) / "app"), federation,
                            run_config, log, watch, terminal=terminal)
    return log, status


def unreachable(log: Path) -> str | None:
    """Why ``flwr run`` started no run (its error in one line), or None: it started one."""
    from cli.deploy_parts import RUN_STARTED

    text = log.read_bytes() if log.is_file() else b""
    if RUN_STARTED.search(text):
        return None
    return flwr_error(text.decode(errors="replace")) or "flwr run started no run"
