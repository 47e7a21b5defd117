"""What a client needs to train locally, as one object both apps share.

The ServerApp builds :class:`TrainingSettings` from its run config
(:meth:`server_app.config.training.TrainingConfig.local_settings`) and sends
:meth:`TrainingSettings.to_record` as every train message's ``config``; stock
Flower strategies and ours add the per-message keys (``server-round``,
FedProx's ``proximal-mu``, RapidRetrain's ``precondition``, a replay's own
``local-epochs``); the ClientApp reads them back with
:meth:`TrainingSettings.from_record`. The server-side references (the shadow
models of the membership audit, the in-process references of U-LiRA) train
with the same object, so they train as the clients do.

The record's keys (:data:`KEYS`), units and defaults where absent:

==================  =============================================  =========
key                 meaning (unit)                                 absent
==================  =============================================  =========
``lr``              step size of one optimizer step                required
``local-epochs``    passes over the client's samples (fractions:   required
                    a partial last pass, :func:`task.train.epoch_schedule`)
``batch-size``      samples of a mini-batch                        required
``optimizer``       ``sgd`` or ``adam`` (fresh state a message)    ``sgd``
``momentum``        SGD's momentum, in [0, 1)                      0
``seed``            the run's seed (the local order's seed is      0
                    derived, :meth:`TrainingSettings.local_seed`)
``data-dir``        the server's data folder, ``""``: none         ``""``
``server-round``    the round (Flower's strategies set it)         0
``proximal-mu``     FedProx's mu (Flower's FedProx sets it)        0
``precondition``    ``""`` or ``fisher`` (RapidRetrain)            ``""``
``fisher-samples``  samples of the Fisher estimate                 32
``fisher-damping``  damping of the Fisher preconditioner (x mean)  1
==================  =============================================  =========

Other keys of the record (``history-round``, ``shard``) are the strategies' own
and are ignored here. Values are read with :func:`task.values.coerce`, the
converter the ServerApp reads its run config with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from flwr.app import ConfigRecord

from task.config import OPTIMIZERS
from task.train import TrainResult
from task.train import local_seed as _local_seed
from task.values import ConfigError, coerce

if TYPE_CHECKING:
    from task.interface import Task

PRECONDITIONS = ("", "fisher")
"""Record ``precondition``: none, or RapidRetrain's diagonal Fisher."""

KEYS = {"lr": ("lr", float), "local_epochs": ("local-epochs", float),
        "batch_size": ("batch-size", int), "optimizer": ("optimizer", str),
        "momentum": ("momentum", float), "seed": ("seed", int),
        "data_dir": ("data-dir", str), "server_round": ("server-round", int),
        "proximal_mu": ("proximal-mu", float), "precondition": ("precondition", str),
        "fisher_samples": ("fisher-samples", int),
        "fisher_damping": ("fisher-damping", float)}
"""Field name -> (record key, type), in field order."""

LEARNING_KEYS = ("lr", "local-epochs", "batch-size", "optimizer", "momentum", "seed",
                 "data-dir")
"""Keys every record of :meth:`TrainingSettings.to_record` holds; the others only
where they differ from their defaults (absent means off, as strategies add them)."""

SOURCE = "train-message config"
"""First words of a conversion error of a record's value."""


@dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """One client's local training for one message (keys: :data:`KEYS`).

    Keyword-only (twelve settings). Values are converted on construction
    (:func:`task.values.coerce`: ints to float where a float is meant, strings
    stripped, NaN refused), so equal settings compare equal however they were
    written.

    Attributes
    ----------
    lr : float
        ``lr``: step size of one optimizer step, > 0.
    local_epochs : float
        ``local-epochs``: passes over the client's samples, > 0 (fractions
        allowed: L / r when unlearning).
    batch_size : int
        ``batch-size``: samples of a mini-batch, >= 1.
    optimizer : str
        ``optimizer``: one of :data:`task.config.OPTIMIZERS`.
    momentum : float
        ``momentum``: SGD's momentum, in [0, 1) (Adam ignores it).
    seed : int
        ``seed``: the run's seed, >= 0.
    data_dir : str
        ``data-dir``: the server's data folder (``""``: none).
    server_round : int
        ``server-round``: the round this message belongs to, >= 0.
    proximal_mu : float
        ``proximal-mu``: FedProx's mu, >= 0 (0: no proximal term).
    precondition : str
        ``precondition``: one of :data:`PRECONDITIONS`.
    fisher_samples : int
        ``fisher-samples``: samples of the Fisher estimate, >= 1.
    fisher_damping : float
        ``fisher-damping``: damping, a multiple of the mean Fisher, >= 0.

    Raises
    ------
    ConfigError
        On construction: a value of the wrong type or out of its range, naming
        its key.
    """

    lr: float
    local_epochs: float
    batch_size: int
    optimizer: str = "sgd"
    momentum: float = 0.0
    seed: int = 0
    data_dir: str = ""
    server_round: int = 0
    proximal_mu: float = 0.0
    precondition: str = ""
    fisher_samples: int = 32
    fisher_damping: float = 1.0

    def __post_init__(self) -> None:
        for name, (key, kind) in KEYS.items():
            value = coerce(key, getattr(self, name), kind, source=SOURCE)
            object.__setattr__(self, name, value)  # frozen: set once, here
        self._check_ranges()

    def _check_ranges(self) -> None:
        checks = {"lr": self.lr > 0, "local-epochs": self.local_epochs > 0,
                  "batch-size": self.batch_size >= 1,
                  "optimizer": self.optimizer in OPTIMIZERS,
                  "momentum": 0 <= self.momentum < 1, "seed": self.seed >= 0,
                  "server-round": self.server_round >= 0,
                  "proximal-mu": self.proximal_mu >= 0,
                  "precondition": self.precondition in PRECONDITIONS,
                  "fisher-samples": self.fisher_samples >= 1,
                  "fisher-damping": self.fisher_damping >= 0}
        allowed = {"lr": "> 0", "local-epochs": "> 0", "batch-size": ">= 1",
                   "optimizer": f"one of {OPTIMIZERS}", "momentum": "in [0, 1)",
                   "seed": ">= 0", "server-round": ">= 0", "proximal-mu": ">= 0",
                   "precondition": f"one of {PRECONDITIONS}",
                   "fisher-samples": ">= 1", "fisher-damping": ">= 0"}
        for key, ok in checks.items():
            if not ok:
                name = next(n for n, (k, _) in KEYS.items() if k == key)
                raise ConfigError(f"{SOURCE} '{key}' = {getattr(self, name)!r} "
                                  f"must be {allowed[key]}")

    def to_record(self) -> ConfigRecord:
        """The settings as a train message's ``config``.

        Returns
        -------
        ConfigRecord
            :data:`LEARNING_KEYS` always, in that order; every other key of
            :data:`KEYS` only where it differs from its default.
        """
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        record = ConfigRecord()
        for name, (key, _) in KEYS.items():
            value = getattr(self, name)
            if key in LEARNING_KEYS or value != defaults[name]:
                record[key] = value
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> TrainingSettings:
        """Read a train message's ``config`` (keys absent: their defaults).

        Parameters
        ----------
        record : ConfigRecord or Mapping[str, object]
            The message's ``config``; keys not in :data:`KEYS` are ignored.

        Returns
        -------
        TrainingSettings

        Raises
        ------
        ConfigError
            ``lr``, ``local-epochs`` or ``batch-size`` is absent, or a value
            has the wrong type or range (one line naming the key).
        """
        for key in ("lr", "local-epochs", "batch-size"):
            if key not in record:
                raise ConfigError(f"{SOURCE} lacks '{key}' (the server's "
                                  "TrainingSettings.to_record writes it)")
        return cls(**{name: record[key] for name, (key, _) in KEYS.items()
                      if key in record})

    def local_seed(self, phase: str, partition_id: int) -> int:
        """The seed of one client's local order (:func:`task.train.local_seed`).

        Parameters
        ----------
        phase : str
            ``"learn"`` or ``"unlearn"``.
        partition_id : int
            The client's partition id.

        Returns
        -------
        int
            A seed in ``[0, 2**32)`` from :attr:`seed`, ``phase``,
            :attr:`server_round` and ``partition_id``.
        """
        return _local_seed(self.seed, phase, self.server_round, partition_id)

    def train(self, task: Task, model: torch.nn.Module, x: torch.Tensor,
              y: torch.Tensor, *, seed: int, device: torch.device | str | None,
              grad_transform=None) -> TrainResult:
        """Train ``model`` in place with the task's ``train`` and these settings.

        Parameters
        ----------
        task : Task
            Gives the training step (:attr:`task.interface.Task.train`).
        model : torch.nn.Module
            Starts from the received model; updated in place.
        x, y : torch.Tensor
            The client's samples (N, ...) and targets (N,) or (N, T).
        seed : int
            Seeds this training's order of samples (not the run's :attr:`seed`:
            the client passes :meth:`local_seed`, the references their own).
        device : torch.device or str or None
            Where to train (None: the CPU).
        grad_transform : callable, optional
            A diagonal preconditioner (RapidRetrain's,
            :func:`task.train.fisher_preconditioner`).

        Returns
        -------
        TrainResult
            What the training did (seconds, loss, steps, epochs, samples).

        Raises
        ------
        ValueError
            As the task's ``train`` (empty data, ...).
        """
        return task.train(model, x, y, self, seed=seed, grad_transform=grad_transform,
                          device=device)


def data_dir_of(record: Mapping[str, object]) -> str:
    """The server's ``data-dir`` of any message's ``config`` (evaluate's too).

    Parameters
    ----------
    record : ConfigRecord or Mapping[str, object]
        A message's ``config``; it need not hold training settings.

    Returns
    -------
    str
        The folder, stripped; ``""`` where the record has none.

    Raises
    ------
    ConfigError
        ``data-dir`` is not a string.
    """
    return coerce("data-dir", record.get("data-dir", ""), str, source=SOURCE)
