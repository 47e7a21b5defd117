"""The learning task as an interface: what both apps need from it, and nothing more.

A :class:`Task` is a frozen record of functions. The built-in tasks (one module
each, :mod:`task.tasks`) are written against it, and so is a user's own
(``task = "package.module:factory"``, :mod:`task.registry`; docs/TASKS.md). Everything
downstream (the ClientApp's training and evaluation, the server's central
evaluation, coded storage's quantisation range, the membership audit, the
backdoor check) reads the run's task through this record, never a dataset name.

Required: ``name``, ``load`` (the whole task's data as a
:class:`~task.data.TaskData`) and ``model`` (a fresh model for a number of
classes). The local training and evaluation steps default to the project's loops
(:func:`task.train.local_train`, :func:`task.train.predict_proba`,
:func:`task.train.score_proba`). Optional parts (None: the task has none, and a run
that needs one is refused before any engine starts, naming the key):

- ``stamp``: the backdoor trigger (run-config ``backdoor-trigger``);
- ``tokenize``: text to token ids, for the text backdoor (``backdoor-phrase``,
  :mod:`task.text_backdoor`) of a task with per-position targets;
- ``membership``: what the membership audit feeds its attack (``mia``; the
  default :func:`task.membership.membership_features` takes any softmax outputs);
- ``classes = False``: targets are not one class a sample (e.g. next characters),
  so the shadow-model attack (``mia-shadows``) and label partitions do not apply,
  and run-config ``block-size`` (the blocks' length) must be at least 2.

``metric`` says which score heads the task's results, ``"accuracy"`` or ``"loss"``
(e.g. a language model; None: ``"loss"`` where ``perplexity``, else
``"accuracy"``): summary.json ``task`` records it (:meth:`Task.describe`), and
the experiment report and figures read it there, never a dataset name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import nn

from task.backdoor import Stamp
from task.config import TaskConfig, check_block_size
from task.data import TaskData
from task.membership import membership_features
from task.train import TrainResult, local_train, predict_proba, score_proba

TrainFn = Callable[..., TrainResult]
"""``train(model, x, y, settings, *, seed, grad_transform, device) -> TrainResult``:
trains ``model`` in place with a :class:`task.training_settings.TrainingSettings`
(the signature of :func:`task.train.local_train`)."""

PredictFn = Callable[..., np.ndarray]
"""``predict(model, x, *, device) -> proba``: softmax outputs, float32 (N, C) or
(N, T, V), on the CPU (the signature of :func:`task.train.predict_proba`)."""

ScoreFn = Callable[[np.ndarray, np.ndarray], tuple[float, float]]
"""``score(proba, y) -> (loss, accuracy)``: loss in nats, accuracy in [0, 1]."""

METRICS = ("accuracy", "loss")
""":attr:`Task.metric`: the headline score (accuracy: higher is better; loss, in
nats: lower is better)."""


def given_folder(data_dir: str) -> str:
    """A plug-in task's data folder: run-config ``data-dir`` as given (``""``: none)."""
    return data_dir


def is_folder(folder: str) -> bool:
    """Whether ``folder`` names an existing folder (a plug-in task's ``holds``)."""
    return bool(folder) and Path(folder).expanduser().is_dir()


@dataclass(frozen=True)
class Task:
    """A learning task: its data, model, local steps and optional parts.

    Attributes
    ----------
    name : str
        Short name (logs, summary.json ``task``, the default run name).
    load : callable
        ``load(settings: TaskConfig) -> TaskData``: train and test samples with
        their targets (:meth:`TaskData.from_arrays`, or
        :meth:`TaskData.from_datasets` for Hugging Face ``datasets.Dataset``).
        ``settings.data_dir`` is the folder ``locate`` found. Called once per
        process and settings (cached), in the ServerApp and every ClientApp, so
        it must give the same data every time.
    load_test : callable or None
        ``load_test(settings: TaskConfig) -> TaskData``: the test split alone, for
        a server whose clients each read their own data folder (run-config
        ``client-data = true``): a :class:`TaskData` whose training arrays have 0
        rows (:meth:`TaskData.test_only`), so nothing of the training split is
        held. None (a plug-in's default): such a run is refused naming ``task``.
    model : callable
        ``model(num_classes: int) -> torch.nn.Module``: a fresh model. The
        ServerApp builds W^0 with it right after ``torch.manual_seed(seed)``.
        Its ``state_dict()`` is what travels and is stored: parameters and
        buffers of any dtype (e.g. BatchNorm's running statistics and its
        int64 ``num_batches_tracked``).
    train : callable
        :data:`TrainFn`; default :func:`task.train.local_train`.
    predict : callable
        :data:`PredictFn`; default :func:`task.train.predict_proba`.
    score : callable
        :data:`ScoreFn`; default :func:`task.train.score_proba`.
    classes : bool
        Each sample has one class label (targets (N,)); False for per-position
        targets (N, T), split by contiguous ranges and without shadow models,
        whose run-config ``block-size`` must be at least 2
        (:meth:`check_settings`).
    stamp : callable or None
        ``stamp(x, trigger) -> x'``: a stamped copy of samples (the backdoor
        check, ``backdoor-trigger``); None: no backdoor check.
    tokenize : callable or None
        ``tokenize(text) -> ids``: int64 token ids (len,) of a string in the
        task's vocabulary, ValueError for a character outside it (the text
        backdoor, ``backdoor-phrase``: :mod:`task.text_backdoor`; blocks of ids
        with next-token targets, ``classes = False``); None: no text backdoor.
    membership : callable or None
        ``membership(proba, targets) -> features`` (N, F): the membership
        audit's attack features of this task's ``predict`` outputs; None: no
        membership audit (``mia`` must be false).
    check : callable or None
        ``check(settings: TaskConfig)``: the task's own checks of run-config keys
        (raise ValueError naming the key); run before any engine starts.
    locate : callable
        ``locate(data_dir) -> folder``: where the data is, from run-config
        ``data-dir`` (``""``: the task's default); raise FileNotFoundError
        naming ``data-dir`` when it is not there. Default: ``data-dir`` as given.
    holds : callable
        ``holds(folder) -> bool``: whether a folder holds the data (a ClientApp
        takes the server's folder where it does). Default: it exists.
    provenance : callable or None
        ``provenance(folder) -> dict`` with ``format``, ``files`` and ``sha256``
        (summary.json ``data``); None: the task's name only.
    provenance_test : callable or None
        The same over the test split's files alone, for a server that reads only
        them (run-config ``client-data = true``); None: ``provenance``'s.
    perplexity : bool
        The loss is nats per token: the summary adds ``perplexity`` = exp(loss).
    metric : {"accuracy", "loss"} or None
        The headline score of the task: what the experiment report and its
        figures show for it (``"loss"``: the test loss, lower is better; the
        accuracy-only checks are skipped). None: ``"loss"`` where
        ``perplexity``, else ``"accuracy"`` (:attr:`headline_metric`).
    num_classes : int or None
        Classes known without loading the data (checks of ``backdoor-target``
        and ``classes-per-client`` before any engine starts); None: taken from
        the loaded data.
    """

    name: str
    load: Callable[[TaskConfig], TaskData]
    model: Callable[[int], nn.Module]
    load_test: Callable[[TaskConfig], TaskData] | None = None
    train: TrainFn = local_train
    predict: PredictFn = predict_proba
    score: ScoreFn = score_proba
    classes: bool = True
    stamp: Stamp | None = None
    tokenize: Callable[[str], np.ndarray] | None = None
    membership: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = \
        membership_features
    check: Callable[[TaskConfig], None] | None = None
    locate: Callable[[str], str] = given_folder
    holds: Callable[[str], bool] = is_folder
    provenance: Callable[[str], dict] | None = None
    provenance_test: Callable[[str], dict] | None = None
    perplexity: bool = False
    num_classes: int | None = None
    metric: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Task.name = {self.name!r} must be a non-empty string")
        for part in ("load", "model", "train", "predict", "score", "locate", "holds"):
            if not callable(getattr(self, part)):
                raise ValueError(f"Task {self.name!r}: {part} must be callable, got "
                                 f"{type(getattr(self, part)).__name__}")
        _check_train_signature(self.name, self.train)
        if self.metric is not None and self.metric not in METRICS:
            raise ValueError(f"Task {self.name!r}: metric = {self.metric!r} must be "
                             f"one of {METRICS} or None")

    @property
    def headline_metric(self) -> str:
        """:attr:`metric`; None: ``"loss"`` with ``perplexity``, else ``"accuracy"``."""
        if self.metric is not None:
            return self.metric
        return "loss" if self.perplexity else "accuracy"

    def describe(self) -> dict:
        """summary.json ``task``: what the task says about itself.

        Returns
        -------
        dict
            ``name``, ``metric`` (:attr:`headline_metric`), ``classes`` and
            ``perplexity``: what the experiments read instead of a dataset name.
        """
        return {"name": self.name, "metric": self.headline_metric,
                "classes": self.classes, "perplexity": self.perplexity}

    def check_settings(self, settings: TaskConfig) -> None:
        """Check the run-config keys whose range depends on the task, then :attr:`check`.

        A task with per-position targets (``classes = False``) reads its samples
        as blocks of ``block-size`` positions, so ``block-size`` must be at least
        2; a task with class labels ignores the key.

        Parameters
        ----------
        settings : TaskConfig
            The run's task settings (as every ClientApp builds them).

        Raises
        ------
        ValueError
            One line naming the key (``block-size``, or what :attr:`check` names).
        """
        if not self.classes:
            check_block_size(settings.block_size)
        if self.check is not None:
            self.check(settings)

    def check_data(self, data: TaskData) -> TaskData:
        """``data`` if it is what this task declares (``classes``), else ValueError.

        Raises
        ------
        ValueError
            ``load`` returned something else than a :class:`TaskData`, targets
            whose shape contradicts ``classes``, or labels outside
            [0, num_classes).
        """
        if not isinstance(data, TaskData):
            raise ValueError(f"task {self.name!r}: load() returned a "
                             f"{type(data).__name__}, not a task.data.TaskData")
        if data.has_classes != self.classes:
            want = "(N,) class labels" if self.classes else "(N, T) targets"
            raise ValueError(f"task {self.name!r}: targets of shape "
                             f"{tuple(data.train_y.shape)}, but the task declares "
                             f"classes={self.classes} ({want})")
        if self.num_classes is not None and data.num_classes != self.num_classes:
            raise ValueError(f"task {self.name!r}: the data has {data.num_classes} "
                             f"classes, the task declares {self.num_classes}")
        for split, y in (("train", data.train_y), ("test", data.test_y)):
            if len(y) and (int(y.min()) < 0 or int(y.max()) >= data.num_classes):
                raise ValueError(f"task {self.name!r}: {split} targets outside "
                                 f"[0, {data.num_classes})")
        return data

    def provenance_of(self, folder: str, test_only: bool = False) -> dict:
        """summary.json ``data``: :attr:`provenance`'s, or the task's name alone.

        ``test_only`` (run-config ``client-data = true``): :attr:`provenance_test`'s
        where the task has one (the test split's files alone are hashed).
        """
        if test_only and self.provenance_test is not None:
            return self.provenance_test(folder)
        if self.provenance is not None:
            return self.provenance(folder)
        return {"dataset": self.name, "folder": folder,
                "format": f"task {self.name!r}, read by its own loader", "files": [],
                "sha256": ""}


def _check_train_signature(name: str, train: TrainFn) -> None:
    """Refuse a ``train`` that cannot be called as :func:`task.train.local_train`.

    A plug-in written for the keyword form ``train(model, x, y, *, epochs, ...)``
    would otherwise fail in the first ClientApp, after the engine has started.

    Raises
    ------
    ValueError
        ``train`` does not accept ``(model, x, y, settings, *, seed,
        grad_transform, device)``; the message names the task and its signature.
    """
    try:
        signature = inspect.signature(train)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return
    try:
        signature.bind(None, None, None, None, seed=0, grad_transform=None, device=None)
    except TypeError:
        raise ValueError(
            f"Task {name!r}: train{signature} must accept (model, x, y, settings, *, "
            "seed, grad_transform, device), the signature of task.train.local_train "
            "(settings: a task.training_settings.TrainingSettings)") from None
