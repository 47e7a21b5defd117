"""server_app.rounds.polling_grid: replies pulled every 0.2 s, as send_and_receive."""

from __future__ import annotations

import time

import pytest
from flwr.app import Message, RecordDict
from flwr.superlink.grid.http_grid import HttpGrid

from server_app.rounds.polling_grid import PollingGrid, fast_replies


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
