"""cli.warm_exec: ClientApp processes forked from a warm SuperExec, reaped and stopped."""

from __future__ import annotations

import json
import os
import time

import flwr.supernode.runtime.run_clientapp as flower_clientapp
import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResultStatus

from cli import warm_exec


def _spec(token: str = "tok") -> ExecutionSpec:
    return ExecutionSpec(task_type=TaskType.CLIENT_APP, runtime_api_address="127.0.0.1:1",
                         token=token, insecure=True, root_certificates_path=None,
                         runtime_dependency_install=False, parent_pid=os.getpid(),
                         suppress_output=False, task_id=1)


def _wait_reaped(executor: warm_exec.ForkExecutor, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while executor.children and time.monotonic() < deadline:
        executor.reconcile()
        time.sleep(0.05)


@pytest.mark.subprocess
def test_a_clientapp_task_runs_flowers_body_in_a_forked_child(tmp_path, monkeypatch):
    out = tmp_path / "ran.json"

    def body(**kw):  # stands in for Flower's run_clientapp, which ends in sys.exit
        out.write_text(json.dumps({"token": kw["token"], "pid": os.getpid(),
                                   "parent": kw["parent_pid"]}))
        raise SystemExit(0)

    monkeypatch.setattr(flower_clientapp, "run_clientapp", body)
    executor = warm_exec.ForkExecutor()
    assert executor.launch(_spec("abc")).status == LaunchResultStatus.ACCEPTED
    assert len(executor.children) == 1
    _wait_reaped(executor)
    assert not executor.children  # ended and reaped
    ran = json.loads(out.read_text())
    assert ran["token"] == "abc" and ran["pid"] != os.getpid() == ran["parent"]


@pytest.mark.subprocess
def test_close_stops_children_still_running(monkeypatch):
    monkeypatch.setattr(flower_clientapp, "run_clientapp", lambda **kw: time.sleep(60))
    executor = warm_exec.ForkExecutor(grace_s=2.0)
    executor.launch(_spec())
    (pid,) = executor.children
    t0 = time.monotonic()
    executor.close()
    assert time.monotonic() - t0 < 5 and not executor.children
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_warm_up_imports_what_is_installed_and_skips_the_rest():
    assert warm_exec.warm_up(("json", "no_such_module_xyz")) == ["json"]


@pytest.mark.parametrize("value", ["0", "abc", "nan", "100"])
def test_a_bad_poll_interval_is_one_clear_error(value, monkeypatch, capsys):
    monkeypatch.setenv(warm_exec.POLL_ENV, value)
    with pytest.raises(SystemExit) as end:
        warm_exec.main(["--runtime-api-address", "127.0.0.1:1"])
    assert end.value.code == 2
    assert f"{warm_exec.POLL_ENV}='{value}' is not allowed" in capsys.readouterr().err


def test_slots_allow_k_holders_and_free_on_close(tmp_path):
    slots = warm_exec.Slots(tmp_path / "slots", 2)
    first, second = slots.take(), slots.take()
    assert first is not None and second is not None
    assert warm_exec.Slots(tmp_path / "slots", 2).take() is None  # another SuperExec
    os.close(first)
    again = slots.take()
    assert again is not None
    for fd in (second, again):
        os.close(fd)
    with pytest.raises(ValueError, match="slots = 0"):
        warm_exec.Slots(tmp_path / "slots", 0)


@pytest.mark.subprocess
def test_a_forked_clientapp_holds_its_slot_until_it_exits(tmp_path, monkeypatch):
    monkeypatch.setattr(flower_clientapp, "run_clientapp", lambda **kw: time.sleep(1.0))
    folder = tmp_path / "slots"
    executor = warm_exec.ForkExecutor(slots=warm_exec.Slots(folder, 1))
    assert executor.reserve()
    executor.launch(_spec())
    assert executor.held is None  # handed to the child
    assert not executor.reserve()  # the child holds the only slot
    _wait_reaped(executor)
    assert executor.reserve()  # free again once the child ended
    executor.release()
    assert warm_exec.Slots(folder, 1).take() is not None


def test_the_supernode_loop_sleeps_at_most_the_cap(monkeypatch):
    import flwr.supernode.start_client_internal as loop

    from cli import supernode

    monkeypatch.setattr(loop, "time", time)  # restored after the test
    assert supernode.shorten_waits(0.05)
    t0 = time.monotonic()
    loop.time.sleep(3)  # Flower's idle wait
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    for _ in range(10):
        loop.time.sleep(0.5)  # Flower's wait for the ClientApp's reply
    assert time.monotonic() - t0 < 10 * 0.5 / 2
    assert loop.time.monotonic() > 0 and loop.time.time() > 0  # the rest is time's
    assert not supernode.shorten_waits(0.05)  # already replaced: not stacked
    with pytest.raises(ValueError, match="SE_NODE_POLL_S"):
        supernode.CappedSleep(float("nan"))


def test_node_side_object_pulls_retry_soon_and_are_patched_once(monkeypatch):
    import types

    import flwr.supernode.start_client_internal as loop
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    from cli import supernode

    monkeypatch.setattr(loop, "pull_objects", inflatable_utils.pull_objects)  # restored
    assert supernode.shorten_object_pulls(loop, "pull_objects")
    assert not supernode.shorten_object_pulls(loop, "pull_objects")  # not stacked
    assert not supernode.shorten_object_pulls(types.ModuleType("x"), "pull_objects")
    tries = []

    def pull(object_id):
        tries.append(time.monotonic())
        if len(tries) < 3:
            raise ObjectUnavailableError(object_id)
        return b"c"

    assert loop.pull_objects(["a"], pull) == {"a": b"c"}
    assert tries[-1] - tries[0] < 1.0  # Flower's own: 1 s, then 2 s (+-20%)


def test_a_clientapp_gives_up_a_message_whose_objects_never_come(monkeypatch):
    """After a SuperLink restart a killed run's objects never come: the ClientApp
    process stops asking after its limit (SE_CLIENT_PULL_MAX_S), not after 500 tries;
    an object that comes late, within the limit, is still taken."""
    from flwr.proto.message_pb2 import ObjectTree
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import (
        ObjectPullError,
        ObjectUnavailableError,
    )
    from flwr.supernode.runtime import run_clientapp

    monkeypatch.setattr(run_clientapp, "pull_and_inflate_object_from_tree",
                        inflatable_utils.pull_and_inflate_object_from_tree)  # restored
    warm_exec._quick_pulls(0.5)
    pull = run_clientapp.pull_and_inflate_object_from_tree
    assert pull.keywords["max_time"] == 0.5
    assert warm_exec.CLIENT_PULL_MAX_S == 120.0

    def missing(object_id):
        raise ObjectUnavailableError(object_id)

    start = time.monotonic()
    with pytest.raises(ObjectPullError):
        pull(ObjectTree(object_id="a" * 64), missing, lambda object_id: None)
    assert time.monotonic() - start < 5.0  # 500 tries of 0.05-0.5 s: about 250 s
    tries = []

    def late(object_id):  # there on the 4th ask (about 0.2 s)
        tries.append(object_id)
        if len(tries) < 4:
            raise ObjectUnavailableError(object_id)
        raise ObjectPullError(object_id, "arrived")  # got past the waits

    with pytest.raises(ObjectPullError, match="arrived"):
        pull(ObjectTree(object_id="b" * 64), late, lambda object_id: None)
    assert len(tries) == 4


@pytest.mark.parametrize("value", ["0", "x", "9000", "nan"])
def test_a_bad_pull_limit_is_one_clear_error(value, monkeypatch, capsys):
    monkeypatch.setenv("SE_CLIENT_PULL_MAX_S", value)
    with pytest.raises(SystemExit) as end:
        warm_exec.main(["--runtime-api-address", "127.0.0.1:1"])
    assert end.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"SE_CLIENT_PULL_MAX_S={value!r} is not allowed: use 1 to 7200" in err
