"""Build a stock Flower strategy by name, sized for one shard.

Used for the run-config key ``shard-strategy``: each shard gets its own instance,
sampling ``per_round`` of its ``shard_size`` nodes each round, with client-side
federated evaluation off (the ServerApp evaluates centrally).
"""

from __future__ import annotations

from flwr.serverapp import strategy as flwr_strategies
from flwr.serverapp.strategy import Strategy


def make_stock_strategy(
    name: str,
    per_round: int,
    shard_size: int,
    proximal_mu: float = 0.01,
    server_lr: float = 0.01,
) -> Strategy:
    """A fresh ``flwr.serverapp.strategy.<name>`` instance for one shard.

    Parameters
    ----------
    name : str
        ``FedAvg``, ``FedProx``, ``FedAvgM``, ``FedAdam``, ``FedAdagrad``,
        ``FedYogi``, ``FedMedian`` or ``FedTrimmedAvg``.
    per_round : int
        Nodes sampled per round (``min_train_nodes``).
    shard_size : int
        Nodes in the shard; ``fraction_train = per_round / shard_size``.
    proximal_mu : float
        FedProx's proximal weight mu.
    server_lr : float
        Server learning rate eta of FedAdam / FedAdagrad / FedYogi, and of FedAvgM.

    Raises
    ------
    ValueError
        Unknown name, or ``per_round`` not in ``1..shard_size``.
    """
    cls = getattr(flwr_strategies, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)) or name == "Strategy":
        raise ValueError(f"shard-strategy {name!r} is not a Flower strategy")
    if not 1 <= per_round <= shard_size:
        raise ValueError(
            f"{per_round} clients per shard round is not allowed: between 1 and the "
            f"shard size {shard_size}"
        )
    kwargs: dict[str, object] = {
        "fraction_train": per_round / shard_size,
        "min_train_nodes": per_round,
        "min_available_nodes": per_round,
        "fraction_evaluate": 0.0,
    }
    if name == "FedProx":
        kwargs["proximal_mu"] = proximal_mu
    elif name in ("FedAdam", "FedAdagrad", "FedYogi"):
        kwargs["eta"] = server_lr
    elif name == "FedAvgM":
        kwargs["server_learning_rate"] = server_lr
    return cls(**kwargs)
