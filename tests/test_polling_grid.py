"""cli.polling_grid: replies pulled every 0.2 s; the apps themselves on stock Flower."""

from __future__ import annotations

import time

import pytest
from flwr.app import Message, RecordDict
from flwr.superlink.grid.http_grid import HttpGrid

from cli.polling_grid import PollingGrid, fast_replies


class SlowGrid:
    """push/pull only: reply i arrives at pull number ``ready[i]`` (never if None)."""

    def __init__(self, ready: list[int | None]) -> None:
        self.ready, self.pulls, self.pushed = ready, 0, []

    def push_messages(self, messages):
        self.pushed = list(messages)
        return [f"m{i}" for i in range(len(self.pushed))]

    def pull_messages(self, message_ids):
        self.pulls += 1
        out = []
        for i, at in enumerate(self.ready):
            if at == self.pulls and f"m{i}" in set(message_ids):
                reply = Message(RecordDict(), reply_to=self.pushed[i])
                reply.metadata.__dict__["_reply_to_message_id"] = f"m{i}"
                out.append(reply)
        return out


def _messages(n: int) -> list[Message]:
    return [Message(RecordDict(), dst_node_id=i + 1, message_type="query.x")
            for i in range(n)]


def test_every_reply_is_returned_after_as_many_pulls_as_needed():
    inner = SlowGrid([1, 3, 2])
    grid = PollingGrid(inner, poll_s=0.01)
    t0 = time.monotonic()
    replies = list(grid.send_and_receive(_messages(3)))
    assert len(replies) == 3 and inner.pulls == 3
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert time.monotonic() - t0 < 1.0  # two waits of 0.01 s, not of 3 s


def test_a_timeout_returns_the_replies_that_came():
    inner = SlowGrid([1, None])
    t0 = time.monotonic()
    replies = list(PollingGrid(inner, poll_s=0.02).send_and_receive(_messages(2),
                                                                    timeout=0.3))
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 0.3 <= time.monotonic() - t0 < 1.5 and inner.pulls > 3


@pytest.mark.parametrize("poll_s", [0, -1, float("inf"), float("nan")])
def test_a_bad_interval_is_refused(poll_s):
    with pytest.raises(ValueError, match="poll_s"):
        PollingGrid(SlowGrid([]), poll_s=poll_s)


def test_only_flowers_deployment_grid_is_wrapped(monkeypatch):
    from flwr.superlink.grid import http_grid

    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)  # restored
    other = SlowGrid([])
    assert fast_replies(other) is other
    deployed = HttpGrid.__new__(HttpGrid)  # no connection needed to tell its class
    wrapped = fast_replies(deployed)
    assert isinstance(wrapped, PollingGrid) and wrapped.inner is deployed


def _flaky(misses: int):
    """A pull_object_fn that finds the object only after ``misses`` tries."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    tries = []

    def pull(object_id: str) -> bytes:
        tries.append(time.monotonic())
        if len(tries) <= misses:
            raise ObjectUnavailableError(object_id)
        return b"content"
    return pull, tries


def test_the_deployment_grid_retries_a_missing_reply_object_soon(monkeypatch):
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.superlink.grid import http_grid

    flowers = inflatable_utils.pull_objects
    monkeypatch.setattr(http_grid, "pull_objects", flowers)  # restored after the test
    fast_replies(SlowGrid([]))  # not Flower's deployment Grid: its pulls untouched
    assert http_grid.pull_objects is flowers
    fast_replies(HttpGrid.__new__(HttpGrid))
    pull, tries = _flaky(misses=2)
    assert http_grid.pull_objects(["a"], pull) == {"a": b"content"}
    # Flower's own waits: 1 s, then 2 s (+-20%); here 0.05 s, then 0.1 s (+-20%)
    assert len(tries) == 3 and tries[-1] - tries[0] < 1.0


# Issue 41, item 5: the apps run on stock Flower. The probe imports the Flower modules
# our deployment layer patches, keeps every loaded flwr module's globals, imports the
# ServerApp and the ClientApp and starts the ServerApp on Flower's deployment Grid (its
# run stops where the run config would be read), then names every global that changed.
PATCHED_BY_US = ("flwr.superlink.grid.http_grid", "flwr.supernode.start_client_internal",
                 "flwr.supernode.runtime.run_clientapp",
                 "flwr.supernode.fleet_http_connection", "flwr.supercore.heartbeat")
PROBE = r'''
import importlib, json, sys, types
for name in sys.argv[1:]:
    importlib.import_module(name)

def flower():
    return {m: dict(vars(mod)) for m, mod in list(sys.modules.items())
            if m.split(".")[0] == "flwr" and mod is not None}

before = flower()
import client_app.app
import server_app.app as server
from flwr.app import Context, RecordDict
from flwr.superlink.grid.http_grid import HttpGrid

seen = []
class Stop(Exception):
    pass
def stop(grid, run_config, engine=None):
    seen.append(grid._grid)  # inside the receipts' TrainedNodes (server_app.rounds.engine)
    raise Stop
server.open_run = stop
deployed = HttpGrid.__new__(HttpGrid)
try:
    server.main(deployed, Context(run_id=1, node_id=0, node_config={},
                                  state=RecordDict(), run_config={}))
except Stop:
    pass
after = flower()
def differs(old, new, key):  # a new submodule attribute is an import, not a patch
    if key not in old:
        return not isinstance(new[key], types.ModuleType)
    return key not in new or new[key] is not old[key]

changed = sorted(f"{m}.{k}" for m, old in before.items()
                 for k in set(old) | set(after[m]) if differs(old, after[m], k))
print(json.dumps({"changed": changed, "grid": type(seen[0]).__name__,
                  "same": seen[0] is deployed}))
'''


def _start_server_app(hook: str | None) -> dict:
    """The probe's findings, run with or without the deployment layer's hook."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from server_app.app import GRID_HOOK_ENV

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != GRID_HOOK_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    if hook is not None:
        env[GRID_HOOK_ENV] = hook
    out = subprocess.run([sys.executable, "-c", PROBE, *PATCHED_BY_US], cwd=root,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.subprocess
def test_the_server_app_changes_no_flower_global_without_our_deploy_command():
    """A plain ``flwr run`` on anyone's SuperLink: Flower's Grid, Flower's globals."""
    found = _start_server_app(hook=None)
    assert found == {"changed": [], "grid": "HttpGrid", "same": True}


@pytest.mark.subprocess
def test_our_deploy_commands_hook_keeps_the_fast_replies():
    """The SuperLink our commands start names the hook: replies every 0.2 s."""
    from cli.polling_grid import GRID_HOOK, GRID_HOOK_ENV, hook_env
    from server_app.app import GRID_HOOK_ENV as SERVER_APP_READS

    assert GRID_HOOK_ENV == SERVER_APP_READS
    assert hook_env({"A": "1"}) == {"A": "1", GRID_HOOK_ENV: GRID_HOOK}
    found = _start_server_app(hook=GRID_HOOK)
    assert found["grid"] == "PollingGrid"
    assert found["changed"] == ["flwr.superlink.grid.http_grid.pull_objects"]


@pytest.mark.parametrize("spec", ["cli.polling_grid", "no_such_module_xyz:f",
                                  "cli.polling_grid:nothing", "cli.polling_grid:POLL_S"])
def test_a_bad_hook_is_one_line(monkeypatch, spec):
    from server_app.app import GRID_HOOK_ENV, deployment_grid

    monkeypatch.setenv(GRID_HOOK_ENV, spec)
    with pytest.raises(ValueError) as err:
        deployment_grid(SlowGrid([]))
    assert "\n" not in str(err.value) and GRID_HOOK_ENV in str(err.value)
    assert repr(spec) in str(err.value)
