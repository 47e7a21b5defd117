"""Screening of client replies before aggregation.

Hostile or broken input is rejected, recorded and left out; nodes that did not
answer are recorded as dropouts. Screening is pure: it reads replies and what was
sent, and never aggregates.

A training reply (``train`` or ``train.unlearn``) is accepted only if it comes
from a node that was asked, once, without an error, and has exactly the
structure the ClientApp sends:

- exactly two records, ``arrays`` (an ArrayRecord) and ``metrics`` (a
  MetricRecord), nothing else;
- ``arrays`` holds exactly the layers of the model sent, in the same order, each
  with the dtype and shape sent, only finite values and updates within the
  history store's range (``max_update``: the quantisation range when coded, a
  sanity bound of 1e4 per parameter when uncoded; integer layers, counters
  stored exactly, up to 2^24);
- ``metrics`` holds exactly the keys of :data:`TRAIN_METRICS`, each a single
  number (not a bool, not a list) in its range:

  ========================  ================================================
  ``num-examples``          int, 1 .. samples the client holds (the server
                            knows each partition's size; else 2^31 - 1)
  ``train-seconds``         finite, 0 .. the round timeout (else one week)
  ``train-loss``            finite, 0 .. 1e9 (nats)
  ``local-epochs``          finite, > 0 and within ``1 / samples held``
                            (one sample's pass) plus a relative 1e-6 of the
                            epochs asked, on both sides
  ========================  ================================================

A client reports the samples it saw divided by the samples it holds, so its
report is within one sample's pass of what was asked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID

from history.coded.catalog import EXACT_INTEGER

TRAIN_RECORDS: dict[str, type] = {"arrays": ArrayRecord, "metrics": MetricRecord}
"""Record name -> record type of a training reply (exactly these)."""

TRAIN_METRICS = ("num-examples", "train-seconds", "train-loss", "local-epochs")
"""Metric keys of a training reply (exactly these)."""

MAX_EXAMPLES = 2**31 - 1
"""Cap on ``num-examples`` when the server does not know the partition's size."""

MAX_TRAIN_SECONDS = 7 * 24 * 3600.0
"""Cap on ``train-seconds`` when rounds have no timeout: one week."""

MAX_LOSS = 1e9
"""Cap on ``train-loss`` (nats): a larger loss is a diverged or forged reply."""

MAX_REASON = 500
"""Longest fault reason kept (characters); client texts are cut to it."""

_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")

EPOCH_RTOL = 1e-6
"""Relative slack on ``local-epochs`` above what was asked (float rounding)."""


@dataclass(frozen=True)
class ReplyLimits:
    """What the server knows that bounds the numbers in a reply.

    Attributes
    ----------
    held : Mapping[int, int]
        Partition id -> samples that client holds (after the ``client-samples``
        cap). A partition not listed is capped at :data:`MAX_EXAMPLES`.
    max_seconds : float
        Largest ``train-seconds`` (s): the round timeout, since a reply that
        arrived in time cannot have trained longer.
    max_update : float or None
        Largest ``|w - w_sent|`` of any parameter, or None for no bound (coded
        storage: the quantisation range; uncoded: a sanity range, 1e4).
    """

    held: Mapping[int, int] = field(default_factory=dict)
    max_seconds: float = MAX_TRAIN_SECONDS
    max_update: float | None = None


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
        """Record one fault; ``reason`` is made one safe line (:func:`one_line`)."""
        self.entries.append({"stage": stage, "round": rnd, "node": node,
                             "partition": partition, "kind": kind,
                             "reason": one_line(reason)})

    def counts(self) -> dict[str, int]:
        """Number of faults of each kind."""
        out: dict[str, int] = {}
        for entry in self.entries:
            out[entry["kind"]] = out.get(entry["kind"], 0) + 1
        return out


def one_line(text: object, limit: int = MAX_REASON) -> str:
    """``text`` as one printable line of at most ``limit`` characters.

    ANSI escape sequences are removed, every other control character (newline,
    tab, NUL, ...) becomes a space, and a longer text is cut with ``...``. Every
    client-supplied text that reaches the fault log, summary or log goes through
    here.
    """
    line = _ANSI.sub("", str(text))
    line = "".join(" " if not ch.isprintable() else ch for ch in line).strip()
    return line if len(line) <= limit else line[:limit - 3] + "..."


def check_reply(reply: Message, sent: Message, held: int | None = None,
                limits: ReplyLimits | None = None) -> str | None:
    """Why ``reply`` must not be aggregated, or None if it is acceptable.

    Never raises on any reply content: whatever goes wrong while inspecting a
    reply (any exception, a layer that decodes to no array) rejects it.

    Parameters
    ----------
    reply : Message
        A training reply (``train`` or ``train.unlearn``).
    sent : Message
        The message it answers: its ``arrays`` are the model the reply must
        match, its ``config`` the ``local-epochs`` and ``batch-size`` asked.
    held : int, optional
        Samples the replying client holds (None: unknown, capped at
        :data:`MAX_EXAMPLES`).
    limits : ReplyLimits, optional
        ``max_seconds`` and ``max_update``; ``held`` is taken from the argument.

    Returns
    -------
    str or None
        A one-line reason, or None.
    """
    try:
        return _check_reply(reply, sent, held, limits or ReplyLimits())
    except Exception as err:  # noqa: BLE001 - any failure inspecting a reply rejects it
        return f"reply cannot be inspected: {type(err).__name__}: {err}"


def _check_reply(reply: Message, sent: Message, held: int | None,
                 limits: ReplyLimits) -> str | None:
    """:func:`check_reply` without the guard (may raise on odd content)."""
    if reply.has_error():
        return f"client error: {reply.error.reason}"
    content = reply.content
    reason = _check_records(content)
    if reason is None:
        reason = _check_arrays(content["arrays"], sent.content["arrays"],
                               limits.max_update)
    if reason is None:
        config = sent.content.config_records.get("config") or {}
        reason = _check_metrics(content["metrics"], held, config, limits.max_seconds)
    return reason


def _check_records(content: object) -> str | None:
    """Exactly the records of :data:`TRAIN_RECORDS`, with their types."""
    if not isinstance(content, RecordDict):
        return f"content is a {type(content).__name__}, not a RecordDict"
    names = list(content.keys())
    if sorted(names) != sorted(TRAIN_RECORDS):
        return (f"records {sorted(names)}: a training reply holds exactly "
                f"{sorted(TRAIN_RECORDS)}")
    for name, kind in TRAIN_RECORDS.items():
        if not isinstance(content[name], kind):
            return (f"record {name!r} is a {type(content[name]).__name__}, "
                    f"expected a {kind.__name__}")
    return None


def _check_arrays(arrays: ArrayRecord, sent: ArrayRecord, max_update: float | None
                  ) -> str | None:
    """The layers sent, same order, dtype and shape, finite, within ``max_update``."""
    if list(arrays.keys()) != list(sent.keys()):
        return f"layers {list(arrays.keys())} differ from the model sent {list(sent)}"
    for key, value in arrays.items():
        want = sent[key].numpy()
        if not isinstance(value, Array):
            return f"layer {key!r} is a {type(value).__name__}, not an Array"
        declared = f"{value.dtype}{list(value.shape)}"
        if declared != f"{want.dtype}{list(want.shape)}":
            return f"layer {key!r} is {declared}, expected {want.dtype}{list(want.shape)}"
        try:
            got = value.numpy()
        except Exception as err:  # untrusted bytes: any decoding failure is a reject
            return f"layer {key!r} cannot be decoded: {type(err).__name__}"
        if not isinstance(got, np.ndarray):
            return f"layer {key!r} decodes to a {type(got).__name__}, not an array"
        if got.shape != want.shape or got.dtype != want.dtype:
            return (f"layer {key!r} decodes to {got.dtype}{list(got.shape)}, "
                    f"expected {want.dtype}{list(want.shape)}")
        if not np.isfinite(got).all():
            return f"layer {key!r} has NaN or Inf values"
        if max_update is not None and got.size:
            step = float(np.max(np.abs(got.astype(np.float64) - want)))
            # integer buffers (counters) are stored exactly, up to EXACT_INTEGER
            bound = max_update if got.dtype.kind in "fc" else EXACT_INTEGER
            if step > bound:
                return (f"layer {key!r} moves by {step:.3g}: the history store "
                        f"holds updates up to {bound:.3g} per parameter")
    return None


def _number(metrics: MetricRecord, key: str) -> tuple[float | None, str | None]:
    """The finite single number under ``key``, or a reason it is not one."""
    value = metrics[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"{key} = {value!r}: must be a single number"
    if isinstance(value, float) and not math.isfinite(value):
        return None, f"{key} = {value!r}: must be finite"
    return value, None


def _check_metrics(metrics: MetricRecord, held: int | None, config: Mapping,
                   max_seconds: float) -> str | None:
    """Exactly :data:`TRAIN_METRICS`, each a finite number in its range."""
    keys = list(metrics.keys())
    if sorted(keys) != sorted(TRAIN_METRICS):
        return (f"metrics {sorted(keys)}: a training reply holds exactly "
                f"{sorted(TRAIN_METRICS)}")
    values = {}
    for key in TRAIN_METRICS:
        values[key], reason = _number(metrics, key)
        if reason:
            return reason
    n, cap = values["num-examples"], held if held is not None else MAX_EXAMPLES
    if not isinstance(n, int) or not 1 <= n <= cap:
        return f"num-examples = {n!r}: must be an integer in [1, {cap}] (samples held)"
    if not 0 <= values["train-seconds"] <= max_seconds:
        return (f"train-seconds = {values['train-seconds']!r}: must be in "
                f"[0, {max_seconds:g}]")
    if not 0 <= values["train-loss"] <= MAX_LOSS:
        return f"train-loss = {values['train-loss']!r}: must be in [0, {MAX_LOSS:g}]"
    least, most = _epoch_range(config, held or n)
    if not (0 < values["local-epochs"] and least <= values["local-epochs"] <= most):
        return (f"local-epochs = {values['local-epochs']!r}: must be in "
                f"[{least:.6g}, {most:.6g}] (the epochs asked, to one sample's pass)")
    return None


def _epoch_range(config: Mapping, held: int) -> tuple[float, float]:
    """Epochs asked plus or minus one sample's pass (``1 / held``) and 1e-6 relative.

    A client reports the samples it saw divided by the samples it holds; the
    partial last pass is ``max(1, round(f * held))`` samples, so the report is
    within ``1 / held`` of what was asked. Not asked: ``(0, inf)``.
    """
    asked = config.get("local-epochs")
    if isinstance(asked, bool) or not isinstance(asked, int | float):
        return 0.0, math.inf
    slack = float(asked) * EPOCH_RTOL + 1.0 / held
    return max(0.0, float(asked) - slack), float(asked) + slack


def _answered_for(reply: Message, sent: Mapping[int, Message]) -> int | None:
    """The node an error reply of the SuperLink stands for, or None.

    Flower's SuperLink answers a message to a node it deems offline (no
    heartbeat in time: a link down, a host gone) itself, with an error reply
    from its own node id whose ``reply_to_message_id`` is the message's id
    (given at push). Such a reply is that node's missing answer, not a reply
    from a node that was not asked. Only the SuperLink's id
    (``SUPERLINK_NODE_ID``, never a SuperNode's) may answer for another node: a
    client's error reply naming another node's message stays a rejected reply.
    """
    wanted = reply.metadata.reply_to_message_id
    if reply.metadata.src_node_id != SUPERLINK_NODE_ID or not reply.has_error() \
            or not wanted:
        return None
    for node, message in sent.items():
        if (message.metadata.message_id or message.object_id) == wanted:
            return node
    return None


def screen(replies: Iterable[Message], messages: Sequence[Message], stage: str,
           rnd: int, faults: FaultLog, partition_of: Mapping[int, int] | None = None,
           limits: ReplyLimits | None = None) -> list[Message]:
    """Keep the acceptable replies; record rejections and missing answers.

    Parameters
    ----------
    replies : Iterable[Message]
        What the grid returned.
    messages : Sequence[Message]
        What was sent (one per node); its model and config are the reference.
    stage, rnd : str, int
        Where, for the fault log.
    faults : FaultLog
        Receives one entry per rejected reply and per node that did not answer.
    partition_of : Mapping[int, int], optional
        node id -> partition id, for readable logs and the samples held.
    limits : ReplyLimits, optional
        Bounds on the reply's numbers (default: no partition sizes, one week,
        no update bound).

    Returns
    -------
    list[Message]
        The accepted replies, unchanged, at most one per node asked.
    """
    partition_of = partition_of or {}
    limits = limits or ReplyLimits()
    sent = {m.metadata.dst_node_id: m for m in messages}
    kept: dict[int, Message] = {}
    answered: set[int] = set()
    for reply in replies:
        node = reply.metadata.src_node_id
        pid = partition_of.get(node)
        if node not in sent and (target := _answered_for(reply, sent)) is not None:
            if target not in answered:  # the SuperLink answers for an offline node
                answered.add(target)
                faults.add(stage, rnd, target, partition_of.get(target), "dropout",
                           f"unreachable: {reply.error.reason}")
            continue
        if node not in sent:
            faults.add(stage, rnd, node, pid, "rejected", "reply from a node not asked")
            continue
        if node in answered:
            faults.add(stage, rnd, node, pid, "rejected", "second reply from a node")
            continue
        answered.add(node)
        reason = check_reply(reply, sent[node], limits.held.get(pid), limits)
        if reason is not None:
            kind = "error" if reply.has_error() else "rejected"
            faults.add(stage, rnd, node, pid, kind, reason)
            continue
        kept[node] = reply
    for node in sent:
        if node not in answered:
            faults.add(stage, rnd, node, partition_of.get(node), "dropout",
                       "no answer within the round timeout")
    return list(kept.values())
