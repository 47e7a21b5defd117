"""``run``: the app in Flower's simulation engine, one SuperNode per client.

Merges and checks the run config before anything starts (a bad value: one line
on stderr, exit status 2), then runs ``flwr run . --stream`` with a
``FLWR_HOME`` and ports of its own, so the background SuperLink it starts is
this run's alone; every process of the run is stopped at the end, also when
the command is terminated. The log file gets all of flwr's output; the terminal
gets it without known noise and with each warning once (:mod:`cli.terminal`),
then the result tables, the engine's shutdown lines, and last
``summary: <path>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cli import config
from cli.env import VERBOSE_HELP, free_ports, show_flower_lines
from cli.procs import Children, run_processes, tag_run, tee
from cli.progress import output_sink
from cli.terminal import SUMMARY, Parser, TerminalFilter, help_text
from runstore.folder import COMMAND_LOGS
from server_app.config import ConfigError, RunConfig
from server_app.preflight import check_stored, validate_run_config

# flwr gives its local SuperLink 15 s to start; on a loaded machine that can pass
NO_SUPERLINK = b"Failed to start local SuperLink"
START_ATTEMPTS = 3
# Ray's own future default (it warns at every start while the variable is unset):
# an actor with no GPU is not told CUDA_VISIBLE_DEVICES="". The task runs on the
# CPU either way; a value the user set is kept.
RAY_ENV = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


def parser(prog: str) -> argparse.ArgumentParser:
    """The ``run`` command's arguments."""
    ap = Parser(prog=prog, description=help_text(__doc__.split("\n\n")[0]))
    ap.add_config_options()
    ap.add_argument("--supernodes", type=int, default=None,
                    help="SuperNodes to simulate, at least num-clients (default: "
                    "num-clients; those beyond it are left out of the run)")
    ap.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return ap


def main(argv: list[str], prog: str = "python -m cli run") -> int:
    """Run the simulation; return the exit status (0 with a summary.json).

    Raises
    ------
    ConfigError
        A bad run config or run-name (nothing was started).
    """
    args = parser(prog).parse_args(argv)
    show_flower_lines(args.verbose)
    merged = run_folder_paths(absolute_paths(config.resolve(args.preset,
                                                            args.run_config)))
    merged, cfg, folder = checked_run(merged)
    supernodes = _supernodes(args.supernodes, cfg.data.num_clients)
    terminal = TerminalFilter()
    log_path, status = launch(merged.overrides, supernodes,
                              folder / COMMAND_LOGS, terminal,
                              gpus=cfg.training.client_gpus)
    return _finish(log_path, status, terminal)


def _supernodes(given: int | None, num_clients: int) -> int:
    """``--supernodes``, at least ``num-clients`` (ConfigError before any engine).

    Fewer SuperNodes than clients leave partitions without a node: discovery
    would wait out its timeout and fail inside the engine.
    """
    if given is None:
        return num_clients
    if given < num_clients:
        raise ConfigError(f"--supernodes {given} is not allowed: at least num-clients "
                          f"= {num_clients} (one SuperNode per client; more are left "
                          "out of the run)")
    return given


def launch(overrides: dict, supernodes: int, log_dir: Path,
           terminal: TerminalFilter, gpus: float = 0.0) -> tuple[Path, int]:
    """``flwr run .`` with ``overrides`` on ``supernodes`` simulated SuperNodes.

    The log is ``log_dir/run-<pid>.log`` (the run folder's ``logs/``). ``gpus``:
    each ClientApp's GPUs (run-config ``client-gpus``, :func:`federation_config`).
    Returns the log's path and flwr's exit status.
    """
    log_path = log_dir / f"run-{os.getpid()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr")) / f"sim-{os.getpid()}"
    home.mkdir(parents=True, exist_ok=True)
    try:
        (home / "run-config.toml").write_text(config.to_toml(overrides))
        print(f"flwr run . with {supernodes} SuperNodes; log: {log_path}", file=sys.stderr)
        federation = federation_config(supernodes, gpus)
        status = _run_with_retries(home, federation, log_path, terminal)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return log_path, status


def run_folder_paths(merged: config.Merged) -> config.Merged:
    """The run's name fixed now, and its clients' node folders in the run folder.

    The ServerApp would stamp a missing ``run-name`` itself; fixed here, the
    command knows the run folder. With coded storage ``node-dirs`` is
    ``<run folder>/nodes``: the clients' slices outlive the simulation, and a
    later request (``forget`` on the finished run) decodes them.
    """
    from server_app.config import RunConfig

    cfg = RunConfig.from_run_config(merged.config)
    fixed = {"run-name": cfg.resolved_run_name()}
    if cfg.storage.coded and not cfg.storage.node_dirs:
        fixed["node-dirs"] = str(cfg.output.resolved_results_dir() / fixed["run-name"]
                                 / "nodes")
    return config.Merged({**merged.config, **fixed}, {**merged.overrides, **fixed})


def absolute_paths(merged: config.Merged) -> config.Merged:
    """``data-dir``, ``results-dir`` and a profile file made absolute here.

    The ServerApp runs in another working directory, so a relative path given
    here must reach it resolved (``device-profile``: when it names a ``.toml``
    file, not a shipped profile).
    """
    fixed = {key: str(Path(str(merged.config[key])).expanduser().resolve())
             for key in ("data-dir", "results-dir") if merged.config.get(key)}
    profile = str(merged.config.get("device-profile") or "")
    if profile.endswith(".toml"):
        fixed["device-profile"] = str(Path(profile).expanduser().resolve())
    return config.Merged({**merged.config, **fixed}, {**merged.overrides, **fixed})


def preflight(run_config: dict) -> tuple[RunConfig, str]:
    """Parse and check the config with the task's data loaded (before any engine).

    Loading is cached and cheap for these datasets; with the data the partition
    check runs here, not after the SuperNodes started. A plug-in task is
    imported here too, from this command's ``PYTHONPATH`` (docs/TASKS.md).

    Returns
    -------
    (RunConfig, str)
        The settings and the dataset's folder (resolved).

    Raises
    ------
    ConfigError
        The first bad setting, in one line.
    """
    from server_app.preflight import load_run

    cfg = validate_run_config(run_config)
    check_client_gpus(cfg.training.client_gpus)
    data_dir, task = load_run(cfg)
    return validate_run_config(run_config, task), data_dir

def checked_run(merged: config.Merged) -> tuple[config.Merged, RunConfig, Path]:
    """Every check a run passes before any engine starts; its name and folder fixed.

    The settings with the data (:func:`preflight`); an unset ``run-name`` fixed
    (``<dataset>-<partition>-<UTC time>``, as the ServerApp would name it; the
    commands fix it before, :func:`run_folder_paths`), so the command knows the
    run folder; what that folder holds, if anything
    (:func:`server_app.preflight.check_stored`: lock, finished run, catalog,
    settings, models, history); no process of an earlier start of the run still
    alive (:func:`claim_run`). Nothing is written.

    Raises
    ------
    ConfigError
        One line naming what stops the run (exit status 2).
    """
    if merged.config.get("later-requests"):  # the forget command's own key
        raise ConfigError("run-config 'later-requests' = true is not allowed here: "
                          "`forget --run NAME --pending` sets it to carry out a "
                          "finished run's recorded requests")
    later = str(merged.config.get("forget-run") or "")
    if later:  # a finished run's requests: not a run of this command's
        raise ConfigError(
            f"run-config 'forget-run' = {later!r} is not allowed here: it asks a "
            "ServerApp submitted to a federation (`flwr run . <federation> --run-config "
            f"\"forget-run='{later}'\"`) to carry out that run's requests; from here: "
            f"`forget --run {later} --pending`")
    cfg, data_dir = preflight(merged.config)
    if not merged.config.get("run-name"):
        name = {"run-name": cfg.resolved_run_name()}
        merged = config.Merged({**merged.config, **name}, {**merged.overrides, **name})
        cfg = cfg.replace(run_name=name["run-name"])
    folder = check_stored(cfg, data_dir)
    claim_run(folder)
    return merged, cfg, folder


def claim_run(folder: Path) -> None:
    """Refuse while processes of an earlier start of the run live; tag ours.

    Children started from now on carry the run's tag (:func:`cli.procs.tag_run`),
    so a later start sees them (:func:`cli.procs.run_processes`).

    Raises
    ------
    ConfigError
        A process of an earlier start is alive (its command was killed a moment
        ago and its watchdog is still stopping it).
    """
    left = run_processes(folder)
    if left:
        raise ConfigError(
            f"run-config 'run-name' = {folder.name!r} is not allowed now: processes of "
            f"an earlier start of this run are still running (pids "
            f"{' '.join(map(str, left[:10]))}); they stop within seconds of their "
            "command's end: start it again then")
    tag_run(folder)


def check_client_gpus(gpus: float) -> None:
    """Refuse ``client-gpus`` > 0 where Ray would wait for a GPU that is not there.

    On a Ray cluster (``RAY_ADDRESS`` set) the GPUs may be on other machines, so
    it is left to Ray.

    Raises
    ------
    ConfigError
        ``client-gpus`` > 0 without CUDA on this machine and no Ray cluster.
    """
    if gpus <= 0 or os.environ.get("RAY_ADDRESS"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"run-config 'client-gpus' = {gpus!r} is not allowed: 0 on "
                          "a machine without CUDA (torch.cuda.is_available() is "
                          "False; Ray would wait for a GPU forever)")


def federation_config(supernodes: int, gpus: float = 0.0) -> str:
    """``--federation-config`` of ``flwr run``: SuperNodes and each ClientApp's resources.

    One CPU a ClientApp; ``gpus`` > 0 (run-config ``client-gpus``, fractional) is
    Flower's ``client-resources-num-gpus``: Ray then runs at most 1 / ``gpus``
    ClientApps on a GPU at once and tells each which GPU it has.
    """
    out = f"num-supernodes={supernodes} client-resources-num-cpus=1"
    return f"{out} client-resources-num-gpus={gpus:g}" if gpus > 0 else out


def _run_with_retries(home: Path, federation: str, log_path: Path,
                      terminal: TerminalFilter) -> int:
    """:func:`_flwr_run`, again (fresh ports) when the local SuperLink did not start.

    Nothing of the run started then, so starting again is safe; at most
    :data:`START_ATTEMPTS` tries.
    """
    for attempt in range(1, START_ATTEMPTS + 1):
        status = _flwr_run(home, federation, log_path, terminal)
        if status == 0 or NO_SUPERLINK not in log_path.read_bytes():
            return status
        if attempt < START_ATTEMPTS:
            print(f"flwr's local SuperLink did not start in time (a loaded machine?); "
                  f"starting again ({attempt + 1}/{START_ATTEMPTS})", file=sys.stderr)
    return status


def _flwr_run(home: Path, federation: str, log_path: Path,
              terminal: TerminalFilter) -> int:
    """``flwr run`` with its own FLWR_HOME and ports; output to the log and the terminal.

    The log gets every line; the terminal what ``terminal`` keeps
    (:mod:`cli.terminal`).
    """
    link_port, control_port = free_ports(2)
    env = {**RAY_ENV, **os.environ, "FLWR_HOME": str(home), "PYTHONUNBUFFERED": "1",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(link_port),
           "FLWR_LOCAL_CONTROL_API_PORT": str(control_port)}
    argv = ["flwr", "run", str(config.PROJECT), "--stream",
            "--run-config", str(home / "run-config.toml"), "--federation-config",
            federation]
    with Children() as children, open(log_path, "wb") as log, output_sink() as out:
        proc = children.start(argv, env=env, cwd=config.PROJECT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        terminal.out = out
        pump = tee(proc.stdout, terminal, log)
        status = proc.wait()
        pump.join(timeout=5)
    return status


def summary_path(log_path: Path) -> Path | None:
    """The last ``summary: <path>`` the log names, if that file exists."""
    found = SUMMARY.findall(log_path.read_bytes()) if log_path.is_file() else []
    path = Path(found[-1].decode()) if found else None
    return path if path is not None and path.is_file() else None


def _finish(log_path: Path, status: int, terminal: TerminalFilter) -> int:
    """The result tables, then the engine's held shutdown lines, then ``summary:``."""
    from cli import report

    summary = summary_path(log_path)
    if summary is None and terminal.failure is not None:  # the ServerApp's one line
        print(f"the run failed: {terminal.failure[1]} (see {log_path})", file=sys.stderr)
        return terminal.failure[0]
    if summary is None:
        terminal.release(sys.stdout.buffer)
        print(f"the run failed: no summary.json was written (flwr exit status {status}; "
              f"see {log_path})", file=sys.stderr)
        return 1
    sys.stdout.flush()
    report.main([str(summary)])
    sys.stdout.flush()
    terminal.release(sys.stdout.buffer)
    print(f"summary: {summary}", flush=True)
    return 0
