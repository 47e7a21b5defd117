"""Build a stock Flower strategy by name, sized for one shard.

Used for the run-config key ``shard-strategy``: each shard gets its own instance,
sampling ``per_round`` of its ``shard_size`` nodes each round, with client-side
federated evaluation off (the ServerApp evaluates centrally; Flower's warning
about it is dropped at construction, :data:`EVALUATION_OFF_NOTICE`).

Server-side settings default per strategy (:data:`SERVER_DEFAULTS`): a server
learning rate or momentum left unset takes the strategy's own value, never one
shared by all strategies (a FedAdam step size cripples FedAvgM, and vice versa).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator

from flwr.serverapp import strategy as flwr_strategies
from flwr.serverapp.strategy import Strategy

#: What Flower's FedAvg constructor (and every strategy built on it) logs at
#: WARNING for ``fraction_evaluate = 0.0``: here by design, once per shard strategy.
EVALUATION_OFF_NOTICE = ("fraction_evaluate is set to 0.0. "
                         "Federated evaluation will be skipped.")

# Server-side defaults of the stock strategies that have them: the defaults of
# Flower 1.42's constructors (FedAdam ``eta`` = 0.1, FedYogi ``eta`` = 0.01, FedAvgM
# ``server_learning_rate`` = 1.0), with two exceptions:
# - FedAvgM's momentum: Flower's 0.0 turns FedAvgM into FedAvg; 0.9 is the server
#   momentum of its paper (Hsu et al., "Measuring the Effects of Non-Identical Data
#   Distribution for Federated Visual Classification", 2019).
# - FedAdagrad's eta: with Flower's 0.1 (and tau = 1e-3) the first server step moves
#   every weight by about 0.1, and the MNIST CNN stays at chance (15%, 14%, 20% over
#   3 rounds, still 14% after 8: tests/test_strategies.py's config); 0.01, FedYogi's
#   Flower default, learns (28%, 37%, 62%).
# Strategies not listed have neither setting.
SERVER_DEFAULTS: dict[str, dict[str, float]] = {
    "FedAvgM": {"server_lr": 1.0, "server_momentum": 0.9},
    "FedAdam": {"server_lr": 0.1},
    "FedAdagrad": {"server_lr": 0.01},
    "FedYogi": {"server_lr": 0.01},
}
# Our option name -> the constructor argument of each strategy that takes it.
_ARGUMENT = {
    ("FedAvgM", "server_lr"): "server_learning_rate",
    ("FedAvgM", "server_momentum"): "server_momentum",
    ("FedAdam", "server_lr"): "eta",
    ("FedAdagrad", "server_lr"): "eta",
    ("FedYogi", "server_lr"): "eta",
}


def server_settings(
    name: str, server_lr: float | None = None, server_momentum: float | None = None
) -> dict[str, float]:
    """The server-side settings strategy ``name`` will use.

    Parameters
    ----------
    name : str
        A stock strategy name.
    server_lr : float or None
        Server learning rate (> 0, finite); None: the strategy's default.
    server_momentum : float or None
        FedAvgM's server momentum (in [0, 1)); None: the strategy's default.

    Returns
    -------
    dict[str, float]
        ``server_lr`` and/or ``server_momentum`` (empty for a strategy with neither).

    Raises
    ------
    ValueError
        A value out of range, or given for a strategy that has no such setting.
    """
    defaults = SERVER_DEFAULTS.get(name, {})
    given = {"server_lr": server_lr, "server_momentum": server_momentum}
    if server_lr is not None and not (math.isfinite(server_lr) and server_lr > 0):
        raise ValueError(f"server_lr = {server_lr!r} is not allowed: a finite number > 0")
    if server_momentum is not None and not 0 <= server_momentum < 1:
        raise ValueError(f"server_momentum = {server_momentum!r} is not allowed: "
                         "a number in [0, 1)")
    for option, value in given.items():
        if value is not None and option not in defaults:
            users = [n for n, d in SERVER_DEFAULTS.items() if option in d]
            raise ValueError(f"{option} = {value!r} is not allowed for {name}, which "
                             f"has no such setting (only {', '.join(users)})")
    return {k: v if given[k] is None else given[k] for k, v in defaults.items()}


def make_stock_strategy(
    name: str,
    per_round: int,
    shard_size: int,
    proximal_mu: float = 0.01,
    server_lr: float | None = None,
    server_momentum: float | None = None,
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
        FedProx's proximal weight mu (ignored by the others).
    server_lr : float or None
        Server learning rate of FedAvgM (``server_learning_rate``) or of FedAdam /
        FedAdagrad / FedYogi (``eta``); None: the strategy's default
        (:data:`SERVER_DEFAULTS`).
    server_momentum : float or None
        FedAvgM's server momentum; None: its default (0.9).

    Raises
    ------
    ValueError
        Unknown name, ``per_round`` not in ``1..shard_size``, or a server setting
        out of range or given to a strategy without it (see :func:`server_settings`).
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
    for option, value in server_settings(name, server_lr, server_momentum).items():
        kwargs[_ARGUMENT[name, option]] = value
    with _without_flower_notice(EVALUATION_OFF_NOTICE):
        return cls(**kwargs)


class _DropMessage(logging.Filter):
    """A logging filter that drops the records whose message is exactly ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.text


@contextlib.contextmanager
def _without_flower_notice(text: str) -> Iterator[None]:
    """Flower's logger drops the one message ``text`` inside the block, nothing else.

    The ServerApp evaluates centrally, so federated evaluation is off on purpose
    and Flower's warning about it (once per shard strategy, 7 times in the
    default run) tells a user nothing they can act on.
    """
    logger = logging.getLogger("flwr")
    drop = _DropMessage(text)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
