"""The typed interface of a training history: what is written, what is read.

- :class:`RoundRecorder`: what the learning loop writes a history through, one
  round at a time (``history.store.HistoryStore`` writes blobs;
  ``history.coded.recorder.CodedRecorder`` codes each round into client slices).
- :class:`TrainingHistory`: what unlearning and the storage report read back
  (``HistoryStore``; ``history.coded.reader.CodedHistory`` decodes slices). Its
  first three verbs are exactly ``strategies.unlearning.HistoryReader``, so every
  training history serves calibrated retraining (paper eq. 2-3).
- :class:`FaultSink`, :class:`Federation`: what the coded store needs of the
  server app, without importing it.

Arrays are dicts of layer name -> float32 ndarray.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Protocol

import numpy as np

Arrays = dict[str, np.ndarray]


class TrainingHistory(ABC):
    """A stored training history, read back for unlearning and for reporting.

    Attributes
    ----------
    root : Path
        The store's folder.
    """

    root: Path

    @abstractmethod
    def participants(self, shard: int, rnd: int) -> list[tuple[int, int]]:
        """(partition id, example count) of round ``rnd``'s participants, ascending."""

    @abstractmethod
    def update(self, shard: int, rnd: int, partition_id: int) -> Arrays:
        """The stored update U^rnd = w^rnd - W^(rnd-1) of client ``partition_id``.

        Raises
        ------
        StoreError
            No such update (or it cannot be read back).
        """

    @abstractmethod
    def rounds(self, shard: int) -> list[int]:
        """Rounds (>= 1) with stored updates for ``shard``, ascending."""

    @abstractmethod
    def shard_model(self, shard: int, rnd: int) -> Arrays:
        """Shard model W_s^rnd (rnd = 0: the initial model W^0).

        Raises
        ------
        StoreError
            The store keeps no model of that shard and round.
        """

    @abstractmethod
    def client_shard(self) -> dict[int, int]:
        """Partition id -> shard of every client."""

    @abstractmethod
    def total_bytes(self) -> int:
        """Bytes the server keeps for this history on disk."""

    @abstractmethod
    def verify(self) -> list[str]:
        """Check what the server keeps; one line per problem found ([] if none)."""

    @abstractmethod
    def take_retrieval(self) -> dict | None:
        """Costs of fetching and decoding since the last call (None: none fetched).

        Also forgets what was decoded, so between requests the server keeps
        only what it stores.
        """

    @abstractmethod
    def accounting(self) -> dict | None:
        """Bytes and modelled communication of a coded store; None if nothing is coded.

        See ``history.coded.catalog.CodedCatalog.accounting`` for the keys.
        """

    @abstractmethod
    def retrievals(self) -> list[dict]:
        """Every fetch-and-decode of the run so far, one dict per shard; [] if none.

        Each holds at least ``bytes``, ``transfers``, ``comm_time_s`` (modelled)
        and ``decode_s`` (measured seconds).
        """

    @abstractmethod
    def close(self) -> None:
        """Release the store's files."""


class RoundRecorder(ABC):
    """What the learning loop writes a training history through.

    Per round: ``put_update`` for every participant, ``put_shard_model`` for
    every shard, then ``end_round``; round 0 holds the initial models only.
    ``mark_complete`` after the last round.

    Attributes
    ----------
    root : Path
        The store's folder.
    max_update : float or None
        Largest |parameter| of an update the store can keep (None: no limit);
        reply screening rejects larger ones.
    """

    root: Path
    max_update: float | None

    @abstractmethod
    def put_shard_model(self, shard: int, rnd: int, arrays: Arrays) -> None:
        """Record shard model W_s^rnd (rnd = 0: the initial model)."""

    @abstractmethod
    def put_update(self, shard: int, rnd: int, partition_id: int, arrays: Arrays,
                   num_examples: int, train_seconds: float) -> None:
        """Record client ``partition_id``'s update U^rnd with its example count."""

    @abstractmethod
    def end_round(self, rnd: int, grid: object) -> None:
        """Close round ``rnd`` (the coded recorder codes and distributes it here)."""

    @abstractmethod
    def mark_complete(self) -> None:
        """Declare the history finished; only then can it be read back."""

    @abstractmethod
    def total_bytes(self) -> int:
        """Bytes the server keeps for this history on disk."""

    @abstractmethod
    def close(self) -> None:
        """Release the store's files."""


class FaultSink(Protocol):
    """Where the run's faults go (``server_app.rounds.screening.FaultLog`` has it)."""

    def add(self, stage: str, rnd: int | None, node: int, partition: int | None,
            kind: str, reason: str) -> None:
        """Record one fault."""


class Federation(Protocol):
    """What the coded store needs to know of the federation (no server_app import).

    ``node_of`` maps partition id -> node id, ``shards`` lists each shard's
    partition ids; ``shard_of`` and ``partition_of`` are their inverses.
    """

    node_of: dict[int, int]
    shards: list[list[int]]

    @property
    def shard_of(self) -> dict[int, int]: ...  # noqa: D102

    @property
    def partition_of(self) -> dict[int, int]: ...  # noqa: D102
