"""SISA: exact unlearning inside a shard, the yardstick of every sharded method.

Each shard a request's clients trained in is retrained from W^0 on its retained
clients with learning's schedule (G rounds, the shard's clients per round, L local
epochs, the shard strategy); the other shards keep their models. This is SISA's
exact unlearning with one slice per shard (Bourtoule et al., "Machine Unlearning",
IEEE S&P 2021): the result never depended on a forgotten client. Its distance to
FR is the price of isolation (S models, each on 1/S of the data); SE's distance to
it is the price of SE's approximation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from server_app.config.methods import UnlearningMethod
from server_app.unlearning.frameworks import Framework, Request, retrained_shards
from strategies.factory import make_stock_strategy
from strategies.replay import FrozenShard
from strategies.sharded import ShardedStrategy


class ShardRetrain(ShardedStrategy):
    """Retrain the ``impacted`` shards from scratch on their retained clients.

    Parameters
    ----------
    forget : Iterable[int]
        Partition ids forgotten so far.
    shards : Sequence[Sequence[int]]
        Partition ids of each of SE's shards.
    node_of : Mapping[int, int]
        Partition id -> Flower node id.
    impacted : Iterable[int]
        The shards to retrain; the others are frozen (no message, model kept).
    clients_per_round : int
        Clients a round over all shards in learning (each shard samples
        ``clients_per_round / S``, at most its retained clients).
    num_rounds : int
        G, learning's rounds.
    base_strategy : str
        The shard strategy (a ``flwr.serverapp.strategy`` name).
    seed : int
        Sampling seed.

    Raises
    ------
    ValueError
        An impacted shard keeps no client.
    """

    def __init__(self, forget: Iterable[int], shards: Sequence[Sequence[int]],
                 node_of: Mapping[int, int], impacted: Iterable[int], *,
                 clients_per_round: int, num_rounds: int, base_strategy: str = "FedAvg",
                 seed: int = 0, **strategy_kwargs: float | None) -> None:
        forget, self.impacted = frozenset(forget), sorted(set(impacted))
        retained = [[p for p in pids if p not in forget] for pids in shards]
        per_round = clients_per_round // len(shards)
        subs = []
        for s, pids in enumerate(retained):
            if s not in self.impacted:
                subs.append(FrozenShard())
                continue
            if not pids:
                raise ValueError(f"shard {s} keeps no client after forgetting")
            subs.append(make_stock_strategy(base_strategy, min(per_round, len(pids)),
                                            len(pids), **strategy_kwargs))
        super().__init__(subs, [[node_of[p] for p in pids] for pids in retained],
                         seed=seed)
        self.num_rounds = num_rounds if self.impacted else 0


class ShardRetrainMethod(UnlearningMethod):
    """SISA: each impacted shard retrained from W^0 (:class:`ShardRetrain`)."""

    name = "SISA"
    reads_history = False
    exact = erases_records = True
    colour = "#bcbd22"
    summary = "exact shard retraining (SISA, one slice): each impacted shard from W^0"

    @classmethod
    def build(cls, request: Request) -> Framework:
        """Retrain each shard holding data of the request's clients, from W^0."""
        return _build(request)


def _build(call: Request) -> Framework:
    stage, training = call.stage, call.stage.cfg.training
    federation, store = stage.sharded, stage.sharded_store
    # an earlier request's retraining may have sampled a client learning never did
    impacted, unchanged = retrained_shards(store, federation.shard_of, call.clients,
                                           call.earlier, redrawn=True)
    strategy = ShardRetrain(call.forget, federation.shards, federation.node_of, impacted,
                            clients_per_round=training.clients_per_round,
                            num_rounds=training.num_rounds,
                            base_strategy=training.shard_strategy, seed=stage.cfg.seed,
                            **training.shard_strategy_options)
    models = list(call.current or stage.sharded_models)
    initial = [stage.initial if s in impacted else model for s, model in enumerate(models)]
    return Framework(strategy, initial, strategy.num_rounds, impacted,
                     unchanged=unchanged)
