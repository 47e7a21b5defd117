"""``deploy``: the app on Flower's deployment engine, all on 127.0.0.1.

Starts one ``flower-superlink`` and N ``flower-supernode``s (default 8;
SuperNode i gets ``--node-config "partition-id=i num-partitions=N
node-dir=<run>/nodes/i"``), adds a ``[superlink.<name>]`` entry for them to
``$FLWR_HOME/config.toml``, runs ``flwr run <app> <name> --stream`` and stops
every process it started (also on failure, Ctrl-C and SIGTERM). With
``--isolation process`` (the default) the SuperNodes start no ClientApp
process themselves; a warm SuperExec per SuperNode (:mod:`cli.warm_exec`)
forks one per message, so torch is imported once per node, not once per
message; ``--isolation subprocess`` is Flower's own cold start. Run settings:
pyproject defaults < deploy defaults (num-clients=N, num-shards=2,
clients-per-round=4, as far as N allows) < preset < --run-config (later wins);
num-clients is always N. Prints the summary tables, the wall time and, last,
``summary: <path>``; exits non-zero when no summary.json was written. The run
folder (logs, SuperLink database, node dirs) is removed after a successful run
unless --keep is given. Environment: SE_DEPLOY_DIR (parent of the run folder;
default $TMPDIR or /tmp), SE_DEPLOY_TIMEOUT (seconds for the whole run; default
0 = no limit), SE_DEPLOY_STAGE=0 (run on the working tree instead of a copy of
the app's files).

With ``--hosts`` the SuperLink and every SuperNode run on separate network
hosts (Linux network namespaces on one private LAN, :mod:`cli.hosts`): TLS
with a certificate naming the SuperLink's host, SuperNode keys registered with
``flwr supernode register`` and ``--enable-supernode-auth``. Needs root and
iproute2 ``ip``; a one-line error otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from cli import config
from cli.deploy_parts import (
    DeployError,
    RunWatch,
    SuperNodeOptions,
    connection_entry,
    follow_run,
    say,
    stage_app,
    start_executors,
    start_superlink,
    start_supernodes,
    wait_for_nodes,
)
from cli.env import VERBOSE_HELP, free_ports, show_flower_lines
from cli.procs import Children
from cli.simulation import absolute_paths, checked_run, summary_path
from cli.terminal import Parser, TerminalFilter, help_text
from server_app.config import ConfigError

ISOLATIONS = ("process", "subprocess")
CONTROL_NICE = 5
"""Default niceness of the control plane: client compute 1.02x the simulation's,
not 1.10x, in 4 + 6 runs of benchmarks/deploy_bench.py (docs/results/deploy)."""


def parser(prog: str) -> argparse.ArgumentParser:
    """The ``deploy`` command's arguments."""
    ap = Parser(prog=prog, description=help_text(__doc__),
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("nodes", nargs="?", type=_positive, default=8, metavar="N",
                    help="SuperNodes (= num-clients; default 8)")
    ap.add_config_options()
    ap.add_argument("--keep", action="store_true", help="keep the run folder")
    ap.add_argument("--hosts", action="store_true",
                    help="separate network hosts (one namespace each, needs root): "
                    "TLS and SuperNode authentication across a private LAN")
    ap.add_argument("--isolation", choices=ISOLATIONS, default="process",
                    help="process (default): a warm SuperExec per SuperNode forks a "
                    "ClientApp process per message (torch imported once); "
                    "subprocess: Flower's own, a cold flwr-clientapp per message")
    ap.add_argument("--clientapp-slots", type=_count, default=_cores(), metavar="K",
                    help="process isolation: at most K ClientApp processes at once "
                    "over all SuperNodes (default: the CPUs this process may use, "
                    "as the simulation's one CPU per client; 0 = no limit)")
    ap.add_argument("--control-nice", type=_niceness, default=CONTROL_NICE, metavar="N",
                    help="niceness of the SuperLink (and the ServerApp it starts) and, "
                    f"with process isolation, the SuperNodes, 0-19 (default {CONTROL_NICE}"
                    "): the ClientApps' training (niceness 0) goes first on few cores; "
                    "0 = as started")
    ap.add_argument("--node-poll", type=_seconds, default=1.0, metavar="S",
                    help="seconds an idle SuperNode waits between pulls (default 1; "
                    "3 or more: Flower's own flower-supernode, which waits 3 s)")
    ap.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return ap


def deploy_config(nodes: int, preset: str | None, items: list[str]) -> config.Merged:
    """The merged run config of a deployment with ``nodes`` SuperNodes.

    A preset's topology is shrunk to fit (said on stderr); values given with
    ``--run-config`` are kept as given (a misfit is then a ConfigError).

    Raises
    ------
    ConfigError
        ``--run-config`` sets num-clients other than N, or a merge error.
    """
    shards = min(2, _most_shards(nodes))
    layers: list = [{"num-clients": nodes, "num-shards": shards,
                     "clients-per-round": min(4, shards * (nodes // shards))}]
    preset_values = {} if preset is None else config.parse_item(
        str(config.preset_path(preset)))
    if preset_values.get("num-clients", nodes) != nodes:
        say(f"preset sets num-clients={preset_values['num-clients']}; using "
             f"num-clients={nodes} (one per SuperNode)")
    layers.append(preset_values)
    explicit: set[str] = set()
    for item in items:
        given = config.parse_item(item)
        if given.get("num-clients", nodes) != nodes:
            raise ConfigError(
                f"run-config 'num-clients' = {given['num-clients']} is not allowed: "
                f"there are {nodes} SuperNodes; pass N={given['num-clients']} instead")
        layers.append(given)
        explicit |= set(given)
    merged = config.resolve(None, [*layers, {"num-clients": nodes}])
    for key in ("forget-clients", "forget-records"):
        if key not in explicit:
            _check_preset_clients(preset, key, preset_values.get(key), nodes)
    fit = _shrink(merged.config, nodes, explicit)
    if not merged.config["run-name"]:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        task = str(merged.config.get("task") or merged.config["dataset"])
        fit["run-name"] = (f"{task.replace(':', '.')}-{merged.config['partition']}-"
                           f"deploy{nodes}-{stamp}-{os.getpid()}")
    return config.Merged({**merged.config, **fit}, {**merged.overrides, **fit})


def _most_shards(nodes: int) -> int:
    """Most shards for N clients that leave a shard of two clients (N - 1; 1 for N = 1).

    A generated unlearning request forgets a client of a shard that keeps
    another, so with N shards of one client each no request could be drawn.
    """
    return max(1, nodes - 1)


def _check_preset_clients(preset: str | None, key: str, forget: object,
                          nodes: int) -> None:
    """A preset's ``forget-clients`` (or ``forget-records``) must name ids below N.

    Raises
    ------
    ConfigError
        Naming the preset, the key, N and the two ways out (more SuperNodes, or
        ``--run-config`` with other ids).
    """
    ids = preset_clients(key, forget)
    if ids and max(ids) >= nodes:
        raise ConfigError(
            f"preset {preset!r} sets {key} = {forget!r}, partition ids up to "
            f"{max(ids)}, and deploy {nodes} has partition ids 0..{nodes - 1}: pass "
            f"N >= {max(ids) + 1}, or --run-config \"{key}='...'\" with ids "
            f"below {nodes}")


def preset_clients(key: str, value: object) -> list[int]:
    """The partition ids a ``forget-clients`` or ``forget-records`` value names.

    A value that does not parse names none here (the run-config checks refuse it).
    """
    from task.records import parse_records

    text = str(value or "")
    if key == "forget-records":
        try:
            return sorted(parse_records(text))
        except ValueError:
            return []
    return [int(p) for p in text.split(",") if p.strip().isdigit()]


def _shrink(cfg: dict, nodes: int, explicit: set[str]) -> dict:
    """num-shards and clients-per-round shrunk to N SuperNodes (not explicit ones).

    num-shards at most :func:`_most_shards` (one shard can serve a request);
    clients-per-round a multiple of num-shards that the shards can give.
    """
    fit: dict = {}
    shards, cpr = cfg["num-shards"], cfg["clients-per-round"]
    most = _most_shards(nodes)
    if "num-shards" not in explicit and isinstance(shards, int) and shards > most:
        say(f"num-shards {shards} -> {most} (N = {nodes}: a shard of two clients "
             "can serve an unlearning request)")
        fit["num-shards"] = shards = most
    if "clients-per-round" not in explicit and isinstance(shards, int) and shards >= 1 \
            and isinstance(cpr, int):
        new = max(shards, min(cpr, shards * (nodes // shards)) // shards * shards)
        if new != cpr:
            say(f"clients-per-round {cpr} -> {new} ({shards} shards of "
                 f"{nodes // shards} clients)")
            fit["clients-per-round"] = new
    return fit


def main(argv: list[str], prog: str = "python -m cli deploy") -> int:
    """Run the deployment; return the exit status (0 with a summary.json).

    A run the ServerApp stopped with its one marked line
    (:mod:`server_app.failures`) exits with that line's status; another failure 1.

    Raises
    ------
    ConfigError
        A bad run config or run-name (nothing was started).
    """
    start = time.monotonic()
    args = parser(prog).parse_args(argv)
    show_flower_lines(args.verbose)
    if args.hosts:
        from cli.netns import unavailable

        reason = unavailable()
        if reason:
            raise ConfigError(f"--hosts: {reason}")
    merged, _, _ = checked_run(absolute_paths(
        deploy_config(args.nodes, args.preset, args.run_config)))
    if shutil.which("flower-superlink") is None:
        raise ConfigError("no flower-superlink on PATH: run ./simulate.sh once to "
                          "create .venv")

    say("run config: " + config.describe(merged.overrides))
    run_dir = _run_dir()
    ok = False
    terminal = TerminalFilter()
    try:
        (run_dir / "run-config.toml").write_text(config.to_toml(merged.overrides))
        summary = (_deploy_hosts if args.hosts else _deploy)(
            run_dir, args.nodes, start, args.isolation, args.clientapp_slots,
            args.node_poll, args.control_nice, terminal)
        ok = summary is not None
    finally:
        if ok and not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            say(f"run folder kept: {run_dir} (logs/)")
    if not ok and terminal.failure is not None:  # the ServerApp's one line, its status
        print(f"the run failed: {terminal.failure[1]} (see {run_dir / 'logs'})",
              file=sys.stderr)
        return terminal.failure[0]
    if not ok:
        terminal.release(sys.stdout.buffer)
        return 1
    from cli import report

    sys.stdout.flush()
    report.main([str(summary)])
    sys.stdout.flush()
    terminal.release(sys.stdout.buffer)  # the engine's shutdown lines, after the tables
    where = "separate hosts, TLS" if args.hosts else "127.0.0.1"
    print(f"deploy wall time: {time.monotonic() - start:.1f} s ({args.nodes} SuperNodes, "
          f"{where}, start-up to result)")
    print(f"summary: {summary}", flush=True)
    return 0


def _deploy(run_dir: Path, nodes: int, start: float, isolation: str = "process",
            slots: int = 0, node_poll_s: float = 1.0, nice: int = 0,
            terminal: TerminalFilter | None = None) -> Path | None:
    """SuperLink, SuperNodes (and warm executors), the run; all stopped after.

    ``flwr run``'s output reaches stdout through ``terminal`` (:mod:`cli.terminal`).
    """
    log = run_dir / "logs" / "flwr-run.log"
    ports = free_ports(nodes + 1)
    link = f"127.0.0.1:{ports[0]}"
    timeout_s = float(os.environ.get("SE_DEPLOY_TIMEOUT") or 0)
    options = SuperNodeOptions(isolation, node_poll_s, nice)
    with Children() as children:
        try:
            procs = [start_superlink(children, run_dir, ports[0], nice,
                                     federation=f"se-deploy-{ports[0]}"),
                     *start_supernodes(children, run_dir, link, ports[1:],
                                       options=options)]
            wait_for_nodes(procs[1:], ports[1:], 120.0, run_dir)
            if isolation == "process":
                procs += start_executors(children, run_dir, ports[1:], slots)
        except DeployError as err:
            say(str(err))
            return None
        with connection_entry(Path(os.environ["FLWR_HOME"]), f"se-deploy-{ports[0]}",
                              link) as name:
            app = stage_app(run_dir / "app") if os.environ.get(
                "SE_DEPLOY_STAGE", "1") == "1" else config.PROJECT
            follow_run(children, app, name, run_dir / "run-config.toml", log,
                       RunWatch(start, timeout_s, procs), terminal=terminal)
    summary = summary_path(log)
    if summary is None:
        say(f"the run failed: no summary.json was written (see {log})")
        expired = sum(p.read_text(errors="replace").count(
            "task-token authentication failed")
            for p in (run_dir / "logs").glob("supernode-*.log"))
        if expired:
            say(f"{expired} ClientApp calls were refused with an expired task token: "
                 "ClientApp processes took longer than Flower's 30 s start window "
                 "(an overloaded machine? try fewer SuperNodes)")
    return summary


def _deploy_hosts(run_dir: Path, nodes: int, start: float, isolation: str = "process",
                  slots: int = 0, node_poll_s: float = 1.0, nice: int = 0,
                  terminal: TerminalFilter | None = None) -> Path | None:
    """As :func:`_deploy`, on separate network hosts (:class:`cli.hosts.Federation`)."""
    from cli.hosts import Federation
    from cli.netns import NetnsError

    log = run_dir / "logs" / "flwr-run.log"
    timeout_s = float(os.environ.get("SE_DEPLOY_TIMEOUT") or 0)
    with Children() as children:
        try:
            fed = Federation(run_dir, nodes, children, slots=slots,
                             options=SuperNodeOptions(isolation, node_poll_s, nice))
        except NetnsError as err:
            say(f"--hosts: {err}")
            return None
        with fed:
            try:
                fed.start()
            except DeployError as err:
                say(str(err))
                return None
            summary = fed.run(run_dir / "run-config.toml", log,
                              max(1.0, timeout_s - (time.monotonic() - start))
                              if timeout_s else 0.0, terminal)
    if summary is None:
        say(f"the run failed: no summary.json was written (see {log})")
    return summary


def _run_dir() -> Path:
    """A fresh run folder under SE_DEPLOY_DIR (default $TMPDIR or /tmp)."""
    parent = Path(os.environ.get("SE_DEPLOY_DIR") or tempfile.gettempdir()).resolve()
    parent.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="se-deploy.", dir=parent))
    if any(c in str(run_dir) for c in " \t\n\"'\\"):
        run_dir.rmdir()
        raise ConfigError(f"run folder {str(run_dir)!r} has spaces or quotes (it goes "
                          "into --node-config): set SE_DEPLOY_DIR to a plain path")
    for sub in ("logs", "nodes"):
        (run_dir / sub).mkdir()
    return run_dir


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"N must be a positive integer, got {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"K must be an integer >= 0, got {text!r}")
    return int(text)


def _niceness(text: str) -> int:
    if not text.isdigit() or int(text) > 19:
        raise argparse.ArgumentTypeError(f"N must be a niceness 0-19, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"S must be seconds > 0, got {text!r}")
    return value


def _cores() -> int:
    """CPUs this process may run on (affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
