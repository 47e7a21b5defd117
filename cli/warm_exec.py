"""A SuperExec whose ClientApp processes start warm (``python -m cli.warm_exec``).

With ``flower-supernode --isolation process`` the SuperNode starts no ClientApp
process itself: a SuperExec next to it acquires each task from the SuperNode's
Runtime API and starts a ``flwr-clientapp`` process for it, which runs one
message and exits (Flower 1.42 offers no long-lived ClientApp process:
``flwr_exit`` ends the process after each task). Flower's own SuperExec
starts that process cold, so every message pays the import of torch and Flower
(5-10 s on a loaded 2-core machine). This one imports them once and forks a
child per task; the child runs Flower's own ClientApp process body
(:func:`flwr.supernode.runtime.run_clientapp.run_clientapp`: pull the message,
install the FAB, load the ClientApp from it, reply, exit), so each message still
gets a fresh process, the app's code still comes from the FAB, and the apps'
modules are never imported here (its Flower retry-wait patch is
:mod:`cli.polling_grid`'s, applied in this process and its children only). Tasks
of another type are started by Flower's subprocess executor.

Usage: ``python -m cli.warm_exec --runtime-api-address 127.0.0.1:PORT
[--slots K --slots-dir DIR]`` (insecure, as the SuperNodes ``cli deploy``
starts; with ``--slots`` at most K ClientApp processes run at once among all
SuperExecs given the same DIR, see :class:`Slots`). SIGTERM or SIGINT stop the
children, then this process. ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (seconds,
default here 0.25) is the wait between polls when no task is pending.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import os
import signal
import sys
import time
import traceback
from pathlib import Path

# Third-party modules imported once here, inherited by every forked ClientApp
# process (none of the project's: the app comes from the FAB). torch._dynamo is
# what the first optimizer imports lazily (3 s of a 5 s message, measured);
# numba is the coding kernels'.
WARM_MODULES = ("numpy", "torch", "torch.nn", "torch.optim", "torch._dynamo", "numba",
                "flwr.app", "flwr.clientapp", "flwr.supernode.runtime.run_clientapp")
POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
SLOT_WAIT_S = 0.02
"""Seconds between tries for a free slot: a local ``flock``, not a request."""


def warm_up(modules=WARM_MODULES) -> list[str]:
    """Import ``modules`` (those installed); return the names imported."""
    done = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        done.append(name)
    return done


class Slots:
    """At most ``count`` ClientApp processes at once among all that share ``folder``.

    Slot i is an ``flock`` on ``folder/slot-<i>``: the warm SuperExecs of all
    SuperNodes of one machine share the folder, so N nodes on few cores run as
    many ClientApps at once as the simulation runs clients (one CPU each). A
    forked child inherits the slot's descriptor and holds the slot until it
    exits (the kernel drops the lock then, also on SIGKILL).

    Raises
    ------
    ValueError
        ``count`` < 1.
    """

    def __init__(self, folder: Path, count: int) -> None:
        if count < 1:
            raise ValueError(f"slots = {count} is not allowed: use 1 or more")
        self.folder = Path(folder)
        self.count = count
        self.folder.mkdir(parents=True, exist_ok=True)

    def take(self) -> int | None:
        """A descriptor holding a free slot, or None when all are taken."""
        for i in range(self.count):
            fd = os.open(self.folder / f"slot-{i}", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None


class ForkExecutor:
    """Flower's ``Executor`` protocol: a forked child per ClientApp task.

    ``launch`` forks; the child calls ``run_clientapp`` with the task's token
    and leaves with ``os._exit`` (none of this process's exit handlers run
    twice). ``reconcile`` reaps children that ended; ``close`` sends SIGTERM to
    those still running and waits up to ``grace_s`` seconds, then SIGKILL.
    """

    def __init__(self, grace_s: float = 5.0, slots: Slots | None = None) -> None:
        from flwr.supercore.superexec.executor.subprocess_executor import (
            SubprocessExecutor,
        )

        self.children: dict[int, float] = {}  # pid -> start (time.monotonic)
        self.grace_s = grace_s
        self.other = SubprocessExecutor()
        self.slots = slots
        self.held: int | None = None  # the slot the next launch hands to its child

    def reserve(self) -> bool:
        """Hold a slot for the next launch; False when none is free (no limit: True)."""
        if self.slots is None or self.held is not None:
            return True
        self.held = self.slots.take()
        return self.held is not None

    def release(self) -> None:
        """Give back a slot held but not handed to a child."""
        if self.held is not None:
            os.close(self.held)
            self.held = None

    def get_eligible_capacity(self, supported_task_types, *, insecure=False,
                              root_certificates_path=None):
        """Every supported task type, no prestarted FABs (as the subprocess one)."""
        return set(supported_task_types), set()

    def wait_for_capacity(self, task_type=None, *, fab_hash=None, insecure=False,
                          root_certificates_path=None) -> None:
        """No capacity gate: return at once."""

    def launch(self, spec):
        """Fork a ClientApp process for ``spec`` (other task types: a subprocess)."""
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP:
            self.release()
            return self.other.launch(spec)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns (os._exit)
            _child(spec)
        self.release()  # the child holds its own copy of the slot until it exits
        self.children[pid] = time.monotonic()
        _log(f"task {spec.task_id}: ClientApp process {pid}")
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap the children that ended."""
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                took = time.monotonic() - self.children.pop(pid)
                _log(f"ClientApp process {pid} ended (exit status "
                     f"{os.waitstatus_to_exitcode(status)}) after {took:.1f} s")

    def close(self) -> None:
        """SIGTERM to the live children, SIGKILL after ``grace_s`` seconds."""
        self.release()
        self.reconcile()
        _signal_all(self.children, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while self.children and time.monotonic() < deadline:
            time.sleep(0.05)
            self.reconcile()
        _signal_all(self.children, signal.SIGKILL)
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            self.children.pop(pid, None)


def _child(spec) -> None:  # pragma: no cover - runs in the forked child
    """Flower's ClientApp process body for ``spec``; never returns."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        run_clientapp(runtime_api_address=spec.runtime_api_address, token=spec.token,
                      insecure=spec.insecure, certificates=None,
                      parent_pid=spec.parent_pid,
                      runtime_dependency_install=spec.runtime_dependency_install)
        code = 0
    except SystemExit as end:  # flwr_exit: 0 or 1
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:  # noqa: BLE001 - report it, then leave with status 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _signal_all(pids: dict, sig: int) -> None:
    for pid in list(pids):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pids.pop(pid, None)


PULL_LIMIT_ENV = "SE_CLIENT_PULL_MAX_S"
CLIENT_PULL_MAX_S = 120.0
"""Seconds a ClientApp process waits for its message's objects before it gives up
(default; ``SE_CLIENT_PULL_MAX_S``, 1 to 7200).

Flower hands out a message before its objects are there (the SuperLink before the
ServerApp has pushed them, the SuperNode before it has pulled them), so a ClientApp
may wait for them as long as that delivery takes. After a SuperLink restart a killed
run's objects never come (they stay registered, empty); with the short retry waits
below such a ClientApp asked 500 times, about 250 s, holding a shared slot the next
run's messages waited for (a CI run of ``tests/test_hosts.py`` timed out on it). A
delivery slower than this limit fails that client's reply: the ServerApp records a
dropout after ``round-timeout``."""


def _quick_pulls(max_time_s: float = CLIENT_PULL_MAX_S) -> None:
    """Quicker retries and a time limit for the children's message pulls.

    They retry after 0.05 s, not 1 s (Flower: 1 s), and give up after
    ``max_time_s`` seconds (:data:`CLIENT_PULL_MAX_S`).
    """
    try:
        from flwr.supernode.runtime import run_clientapp
    except ImportError:
        return
    from cli.polling_grid import shorten_object_pulls

    if not shorten_object_pulls(run_clientapp, "pull_and_inflate_object_from_tree",
                                max_time_s=max_time_s):
        _log("warning: this Flower's ClientApp process has no "
             "'pull_and_inflate_object_from_tree'; it keeps its own retry waits")


def _log(text: str) -> None:
    now = time.time()  # milliseconds: a message's path takes a fraction of a second
    print(f"warm_exec {time.strftime('%H:%M:%S', time.localtime(now))}"
          f".{int(now % 1 * 1000):03d}: {text}", flush=True)


def serve(address: str, poll_s: float, slots: Slots | None = None) -> None:
    """Acquire ClientApp tasks from the Runtime API at ``address`` until stopped.

    With ``slots``, a task is only acquired while a slot is free.
    """
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.superexec.plugin import AutoExecPlugin

    executor = ForkExecutor(slots=slots)
    plugin = AutoExecPlugin(runtime_api_address=address, insecure=True,
                            root_certificates_path=None,
                            runtime_dependency_install=False, executor=executor)
    client = RuntimeHttpClient.from_server_address(
        server_address=address, insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker())
    try:
        while True:
            executor.reconcile()
            if not executor.reserve():
                time.sleep(SLOT_WAIT_S)  # a slot frees when a child ends: retry soon
                continue
            res = client.AcquireTask(AcquireTaskRequest(
                supported_task_types=[TaskType.CLIENT_APP]))
            if res.HasField("task") and res.token:
                plugin.launch_task(token=res.token, task=res.task)
            else:
                executor.release()
                time.sleep(poll_s)
    finally:
        executor.close()
        client.close()


def _env_seconds(ap: argparse.ArgumentParser, name: str, default: float,
                 bounds: tuple[float, float]) -> float:
    """Seconds from environment variable ``name`` (unset or empty: ``default``).

    A value that is not a number within ``bounds`` ends the command through
    ``ap.error`` (one line naming the variable and the range; exit status 2).
    """
    raw = os.environ.get(name) or str(default)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not bounds[0] <= value <= bounds[1]:
        ap.error(f"{name}={raw!r} is not allowed: use {bounds[0]:g} to {bounds[1]:g} "
                 "seconds")
    return value


def main(argv: list[str] | None = None) -> int:
    """Warm up, then serve; SIGTERM / SIGINT / SIGHUP end it with status 0, an error with 1.

    After its ClientApp processes are stopped it leaves with ``os._exit``: the
    interpreter's teardown of torch and numba took 3 s and more under load,
    past the launcher's 5-s grace before SIGKILL.
    """
    from cli.terminal import help_text

    ap = argparse.ArgumentParser(prog="python -m cli.warm_exec",
                                 description=help_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--runtime-api-address", required=True,
                    help="the SuperNode's Runtime API, host:port")
    ap.add_argument("--slots-dir", type=Path, default=None,
                    help="folder shared by the SuperExecs that share --slots")
    ap.add_argument("--slots", type=int, default=0,
                    help="ClientApp processes at once among them (0: no limit)")
    args = ap.parse_args(argv)
    if args.slots < 0 or (args.slots and args.slots_dir is None):
        ap.error(f"--slots {args.slots} is not allowed: use 0 (no limit), or >= 1 "
                 "with --slots-dir")
    poll_s = _env_seconds(ap, POLL_ENV, 0.25, (0.01, 60))
    pull_max_s = _env_seconds(ap, PULL_LIMIT_ENV, CLIENT_PULL_MAX_S, (1, 7200))

    def stop(_signum, _frame) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal: no exit mid-cleanup
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    t0 = time.monotonic()
    names = warm_up()
    _quick_pulls(pull_max_s)
    _log(f"imported {', '.join(names)} in {time.monotonic() - t0:.1f} s; serving "
         f"{args.runtime_api_address}")
    slots = Slots(args.slots_dir, args.slots) if args.slots else None
    code = 1
    try:
        serve(args.runtime_api_address, poll_s, slots)
    except SystemExit as end:  # a signal (status 0)
        code = end.code if isinstance(end.code, int) else 0
    except BaseException:  # noqa: BLE001 - e.g. the SuperNode gone for good
        traceback.print_exc()
    finally:  # children stopped (serve's finally); skip torch's slow teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
