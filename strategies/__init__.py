"""Flower strategies for sharded learning and unlearning (no dataset knowledge)."""

from strategies.factory import make_stock_strategy
from strategies.sharded import (
    IsolationError,
    ShardedStrategy,
    ShardGrid,
    pack_shards,
    unpack_shards,
)

__all__ = [
    "IsolationError",
    "ShardGrid",
    "ShardedStrategy",
    "make_stock_strategy",
    "pack_shards",
    "unpack_shards",
]
