"""The ServerApp: check the run, find the nodes, run its stages, write summary.json.

Flow (docs/DESIGN.md, "How a run flows through the wings"): the run config is
parsed into typed sections and checked (:mod:`server_app.config`,
:mod:`server_app.preflight`) -> the data is found and the partition built -> the
run folder is opened and locked (:mod:`server_app.run`) -> the nodes are found
(:func:`server_app.rounds.federation.discover`) -> one :class:`RunContext` with
the run's round loop -> the stages (:func:`server_app.stages.pipeline.run_pipeline`:
learning, unlearning, the audit) -> summary.json.

The ServerApp runs on stock Flower: it changes no Flower global. Our own deploy
commands may hand it a faster Grid through one hook (:func:`deployment_grid`).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from runstore.catalog import CLIENT_RECORDS, RunLog
from runstore.folder import RunFolder
from runstore.summary import RunSummary
from server_app.config import RunConfig
from server_app.config.profile import CALIBRATE_COMMAND
from server_app.config.tasks import check_task, load_run_data
from server_app.config.values import bad
from server_app.evaluation.central import CentralEvaluator
from server_app.failures import one_line
from server_app.forget_run import stored_run_config
from server_app.preflight import check_partition, check_stored, validate_run
from server_app.rounds.costs import CostModel
from server_app.rounds.engine import Engine, TrainedNodes, engine_of
from server_app.rounds.federation import NODE_RULE, bounded_sizes, find_nodes
from server_app.rounds.loop import RoundLoop
from server_app.run.context import RunContext
from server_app.run.plan import RunPlan
from server_app.stages.later import serve_later
from server_app.stages.pipeline import run_pipeline
from server_app.stored import check_node_folders, run_settings
from task.config import RUN_CONFIG_KEY, client_settings, default_run_config
from task.data import partition_sizes
from task.records import check_against_sizes

app = ServerApp()
GRID_HOOK_ENV = "SE_DEPLOY_GRID_HOOK"
"""``module:function`` wrapping the Grid; set only by our deploy commands (cli/)."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one experiment as the run config describes (see docs/CONFIG.md)."""
    with one_line(RunContext.log):  # an expected failure: one marked line
        run_config = stored_run_config(context.run_config, default_run_config())
        engine = engine_of(grid)  # before our wrappers: Flower's own grid
        ctx = open_run(TrainedNodes(deployment_grid(grid)), run_config, engine)
        if ctx.cfg.stages.later_requests:  # a finished run: its pending requests
            serve_later(ctx)
            ctx.folder.release()
            return
        summary = run_pipeline(ctx)
        finish(ctx, summary)


def deployment_grid(grid: Grid) -> Grid:
    """``grid`` as the deployment layer that started this process asks; else ``grid``.

    The deployment layer's one hook into the ServerApp: our own deploy commands
    start the SuperLink with ``SE_DEPLOY_GRID_HOOK`` = ``module:function``
    (docs/DEPLOY.md, "Flower patches of our deploy commands"), which its ServerApps
    inherit, and the function wraps (or patches Flower for) the Grid. Unset (a
    plain ``flwr run`` on any SuperLink, the simulation, the tests) nothing is
    imported and ``grid`` is returned as it is.

    Raises
    ------
    ValueError
        The variable is not ``module:function`` importable here.
    """
    spec = os.environ.get(GRID_HOOK_ENV, "")
    if not spec:
        return grid
    module, _, name = spec.partition(":")
    try:
        hook = getattr(importlib.import_module(module), name) if module and name \
            else None
    except (ImportError, AttributeError):
        hook = None
    if not callable(hook):
        raise ValueError(f"{GRID_HOOK_ENV} = {spec!r} is not allowed: use "
                         "'module:function' importable by the ServerApp, or unset it")
    return hook(grid)


@dataclass
class Prepared:
    """What the ServerApp knows before it contacts a node (every check passed)."""

    cfg: RunConfig
    plan: RunPlan
    data_dir: str
    folder: RunFolder
    catalog: RunLog
    evaluator: CentralEvaluator
    costs: CostModel

    def connect(self, grid: Grid, engine: Engine | None = None) -> RunContext:
        """Find the nodes on ``grid``; the run's context with its round loop.

        ``engine``: where the run runs (:func:`server_app.rounds.engine.engine_of`),
        recorded in the catalog by the run's first process. A node reading its own
        data folder reports its record count at discovery: that count (capped at
        ``client-samples``) replaces the size of the partition the server cut, as
        the bound on the ``num-examples`` its replies may claim (docs/DEPLOY.md,
        "Each client with only its own data": the server trusts the count a node
        declares, and holds it to it).
        """
        cfg, data = self.cfg, self.cfg.data
        found = find_nodes(grid, data.num_clients, timeout=cfg.training.round_timeout,
                           config=ConfigRecord({RUN_CONFIG_KEY: client_settings(
                               cfg.as_dict())}), own_data=data.client_data)
        node_of, plan = found.node_of, self.plan
        if found.left_out:  # a long-lived federation may have more nodes than the run
            plan = plan.with_notes([f"nodes used: {NODE_RULE}; left out: partition ids "
                                    f"{sorted(found.left_out)}"])
            RunContext.log(plan.notes[-1])
        self.catalog.record_once("nodes", json.dumps(
            {"rule": NODE_RULE, "left_out": sorted(found.left_out)}))
        cut = dict(plan.samples)
        samples = bounded_sizes(cut, found.records, data.client_samples)
        if found.records:
            RunContext.log(_own_data_note(found.records, cut, samples))
            check_own_records(cfg, samples)
        if data.client_data:  # what the `forget` command checks record ids against
            self.catalog.record(CLIENT_RECORDS, json.dumps(
                {str(p): n for p, n in sorted(samples.items())}))
        loop = RoundLoop(grid, cfg.training.round_timeout,
                         partition_of={n: p for p, n in node_of.items()},
                         samples=samples, costs=self.costs)
        engine = engine or engine_of(grid)
        self.catalog.record_once("engine", json.dumps(engine.to_json()))  # the run's
        return RunContext(cfg, plan.with_nodes(node_of, samples), loop, self.folder,
                          self.catalog, self.evaluator, self.data_dir, engine)


def check_own_records(cfg: RunConfig, samples: dict[int, int]) -> None:
    """``forget-records`` against the records the clients reported holding.

    The command and :func:`prepare` checked the ids against the partition the
    run would cut; a client reading its own folder may hold fewer.

    Raises
    ------
    ConfigError
        One line naming ``forget-records``, the client and what it holds.
    """
    records = cfg.unlearning.erased_records
    why = check_against_sizes(records, samples) if records else None
    if why is not None:
        raise bad("forget-records", cfg.unlearning.forget_records,
                  f"{why} (as its own data folder reports)")


def _own_data_note(reported: dict[int, int], cut: dict[int, int],
                   used: dict[int, int]) -> str:
    """One log line: how many clients read their own folders, and any size that moved."""
    moved = [p for p in sorted(reported) if cut and cut.get(p) != used[p]]
    line = (f"client data: {len(reported)} of {len(used)} clients read their own "
            "folders (num-examples bounded by the records they reported)")
    if not cut:  # client-data = true: the server cut nothing
        return line + "; the server read only the test split (client-data = true)"
    if moved:
        p = moved[0]
        line += (f"; {len(moved)} differ from the partition the run would cut "
                 f"(e.g. client {p}: {used[p]} records, not {cut.get(p)})")
    return line


def open_run(grid: Grid, run_config, engine: Engine | None = None) -> RunContext:
    """:func:`prepare`, then find the nodes (:meth:`Prepared.connect`)."""
    return prepare(run_config).connect(grid, engine)


def prepare(run_config) -> Prepared:
    """Check the run config and the data, plan the requests, open the run folder.

    Everything that can fail without a node fails here, before any folder or
    node (:mod:`server_app.preflight`).
    """
    cfg, plan = validate_run(run_config, files=False)  # every check without data
    data = cfg.data
    data_dir = str(cfg.task().locate(data.data_dir))  # DatasetNotFoundError: no data
    task = load_run_data(cfg, data_dir)  # the run's task's data: fail early
    check_task(cfg, cfg.task(), task)  # its number of classes bounds some keys
    # what needs the data: the partition (once); the rest was checked just above.
    # client-data = true: the server holds the test split alone; each client's
    # size is what its node reports at discovery (Prepared.connect)
    if not data.client_data:
        plan = plan.with_notes(check_partition(cfg, task))
    for note in plan.notes:
        RunContext.log(note)
    # what each client holds bounds the num-examples its replies may claim
    samples = {} if data.client_data else dict(enumerate(partition_sizes(
        task, data.num_clients, data.partition, cfg.seed, data.client_samples,
        data.partition_alpha, data.classes_per_client)))
    plan = plan.with_nodes({}, samples)
    later = cfg.stages.later_requests
    if not later:  # what a resume reads back, as the command checked it (blobs: later)
        check_stored(cfg, data_dir, verify_blobs=False, plan=plan)
    results, name = cfg.output.resolved_results_dir(), cfg.resolved_run_name()
    if later:  # the node folders a later request decodes, as `forget` checked them
        check_node_folders(cfg, results / name)
    folder = RunFolder.reopen(results / name) if later else RunFolder.start(results, name)
    # resolved paths: another spelling of the same folders is the same run; the
    # later-requests switch says what this process does, not what the run is
    catalog = RunLog(folder.runlog_path, run_settings(cfg, data_dir))
    if cfg.unlearning.framework_list:
        plan = plan.with_requests(catalog.record_requests(plan.request_lists()))
    RunContext.log(f"results: {folder.path}{' (resumed)' if catalog.resumed else ''}")
    evaluator = CentralEvaluator(cfg.task(), task, data.test_samples or None,
                                 cfg.training.device)
    costs, notes = cost_model(cfg, evaluator.num_classes)
    return Prepared(cfg, plan.with_notes(notes), data_dir, folder, catalog, evaluator,
                    costs)


def cost_model(cfg: RunConfig, num_classes: int) -> tuple[CostModel, list[str]]:
    """The run's prices: its task on its device profile (run-config ``device-profile``).

    A task the profile lacks (a plug-in not calibrated) is priced by the
    profile's per-parameter fallback; the returned note (also logged) says so
    and names the command that calibrates it. Returns the prices and [] or
    that one note.

    Raises
    ------
    ConfigError
        The profile cannot be read (one line naming ``device-profile``).
    """
    profile, task = cfg.training.profile(), cfg.task()
    parameters = 0 if task.name in profile.tasks else sum(
        p.numel() for p in task.model(num_classes).parameters())
    costs = CostModel.of(profile, task.name, cfg.training.link_rate_mbps, parameters)
    if costs.estimated:
        note = (f"device-profile {profile.name!r} has no per-sample cost for task "
                f"{task.name!r}: its modelled training time is estimated from its "
                f"{parameters} parameters; measure it with {CALIBRATE_COMMAND} "
                f"--tasks {cfg.data.task_spec} --out PROFILE.toml and pass "
                "device-profile = PROFILE.toml")
        RunContext.log(note)
        return costs, [note]
    return costs, []


def finish(ctx: RunContext, summary: RunSummary) -> None:
    """Faults, warnings and perplexity into ``summary``; write summary.json."""
    faults = ctx.faults
    summary.faults = {"counts": faults.counts(), "entries": faults.entries}
    summary.warnings = summary.collect_warnings()
    if ctx.cfg.task().perplexity:  # the loss is nats per token
        summary.add_perplexity()
    path = ctx.folder.finish(summary.to_json())
    RunContext.log(f"summary: {path}")
