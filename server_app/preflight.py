"""Checks of a whole run before any engine starts: plain functions, no nodes.

:func:`validate_run_config` is what a launcher calls on the merged run-config
mapping before it starts Flower (simulation or deployment): it parses the
settings (:meth:`RunConfig.from_run_config`, each key alone and the simple
combinations) and runs :func:`check_run`, which adds what needs more than the
settings but neither nodes nor (unless given) the dataset:

- the run's task (run-config ``task``; a plug-in is imported here) and the
  settings that need a part it lacks (:func:`server_app.config.tasks.check_task`);
- the unlearning methods of one's own in ``frameworks`` (imported here,
  :func:`server_app.unlearning.methods.load_method`);
- the unlearning requests: generated or ``forget-clients``, on the shards and
  on the baselines' shards, none emptying a shard
  (:func:`server_app.unlearning.plan.plan_requests`; a staged run's first ones:
  :func:`server_app.stages.plan.check_stage_requests`);
- ``storage = "coded"``: the initial model's floating-point layers fit the
  fixed point of GF(2^31-1) with :data:`QUANT_HEADROOM` x headroom
  (:func:`largest_scale_bits`; integer buffers are coded exactly);
- an explicit ``data-dir`` holds the dataset, and ``run-name`` does not name a
  finished run (``files=True``);
- with the loaded task: the partition can be built for ``num-clients`` (not with
  ``client-data = true``: each client reads its own folder, the server holds
  the test split alone, and ``forget-records`` is checked against the counts
  the nodes report at discovery);
- what the run folder holds can be resumed (:func:`check_stored`: catalog,
  settings, stage results, models, history stores; also run by the ServerApp).

Every failure is a :class:`~server_app.config.ConfigError` whose one-line
message names the key(s), the value and what is allowed. The ServerApp runs the
same checks (with the task) before it creates the run folder or contacts a node.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from coding.field import MAX_MAGNITUDE
from server_app.config import ConfigError, RunConfig
from server_app.config.storage import MIN_SCALE_BITS
from server_app.config.tasks import check_model, check_task, data_folder, load_run_data
from server_app.config.values import bad as _bad
from server_app.run.plan import RunPlan, plan_run
from server_app.stages.plan import check_stage_requests
from server_app.stored import check_run_folder, run_settings
from server_app.unlearning.methods import (
    NoHistory,
    UnlearningRequest,
    load_method,
    probe_method,
)

if TYPE_CHECKING:
    from task.data import TaskData
    from task.interface import Task

QUANT_HEADROOM = 8.0
"""Coded storage: the fixed point must hold 8x the initial model's largest
magnitude. Round 0 stores the initial model itself; later rounds store client
updates, which may outgrow it, so an initial model at the edge of the range
would fail a few rounds in. 8x (3 bits) keeps the default 24 bits (|x| <= 64)
valid for every model here (CNN: largest initial weight < 1)."""

def validate_run_config(run_config: Mapping[str, object], task: TaskData | None = None,
                        files: bool = True) -> RunConfig:
    """Parse and check a merged run config; what a launcher calls before any engine.

    Parameters
    ----------
    run_config : Mapping[str, object]
        Kebab-case keys (``pyproject.toml`` defaults, preset, ``--run-config``);
        missing keys take defaults, unknown keys are ignored.
    task : TaskData, optional
        The loaded dataset; with it the partition is checked too.
    files : bool
        Also check the file system (``data-dir``, ``run-name``); leave False
        where the ServerApp runs on another machine.

    Returns
    -------
    RunConfig
        The parsed settings.

    Raises
    ------
    ConfigError
        The first bad setting or combination, in one line.
    """
    return validate_run(run_config, task, files)[0]


def validate_run(run_config: Mapping[str, object], task: TaskData | None = None,
                 files: bool = True) -> tuple[RunConfig, RunPlan]:
    """:func:`validate_run_config`, and the run's plan its checks built.

    Raises
    ------
    ConfigError
        As :func:`validate_run_config`.
    """
    cfg = RunConfig.from_run_config(run_config)
    return cfg, check_run(cfg, task, files=files)


def check_run(cfg: RunConfig, task: TaskData | None = None,
              files: bool = True) -> RunPlan:
    """Every check of a parsed config that needs no node (see the module docstring).

    Returns
    -------
    RunPlan
        The run's plan (:func:`server_app.run.plan.plan_run`); its ``notes``:
        settings that are carried out in a reduced form (a baseline sampling
        fewer clients, a smaller non-IID client size).

    Raises
    ------
    ConfigError
        A task, request, coded-storage, file or partition setting that cannot work.
    """
    check_task(cfg, cfg.task(), task)
    for spec in cfg.unlearning.plugin_methods.values():
        load_method(spec)  # ConfigError naming frameworks
    if cfg.stages.staged:  # requests come stage by stage (server_app.stages)
        check_stage_requests(cfg)
    plan = plan_run(cfg)
    if task is not None and cfg.unlearning.plugin_methods:  # built, not only typed
        probe_methods(cfg, plan, task.num_classes)
    if cfg.storage.coded:
        num_classes = (task if task is not None else _load_task(cfg)).num_classes
        if task is None:  # with the data, check_task above has built the model
            check_model(cfg, cfg.task(), num_classes)  # built next, for the range
        check_coded_range(cfg, initial_magnitude(cfg.task(), num_classes, cfg.seed))
    if files:
        _check_files(cfg)
    if task is not None and not cfg.data.client_data:  # else: the clients' own data
        plan = plan.with_notes(check_partition(cfg, task))
    return plan


def check_stored(cfg: RunConfig, data_dir: str | Path, verify_blobs: bool = True,
                 plan: RunPlan | None = None) -> Path:
    """What the run folder holds, if anything, can be resumed; return its path.

    The checks of :func:`server_app.stored.check_run_folder` (lock, finished
    run, catalog, settings, requests, stage results, models' SHA-256, history
    stores), with this run's settings and planned requests. Nothing is changed
    on disk.

    Parameters
    ----------
    cfg : RunConfig
        The checked settings (:func:`validate_run_config`).
    data_dir : str or Path
        The dataset's folder, resolved (it is part of the recorded settings).
    verify_blobs : bool
        Hash every stored history blob too.
    plan : RunPlan, optional
        The run's plan (its planned requests); default :func:`plan_run`'s.

    Raises
    ------
    ConfigError
        One line naming the file or setting a resume cannot use.
    """
    one_stage = cfg.unlearning.framework_list and not cfg.stages.staged
    requests = (plan or plan_run(cfg)).request_lists() if one_stage else None
    return check_run_folder(cfg, run_settings(cfg, data_dir), requests, verify_blobs)


def probe_methods(cfg: RunConfig, plan: RunPlan, num_classes: int) -> None:
    """Build each method of one's own as its first request will, before any engine.

    On W^0 of the run's task (its real dtypes and shapes, seeded as the
    ServerApp seeds it), SE's shards and the first planned request (else the
    first client of shard 0), with an empty history
    (:class:`server_app.unlearning.methods.NoHistory`).

    Raises
    ------
    ConfigError
        A method that cannot be built (:func:`server_app.unlearning.methods.probe_method`).
    """
    import torch
    from flwr.app import ArrayRecord, ConfigRecord

    shards = plan.shard_lists()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        initial = ArrayRecord(cfg.task().model(num_classes).state_dict())
    batch = tuple(sorted(plan.requests[0])) if plan.requests else (shards[0][0],)
    request = UnlearningRequest(
        frozenset(batch), batch, shards, {p: p for p in range(cfg.data.num_clients)},
        NoHistory(initial), [initial.copy() for _ in shards], initial, ConfigRecord({}),
        cfg.retrain_epochs, cfg.training.num_rounds, cfg.training.clients_per_round,
        cfg.seed)
    for spec in cfg.unlearning.plugin_methods.values():
        probe_method(spec, request)


def initial_magnitude(task: Task | str, num_classes: int, seed: int) -> float:
    """Largest magnitude of a floating-point layer of W^0 (as the ServerApp builds it).

    Builds the task's model (``task``: a :class:`~task.interface.Task`, or a
    built-in task's name) after ``torch.manual_seed(seed)`` inside a forked RNG
    (the caller's RNG state is left alone). Integer buffers (e.g. BatchNorm's
    ``num_batches_tracked``) are coded exactly, not in the fixed point, so they
    do not count. Returns a float >= 0.
    """
    import torch

    from task.registry import get_task

    model = (get_task(task) if isinstance(task, str) else task).model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        state = model(num_classes).state_dict()
    return max((float(t.detach().abs().max()) for t in state.values()
                if t.numel() and t.is_floating_point()), default=0.0)


def largest_scale_bits(magnitude: float, headroom: float = QUANT_HEADROOM) -> int:
    """Most fractional bits b in [16, 30] with (2^30 - 1) / 2^b >= headroom x magnitude.

    Returns 0 when no b fits.
    """
    fits = [b for b in range(MIN_SCALE_BITS, 31)
            if MAX_MAGNITUDE / 2**b >= headroom * magnitude]
    return max(fits, default=0)


def check_coded_range(cfg: RunConfig, magnitude: float) -> None:
    """Refuse a ``quant-scale-bits`` whose range is under 8x the initial model's.

    Raises
    ------
    ConfigError
        Naming ``quant-scale-bits`` and the largest value allowed for the model.
    """
    most = largest_scale_bits(magnitude)
    if cfg.storage.quant_scale_bits <= most:
        return
    limit = MAX_MAGNITUDE / 2**cfg.storage.quant_scale_bits
    allowed = (f"at most {most} for this model" if most else
               f"no value in [{MIN_SCALE_BITS}, 30] fits this model: use "
               "storage='uncoded'")
    raise _bad("quant-scale-bits", cfg.storage.quant_scale_bits,
               f"{allowed} with storage='coded': its initial weights reach "
               f"{magnitude:.4g}, and {cfg.storage.quant_scale_bits} fractional bits hold "
               f"|x| <= {limit:.4g} in GF(2^31-1), under the required "
               f"{QUANT_HEADROOM:g}x headroom")


def _load_task(cfg: RunConfig) -> TaskData:
    """The run's data, loaded (cached): its model's output size sizes W^0.

    Raises
    ------
    ConfigError
        The data is not found (naming ``data-dir``) or cannot be loaded.
    """
    return load_run_data(cfg, data_folder(cfg))


def load_run(cfg: RunConfig) -> tuple[str, TaskData]:
    """The run's data folder and its data (what a launcher checks the partition on).

    Raises
    ------
    ConfigError
        As :func:`server_app.config.tasks.data_folder` and ``load_run_data``.
    """
    folder = data_folder(cfg)
    return folder, load_run_data(cfg, folder)


def _check_files(cfg: RunConfig) -> None:
    if cfg.data.data_dir:
        data_folder(cfg)  # ConfigError naming data-dir
    if cfg.output.run_name:
        path = cfg.output.resolved_results_dir() / cfg.output.run_name
        if (path / "summary.json").exists():
            raise _bad("run-name", cfg.output.run_name,
                       f"a name without a finished run: {path} holds one; choose "
                       "another run-name or remove that folder")


def check_partition(cfg: RunConfig, task: TaskData) -> list[str]:
    """Build the partition the clients will use, once, before the first round.

    Returns notes for the log (a non-IID client size below N // C).

    Raises
    ------
    ConfigError
        Naming ``num-clients`` and ``partition`` when it cannot be built.
    """
    from task.data import partitions

    try:
        parts = partitions(task, cfg.data.num_clients, cfg.data.partition, cfg.seed,
                           cfg.data.partition_alpha, cfg.data.classes_per_client)
    except ValueError as err:
        raise ConfigError(f"run-config 'num-clients' = {cfg.data.num_clients} with "
                          f"partition = {cfg.data.partition!r} is not allowed for "
                          f"{cfg.data.task_spec}: {err}") from err
    check_erasure(cfg, task, parts)
    if not task.has_classes and cfg.data.partition in ("dirichlet", "pathological"):
        return [f"partition={cfg.data.partition!r} on {task.kind or 'targets'} without "
                "classes: its own non-IID buckets (no classes to split)"]
    even = len(task.train_y) // cfg.data.num_clients
    size = len(parts[0])
    if task.has_classes and cfg.data.partition == "noniid" and size < even:
        return [f"partition='noniid' with {cfg.data.num_clients} clients: {size} samples "
                f"per client (N // C = {even} needs more of one class than exists)"]
    return []


def check_erasure(cfg: RunConfig, task: TaskData, parts: list) -> None:
    """``forget-records`` / ``forget-labels`` against the clients' records.

    :func:`server_app.admission.erasure_refusal`, the check every entry
    point of a records or class request calls: a record id must be one the
    client holds (its first ``client-samples`` records of its partition,
    :mod:`task.records`); a label must be one of the task's classes, and every
    client must keep a record.

    Raises
    ------
    ConfigError
        Naming the key, the client and what it holds.
    """
    from server_app.admission import Holdings, erasure_refusal
    from server_app.unlearning.erasure import Erasure

    unlearning, cap = cfg.unlearning, cfg.data.client_samples
    if not (unlearning.erased_records or unlearning.erased_labels):
        return
    held = [part[:cap] if cap > 0 else part for part in parts]
    holdings = Holdings(cfg.data.task_spec, dict(enumerate(map(len, held))),
                        lambda: (task, held))
    refusal = erasure_refusal(unlearning.erased_records, unlearning.erased_labels,
                              holdings, Erasure(clients=tuple(range(len(held)))))
    if refusal is not None:
        key = f"forget-{refusal[0]}"
        value = unlearning.forget_records if key == "forget-records" \
            else unlearning.forget_labels
        raise _bad(key, value, refusal[1])
