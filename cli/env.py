"""The environment every command runs in (defaults only: what is set stays)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from cli.config import PROJECT


def setup_env(environ: dict | None = None) -> dict:
    """Set the project's environment defaults in ``environ`` (``os.environ``).

    ``PATH`` gets this interpreter's ``bin`` (``flwr``, ``flower-superlink``)
    unless it is there already; ``FLWR_HOME`` = ``.flwr_home/``;
    ``SE_RESULTS_DIR`` = ``results/``; ``SE_DATA_DIR`` = ``../shared/data``
    when that exists; no runtime dependency installation, telemetry or update
    check; ``RAY_TMPDIR`` per user. These paths and ``PYTHONPATH``'s entries are
    made absolute against the current folder (the command's children run in the
    project folder). Folders are created.

    Returns
    -------
    dict
        ``environ``.
    """
    env = os.environ if environ is None else environ
    venv_bin = str(Path(sys.executable).parent)
    if venv_bin not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join(filter(None, [venv_bin, env.get("PATH", "")]))
    env.setdefault("FLWR_HOME", str(PROJECT / ".flwr_home"))
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"  # offline: no update look-up
    env.setdefault("RAY_TMPDIR", f"/tmp/ray-se-{os.getuid()}")
    env.setdefault("SE_RESULTS_DIR", str(PROJECT / "results"))
    shared = PROJECT.parent / "shared" / "data"
    if not env.get("SE_DATA_DIR") and shared.is_dir():
        env["SE_DATA_DIR"] = str(shared.resolve())
    # absolute: the command's children run in the project folder, not this one
    for key in ("FLWR_HOME", "RAY_TMPDIR", "SE_RESULTS_DIR", "SE_DATA_DIR"):
        if env.get(key):
            env[key] = str(Path(env[key]).expanduser().resolve())
    if env.get("PYTHONPATH"):  # a plug-in task or method (docs/TASKS.md)
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(p).expanduser().resolve()) if p else p
            for p in env["PYTHONPATH"].split(os.pathsep))
    for key in ("FLWR_HOME", "RAY_TMPDIR", "SE_RESULTS_DIR"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    return env


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (free when asked)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


VERBOSE_HELP = ("also Flower's per-shard strategy lines at INFO (configure_train: "
                "Sampled ..., aggregate_train: Received ...), each naming its shard; "
                "without it the run prints its own line per round and federation")


def show_flower_lines(verbose: bool, environ: dict | None = None) -> None:
    """``--verbose``: set ``SE_VERBOSE=1`` for the processes the command starts.

    The ServerApp inherits it (through ``flwr run`` and its local SuperLink in
    simulation, through the SuperLink in deployment), and its sharded strategies
    then keep Flower's per-shard lines (:func:`strategies.sharded.shard_lines`).
    Without ``verbose`` nothing is changed (a ``SE_VERBOSE`` set by the user stays).
    """
    from strategies.sharded import VERBOSE_ENV

    if verbose:
        (os.environ if environ is None else environ)[VERBOSE_ENV] = "1"


def back_to_caller(stays: bool = False) -> None:
    """Work in the folder ``./simulate.sh`` was called from (``$SE_CALLER_DIR``).

    ``simulate.sh`` changes to the project folder to install it; the paths a user
    types are relative to their own folder, and every process the command starts
    is given the project folder itself. ``stays``: keep to the project folder (the
    test suite), only clearing the variable.
    """
    caller = os.environ.pop("SE_CALLER_DIR", "")
    if caller and not stays and os.path.isdir(caller):
        os.chdir(caller)
