"""The pieces of a local deployment: SuperLink, SuperNodes, connection, run."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cli.procs import Children, tee
from cli.progress import output_sink, wait_bar
from cli.terminal import TerminalFilter

RUN_STARTED = re.compile(rb"Successfully started run (\d+)")
# files of the app bundle `flwr run` would build (it walks the whole folder first)
APP_SUFFIXES = (".py", ".toml", ".md", ".yaml", ".yml", ".json", ".jsonl")
APP_NAMES = {".gitignore", "LICENSE", "LICENSE.md", ".editorconfig"}


class DeployError(RuntimeError):
    """A process of the deployment did not start or died."""


@dataclass(frozen=True)
class Place:
    """Where a process of the deployment runs and how it is secured.

    ``host``: the address it binds (SuperLink) or its Runtime API binds
    (SuperNode); ``wrap``: argv prefix that runs it on its host (e.g. ``ip
    netns exec NS``; empty: this machine's own network); ``security``: its TLS
    and authentication arguments (default ``--insecure``); ``connect(host,
    port)``: whether a TCP connection to it succeeds from where it runs.
    """

    host: str = "127.0.0.1"
    wrap: tuple[str, ...] = ()
    security: tuple[str, ...] = ("--insecure",)
    connect: Callable[[str, int], bool] | None = None


LOOPBACK = Place()


@dataclass(frozen=True)
class SuperNodeOptions:
    """How the SuperNodes run (:mod:`cli.deploy`'s options).

    Attributes
    ----------
    isolation : str
        The SuperNodes' ``--isolation``: ``subprocess`` (each starts a cold
        ``flwr-clientapp`` per message itself) or ``process`` (they start none:
        :func:`start_executors` does, warm).
    node_poll_s : float
        Seconds between a SuperNode's pulls when idle; below 3 they run as
        :mod:`cli.supernode` (Flower's SuperNode, its 3-s idle wait capped at
        this), else as plain ``flower-supernode``.
    nice : int
        Niceness added to each SuperNode (:func:`niced`; :mod:`cli.deploy` gives
        the SuperLink the same); only with ``process`` isolation (with
        ``subprocess`` a SuperNode's ClientApps would inherit it).
    """

    isolation: str = "process"
    node_poll_s: float = 1.0
    nice: int = 0


NODE_DEFAULTS = SuperNodeOptions()
"""Process isolation, idle pulls every second, niceness 0."""


@dataclass(frozen=True)
class Partitions:
    """The partitions of the SuperNodes one call starts (their node-config).

    Attributes
    ----------
    first : int
        ``partition-id`` of the first SuperNode (a restart of one SuperNode);
        the k-th has ``first + k``.
    total : int, optional
        ``num-partitions`` (None: as many as SuperNodes started).
    client_data : Sequence[Path], optional
        ``client_data[k]``: the k-th SuperNode's own data folder (``client-data``,
        :mod:`task.client_folder`); None: each cuts its share from the dataset.
    """

    first: int = 0
    total: int | None = None
    client_data: Sequence[Path] | None = None


@dataclass(frozen=True)
class RunWatch:
    """When :func:`follow_run` stops early.

    Attributes
    ----------
    start : float
        ``time.monotonic()`` the time limit counts from.
    timeout_s : float
        Seconds after ``start`` to stop (0: no limit).
    watched : Sequence[subprocess.Popen]
        Processes (SuperLink, SuperNodes) whose death stops it.
    """

    start: float
    timeout_s: float
    watched: Sequence[subprocess.Popen] = ()


def start_superlink(children: Children, run_dir: Path, port: int,
                    nice: int = 0, place: Place = LOOPBACK,
                    database: Path | None = None, log_name: str = "superlink.log",
                    federation: str = "") -> subprocess.Popen:
    """``flower-superlink`` on ``place.host``:``port`` (one port serves every API).

    Without ``database`` its state stays in memory (Flower's default): the run
    dies with this SuperLink anyway, and with an SQLite file every request
    (each object of a message, each poll) went through SQLAlchemy: the
    SuperLink used 42 s of CPU in the 3-round deploy benchmark instead of
    16-20 s, taken from the clients' training on 2 cores
    (docs/results/deploy/README.md). With ``database`` (a file) a restarted
    SuperLink keeps its nodes and runs. ``nice``: see :func:`niced`. Its
    environment names the deployment layer's Grid hook (:func:`cli.polling_grid.hook_env`):
    its ServerApps pull replies every 0.2 s; the ServerApp alone changes no Flower global.
    ``federation``: the connection name that reaches it, which its runs record
    (``$SE_FEDERATION``, :mod:`server_app.rounds.engine`) so a later request goes back.

    Raises
    ------
    DeployError
        It exited or did not listen within 60 s.
    """
    from cli.polling_grid import hook_env
    from server_app.rounds.engine import FEDERATION_ENV

    env = {k: v for k, v in os.environ.items()  # only the HTTP APIs on --port
           if k not in ("FLWR_INTERNAL_GRPC_CONTROL_API", "FLWR_INTERNAL_GRPC_FLEET_API")}
    env = hook_env(env)  # its ServerApps poll replies every 0.2 s (cli.polling_grid)
    if federation:
        env[FEDERATION_ENV] = federation
    state = ["--database", str(database)] if database else []
    with open(run_dir / "logs" / log_name, "ab") as log:
        proc = children.start(
            [*place.wrap, "flower-superlink", *place.security, "--host", place.host,
             "--port", str(port), *state, "--disable-runtime-dependency-installation"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=niced(nice))
    say(f"SuperLink pid {proc.pid} on {place.host}:{port}; run folder {run_dir}")
    wait_for_port(port, proc, 60.0, "SuperLink", run_dir, place)
    return proc


def start_supernodes(children: Children, run_dir: Path, link: str,
                     ports: Sequence[int], *,
                     options: SuperNodeOptions = NODE_DEFAULTS,
                     places: Sequence[Place] | None = None,
                     partitions: Partitions = Partitions()) -> list[subprocess.Popen]:
    """One ``flower-supernode`` per port; SuperNode k has partition-id ``first + k``.

    ``options``: how they run (:class:`SuperNodeOptions`: isolation, idle poll
    seconds, niceness). ``places[k]`` (default: all :data:`LOOPBACK`) says where
    SuperNode k runs and its TLS / authentication arguments. ``partitions``: their
    partition ids, num-partitions and own data folders (:class:`Partitions`).
    """
    from cli.config import PROJECT

    isolation, node_poll_s = options.isolation, options.node_poll_s
    env = {**_thread_env(), "SE_NODE_POLL_S": str(node_poll_s)}
    command = (["flower-supernode"] if node_poll_s >= 3
               else [sys.executable, "-m", "cli.supernode"])
    places = places or [LOOPBACK] * len(ports)
    total, client_data = partitions.total, partitions.client_data
    procs = []
    for k, port in enumerate(ports):
        i, place = partitions.first + k, places[k]
        node_dir = run_dir / "nodes" / str(i)
        node_dir.mkdir(parents=True, exist_ok=True)
        node_config = (f'partition-id={i} num-partitions={total or len(ports)} '
                       f'node-dir="{node_dir}"')
        if client_data is not None:
            node_config += f' client-data="{client_data[k]}"'
        with open(run_dir / "logs" / f"supernode-{i}.log", "ab") as log:
            procs.append(children.start(
                [*place.wrap, *command, *place.security, "--superlink", link,
                 "--host", place.host, "--port", str(port), "--node-config", node_config,
                 "--isolation", isolation],
                env=env, cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=niced(options.nice if isolation == "process" else 0)))
    say(f"{len(procs)} SuperNodes ({isolation} isolation, pulls every "
         f"{min(node_poll_s, 3.0):g} s when idle), pids "
         f"{' '.join(str(p.pid) for p in procs)}, ports {' '.join(map(str, ports))}")
    return procs


def start_executors(children: Children, run_dir: Path, ports: Sequence[int],
                    slots: int = 0, places: Sequence[Place] | None = None,
                    first: int = 0) -> list[subprocess.Popen]:
    """One warm SuperExec (:mod:`cli.warm_exec`) per SuperNode Runtime API port.

    Each imports torch and Flower once and forks a ClientApp process per
    message; its output goes to ``logs/clientapp-<i>.log``. With ``slots`` > 0
    at most that many ClientApp processes run at once over all of them (files
    in ``<run>/slots``). They run in the project folder (for ``cli``); the
    ClientApp itself is loaded from the FAB. ``places[i]``: where SuperNode i
    runs (its executor runs there too); ``first``: its partition id.
    """
    from cli.config import PROJECT

    limit = ["--slots", str(slots), "--slots-dir", str(run_dir / "slots")] if slots else []
    places = places or [LOOPBACK] * len(ports)
    procs = []
    for k, port in enumerate(ports):
        i, place = first + k, places[k]
        with open(run_dir / "logs" / f"clientapp-{i}.log", "ab") as log:
            procs.append(children.start(
                [*place.wrap, sys.executable, "-m", "cli.warm_exec",
                 "--runtime-api-address", f"{place.host}:{port}", *limit],
                env=_thread_env(), cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL))
    say(f"{len(procs)} warm ClientApp executors "
         f"({f'at most {slots} ClientApps at once' if slots else 'no limit'}), pids "
         f"{' '.join(str(p.pid) for p in procs)}")
    return procs


def niced(nice: int):
    """A ``preexec_fn`` adding ``nice`` to a child's niceness; None for 0.

    The control plane (SuperLink and the ServerApp it starts, SuperNodes) at
    a positive niceness yields the cores to the clients' training, which
    runs one ClientApp process per core: its polls wait while a core is busy
    and run when it frees (CFS still gives each its share). The ClientApp
    processes (forked by :mod:`cli.warm_exec`) keep niceness 0.
    """
    return None if nice == 0 else functools.partial(os.nice, nice)


def _thread_env() -> dict:
    """``os.environ`` with one OpenMP / MKL thread unless set (N processes, few cores)."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS", "1")}


def wait_for_nodes(procs: Sequence[subprocess.Popen], ports: Sequence[int],
                   seconds: float, run_dir: Path,
                   places: Sequence[Place] | None = None) -> None:
    """Wait until every SuperNode listens on its port (a bar with the time left).

    Raises
    ------
    DeployError
        A SuperNode exited, or was not listening after ``seconds``.
    """
    progress, task = wait_bar("SuperNodes up", len(ports))
    start = time.monotonic()
    places = places or [LOOPBACK] * len(ports)
    try:
        for i, (proc, port) in enumerate(zip(procs, ports, strict=True)):
            left = max(1.0, seconds - (time.monotonic() - start))
            wait_for_port(port, proc, left, f"SuperNode {i}", run_dir, places[i])
            if progress is not None:
                progress.advance(task)
    finally:
        if progress is not None:
            progress.stop()
    say(f"{len(ports)} SuperNodes listening after {time.monotonic() - start:.1f} s")


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float, name: str,
                  run_dir: Path, place: Place = LOOPBACK) -> None:
    """Wait until ``place.host``:``port`` accepts connections while ``proc`` lives.

    Raises
    ------
    DeployError
        ``proc`` exited, or ``seconds`` passed.
    """
    connect = place.connect or _connects
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DeployError(f"{name} exited during start-up (see {run_dir}/logs)")
        if connect(place.host, port):
            return
        time.sleep(0.2)
    raise DeployError(f"{name} not listening on {place.host}:{port} after "
                      f"{seconds:.0f} s")


def _connects(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port),
                                                                timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def connection_entry(flwr_home: Path, name: str, address: str,
                     root_certificates: Path | None = None) -> Iterator[str]:
    """A ``[superlink.<name>]`` entry in ``flwr_home/config.toml`` while in use.

    Insecure, or TLS checked against ``root_certificates`` (a CA file).
    """
    path = flwr_home / "config.toml"
    security = (f'root-certificates = "{root_certificates}"' if root_certificates
                else "insecure = true")
    block = (f"\n# se-deploy begin {name}\n[superlink.{name}]\n"
             f'address = "{address}"\n{security}\n# se-deploy end {name}\n')
    with _config_lock(path):
        text = path.read_text() if path.exists() else '[superlink]\ndefault = "local"\n'
        path.write_text(text.rstrip("\n") + "\n" + block)
    try:
        yield name
    finally:
        tag = re.escape(name)
        pattern = re.compile(rf"\n?# se-deploy begin {tag}\n.*?# se-deploy end {tag}\n",
                             re.S)
        with _config_lock(path):
            text = path.read_text() if path.exists() else ""
            path.write_text(pattern.sub("\n", text, count=1).rstrip("\n") + "\n")


@contextlib.contextmanager
def _config_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(".config.toml.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def stage_app(out: Path) -> Path:
    """Copy the app's tracked files as ``flwr run .`` would bundle them.

    ``flwr run`` walks every file under the app folder before filtering (.venv
    alone: 10-15 s). Returns ``out``, or the project itself without git.
    """
    from cli.config import PROJECT

    try:
        names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"],
                               cwd=PROJECT, check=True, capture_output=True
                               ).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return PROJECT
    for name in filter(None, names):
        src = PROJECT / name
        if src.is_file() and not src.is_symlink() and (
                src.suffix in APP_SUFFIXES or src.name in APP_NAMES):
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out / name)
    return out if (out / "pyproject.toml").is_file() else PROJECT


def follow_run(children: Children, app: Path, name: str, run_config: Path, log: Path,
               watch: RunWatch, *, terminal: TerminalFilter | None = None,
               wrap: Sequence[str] = ()) -> int | None:
    """``flwr run app name --stream`` with its output in ``log`` and on stdout.

    Returns ``flwr``'s exit status, or None when stopped early (below).

    Stdout gets what ``terminal`` keeps (:mod:`cli.terminal`; default a fresh
    filter), the log every line.

    Stops early when a process of ``watch.watched`` (SuperLink, SuperNode) dies
    or ``watch.timeout_s`` seconds after ``watch.start`` (``time.monotonic``; 0:
    no limit). If the log stream is killed by a signal while the run goes on,
    follows it again with ``flwr log`` (up to 3 times). ``wrap``: argv prefix
    that runs ``flwr`` on the host it submits from (e.g. ``ip netns exec NS``).
    """
    argv = ["flwr", "run", str(app), name, "--stream", "--run-config", str(run_config)]
    say(f"flwr run {app} {name} --stream (log: {log})")
    terminal = terminal or TerminalFilter()
    with open(log, "ab") as sink, output_sink() as out:
        terminal.out = out
        for attempt in range(4):
            proc = children.start([*wrap, *argv], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
            pump = tee(proc.stdout, terminal, sink)
            while proc.poll() is None:
                if _stop_reason(watch, log.parent):
                    return None
                time.sleep(0.5)
            pump.join(timeout=5)
            text = log.read_bytes()
            started = RUN_STARTED.search(text)
            if b"summary: /" in text or proc.returncode >= 0 or not started or attempt == 3:
                if proc.returncode:
                    say(f"flwr exited with status {proc.returncode}")
                return proc.returncode
            say(f"the log stream was killed (signal {-proc.returncode}); following run "
                 f"{started.group(1).decode()} again")
            argv = ["flwr", "log", started.group(1).decode(), name, "--stream"]


def _stop_reason(watch: RunWatch, logs: Path) -> str | None:
    for proc in watch.watched:
        if proc.poll() is not None:
            say(f"process {proc.pid} (SuperLink or SuperNode) died; stopping "
                 f"(see {logs})")
            return "died"
    if watch.timeout_s > 0 and time.monotonic() - watch.start >= watch.timeout_s:
        say(f"no result after SE_DEPLOY_TIMEOUT={watch.timeout_s:.0f} s; stopping")
        return "timeout"
    return None


def say(text: str) -> None:
    """One ``deploy:`` line on stderr (the command's progress and notes)."""
    print(f"deploy: {text}", file=sys.stderr, flush=True)
