"""A federation of separate network hosts on one machine, with TLS and node keys.

:class:`Federation` starts a SuperLink host and N SuperNode hosts, each in its
own network namespace with its own address on one private LAN
(:mod:`cli.netns`), all running the one ``.venv`` of this checkout by path:

- the SuperLink host ``superlink.se.test`` (10.231.0.1) runs
  ``flower-superlink`` on port 9093 with TLS (a certificate naming
  ``superlink.se.test``, signed by a CA made for the run: :mod:`cli.pki`) and
  ``--enable-supernode-auth``; the ServerApp runs there, and ``flwr`` is called
  there (the operator's seat);
- SuperNode host i ``node<i>.se.test`` (10.231.0.<i+2>) runs
  ``flower-supernode --superlink superlink.se.test:9093 --root-certificates
  <ca> --auth-supernode-private-key <key i>`` (its ECDSA P-384 key, registered
  before with ``flwr supernode register``), with its node-dir
  ``<run>/nodes/<i>``, and, with process isolation, its warm SuperExec
  (:mod:`cli.warm_exec`) next to it on the same host.

The SuperLink, SuperNode and executor starts are :mod:`cli.deploy_parts`'
(given a :class:`cli.deploy_parts.Place` per host). Leaving the ``with`` block
stops every process (:class:`cli.procs.Children`) and deletes every namespace
and veth; a run killed outright is cleaned by the watchdogs of both, and any
leftovers of earlier runs by :func:`cli.netns.remove_stale`. The run folder
holds ``pki/`` (CA, server and node keys, private keys 0600), ``logs/`` and
``nodes/``. ``./simulate.sh deploy N --hosts`` uses it (:mod:`cli.deploy`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from cli import netns, pki
from cli.deploy_parts import (
    NODE_DEFAULTS,
    DeployError,
    Partitions,
    Place,
    RunWatch,
    SuperNodeOptions,
    connection_entry,
    follow_run,
    stage_app,
    start_executors,
    start_superlink,
    start_supernodes,
    wait_for_nodes,
)
from cli.procs import Children
from cli.terminal import TerminalFilter

LINK_PORT = 9093
NODE_PORT = 9094
DOMAIN = "se.test"
LINK_NAME = "superlink"


class HostsError(DeployError):
    """The hosts could not be set up, or a ``flwr`` call on them failed."""


_FEDERATIONS = itertools.count(1)


class Federation:
    """A SuperLink host and ``nodes`` SuperNode hosts; a context manager.

    ``children``: where every process is started (stopped by its owner, and
    again by :meth:`close`). ``options`` (the SuperNodes' isolation, idle poll
    seconds and niceness, the SuperLink's niceness too:
    :class:`cli.deploy_parts.SuperNodeOptions`) and ``slots`` are
    :mod:`cli.deploy`'s options. ``database``: keep the SuperLink's
    state in ``<run>/superlink.db`` (a restarted SuperLink keeps nodes and
    runs). ``spare``: extra hosts with no SuperNode (``spare0``, ...) for
    checks that start one of their own. ``client_data[i]``: SuperNode i's own
    data folder (``client-data``), else it cuts its share from the dataset.

    Raises
    ------
    ValueError
        ``nodes`` < 1 or > 200.
    netns.NetnsError
        No root or no ``ip`` (one line), or a namespace could not be made.
    """

    def __init__(self, run_dir: Path, nodes: int, children: Children, *,
                 options: SuperNodeOptions = NODE_DEFAULTS, slots: int = 0,
                 database: bool = False, spare: int = 0,
                 client_data: Sequence[Path] | None = None) -> None:
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes = {nodes} is not allowed: use 1 to 200")
        self.run_dir, self.nodes, self.children = Path(run_dir), nodes, children
        self.options, self.slots = options, slots
        self.client_data = list(client_data) if client_data is not None else None
        self.database = self.run_dir / "superlink.db" if database else None
        self.pki_dir = self.run_dir / "pki"
        self.network = netns.Network(DOMAIN)
        self._stack = contextlib.ExitStack()
        self._stack.callback(self.network.close)
        try:
            self.link = self.network.add_host(LINK_NAME)
            self.hosts = [self.network.add_host(f"node{i}") for i in range(nodes)]
            self.spares = [self.network.add_host(f"spare{i}") for i in range(spare)]
            self.ca = pki.make_ca(self.pki_dir)
            self.server = pki.server_certificate(self.ca, self.pki_dir, self.link.name,
                                                 addresses=(self.link.address,))
            self.keys = [pki.node_key(self.pki_dir / f"node{i}.key")
                         for i in range(nodes)]
        except BaseException:
            self.close()
            raise
        self.address = f"{self.link.name}:{LINK_PORT}"
        self.node_ids: list[int] = []
        self.connection = ""
        # runs record it; one per federation, also several in one process
        self.connection_name = f"se-hosts-{os.getpid()}-{next(_FEDERATIONS)}"
        self.superlink: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen | None] = [None] * nodes
        self.executors: list[subprocess.Popen | None] = [None] * nodes

    # --- places -------------------------------------------------------------

    def link_place(self) -> Place:
        """Where the SuperLink runs: its host, TLS and node authentication."""
        return Place(self.link.address, tuple(self.link.wrap()),
                     ("--ssl-ca-certfile", str(self.ca.cert),
                      "--ssl-certfile", str(self.server.cert),
                      "--ssl-keyfile", str(self.server.key), "--enable-supernode-auth"),
                     self.link.connect)

    def node_place(self, i: int) -> Place:
        """Where SuperNode ``i`` runs: its host, the CA it trusts, its key."""
        host = self.hosts[i]
        return Place("127.0.0.1", tuple(host.wrap()),
                     ("--root-certificates", str(self.ca.cert),
                      "--auth-supernode-private-key", str(self.keys[i].key)),
                     host.connect)

    # --- start --------------------------------------------------------------

    def start(self, seconds: float = 120.0) -> Federation:
        """SuperLink, connection entry, registration, SuperNodes and executors.

        Raises
        ------
        DeployError
            A process exited or did not listen in time.
        HostsError
            ``flwr supernode register`` failed.
        """
        self.start_link()
        self.connection = self._stack.enter_context(connection_entry(
            Path(os.environ["FLWR_HOME"]), self.connection_name, self.address,
            self.ca.cert))
        self.node_ids = [self.register(key.cert) for key in self.keys]
        _say(f"{self.nodes} SuperNode keys registered: node ids "
             f"{' '.join(map(str, self.node_ids))}")
        for i in range(self.nodes):
            self.start_node(i, wait=False)
        wait_for_nodes(self.supernodes, [NODE_PORT] * self.nodes, seconds, self.run_dir,
                       [self.node_place(i) for i in range(self.nodes)])
        if self.options.isolation == "process":
            for i in range(self.nodes):
                self._start_executor(i)
        return self

    def start_link(self) -> subprocess.Popen:
        """Start (or restart) the SuperLink on its host; wait until it listens."""
        self.superlink = start_superlink(self.children, self.run_dir, LINK_PORT,
                                         self.options.nice, self.link_place(),
                                         self.database, federation=self.connection_name)
        return self.superlink

    def start_node(self, i: int, wait: bool = True) -> subprocess.Popen:
        """Start (or restart) SuperNode ``i`` (and its executor, with ``wait``)."""
        data = None if self.client_data is None else [self.client_data[i]]
        (proc,) = start_supernodes(
            self.children, self.run_dir, self.address, [NODE_PORT], options=self.options,
            places=[self.node_place(i)],
            partitions=Partitions(first=i, total=self.nodes, client_data=data))
        self.supernodes[i] = proc
        if wait:
            wait_for_nodes([proc], [NODE_PORT], 60.0, self.run_dir, [self.node_place(i)])
            if self.options.isolation == "process":
                self._start_executor(i)
        return proc

    def _start_executor(self, i: int) -> None:
        (self.executors[i],) = start_executors(self.children, self.run_dir, [NODE_PORT],
                                               self.slots, [self.node_place(i)], first=i)

    # --- operations ---------------------------------------------------------

    def flwr(self, *args: str, timeout_s: float = 60.0,
             check: bool = True) -> subprocess.CompletedProcess:
        """``flwr ARGS`` on the SuperLink host (the operator's seat).

        Raises
        ------
        HostsError
            With ``check``: it exited non-zero or took over ``timeout_s``.
        """
        try:
            proc = subprocess.run([*self.link.wrap(), "flwr", *args], capture_output=True,
                                  text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as err:
            raise HostsError(f"flwr {' '.join(args)}: no answer in {timeout_s:.0f} s"
                             ) from err
        if check and proc.returncode:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["?"]
            raise HostsError(f"flwr {' '.join(args)} exited {proc.returncode}: {tail[0]}")
        return proc

    def register(self, public_key: Path) -> int:
        """``flwr supernode register KEY``; returns the node id.

        Raises
        ------
        HostsError
            Refused, or no node id in its answer.
        """
        out = self.flwr("supernode", "register", str(public_key), self.connection,
                        "--format", "json").stdout
        try:
            return int(json.loads(out[out.index("{"):])["node-id"])
        except (ValueError, KeyError) as err:
            raise HostsError(f"flwr supernode register {public_key}: no node id in "
                             f"{out.strip()[-200:]!r}") from err

    def unregister(self, node_id: int) -> None:
        """``flwr supernode unregister NODE_ID`` (HostsError when refused)."""
        self.flwr("supernode", "unregister", str(node_id), self.connection)

    def listed_nodes(self) -> dict[int, str]:
        """``flwr supernode ls``: node id -> status (``online``, ``offline``, ...)."""
        out = self.flwr("supernode", "ls", self.connection, "--format", "json").stdout
        data = json.loads(out[out.index("{"):])
        return {int(n["node-id"]): str(n.get("status", "")) for n in data["nodes"]}

    def run(self, run_config: Path, log: Path, timeout_s: float = 0.0,
            terminal: TerminalFilter | None = None, app: Path | None = None
            ) -> Path | None:
        """``flwr run`` from the SuperLink host with ``run_config`` (a TOML file).

        Returns the ``summary.json`` path its log names, or None (the run failed,
        a watched process died or ``timeout_s`` passed: see ``log``).
        """
        from cli.config import PROJECT
        from cli.simulation import summary_path

        app = app or (stage_app(self.run_dir / "app") if os.environ.get(
            "SE_DEPLOY_STAGE", "1") == "1" else PROJECT)
        watched = [p for p in (self.superlink, *self.supernodes) if p is not None]
        follow_run(self.children, app, self.connection, run_config, log,
                   RunWatch(time.monotonic(), timeout_s, watched), terminal=terminal,
                   wrap=self.link.wrap())
        return summary_path(log)

    def wait_online(self, seconds: float = 60.0) -> bool:
        """Wait until ``flwr supernode ls`` lists every SuperNode online; the result."""
        def online() -> bool:
            try:
                listed = self.listed_nodes()
            except HostsError:  # the SuperLink is (re)starting
                return False
            return all(listed.get(n) == "online" for n in self.node_ids)

        return wait_until(online, seconds, 1.0)

    def kill_host(self, i: int) -> list[int]:
        """SIGKILL every process on SuperNode host ``i`` (a host crash); their pids."""
        pids = netns.namespace_pids(self.hosts[i].netns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in (self.supernodes[i], self.executors[i]):
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        return pids

    def restart_node(self, i: int, seconds: float = 120.0) -> subprocess.Popen:
        """Start SuperNode ``i`` again once the SuperLink has taken it as offline.

        A node that died without deactivating stays online for the SuperLink
        until two heartbeat intervals pass, and a new start with its key is
        refused until then (``activate-node`` 412, exit 305).

        Raises
        ------
        HostsError
            Still listed online after ``seconds``.
        """
        node = self.node_ids[i]
        if not wait_until(lambda: self.listed_nodes().get(node) != "online", seconds,
                          1.0):
            raise HostsError(f"SuperNode {i} (node {node}) still online for the "
                             f"SuperLink after {seconds:.0f} s")
        return self.start_node(i)

    def kill_link(self) -> None:
        """SIGKILL every process on the SuperLink host (the ServerApp too)."""
        for pid in netns.namespace_pids(self.link.netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.superlink is not None:
            self.superlink.wait(timeout=10)

    def close(self) -> None:
        """Remove the connection entry and the network (its processes too); idempotent."""
        self._stack.close()

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_until(test, seconds: float, step_s: float = 0.5) -> bool:
    """Poll ``test()`` until it is true or ``seconds`` pass; its last value."""
    deadline = time.monotonic() + seconds
    while True:
        value = test()
        if value or time.monotonic() >= deadline:
            return bool(value)
        time.sleep(step_s)


def _say(text: str) -> None:
    import sys

    print(f"hosts: {text}", file=sys.stderr, flush=True)
