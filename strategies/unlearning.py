"""Unlearning strategies: Sharding Eraser, FedEraser, FedRetrain, RapidRetrain.

Each is a Flower ``Strategy`` with the usual verbs, so it runs under
``Strategy.start(grid, initial_arrays, num_rounds=strategy.num_rounds)`` or any
round loop, and swaps for another in one line. All work on packed shard models
(see :mod:`strategies.sharded`); the baselines are the one-shard case.

- :class:`CalibratedRetraining` (:mod:`strategies.replay`, re-exported here):
  FedEraser's calibrated retraining of one shard from its stored history (paper
  eq. 2-3; Liu et al., IWQoS 2021, Alg. 1).
- :class:`ShardingEraser` (SE): calibrated retraining of the impacted shards
  only; the other shards are frozen, bit for bit (Lin et al., IJCAI 2024).
- :class:`FedEraser` (FE): the same on one unsharded federation.
- :class:`FedRetrain` (FR): train from scratch on the retained clients.
- :class:`RapidRetrain` (RR): FR with Fisher-preconditioned local steps (the
  client applies it; see ``task.train.fisher_preconditioner``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from flwr.app import ConfigRecord
from flwr.serverapp.strategy import Strategy

from strategies.calibration import calibration_plan, first_participation
from strategies.factory import make_stock_strategy
from strategies.replay import (
    UNLEARN_MESSAGE,
    CalibratedRetraining,
    FrozenShard,
    HistoryReader,
    ReplaySchedule,
    reported_examples,
)
from strategies.sharded import ShardedStrategy

__all__ = ["CalibratedRetraining", "FedEraser", "FedRetrain", "FrozenShard",
           "HistoryReader", "ImpactedShards", "RapidRetrain", "ReplaySchedule",
           "ShardingEraser", "UNLEARN_MESSAGE", "calibration_plan",
           "first_participation", "reported_examples"]


class ImpactedShards(ShardedStrategy):
    """A sharded strategy that redoes its ``impacted`` shards; the others frozen.

    Each impacted shard's sub-strategy has ``num_rounds`` and ``replay_report``.
    """

    impacted: list[int]

    @property
    def num_rounds(self) -> int:
        """Server rounds: the longest plan of an impacted shard."""
        return max((getattr(s, "num_rounds", 0) for s in self.shard_strategies),
                   default=0)

    def replay_report(self) -> dict[int, dict]:
        """Impacted shard -> its sub-strategy's ``replay_report()``."""
        return {s: self.shard_strategies[s].replay_report() for s in self.impacted}


class ShardingEraser(ImpactedShards):
    """SE: calibrated retraining of the impacted shards only.

    Parameters
    ----------
    history : HistoryReader
        The sharded history (shard s's rounds under shard index s).
    forget : Iterable[int]
        Partition ids to forget (cumulative over requests).
    shards : Sequence[Sequence[int]]
        Partition ids of each shard.
    node_of : Mapping[int, int]
        partition id -> node id.
    retrain_epochs : float
        L / r.
    schedule : ReplaySchedule
        Passed to each :class:`CalibratedRetraining` (dt, where the replay
        starts, the ``final`` exact rounds and their epochs); its ``refill``
        refills forgotten participants' slots from the shard's retained members
        (``replay-refill``), of those ``present`` in the round's stage.
    impacted : Iterable[int], optional
        Shards to retrain; default every shard holding a forgotten client. In a
        sequential series, request k retrains only the shards of its own
        clients, with ``forget`` = all clients forgotten so far (the other
        shards already excluded the earlier ones).
    changed : Iterable[int]
        Clients that stay but lost records (a records or class-level request):
        their shards are impacted too, and each replay starts from the first
        round a forgotten or changed client trained (:class:`CalibratedRetraining`).

    Raises
    ------
    ValueError
        A forgotten or changed id in no shard, a shard that would lose every
        client, or an impacted shard that holds no forgotten or changed client.
    """

    def __init__(self, history: HistoryReader, forget: Iterable[int],
                 shards: Sequence[Sequence[int]], node_of: Mapping[int, int],
                 retrain_epochs: float, schedule: ReplaySchedule = ReplaySchedule(), *,
                 impacted: Iterable[int] | None = None,
                 changed: Iterable[int] = ()) -> None:
        forget, changed = frozenset(forget), frozenset(changed)
        shard_of = {p: s for s, pids in enumerate(shards) for p in pids}
        unknown = sorted((forget | changed) - set(shard_of))
        if unknown:
            raise ValueError(f"cannot forget partition ids {unknown}: in no shard")
        for s, pids in enumerate(shards):
            if set(pids) <= forget:
                raise ValueError(f"forgetting {sorted(forget)} would empty shard {s}")
        holding = {shard_of[p] for p in forget | changed}
        self.impacted = sorted(holding if impacted is None else set(impacted))
        if not set(self.impacted) <= holding:
            raise ValueError(f"shards {sorted(set(self.impacted) - holding)} hold no "
                             "forgotten client: nothing to retrain there")
        subs: list[Strategy] = [
            CalibratedRetraining(history, s, forget, node_of, retrain_epochs, schedule,
                                 members=shards[s], changed=changed)
            if s in self.impacted else FrozenShard()
            for s in range(len(shards))
        ]
        super().__init__(subs, [[node_of[p] for p in pids] for pids in shards],
                         seed=None)

    def start_rounds(self) -> dict[int, int | None]:
        """Impacted shard -> g0, the stored round its replay starts at.

        None: no forgotten client trained there; its model stays.
        """
        return {s: self.shard_strategies[s].start_round
                if self.shard_strategies[s].plan else None for s in self.impacted}



class FedEraser(ShardingEraser):
    """FE: calibrated retraining of one unsharded federation (Liu et al., 2021).

    Same parameters as :class:`ShardingEraser`, with ``shards`` a single list of
    every client; ``history`` is the unsharded federation's own store.
    """


class FedRetrain(ShardedStrategy):
    """FR: retrain from scratch on the retained clients, G rounds of L epochs.

    One stock ``base_strategy`` per shard, over the retained clients only, so
    the result equals a learning run whose client set excludes the forgotten
    ones (same seed, same sampling). A shard that keeps fewer clients than it
    sampled per round in learning samples all of them: ``min(per round,
    retained)`` (:attr:`sampled`, :attr:`clients_per_round`).

    Parameters
    ----------
    forget : Iterable[int]
        Partition ids to forget.
    shards : Sequence[Sequence[int]]
        Partition ids of each shard (one list for the unsharded federation).
    node_of : Mapping[int, int]
        partition id -> node id.
    clients_per_round : int
        Clients sampled per round in all shards together.
    num_rounds : int
        G.
    base_strategy : str
        A ``flwr.serverapp.strategy`` name (default FedAvg).
    seed : int
        Sampling seed (as in learning).

    Attributes
    ----------
    sampled : list[int]
        Clients each shard samples per round: ``min(clients_per_round / S,
        retained clients of the shard)``.
    clients_per_round : int
        Their sum: clients per round over all shards.

    Raises
    ------
    ValueError
        A shard left with no retained client.
    """

    def __init__(self, forget: Iterable[int], shards: Sequence[Sequence[int]],
                 node_of: Mapping[int, int], clients_per_round: int, num_rounds: int,
                 base_strategy: str = "FedAvg", seed: int = 0,
                 **strategy_kwargs: float | None) -> None:
        forget = frozenset(forget)
        retained = [[p for p in pids if p not in forget] for pids in shards]
        per_round = clients_per_round // len(shards)
        for s, pids in enumerate(retained):
            if not pids:
                raise ValueError(f"shard {s} keeps no client after forgetting")
        self.sampled = [min(per_round, len(pids)) for pids in retained]
        self.clients_per_round = sum(self.sampled)
        subs = [make_stock_strategy(base_strategy, n, len(pids), **strategy_kwargs)
                for n, pids in zip(self.sampled, retained, strict=True)]
        super().__init__(subs, [[node_of[p] for p in pids] for pids in retained],
                         seed=seed)
        self.num_rounds = num_rounds


class RapidRetrain(FedRetrain):
    """RR: FedRetrain with Fisher-preconditioned local SGD on the clients.

    Source: Liu et al., "The Right to be Forgotten in Federated Learning: An
    Efficient Realization with Rapid Retraining", INFOCOM 2022 (diagonal
    empirical Fisher information matrix).

    Each training message carries ``precondition = "fisher"``,
    ``fisher-samples`` and ``fisher-damping``; the client estimates
    F = mean_i g_i * g_i over ``fisher-samples`` per-sample gradients at the
    start of its local training and steps with
    w <- w - lr * g * (mean(F) + lambda) / (F + lambda), lambda = damping *
    mean(F) per layer (see ``task.train.fisher_preconditioner``).
    """

    def __init__(self, *args, fisher_samples: int = 32, fisher_damping: float = 1.0,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fisher_samples = fisher_samples
        self.fisher_damping = fisher_damping

    def configure_train(self, server_round, arrays, config, grid):
        """FedRetrain's messages, asking for Fisher preconditioning."""
        config = ConfigRecord(dict(config))
        config["precondition"] = "fisher"
        config["fisher-samples"] = self.fisher_samples
        config["fisher-damping"] = self.fisher_damping
        return super().configure_train(server_round, arrays, config, grid)
