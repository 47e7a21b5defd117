"""What a client needs to train locally, as one object both apps share.

:class:`LocalTraining` declares the local-training keys once, for the run config
and the messages. The ServerApp builds :class:`TrainingSettings` from its run config
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
from typing import TYPE_CHECKING, get_type_hints

import torch
from flwr.app import ConfigRecord

from task.config import OPTIMIZERS
from task.section import Section
from task.train import TrainResult
from task.train import local_seed as _local_seed
from task.values import ConfigError, bad, coerce

if TYPE_CHECKING:
    from task.interface import Task

PRECONDITIONS = ("", "fisher")
"""Record ``precondition``: none, or RapidRetrain's diagonal Fisher."""

MAX_LR, MAX_EPOCHS, MAX_BATCH = 10.0, 1000, 2**20  # lr: larger steps diverge here

LEARNING_KEYS = ("lr", "local-epochs", "batch-size", "optimizer", "momentum", "seed",
                 "data-dir")
"""Keys every record of :meth:`TrainingSettings.to_record` holds; the others only
where they differ from their defaults (absent means off, as strategies add them)."""

SOURCE = "train-message config"
"""First words of an error of a record's value."""


@dataclass(frozen=True, kw_only=True)
class LocalTraining(Section):
    """How a client trains locally: one schema of these keys for both apps.

    The run-config section :class:`server_app.config.training.TrainingConfig` and
    every message's :class:`TrainingSettings` are this and their own keys
    (defaults: pyproject.toml's); :meth:`check_ranges` checks these keys for both.

    Attributes
    ----------
    lr : float
        ``lr``: step size of one optimizer step, in (0, :data:`MAX_LR`].
    local_epochs : float
        ``local-epochs``: passes over the client's samples, in (0, 1000]: a message's
        a float (L, or L / r when unlearning); the run config's L a whole number, read
        as an int (its default's type, :meth:`Section.from_run_config`), printed so.
    batch_size : int
        ``batch-size``: samples of a mini-batch, in [1, :data:`MAX_BATCH`].
    optimizer : str
        ``optimizer``: one of :data:`task.config.OPTIMIZERS` (fresh state a message).
    momentum : float
        ``momentum``: SGD's momentum, in [0, 1) (Adam ignores it).
    """

    lr: float = 0.05
    local_epochs: float = 2  # an int: the run config's L is read as one
    batch_size: int = 32
    optimizer: str = "sgd"
    momentum: float = 0.5

    def _ranges(self) -> tuple[tuple[str, bool, str], ...]:  # key, in range, allowed
        kind = "integer" if isinstance(self.local_epochs, int) else "number"
        return (("lr", 0 < self.lr <= MAX_LR, f"a positive number, at most {MAX_LR:g} "
                 "(larger steps diverge for every model here)"),
                ("local-epochs", 0 < self.local_epochs <= MAX_EPOCHS,
                 f"a positive {kind}, at most {MAX_EPOCHS}"),
                ("batch-size", 1 <= self.batch_size <= MAX_BATCH,
                 f"a positive integer, at most {MAX_BATCH}"),
                ("optimizer", self.optimizer in OPTIMIZERS,
                 f"one of {', '.join(OPTIMIZERS)}"),
                ("momentum", 0 <= self.momentum < 1, "a number in [0, 1)"))

    def check_ranges(self, source: str = "run-config") -> None:
        """Raise :class:`ConfigError` on the first bad value (one line from ``source``)."""
        for key, ok, allowed in self._ranges():
            if not ok:
                raise bad(key, getattr(self, self.keys()[key]), allowed, source=source)


@dataclass(frozen=True, kw_only=True)
class TrainingSettings(LocalTraining):
    """One client's local training for one message (keys: :data:`KEYS`).

    :class:`LocalTraining`'s keys and the message's own, keyword-only. Values are
    converted on construction (:func:`task.values.coerce`: ints to float where a
    float is meant, strings stripped, NaN refused), so equal settings compare equal.

    Attributes
    ----------
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
        On construction: a value of the wrong type or range (one line naming its key).
    """

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
        self.check_ranges(SOURCE)

    def _ranges(self) -> tuple[tuple[str, bool, str], ...]:
        return (*super()._ranges(), ("seed", self.seed >= 0, "an integer >= 0"),
                ("server-round", self.server_round >= 0, "an integer >= 0"),
                ("proximal-mu", self.proximal_mu >= 0, "a number >= 0"),
                ("precondition", self.precondition in PRECONDITIONS,
                 f"one of {PRECONDITIONS}"),
                ("fisher-samples", self.fisher_samples >= 1, "an integer >= 1"),
                ("fisher-damping", self.fisher_damping >= 0, "a number >= 0"))

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
        """Read a train message's ``config`` (absent keys: the module table's).

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
        given = {name: record[key] for name, (key, _) in KEYS.items() if key in record}
        return cls(**{"momentum": 0.0, **given})  # absent: none (the run config's: 0.5)

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


KEYS = {name: (key, get_type_hints(TrainingSettings)[name])
        for key, name in TrainingSettings.keys().items()}
"""Field name -> (record key, type: the field's annotation), in field order."""


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
