"""The run's task as the server sees it: which one, its data, and its checks.

:func:`resolve_task` resolves run-config ``task`` (:func:`task.registry.get_task`:
a built-in, or a plug-in imported once per process); :func:`check_task` refuses,
in one line naming the key, every setting that needs a part the task lacks
(:class:`task.interface.Task`'s optional parts) or that the task refuses
(:meth:`~task.interface.Task.check_settings`: ``block-size`` of a task with
per-position targets, then its own ``check``). :meth:`RunConfig.validate` runs it
for the built-in tasks (nothing to import); :func:`server_app.preflight.check_run`
for every task, before any engine starts, and again with the loaded data. The
functions take the :class:`~server_app.config.RunConfig` (``cfg``), whose
``task()`` and ``task_settings()`` they use.
"""

from __future__ import annotations

from server_app.config.values import ConfigError, bad
from task.data import TaskData
from task.interface import Task
from task.registry import get_task, load_data, load_test_data


def resolve_task(spec: str) -> Task:
    """The task ``spec`` names (:func:`task.registry.get_task`, cached per process).

    Raises
    ------
    ConfigError
        One line naming ``task``: a module that cannot be imported, a missing
        attribute, or a factory that gives no :class:`Task`.
    """
    try:
        return get_task(spec)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None


def data_folder(cfg) -> str:
    """Where the run's data is (:meth:`Task.locate` of ``data-dir``).

    Raises
    ------
    ConfigError
        The data is not there (one line naming ``data-dir``).
    """
    try:
        return str(cfg.task().locate(cfg.data.data_dir))
    except FileNotFoundError as err:  # DatasetNotFoundError: one line, naming data-dir
        raise ConfigError(str(err).splitlines()[0]) from None


def load_run_data(cfg, folder: str) -> TaskData:
    """The run's data from ``folder`` (:func:`task.registry.load_data`, cached).

    With run-config ``client-data = true`` the test split alone
    (:func:`task.registry.load_test_data`: training arrays of 0 rows): every
    client reads its own folder, and the server never reads the training split.

    Raises
    ------
    ConfigError
        The task's loader fails, or its data contradicts the task, or (with
        ``client-data``) the task has no test-only loader (one line).
    """
    load = load_test_data if cfg.data.client_data else load_data
    try:
        return load(cfg.task(), cfg.task_settings(), folder)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"run-config 'task' = {cfg.data.task_spec!r}: its data "
                          f"cannot be loaded: {_first_line(err)}") from err
    except Exception as err:  # a plug-in's own code failed: one line, not a traceback
        raise ConfigError(f"run-config 'task' = {cfg.data.task_spec!r}: its data "
                          f"cannot be loaded: {type(err).__name__}: {_first_line(err)}"
                          ) from err


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [""])[0]


def check_model(cfg, task: Task, num_classes: int) -> None:
    """The task's model factory builds a ``torch.nn.Module`` (before any engine).

    Raises
    ------
    ConfigError
        ``Task.model(num_classes)`` raised, or returned something that is not a
        ``torch.nn.Module``, or one whose parameters cannot become Flower
        arrays (bfloat16: no NumPy dtype; one line naming ``task``).
    """
    import torch

    where = f"run-config 'task' = {cfg.data.task_spec!r}: its model({num_classes})"
    try:
        model = task.model(num_classes)
    except Exception as err:  # a plug-in's own code
        raise ConfigError(f"{where} failed: {type(err).__name__}: {_first_line(err)}"
                          ) from err
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{where} returned a {type(model).__name__}, not a "
                          "torch.nn.Module")
    from flwr.app import ArrayRecord

    try:  # W^0 as the ServerApp builds it: every dtype must convert to NumPy
        ArrayRecord(model.state_dict())
    except Exception as err:  # e.g. bfloat16: NumPy has no such dtype
        dtypes = sorted({str(t.dtype).removeprefix("torch.")
                         for t in model.state_dict().values()})
        raise ConfigError(f"{where} has parameters of dtype(s) {dtypes} that cannot "
                          f"be sent as Flower arrays ({type(err).__name__}: "
                          f"{_first_line(err)}); use float32, float64, float16 or "
                          "integer dtypes") from None


def _check_phrase(audit, task: Task, who: str) -> None:
    """The text backdoor needs the task's tokenizer, and characters it knows."""
    if not audit.backdoor_phrase:
        return
    if task.tokenize is None:
        raise bad("backdoor-phrase", audit.backdoor_phrase,
                  f"'' with {who}, which has no tokenizer for a text backdoor "
                  "(Task.tokenize; the image trigger is backdoor-trigger)")
    for key in ("backdoor-phrase", "backdoor-continuation"):
        value = audit.as_dict()[key]
        try:
            task.tokenize(value)
        except ValueError as err:
            raise bad(key, value, f"characters of {who}'s vocabulary ({err})") from None


def check_task(cfg, task: Task, data: TaskData | None = None) -> None:
    """Refuse the settings that need a part ``task`` lacks, and what its check refuses.

    Parameters
    ----------
    cfg : server_app.config.RunConfig
        The parsed settings.
    task : Task
        The run's task.
    data : TaskData, optional
        Its loaded data: then the number of classes bounds ``backdoor-target``
        and ``classes-per-client`` (else :attr:`Task.num_classes`, if declared).

    Raises
    ------
    ConfigError
        One line naming the key, the value and why (the task's name); with
        ``data``, also :func:`check_model`'s refusal.
    """
    audit, who = cfg.audit, f"task {task.name!r}"
    if cfg.data.client_data and task.load_test is None:
        raise bad("client-data", True, f"false with {who}, which has no test-only "
                  "loader (Task.load_test): with client-data = true the server reads "
                  "only the test split (run-config 'task')")
    try:  # the settings a ClientApp builds, then the task's checks of them
        task.check_settings(cfg.task_settings())
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    if audit.backdoor_trigger and task.stamp is None:
        raise bad("backdoor-trigger", audit.backdoor_trigger,
                  f"0 with {who}, which has no backdoor trigger (Task.stamp)")
    _check_phrase(audit, task, who)
    if audit.mia and task.membership is None:
        raise bad("mia", audit.mia, f"false with {who}, which gives the membership "
                  "audit no attack features (Task.membership)")
    if audit.mia_references and not task.classes:
        raise bad("mia-references", audit.mia_references,
                  f"0 with {who}: LiRA reads one true class a sample (its logit-scaled "
                  "confidence); a per-character score is not built (Task.classes)")
    if audit.mia_shadows and not task.classes:
        raise bad("mia-shadows", audit.mia_shadows,
                  f"0 with {who}: shadow models need one class label a sample "
                  "(Task.classes)")
    classes = data.num_classes if data is not None else task.num_classes
    if classes is None:
        return
    if data is not None:  # what every process will build from the task
        check_model(cfg, task, classes)
    if audit.backdoor_trigger and audit.backdoor_target >= classes:
        raise bad("backdoor-target", audit.backdoor_target,
                  f"a class index in 0..{classes - 1} ({who} has {classes} classes)")
    if cfg.data.partition == "pathological" and cfg.data.classes_per_client > classes:
        raise bad("classes-per-client", cfg.data.classes_per_client,
                  f"at most the {classes} classes of {who}")
