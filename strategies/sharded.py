"""Isolated sharding: one stock Flower strategy per shard, behind one Strategy.

A :class:`ShardedStrategy` holds S sub-strategies (any ``flwr.serverapp.strategy``
class: ``FedAvg``, ``FedProx``, ``FedAdam`` ...). The S shard models travel
packed in one ``ArrayRecord`` whose keys carry a ``shard<s>/`` prefix. Isolation
holds by construction:

- shard s's sub-strategy is given only shard s's model and a :class:`ShardGrid`,
  a view of the grid that lists, and accepts messages for, shard s's nodes only;
- every configured message is checked to target a node of its shard;
- replies are routed to a sub-strategy by their source node, so shard t never
  aggregates a reply of shard s.

Flower's stock strategies log ``configure_train: Sampled 5 nodes (out of 25)``,
``aggregate_train: Received ...`` and their evaluate twins at INFO on every call,
without naming a shard: S lines per verb and round. Inside the sub-strategy calls
(:func:`shard_lines`) such INFO lines are dropped, unless :data:`VERBOSE_ENV` is
set (the commands' ``--verbose``); what is kept is prefixed ``shard <s>:``.

Source: Bourtoule et al., "Machine Unlearning" (SISA, IEEE S&P 2021) for isolated
shards; Lin et al., "Scalable Federated Unlearning via Isolated and Coded
Sharding" (IJCAI 2024), Sec. 3.1, for its federated form.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

VERBOSE_ENV = "SE_VERBOSE"
"""Environment variable: ``1`` shows Flower's per-shard strategy lines at INFO (the
commands' ``--verbose`` sets it; the ServerApp inherits it from the process that
starts it: ``flwr run`` in simulation, the SuperLink in deployment)."""


def verbose_from_env() -> bool:
    """Whether :data:`VERBOSE_ENV` asks for Flower's lines (set, and not ``0``)."""
    return os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


class _ShardLines(logging.Filter):
    """Flower's records of one thread: quiet at INFO, or naming shard ``shard``.

    INFO and below are dropped unless ``verbose``; what passes is prefixed
    ``shard <s>:``. Other threads' records pass untouched.
    """

    def __init__(self, shard: int, verbose: bool) -> None:
        super().__init__()
        self.shard, self.verbose = shard, verbose
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread:
            return True
        if record.levelno <= INFO and not self.verbose:
            return False
        record.msg = f"shard {self.shard}: {record.msg}"
        return True


@contextlib.contextmanager
def shard_lines(shard: int, verbose: bool) -> Iterator[None]:
    """Inside the block, Flower's logger names shard ``shard`` or stays quiet.

    Scoped to the calling thread and to the block: a filter on the ``flwr``
    logger while a sub-strategy runs, removed after it; no other Flower code
    path is touched. Warnings and errors always pass (prefixed); INFO and DEBUG
    only with ``verbose``.
    """
    logger = logging.getLogger("flwr")
    lines = _ShardLines(shard, verbose)
    logger.addFilter(lines)
    try:
        yield
    finally:
        logger.removeFilter(lines)


class IsolationError(RuntimeError):
    """A message or parameter of one shard was about to reach another shard."""


_PACKED_KEY = re.compile(r"shard(0|[1-9][0-9]*)/(.*)", re.DOTALL)
"""``shard<s>/<layer>`` as :func:`shard_prefix` writes it: s in ASCII decimal, no
leading zero; the layer is the rest of the key, any text (``/`` and newlines too)."""


def shard_prefix(shard: int) -> str:
    """Key prefix of shard ``shard``'s arrays in a packed ArrayRecord."""
    return f"shard{shard}/"


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Dict of layer name -> ndarray  ->  ArrayRecord (keeps key order, dtypes, shapes).

    0-d arrays stay 0-d (``np.ascontiguousarray`` would make them shape (1,)).
    """
    return ArrayRecord({k: Array(_contiguous(v)) for k, v in arrays.items()})


def _contiguous(value: np.ndarray) -> np.ndarray:
    """``value`` as a C-contiguous ndarray of the same shape, 0-d included."""
    return np.asarray(value, order="C")


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """ArrayRecord -> dict of layer name -> ndarray (copies, key order kept)."""
    return {k: np.array(v.numpy()) for k, v in record.items()}


def keep_dtypes(new: ArrayRecord, reference: ArrayRecord) -> ArrayRecord:
    """``new`` with each array cast back to the dtype of the same key in ``reference``.

    Stock strategies may change a model's dtypes (Flower's FedAdam returns float64
    arrays for a float32 model); clients answer in the dtypes they were sent, and
    replies whose dtypes differ from the model sent are rejected, so a shard model
    must keep its dtypes from round to round.

    Parameters
    ----------
    new : ArrayRecord
        An aggregated model.
    reference : ArrayRecord
        The model the shard had; its dtypes win. Keys only in ``new`` keep theirs.

    Returns
    -------
    ArrayRecord
        ``new`` itself when no dtype differs; otherwise a record with the same keys
        and order whose differing arrays are cast (to an integer or bool dtype after
        rounding to the nearest integer; float64 -> float32 rounds to nearest).
    """
    changed = {key for key, array in new.items()
               if key in reference and array.dtype != reference[key].dtype}
    if not changed:
        return new
    out = ArrayRecord()
    for key, array in new.items():
        if key in changed:
            want = np.dtype(reference[key].dtype)
            values = array.numpy()
            if not np.issubdtype(want, np.inexact) and np.issubdtype(
                    values.dtype, np.inexact):
                values = np.rint(values)  # e.g. an averaged integer counter
            array = Array(_contiguous(values.astype(want)))
        out[key] = array
    return out


def shielded(reply: Message) -> Message:
    """A copy of ``reply`` whose records a strategy may change without harm.

    Flower's FedMedian and FedTrimmedAvg ``pop`` every array out of the replies
    they aggregate; the caller still needs them (the history of client updates,
    the size of each transfer). Records are copied, array buffers are shared.
    """
    if not reply.has_content():
        return reply
    content = RecordDict({key: type(record)(dict(record))
                          for key, record in reply.content.items()})
    return Message(metadata=reply.metadata, content=content)


def pack_shards(shard_arrays: Sequence[ArrayRecord]) -> ArrayRecord:
    """Pack S shard models into one ArrayRecord (keys ``shard<s>/<layer>``).

    Parameters
    ----------
    shard_arrays : Sequence[ArrayRecord]
        One model per shard, in shard order.

    Returns
    -------
    ArrayRecord
        The arrays are shared, not copied.
    """
    packed = ArrayRecord()
    for s, arrays in enumerate(shard_arrays):
        for key, array in arrays.items():
            packed[shard_prefix(s) + key] = array
    return packed


def unpack_shards(arrays: ArrayRecord, num_shards: int) -> list[ArrayRecord]:
    """Split a packed ArrayRecord into its ``num_shards`` shard models.

    A key is split at its first ``/`` only, so a layer name is kept whole
    whatever it holds (``a/b``, ``shard1/x``, ...).

    Raises
    ------
    IsolationError
        A key without a known shard prefix, or a shard with no arrays.
    """
    shards = [ArrayRecord() for _ in range(num_shards)]
    for key, array in arrays.items():
        packed = _PACKED_KEY.fullmatch(key)
        if packed is None:
            raise IsolationError(f"array key {key!r} names no shard")
        s, layer = int(packed[1]), packed[2]
        if s >= num_shards:
            raise IsolationError(f"array key {key!r} names shard {s} of {num_shards}")
        shards[s][layer] = array
    for s, record in enumerate(shards):
        if not record:
            raise IsolationError(f"packed model has no arrays for shard {s}")
    return shards


class ShardGrid(Grid):
    """A view of a Grid restricted to one shard's nodes.

    ``get_node_ids`` lists only the shard's nodes (in the given order), and a
    message to any other node raises :class:`IsolationError` before it is sent.
    """

    def __init__(self, grid: Grid, shard: int, node_ids: Sequence[int]) -> None:
        self._grid = grid
        self.shard = shard
        self._node_ids = list(node_ids)
        self._allowed = frozenset(self._node_ids)

    def _check(self, node_id: int) -> None:
        if node_id not in self._allowed:
            raise IsolationError(
                f"shard {self.shard}: message for node {node_id}, which is not "
                "one of this shard's nodes"
            )

    def set_run(self, run):  # noqa: D102 (delegates)
        self._grid.set_run(run)

    @property
    def run(self):  # noqa: D102 (delegates)
        return self._grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        """Create a message for a node of this shard (see ``Grid.create_message``)."""
        self._check(dst_node_id)
        return self._grid.create_message(
            content, message_type, dst_node_id, group_id, ttl
        )

    def get_node_ids(self) -> list[int]:
        """The shard's node IDs, in shard order."""
        return list(self._node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Push messages, all of which must target this shard's nodes."""
        messages = list(messages)
        for message in messages:
            self._check(message.metadata.dst_node_id)
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Pull replies (see ``Grid.pull_messages``)."""
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        """Send to this shard's nodes only and return their replies."""
        messages = list(messages)
        for message in messages:
            self._check(message.metadata.dst_node_id)
        return self._grid.send_and_receive(messages, timeout=timeout)


class ShardedStrategy(Strategy):
    """S isolated sub-strategies, one per shard, driven as one Flower Strategy.

    Parameters
    ----------
    shard_strategies : Sequence[Strategy]
        One *distinct* strategy instance per shard (stateful strategies such as
        FedAdam keep per-shard state in their instance).
    shard_nodes : Sequence[Sequence[int]]
        Node IDs of each shard; disjoint. Their order fixes sampling and the
        order in which replies are aggregated, so runs are reproducible.
    seed : int or None
        Seeds Python's ``random`` (which stock strategies sample with) per
        (round, shard); the global random state is restored afterwards.
    verbose : bool or None
        Show the sub-strategies' INFO lines, each prefixed with its shard
        (:func:`shard_lines`); False: drop them. None: :func:`verbose_from_env`.

    Raises
    ------
    ValueError
        Mismatched lengths, shared instances, or overlapping shards.
    """

    def __init__(
        self,
        shard_strategies: Sequence[Strategy],
        shard_nodes: Sequence[Sequence[int]],
        seed: int | None = 0,
        verbose: bool | None = None,
    ) -> None:
        if len(shard_strategies) != len(shard_nodes) or not shard_nodes:
            raise ValueError(
                f"{len(shard_strategies)} strategies for {len(shard_nodes)} shards: "
                "need one strategy per shard and at least one shard"
            )
        if len({id(s) for s in shard_strategies}) != len(shard_strategies):
            raise ValueError("each shard needs its own strategy instance")
        seen: dict[int, int] = {}
        for s, nodes in enumerate(shard_nodes):
            for node in nodes:
                if node in seen:
                    raise ValueError(f"node {node} is in shards {seen[node]} and {s}")
                seen[node] = s
        self.shard_strategies = list(shard_strategies)
        self.shard_nodes = [list(n) for n in shard_nodes]
        self.node_shard = seen
        self.seed = seed
        self.verbose = verbose_from_env() if verbose is None else verbose

    @property
    def num_shards(self) -> int:
        """Number of shards S."""
        return len(self.shard_nodes)

    def shard_grid(self, grid: Grid, shard: int) -> ShardGrid:
        """The view of ``grid`` that shard ``shard`` may use."""
        return ShardGrid(grid, shard, self.shard_nodes[shard])

    def _configure(self, verb, server_round, arrays, config, grid) -> list[Message]:
        models = unpack_shards(arrays, self.num_shards)
        messages: list[Message] = []
        state = random.getstate()
        try:
            for s, strategy in enumerate(self.shard_strategies):
                if self.seed is not None:
                    random.seed(f"{self.seed}:{server_round}:{s}")
                shard_config = ConfigRecord(dict(config))
                shard_config["shard"] = s
                with shard_lines(s, self.verbose):
                    out = list(getattr(strategy, verb)(
                        server_round, models[s], shard_config, self.shard_grid(grid, s)
                    ))
                for message in out:
                    if self.node_shard.get(message.metadata.dst_node_id) != s:
                        raise IsolationError(
                            f"shard {s}'s strategy addressed node "
                            f"{message.metadata.dst_node_id} outside its shard"
                        )
                    messages.append(message)
        finally:
            random.setstate(state)
        return messages

    def route_replies(self, replies: Iterable[Message]) -> list[list[Message]]:
        """Split replies by the shard of their source node, in shard node order.

        Raises
        ------
        IsolationError
            A reply from a node that belongs to no shard.
        """
        routed: list[list[Message]] = [[] for _ in range(self.num_shards)]
        for reply in replies:
            node = reply.metadata.src_node_id
            if node not in self.node_shard:
                raise IsolationError(f"reply from node {node}, which is in no shard")
            routed[self.node_shard[node]].append(reply)
        for s, shard_replies in enumerate(routed):
            order = {n: i for i, n in enumerate(self.shard_nodes[s])}
            shard_replies.sort(key=lambda m: order[m.metadata.src_node_id])
        return routed

    def unanswered_shards(self, messages: Iterable[Message],
                          replies: Iterable[Message]) -> dict[int, int]:
        """Shards that were sent messages but have none of ``replies``.

        Parameters
        ----------
        messages : Iterable[Message]
            What was sent this round.
        replies : Iterable[Message]
            The replies that will be aggregated (e.g. those accepted by screening).

        Returns
        -------
        dict[int, int]
            Shard -> number of its nodes asked, in shard order. A shard asked
            nothing (e.g. one SE does not retrain) is not listed.
        """
        asked: dict[int, int] = {}
        for message in messages:
            shard = self.node_shard.get(message.metadata.dst_node_id)
            if shard is not None:
                asked[shard] = asked.get(shard, 0) + 1
        answered = {self.node_shard.get(r.metadata.src_node_id) for r in replies}
        return {s: n for s, n in sorted(asked.items()) if s not in answered}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Each shard samples its own nodes and sends them its own model."""
        self._current = unpack_shards(arrays, self.num_shards)
        return self._configure("configure_train", server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Each shard aggregates only its own replies.

        Sub-strategies see copies of the replies (:func:`shielded`), so the
        replies stay whole for the caller. A shard whose strategy returns no arrays
        keeps its model. A new model keeps the dtypes of the shard's model
        (:func:`keep_dtypes`), whatever dtypes the sub-strategy returns. Metrics
        come back prefixed ``shard<s>/``.
        """
        current = getattr(self, "_current", None)
        if current is None:
            raise RuntimeError("aggregate_train called before configure_train")
        models: list[ArrayRecord] = []
        metrics = MetricRecord()
        for s, shard_replies in enumerate(self.route_replies(replies)):
            # every shard is asked, even without replies: a strategy may update
            # its model from stored state (SE's preparation round).
            with shard_lines(s, self.verbose):
                new, shard_metrics = self.shard_strategies[s].aggregate_train(
                    server_round, [shielded(r) for r in shard_replies]
                )
            models.append(current[s] if new is None else keep_dtypes(new, current[s]))
            for key, value in (shard_metrics or {}).items():
                metrics[shard_prefix(s) + key] = value
        return pack_shards(models), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Each shard sends its own model to its own nodes for evaluation."""
        return self._configure("configure_evaluate", server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Per-shard evaluation metrics, prefixed ``shard<s>/``."""
        metrics = MetricRecord()
        for s, shard_replies in enumerate(self.route_replies(replies)):
            if not shard_replies:
                continue
            with shard_lines(s, self.verbose):
                out = self.shard_strategies[s].aggregate_evaluate(
                    server_round, [shielded(r) for r in shard_replies])
            for key, value in (out or {}).items():
                metrics[shard_prefix(s) + key] = value
        return metrics or None

    def summary(self) -> None:
        """Log the shards and their strategies."""
        log(INFO, "\t├──> %d isolated shards:", self.num_shards)
        for s, (strategy, nodes) in enumerate(
            zip(self.shard_strategies, self.shard_nodes, strict=True)
        ):
            log(INFO, "\t│\t shard %d: %s over %d nodes", s,
                type(strategy).__name__, len(nodes))

