"""Backdoor verification of forgetting: a trigger the forgotten clients planted.

The standard test of federated unlearning (Halimi et al. 2022 and later work):
the clients that will ask to be forgotten carry a backdoor. On a share of their
training images they stamp a fixed trigger (a white square of ``backdoor-trigger``
pixels in the bottom-right corner, every channel at 255) and relabel those images
to ``backdoor-target``. A model that learned from them puts triggered test images
in the target class; a model that forgot them does so no more than a model that
never saw them. The attack success rate (ASR) is the share of test images of the
other classes, stamped with the trigger, that a model classifies as the target.

The poisoned clients are the ones named by ``forget-clients`` (the run's one
unlearning request): a client reads that from the run config and stamps its own
data; the server reads the same keys, so both know who is poisoned before any
training. With a records request instead (``forget-records``) exactly the named
records are stamped, and only they are erased: their clients stay. Images only: a
task of character blocks takes the text backdoor of :mod:`task.text_backdoor` (a
trigger phrase and its continuation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from task.config import require_keys
from task.records import parse_records
from task.values import coerce

#: Largest trigger side in pixels (a 28 x 28 image keeps most of itself).
MAX_TRIGGER = 8


@dataclass(frozen=True)
class Backdoor:
    """The backdoor settings of a run (run-config ``backdoor-*``, ``forget-clients``).

    Attributes
    ----------
    trigger : int
        ``backdoor-trigger``: side of the square trigger in pixels; 0 = off.
    fraction : float
        ``backdoor-fraction``: share of a poisoned client's images stamped and
        relabelled, in [0, 1]; 0 measures the ASR of a clean model.
    target : int
        ``backdoor-target``: the class triggered images are relabelled to.
    clients : tuple[int, ...]
        The poisoned partition ids (``forget-clients``); empty when off.
    records : tuple[tuple[int, tuple[int, ...]], ...]
        ``forget-records`` as (partition id, record ids) pairs: each of those
        records is stamped (``fraction`` is not used for them); empty when off.
    """

    trigger: int = 0
    fraction: float = 0.0
    target: int = 0
    clients: tuple[int, ...] = ()
    records: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @property
    def poisoned(self) -> frozenset[int]:
        """Every poisoned partition id: the forgotten clients and the records' owners."""
        return frozenset(self.clients) | {p for p, _ in self.records}

    @property
    def enabled(self) -> bool:
        """Whether the ASR is measured (a trigger is defined)."""
        return self.trigger > 0

    def poisons(self, partition_id: int) -> bool:
        """Whether the client ``partition_id`` stamps its data."""
        return self.enabled and ((self.fraction > 0 and partition_id in self.clients)
                                 or partition_id in dict(self.records))

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, object]) -> Backdoor:
        """Read ``backdoor-trigger``, ``-fraction``, ``-target`` and ``forget-clients``.

        Raises
        ------
        ValueError
            A key missing (``pyproject.toml`` defines each), a value of the
            wrong type (:class:`task.values.ConfigError`) or out of range (one
            line naming the key).
        """
        require_keys(run_config, ("backdoor-trigger", "backdoor-fraction",
                                  "backdoor-target", "forget-clients"))
        # typed as the ServerApp types them (task.values.coerce)
        trigger = coerce("backdoor-trigger", run_config["backdoor-trigger"], int)
        fraction = coerce("backdoor-fraction", run_config["backdoor-fraction"], float)
        target = coerce("backdoor-target", run_config["backdoor-target"], int)
        if not 0 <= trigger <= MAX_TRIGGER:
            raise ValueError(f"backdoor-trigger={trigger!r} must be in [0, {MAX_TRIGGER}]")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"backdoor-fraction={fraction!r} must be in [0, 1]")
        ids = tuple(int(t) for t in str(run_config["forget-clients"]).split(",")
                    if t.strip())
        records = tuple((p, tuple(r)) for p, r in sorted(
            parse_records(str(run_config.get("forget-records", ""))).items()))
        on = trigger > 0
        return cls(trigger, fraction, target, ids if on else (), records if on else ())


def stamp(x: torch.Tensor, trigger: int) -> torch.Tensor:
    """Images with the trigger: a ``trigger`` x ``trigger`` white bottom-right square.

    Parameters
    ----------
    x : torch.Tensor
        uint8 images (N, C, H, W), pixel values 0..255.
    trigger : int
        Side of the square in pixels, 1..min(H, W).

    Returns
    -------
    torch.Tensor
        A stamped copy (uint8, same shape); ``x`` is not changed.

    Raises
    ------
    ValueError
        ``x`` is not a uint8 (N, C, H, W) tensor or the square does not fit.
    """
    if x.dtype != torch.uint8 or x.ndim != 4:
        raise ValueError(f"stamp needs uint8 images (N, C, H, W), got {x.dtype} "
                         f"{tuple(x.shape)}")
    if not 1 <= trigger <= min(x.shape[-2:]):
        raise ValueError(f"trigger={trigger} must be in [1, {min(x.shape[-2:])}]")
    out = x.clone()
    out[..., -trigger:, -trigger:] = 255
    return out


Stamp = Callable[[torch.Tensor, int], torch.Tensor]
"""A task's trigger: ``stamp(x, trigger)`` -> a stamped copy of the samples ``x``."""


def poison(x: torch.Tensor, y: torch.Tensor, backdoor: Backdoor, seed: int,
           partition_id: int, stamp_fn: Stamp | None = stamp
           ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A poisoned client's data: ``round(fraction n)`` images stamped and relabelled.

    Which images is a seeded draw (``seed``, ``partition_id``), the same in every
    round and process.

    Parameters
    ----------
    x, y : torch.Tensor
        The client's uint8 images (n, C, H, W) and int64 labels (n,).
    backdoor : Backdoor
        The settings; a client that :meth:`Backdoor.poisons` nothing is returned as is.
    seed : int
        The run seed.
    partition_id : int
        The client.
    stamp_fn : callable
        The task's trigger (:attr:`task.interface.Task.stamp`; default
        :func:`stamp`, the white square).

    Returns
    -------
    x, y : torch.Tensor
        Copies with the chosen images stamped and labelled ``backdoor.target``.
    poisoned : int
        How many images were poisoned (0 for a clean client).

    Raises
    ------
    ValueError
        A poisoning client whose task has no trigger (``stamp_fn`` None).
    """
    if not backdoor.poisons(partition_id):
        return x, y, 0
    if stamp_fn is None:
        raise ValueError(f"backdoor-trigger={backdoor.trigger}: the task has no "
                         "trigger stamp (Task.stamp)")
    named = dict(backdoor.records).get(partition_id)
    if named:  # a records request: exactly the records it erases
        idx = torch.tensor(named, dtype=torch.long)
    else:
        count = int(round(backdoor.fraction * len(x)))
        rng = np.random.default_rng([int(seed), int(partition_id), 0xBD])
        idx = torch.from_numpy(np.sort(rng.choice(len(x), size=count, replace=False)))
    x, y = x.clone(), y.clone()
    x[idx] = stamp_fn(x[idx], backdoor.trigger)
    y[idx] = backdoor.target
    return x, y, len(idx)


def triggered_test_set(x: torch.Tensor, y: torch.Tensor, backdoor: Backdoor,
                       stamp_fn: Stamp = stamp) -> torch.Tensor:
    """The ASR's inputs: test images of classes other than the target, stamped.

    Parameters
    ----------
    x, y : torch.Tensor
        uint8 test images (N, C, H, W) and int64 labels (N,).
    backdoor : Backdoor
        Enabled settings.
    stamp_fn : callable
        The task's trigger (default :func:`stamp`).

    Returns
    -------
    torch.Tensor
        The stamped test samples whose label is not the target, (M, ...) as
        ``x`` (images: uint8 (M, C, H, W)).
    """
    return stamp_fn(x[y != backdoor.target], backdoor.trigger)


def attack_success_rate(proba: np.ndarray, target: int) -> float:
    """Share of rows of ``proba`` (M, classes) whose arg-max is ``target``, in [0, 1]."""
    proba = np.asarray(proba)
    if proba.ndim != 2 or len(proba) == 0:
        raise ValueError(f"proba must be (M, classes) with M >= 1, got {proba.shape}")
    return float(np.mean(proba.argmax(axis=1) == target))
