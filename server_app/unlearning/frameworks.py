"""Build an unlearning framework (a registered method, or one's own) for one request.

:func:`build_framework` turns a framework's name, the learned stage and the
clients to forget into a :class:`Framework`: its Flower strategy, the shard models
it starts from, its rounds, the shards it retrains and, for the from-scratch
baselines, how many clients it samples per round. The method's class builds it
(:class:`server_app.config.methods.UnlearningMethod`, the built-ins in
:mod:`server_app.unlearning.builtin`); a user's ``package.module:Class``
``ShardedStrategy`` is built by :func:`build_plugin`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord

from history import TrainingHistory
from server_app.config import RunConfig
from server_app.config.methods import MethodSettings, UnlearningMethod
from server_app.config.methods import info as method_info
from server_app.rounds.federation import Federation
from server_app.unlearning.methods import UnlearningRequest, build_method
from strategies.calibration import first_participation, weighted_step
from strategies.sharded import ShardedStrategy

# shard strategies whose round is W^g = W^(g-1) + sum n_m U_m^g / sum n_m, so a
# shard model can be rebuilt from the stored record (coded storage keeps no W^g)
REBUILDABLE = ("FedAvg", "FedProx")


@dataclass
class Stage:
    """What the unlearning stage needs from learning.

    ``cfg`` is the run's config: the methods read their settings from it
    (``cfg.training``, ``cfg.unlearning``, ``cfg.methods``, ``cfg.seed``).
    """

    cfg: RunConfig
    sharded: Federation
    baseline: Federation
    sharded_store: TrainingHistory
    baseline_store: TrainingHistory | None
    sharded_models: list[ArrayRecord]
    initial: ArrayRecord
    train_config: ConfigRecord
    target_loss: float | None = None
    """FR / RR: the original model's test loss, for rounds-to-target."""
    present: Callable[[int], Collection[int]] | None = None
    """Staged runs: stored round -> the clients present in its stage, the only ones
    ``replay-refill`` may draw (None: every member of the shard)."""


@dataclass
class Framework:
    """One framework, built for one request.

    Attributes
    ----------
    strategy : ShardedStrategy
        The Flower strategy to run.
    initial : list[ArrayRecord]
        Each shard's model before round 1.
    num_rounds : int
        Rounds to run.
    impacted : list[int]
        Shards it retrains (SE: those holding a forgotten client; else all).
    clients_per_round : int, optional
        FR / RR: clients sampled per round over all shards (fewer than in
        learning when forgetting left a shard too few).
    sampled : list[int], optional
        FR / RR: clients each shard samples per round.
    replay : dict, optional
        SE: per impacted shard, :meth:`CalibratedRetraining.replay_report`;
        ``unchanged``: shards of the request whose clients never trained there
        (left as they are); ``start_models``: where each W^(g0-1) came from.
    unchanged : list[int], optional
        A method without a replay report: the request's shards left as they are
        (its clients never trained there), for the log.
    """

    strategy: ShardedStrategy
    initial: list[ArrayRecord]
    num_rounds: int
    impacted: list[int]
    clients_per_round: int | None = None
    sampled: list[int] | None = None
    replay: dict | None = None
    unchanged: list[int] | None = None


@dataclass(frozen=True)
class Request:
    """What a method's :meth:`~UnlearningMethod.build` gets for one request.

    Attributes
    ----------
    method : type[UnlearningMethod]
        The method's class (its ``name`` and description).
    settings : MethodSettings
        Its own settings (``method.<key>.*``; :attr:`UnlearningMethod.Settings`).
    stage : Stage
        The learned stage.
    forget : set[int]
        Every partition id forgotten so far.
    batch : sequence of int, optional
        This request's partition ids (default: ``forget``).
    current : sequence of ArrayRecord, optional
        The shard models after the previous request (default: the learned ones).
    changed : frozenset of int
        Clients that stay but lost records (a records or class-level request,
        :mod:`server_app.unlearning.erasure`): a method with ``erases_records``
        retrains their shards with them taking part.
    erasing : frozenset of int
        Those of ``changed`` whose records this request erases (the others lost
        theirs in an earlier request: they only train on what they keep).
    """

    method: type[UnlearningMethod]
    settings: MethodSettings
    stage: Stage
    forget: set[int]
    batch: Sequence[int] | None = None
    current: Sequence[ArrayRecord] | None = None
    changed: frozenset[int] = frozenset()
    erasing: frozenset[int] = frozenset()

    @property
    def earlier(self) -> set[int]:
        """Clients forgotten or changed by the series' earlier requests."""
        return (set(self.forget) | set(self.changed)) - self.clients

    @property
    def clients(self) -> set[int]:
        """The clients whose shards the request sends back.

        This request's forgotten ones and those whose records it erases; with
        neither, every client forgotten so far.
        """
        if self.batch or self.erasing:
            return set(self.batch or ()) | self.erasing
        return set(self.forget)


def build_framework(name: str, stage: Stage, forget: set[int],
                    batch: Sequence[int] | None = None,
                    current: Sequence[ArrayRecord] | None = None,
                    changed: frozenset[int] = frozenset(), *,
                    erasing: frozenset[int] | None = None) -> Framework:
    """The framework ``name`` for forgetting ``forget``.

    ``forget`` holds every client forgotten so far; ``batch`` (this request's
    clients) picks the shards a selective method retrains and ``current`` holds
    the shard models after the previous request (default: the learned ones);
    ``changed`` the clients that stay but lost records, ``erasing`` those of them
    this request concerns (default: all, :class:`Request`). The method's class
    builds it (:mod:`server_app.config.methods`).

    Raises
    ------
    ValueError
        Unknown framework, or one its builder refuses (FE without a baseline
        history, ...).
    """
    try:
        described = method_info(name, stage.cfg.unlearning.plugin_methods)
    except KeyError as err:
        raise ValueError(err.args[0]) from None
    if changed and not described.erases_records:  # the config check refuses it first
        raise ValueError(f"{name} cannot erase records while their clients stay")
    own = stage.cfg.methods.get(name) or described.Settings()
    request = Request(described, own, stage, forget, batch, current, frozenset(changed),
                      frozenset(changed if erasing is None else erasing))
    return build_plugin(request) if described.plugin else described.build(request)


def retrained_shards(store: TrainingHistory, shard_of: dict[int, int], clients: set[int],
                     earlier: set[int], redrawn: bool) -> tuple[list[int], list[int]]:
    """The shards whose current models hold data of ``clients``; those that do not.

    A shard holds a client's data when the client trained there in learning (the
    stored record, :func:`strategies.calibration.first_participation`); and, when
    a method retrains with clients drawn afresh (SE's and SE-R's refilled slots,
    SISA's sampling from W^0: ``redrawn``), also when an earlier request of the
    series retrained the shard: one of ``earlier`` (clients forgotten or changed
    before this request) trained there, and any member of the shard may have
    been drawn into that retraining. Such a shard is retrained again, with every
    client forgotten so far left out, rather than kept with the data of a
    client now forgotten.

    Parameters
    ----------
    store : TrainingHistory
        The learning record of the shards.
    shard_of : dict of int to int
        Partition id -> shard.
    clients : set of int
        This request's clients.
    earlier : set of int
        Clients forgotten or whose records were erased by earlier requests.
    redrawn : bool
        The method's retraining draws clients who may not have trained there.

    Returns
    -------
    (list of int, list of int)
        The shards to retrain and the request's shards left as they are, sorted.
    """
    held = {shard_of[p] for p in clients}
    retrained = {s for s in held if first_participation(store, s, clients) is not None
                 or (redrawn and first_participation(store, s, earlier) is not None)}
    return sorted(retrained), sorted(held - retrained)


def rebuild_shard_model(store: TrainingHistory, shard: int, rnd: int) -> dict:
    """W_s^rnd = W_s^0 + the FedAvg steps of stored rounds 1..rnd (float32).

    Exact for a FedAvg / FedProx shard up to float32 rounding and, with coded
    storage, the quantisation step (2^-quant-scale-bits) of each stored update.

    Raises
    ------
    StoreError
        The record of a round is missing.
    """
    model = store.shard_model(shard, 0)
    for g in store.rounds(shard):
        if g > rnd:
            break
        members = store.participants(shard, g)
        model = weighted_step(model, [store.update(shard, g, p) for p, _ in members],
                              [n for _, n in members])
    return model


def build_plugin(call: Request) -> Framework:
    """A method of one's own on SE's shards (:mod:`server_app.unlearning.methods`)."""
    stage, cfg, federation = call.stage, call.stage.cfg, call.stage.sharded
    request = UnlearningRequest(
        frozenset(call.forget), tuple(sorted(call.batch or call.forget)),
        federation.shards, federation.node_of, stage.sharded_store,
        list(call.current or stage.sharded_models), stage.initial, stage.train_config,
        cfg.retrain_epochs, cfg.training.num_rounds, cfg.training.clients_per_round,
        cfg.seed)
    strategy = build_method(call.method.plugin, request)
    initial = list(getattr(strategy, "initial_models", None) or request.models)
    impacted = list(getattr(strategy, "impacted", None) or range(len(request.shards)))
    return Framework(strategy, initial, strategy.num_rounds, impacted)
