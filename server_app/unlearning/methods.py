"""Unlearning methods of one's own: ``frameworks = "SE,FR,package.module:Class"``.

A method is a :class:`strategies.ShardedStrategy` class (a Flower ``Strategy``
with one sub-strategy a shard and the shards' nodes kept apart, as SE, FR, FE and
RR are), built for each request from an :class:`UnlearningRequest`
(``Class(request)``), and run by
the same round loop, cost meter, evaluation, audit and report as SE, FR, FE and
RR (:mod:`server_app.unlearning.driver`). It works on SE's sharded federation:
the S shard models packed in one ``ArrayRecord`` (``shard<s>/<layer>``,
:func:`strategies.sharded.pack_shards`), SE's stored training history, and
messages of type ``train`` or ``train.unlearn`` to the retained clients. Its name
in summary.json, the report and the experiment suite is its class name.

What the class must have besides the Strategy verbs (ShardedStrategy routes them
to its sub-strategies; override ``configure_train`` / ``aggregate_train`` to do
more):

- ``num_rounds`` (int): the server rounds to run (0: nothing to do);
- optionally ``initial_models`` (list of S ``ArrayRecord``): the shard models of
  round 0 (default: ``request.models``, the models after the previous request);
- optionally ``impacted`` (list of shard indices) for the report (default: all).

docs/TASKS.md shows a minimal one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord

from history import StoreError, TrainingHistory
from server_app.config import ConfigError
from strategies.sharded import ShardedStrategy
from task.registry import import_object


@dataclass(frozen=True)
class UnlearningRequest:
    """What a method of one's own gets for one request.

    Attributes
    ----------
    forget : frozenset[int]
        Every partition id forgotten so far (forgetting is cumulative).
    batch : tuple[int, ...]
        This request's partition ids.
    shards : list[list[int]]
        Partition ids of each of SE's S shards.
    node_of : Mapping[int, int]
        Partition id -> Flower node id.
    history : history.TrainingHistory
        SE's stored training history (``participants``, ``update``, ``rounds``,
        ``shard_model``; uncoded or coded, read the same way).
    models : list[ArrayRecord]
        The S shard models now (the learned ones, or after the previous request).
    initial : ArrayRecord
        W^0, the model learning started from.
    train_config : ConfigRecord
        What learning's messages carried (``lr``, ``local-epochs``, ``batch-size``,
        ``optimizer``, ``momentum``, ``seed``, ``data-dir``).
    retrain_epochs : float
        L / r of the run (``retrain-ratio``).
    num_rounds : int
        G, the learning rounds.
    clients_per_round : int
        Clients sampled a round over all shards in learning.
    seed : int
        The run's seed.
    """

    forget: frozenset[int]
    batch: tuple[int, ...]
    shards: list[list[int]]
    node_of: Mapping[int, int]
    history: TrainingHistory
    models: list[ArrayRecord]
    initial: ArrayRecord
    train_config: ConfigRecord
    retrain_epochs: float
    num_rounds: int
    clients_per_round: int
    seed: int


def load_method(spec: str) -> type[ShardedStrategy]:
    """The method class ``spec`` (``package.module:Class``) names.

    Raises
    ------
    ConfigError
        One line naming ``frameworks``: the module cannot be imported, the
        attribute is missing, or it is not a ``ShardedStrategy`` class.
    """
    try:
        obj = import_object(spec, "frameworks")
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    if not (isinstance(obj, type) and issubclass(obj, ShardedStrategy)):
        what = f"the class {obj.__name__}" if isinstance(obj, type) else \
            f"a {type(obj).__name__}"
        raise ConfigError(f"run-config 'frameworks' = {spec!r} is not allowed: it is "
                          f"{what}, not a strategies.ShardedStrategy subclass")
    return obj


def build_method(spec: str, request: UnlearningRequest) -> ShardedStrategy:
    """``Class(request)``, checked to have ``num_rounds`` (and S initial models).

    Raises
    ------
    ValueError
        The method lacks ``num_rounds`` or gives another number of models.
    """
    strategy = load_method(spec)(request)
    rounds = getattr(strategy, "num_rounds", None)
    if not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"method {spec!r}: num_rounds = {rounds!r} must be an int >= 0")
    models = getattr(strategy, "initial_models", None) or request.models
    if len(models) != len(request.shards):
        raise ValueError(f"method {spec!r}: {len(models)} initial models for "
                         f"{len(request.shards)} shards")
    return strategy


class NoHistory(TrainingHistory):
    """A training history with no rounds yet: what a method sees when probed.

    Before learning only W^0 exists: ``shard_model(s, 0)`` gives it, and an
    update or a later model raises :class:`history.StoreError` (as a real store
    does for what it lacks); ``rounds`` and ``participants`` are empty.

    Parameters
    ----------
    initial : ArrayRecord
        W^0, every shard's model before round 1.
    """

    root = None

    def __init__(self, initial: ArrayRecord) -> None:
        self._initial = {k: v.numpy() for k, v in initial.items()}

    def rounds(self, shard: int) -> list[int]:
        """No round is stored yet."""
        return []

    def participants(self, shard: int, rnd: int) -> list[tuple[int, int]]:
        """No participant is stored yet."""
        return []

    def client_shard(self) -> dict[int, int]:
        """No client is stored yet."""
        return {}

    def update(self, shard: int, rnd: int, partition_id: int):
        """Raises StoreError: nothing is stored before learning."""
        raise StoreError(f"update of client {partition_id} in round {rnd}: none "
                         "stored yet")

    def shard_model(self, shard: int, rnd: int):
        """W^0 for round 0; a later round raises StoreError (none stored yet)."""
        if rnd == 0:
            return {k: v.copy() for k, v in self._initial.items()}
        raise StoreError(f"shard {shard}'s model of round {rnd}: none stored yet")

    def total_bytes(self) -> int:
        """Nothing stored."""
        return 0

    def verify(self) -> list[str]:
        """Nothing to verify."""
        return []

    def take_retrieval(self) -> dict | None:
        """No coded retrieval."""
        return None

    def accounting(self) -> dict | None:
        """No coded accounting."""
        return None

    def retrievals(self) -> list[dict]:
        """No coded retrieval."""
        return []

    def close(self) -> None:
        """Nothing to close."""


def probe_method(spec: str, request: UnlearningRequest) -> None:
    """Build method ``spec`` once on ``request`` (before any engine), as a request will.

    ``request`` holds the run's real W^0 (dtypes and shapes), shards and seed,
    with :class:`NoHistory`: a class that is no method (a plain
    ``ShardedStrategy``, whose constructor takes other arguments) fails here,
    not after learning.

    Raises
    ------
    ConfigError
        One line naming ``frameworks``: the class cannot be loaded, its
        constructor raised, or it lacks ``num_rounds`` / gives another number
        of models.
    """
    try:
        build_method(spec, request)
    except ConfigError:
        raise
    except Exception as err:  # a plug-in's own code: any error is the plug-in's
        text = str(err).splitlines()[0] if str(err) else ""
        raise ConfigError(f"run-config 'frameworks' = {spec!r}: the method cannot be "
                          f"built on this run's model and shards ({type(err).__name__}"
                          f": {text}); it must take one UnlearningRequest (docs/"
                          "TASKS.md)") from None
