"""Screening of client replies before aggregation.

Hostile or broken input is rejected, recorded and left out; nodes that did not
answer are recorded as dropouts.

A training reply is accepted only if it comes from a node that was asked, has no
error, carries exactly the layers of the model that was sent with the same
shapes and dtype, only finite values, and a positive integer example count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, Message


@dataclass
class FaultLog:
    """Faults seen in a run: one dict per rejected reply or missing answer.

    Each entry has ``stage`` (e.g. ``sharded``), ``round`` (None for a fault
    tied to no round), ``node``, ``partition`` (or None), ``kind`` (``dropout``,
    ``rejected``, ``error``; coded retrieval: ``damaged-slice``, ``lost-slice``,
    ``damaged-file``, ``refused-fetch``) and ``reason``.
    """

    entries: list[dict] = field(default_factory=list)

    def add(self, stage: str, rnd: int | None, node: int, partition: int | None,
            kind: str, reason: str) -> None:
        """Record one fault."""
        self.entries.append({"stage": stage, "round": rnd, "node": node,
                             "partition": partition, "kind": kind, "reason": reason})

    def counts(self) -> dict[str, int]:
        """Number of faults of each kind."""
        out: dict[str, int] = {}
        for entry in self.entries:
            out[entry["kind"]] = out.get(entry["kind"], 0) + 1
        return out


def check_reply(reply: Message, sent: ArrayRecord) -> str | None:
    """Why ``reply`` must not be aggregated, or None if it is acceptable.

    Parameters
    ----------
    reply : Message
        A training reply (``train`` or ``train.unlearn``).
    sent : ArrayRecord
        The model sent to that node: the reply must match its layers.
    """
    if reply.has_error():
        return f"client error: {reply.error.reason}"
    content = reply.content
    if len(content.array_records) != 1 or len(content.metric_records) != 1:
        return "reply must hold exactly one ArrayRecord and one MetricRecord"
    arrays = next(iter(content.array_records.values()))
    if list(arrays) != list(sent):
        return f"layers {sorted(arrays)} differ from the model sent {sorted(sent)}"
    for key, value in arrays.items():
        got, want = value.numpy(), sent[key].numpy()
        if got.shape != want.shape or got.dtype != want.dtype:
            return (f"layer {key!r} is {got.dtype}{list(got.shape)}, expected "
                    f"{want.dtype}{list(want.shape)}")
        if not np.isfinite(got).all():
            return f"layer {key!r} has NaN or Inf values"
    metrics = next(iter(content.metric_records.values()))
    n = metrics.get("num-examples")
    if isinstance(n, bool) or not isinstance(n, int | float) or n != int(n) or n <= 0:
        return f"num-examples = {n!r}: must be a positive integer"
    seconds = metrics.get("train-seconds", 0.0)
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
        return f"train-seconds = {seconds!r}: must be a finite number >= 0"
    return None


def screen(replies: Iterable[Message], messages: Sequence[Message], stage: str,
           rnd: int, faults: FaultLog, partition_of: Mapping[int, int] | None = None
           ) -> list[Message]:
    """Keep the acceptable replies; record rejections and missing answers.

    Parameters
    ----------
    replies : Iterable[Message]
        What the grid returned.
    messages : Sequence[Message]
        What was sent (one per node); its model is the reference.
    stage, rnd : str, int
        Where, for the fault log.
    faults : FaultLog
        Receives one entry per rejected reply and per node that did not answer.
    partition_of : Mapping[int, int], optional
        node id -> partition id, for readable logs.

    Returns
    -------
    list[Message]
        The accepted replies, at most one per node asked.
    """
    partition_of = partition_of or {}
    sent = {m.metadata.dst_node_id: m.content["arrays"] for m in messages}
    kept: dict[int, Message] = {}
    for reply in replies:
        node = reply.metadata.src_node_id
        pid = partition_of.get(node)
        if node not in sent:
            faults.add(stage, rnd, node, pid, "rejected", "reply from a node not asked")
            continue
        if node in kept:
            faults.add(stage, rnd, node, pid, "rejected", "second reply from a node")
            continue
        reason = check_reply(reply, sent[node])
        if reason is not None:
            kind = "error" if reply.has_error() else "rejected"
            faults.add(stage, rnd, node, pid, kind, reason)
            continue
        kept[node] = reply
    for node in sent:
        if node not in kept and not any(
                e["node"] == node and e["round"] == rnd and e["stage"] == stage
                for e in faults.entries):
            faults.add(stage, rnd, node, partition_of.get(node), "dropout",
                       "no answer within the round timeout")
    return list(kept.values())
