"""``flower-supernode`` with a shorter wait between pulls (``python -m cli.supernode``).

Deployment layer: this entry point patches Flower's SuperNode modules in its own
process only; ``cli deploy`` starts it (docs/DEPLOY.md, "Flower patches of our
deploy commands"), a SuperNode started as ``flower-supernode`` is Flower's own.

Flower 1.42's SuperNode loop (``flwr.supernode.start_client_internal``) sleeps
3 s after every pull from the SuperLink that found no message, so a message
waits 1.5 s on average (up to 3 s) before its node sees it, and a round of N
nodes waits for the slowest of N such draws (2.4 s for 4 nodes). The loop's
waits are ``time.sleep`` calls on that module's ``time``; this entry point gives
the module a ``time`` whose ``sleep`` is capped at ``SE_NODE_POLL_S`` seconds
(default 1; each pull costs the SuperNode and the SuperLink about 25 ms of CPU
together, measured on 2 cores) and otherwise is the standard module, then runs Flower's own
``flower-supernode`` with the same arguments. The loop's short waits (0.5 s:
for the ClientApp's reply, for an object's content) only read the SuperNode's
own in-memory state, so they are cut to ``LOCAL_WAIT_S``: a reply no longer
waits up to 0.5 s before it leaves for the SuperLink. Nothing else changes. If a later
Flower has no module-level ``time`` there, the SuperNode runs unchanged and a
warning says so.

A message travels as objects (one per array, record and the message), pulled
one by one; Flower 1.42 retries an object that is not there yet (the sender
is still pushing it) after 1 s, doubling up to 10 s. The SuperNode often asks
before the ServerApp has pushed everything, and its ClientApp before the
SuperNode has it, so a round waited 1-3 s for nothing.
:func:`cli.polling_grid.shorten_object_pulls` retries sooner (used
here for the SuperNode's pulls and by :mod:`cli.warm_exec` for its ClientApps').
"""

from __future__ import annotations

import os
import sys
import time
import types

from cli.polling_grid import shorten_object_pulls

POLL_ENV = "SE_NODE_POLL_S"
HEARTBEAT_ENV = "SE_NODE_HEARTBEAT_S"
"""Seconds between a SuperNode's heartbeats (unset: Flower's 30). The SuperLink takes
a node as offline after two intervals without one, and refuses a restarted node
with the same key until then (``activate-node``: 412, exit 305)."""
LOCAL_WAIT_S = 0.05
"""Seconds a wait under 1 s (the node's own state, no network) sleeps at most."""


class CappedSleep(types.ModuleType):
    """The ``time`` module with ``sleep(s)`` sleeping ``min(s, cap_s)``.

    Waits under 1 s sleep at most :data:`LOCAL_WAIT_S`.

    Raises
    ------
    ValueError
        ``cap_s`` is not a finite number > 0.
    """

    def __init__(self, cap_s: float) -> None:
        super().__init__("time")
        if not 0 < cap_s < float("inf"):
            raise ValueError(f"{POLL_ENV} = {cap_s!r} is not allowed: use seconds > 0")
        self.cap_s = cap_s

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        """Sleep ``min(seconds, cap_s)``, or at most ``LOCAL_WAIT_S`` below 1 s."""
        time.sleep(min(seconds, self.cap_s if seconds >= 1 else LOCAL_WAIT_S))


def shorten_waits(cap_s: float) -> bool:
    """Cap the SuperNode loop's sleeps at ``cap_s``; False if the loop has no ``time``.

    Raises
    ------
    ValueError
        As :class:`CappedSleep`.
    """
    from flwr.supernode import start_client_internal as loop

    clock = CappedSleep(cap_s)
    if getattr(loop, "time", None) is not time:
        return False
    loop.time = clock
    return True


def set_heartbeat(seconds: float) -> list[str]:
    """Make Flower's SuperNode heartbeat every ``seconds``; the modules changed.

    The interval goes to the SuperLink with every heartbeat and activation (it
    takes the node as offline after two intervals without one) and paces the
    SuperNode's heartbeat thread. Modules without the constant are left alone.

    Raises
    ------
    ValueError
        ``seconds`` is not a finite number >= 2 (Flower's heartbeat call itself
        may take a second).
    """
    import importlib

    if not 2 <= seconds < float("inf"):
        raise ValueError(f"{HEARTBEAT_ENV} = {seconds!r} is not allowed: use seconds >= 2")
    changed = []
    for name in ("flwr.supernode.fleet_http_connection", "flwr.supercore.heartbeat"):
        module = importlib.import_module(name)
        if hasattr(module, "HEARTBEAT_DEFAULT_INTERVAL"):
            module.HEARTBEAT_DEFAULT_INTERVAL = seconds
            changed.append(name)
    return changed


def main() -> None:
    """Shorten the waits, then run ``flower-supernode`` with ``sys.argv[1:]``."""
    raw = os.environ.get(POLL_ENV) or "1"
    try:
        cap = float(raw)
    except ValueError:
        cap = float("nan")
    if not 0 < cap < float("inf"):
        sys.exit(f"cli.supernode: {POLL_ENV}={raw!r} is not allowed: use seconds > 0")
    beat = os.environ.get(HEARTBEAT_ENV)
    if beat:
        try:
            if len(set_heartbeat(float(beat))) < 2:
                print("cli.supernode: warning: this Flower has no heartbeat interval "
                      f"to set in every module; {HEARTBEAT_ENV} may not apply",
                      file=sys.stderr, flush=True)
        except ValueError as err:
            sys.exit(f"cli.supernode: {err}")
    if not shorten_waits(cap):
        print("cli.supernode: warning: this Flower's SuperNode loop has no module "
              "'time'; it keeps its own waits", file=sys.stderr, flush=True)
    from flwr.supernode import start_client_internal as loop

    if not shorten_object_pulls(loop, "pull_objects"):
        print("cli.supernode: warning: this Flower's SuperNode loop has no "
              "'pull_objects'; it keeps its own retry waits", file=sys.stderr, flush=True)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
