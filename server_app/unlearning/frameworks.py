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
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord

from history import TrainingHistory
from server_app.config import RunConfig
from server_app.config.methods import MethodSettings, UnlearningMethod
from server_app.config.methods import info as method_info
from server_app.rounds.federation import Federation
from server_app.unlearning.methods import UnlearningRequest, build_method
from strategies.calibration import weighted_step
from strategies.sharded import ShardedStrategy

# shard strategies whose round is W^g = W^(g-1) + sum n_m U_m^g / sum n_m, so a
# shard model can be rebuilt from the stored record (coded storage keeps no W^g)
REBUILDABLE = ("FedAvg", "FedProx")


@dataclass(frozen=True, kw_only=True)
class UnlearningSettings:
    """The run settings the unlearning stage reads (from :class:`RunConfig`).

    Attributes
    ----------
    retrain_epochs : float
        L / r, local epochs of a calibration round (seconds of compute follow).
    calibration_interval : int
        FedEraser's interval: every n-th stored round is replayed.
    clients_per_round, num_rounds : int
        FR / RR: the learning budget they retrain with.
    shard_strategy : str
        FR / RR: the stock strategy of their shards.
    strategy_options : dict
        Its server settings (:attr:`RunConfig.shard_strategy_options`).
    seed : int
        Seeds FR / RR sampling.
    request_mode : str
        ``sequential`` or ``concurrent``.
    num_requests : int
        K, for the paper's expected cost (1 with ``forget-clients``).
    frameworks : tuple[str, ...]
        The frameworks to run, in order (run-config ``frameworks``; a method of
        one's own by its class name).
    methods : dict[str, str]
        Name -> ``package.module:Class`` of each method of one's own.
    method_settings : dict[str, MethodSettings]
        Each built-in's own settings, by name (:attr:`RunConfig.methods`).
    local_epochs : float, optional
        L, the local epochs of an exact round (None: ``retrain_epochs``).
    """

    retrain_epochs: float
    calibration_interval: int
    clients_per_round: int
    num_rounds: int
    shard_strategy: str
    strategy_options: dict
    seed: int
    request_mode: str
    num_requests: int
    frameworks: tuple[str, ...] = ()
    methods: dict = field(default_factory=dict)
    method_settings: dict = field(default_factory=dict)
    local_epochs: float | None = None

    @classmethod
    def from_config(cls, cfg: RunConfig) -> UnlearningSettings:
        """The fields of ``cfg`` that unlearning uses."""
        training, unlearning = cfg.training, cfg.unlearning
        return cls(retrain_epochs=cfg.retrain_epochs,
                   calibration_interval=unlearning.calibration_interval,
                   clients_per_round=training.clients_per_round,
                   num_rounds=training.num_rounds,
                   shard_strategy=training.shard_strategy,
                   strategy_options=dict(training.shard_strategy_options),
                   seed=cfg.seed, request_mode=unlearning.request_mode,
                   num_requests=1 if unlearning.forget_clients else unlearning.num_requests,
                   frameworks=tuple(unlearning.framework_list),
                   methods=dict(unlearning.plugin_methods),
                   method_settings=dict(cfg.methods),
                   local_epochs=training.local_epochs)


@dataclass
class Stage:
    """What the unlearning stage needs from learning."""

    settings: UnlearningSettings
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
        described = method_info(name, stage.settings.methods)
    except KeyError as err:
        raise ValueError(err.args[0]) from None
    if changed and not described.erases_records:  # the config check refuses it first
        raise ValueError(f"{name} cannot erase records while their clients stay")
    own = stage.settings.method_settings.get(name) or described.Settings()
    request = Request(described, own, stage, forget, batch, current, frozenset(changed),
                      frozenset(changed if erasing is None else erasing))
    return build_plugin(request) if described.plugin else described.build(request)


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
    stage, settings, federation = call.stage, call.stage.settings, call.stage.sharded
    request = UnlearningRequest(
        frozenset(call.forget), tuple(sorted(call.batch or call.forget)),
        federation.shards, federation.node_of, stage.sharded_store,
        list(call.current or stage.sharded_models), stage.initial, stage.train_config,
        settings.retrain_epochs, settings.num_rounds, settings.clients_per_round,
        settings.seed)
    strategy = build_method(call.method.plugin, request)
    initial = list(getattr(strategy, "initial_models", None) or request.models)
    impacted = list(getattr(strategy, "impacted", None) or range(len(request.shards)))
    return Framework(strategy, initial, strategy.num_rounds, impacted)
