"""Shared fixtures: an in-process Grid that runs the real ClientApp per node."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from experiments.grid import InProcessGrid, set_task_identity
from task.config import fused_run_config

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

SLOW_TIERS = ("slow", "inprocess", "subprocess", "e2e")
"""Markers of the slow tiers (pyproject.toml); ``--fast`` runs the tests with none."""
IN_PROCESS_FIXTURES = {"run_server", "make_grid",  # here
                       "runs", "tiny_all", "stored", "staged_run",  # module fixtures
                       "_finished_once", "coded_run"}
"""A test using one of these (directly or through its fixtures) runs whole federations."""


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast tier: leave out tests marked " + ", ".join(SLOW_TIERS))


def pytest_collection_modifyitems(config, items):
    """Mark in-process runs by their fixtures; with ``--fast`` keep the fast tier.

    On pytest-xdist workers (``-n``) the slow tiers go first: each worker takes
    the next test as it frees (:func:`pytest_xdist_make_scheduler`), so the long
    tests spread over the workers instead of one of them ending the suite alone.
    (A worker's ``config.option.numprocesses`` is None: it is told by its env.)
    """
    for item in items:
        if IN_PROCESS_FIXTURES & set(item.fixturenames):
            item.add_marker("inprocess")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_tier_rank)  # stable: a tier keeps its modules' order
    if not config.getoption("--fast"):
        return
    slow = [item for item in items if any(item.get_closest_marker(m) for m in SLOW_TIERS)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in set(slow)]


def shared_unit(module: str) -> str | None:
    """The work unit of test file ``module`` (a path from the root) when it shares one.

    A module with module-scoped fixtures is one unit: split over workers, or merely
    interleaved with another module's tests, pytest would set a module fixture up
    again (a federation run, the tiny experiment suite) each time it came back. The
    modules using :func:`loopback_deploy` are one unit together, so that its
    deployment runs once. None: each of its tests is a unit of its own.
    """
    path = ROOT / module
    text = path.read_text() if path.is_file() else ""
    if LOOPBACK in text:
        return LOOPBACK
    return module if 'scope="module"' in text else None


@pytest.hookimpl(optionalhook=True)  # -p no:xdist: the hook's spec is not there
def pytest_xdist_make_scheduler(config, log):
    """One test at a time to the worker that frees first; tests sharing fixtures together.

    Each test is its own work unit, except the tests of modules sharing fixtures
    (:func:`shared_unit`), which go to one worker together (``tests/test_hosts.py``,
    in the largest unit, also builds test on test).
    pytest-xdist's own ``xdist_group`` marks do not group under pytest 9.2 (xdist
    3.8 renames ``item._nodeid``, which pytest 9.2 no longer reads), so the unit is
    named here.
    """
    from functools import cache

    from xdist.scheduler import LoadScopeScheduling

    shared = cache(shared_unit)
    # units in the collection's order (slow tiers first), not by their number of tests
    config.option.loadscopereorder = False

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return shared(module) or nodeid

    return TierScheduling(config, log)


def _tier_rank(item) -> int:
    """0 for e2e, 1 subprocess, 2 in-process, 3 slow, 4 the fast tier."""
    ranks = [i for i, m in enumerate(reversed(SLOW_TIERS)) if item.get_closest_marker(m)]
    return min(ranks, default=len(SLOW_TIERS))


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages built outside a Flower run need a run id and node id."""
    set_task_identity()
    yield


@pytest.fixture
def make_grid():
    """Factory: ``make_grid(num_nodes, run_config)`` -> InProcessGrid."""
    from client_app.app import app as client_app

    def make(num_nodes: int, run_config: dict, absent: Iterable[int] = (), **kw):
        return InProcessGrid(client_app, num_nodes, run_config, absent, **kw)

    return make


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline datasets (../shared/data); tests needing them skip without."""
    root = Path(os.environ.get("SE_DATA_DIR", SHARED_DATA))
    if not (root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no offline datasets at {root}")
    return root


DEPLOYED = {"num-clients": 4, "num-shards": 2, "clients-per-round": 4, "num-rounds": 2,
            "local-epochs": 1, "client-samples": 64, "test-samples": 200, "mia": False,
            "frameworks": "SE,FR", "storage": "coded", "forget-clients": "1", "seed": 0}
"""The deployment tests' run: learn, forget client 1 with SE and FR, coded storage,
on 4 SuperNodes (loopback in test_deploy, separate hosts in test_hosts)."""

LOOPBACK = "loopback_deploy"
"""The session fixture below: the test modules naming it share one worker."""


@pytest.fixture(scope="session")
def loopback_deploy(tmp_path_factory, shared_data):
    """``scripts/deploy.sh 4`` with :data:`DEPLOYED`, once: (process, its folder).

    test_deploy checks the deployment's plumbing on it and test_hosts compares the
    separate-hosts run with it (the same results for the same seed).
    """
    import json
    import subprocess

    root = tmp_path_factory.mktemp("loopback")
    values = {**DEPLOYED, "run-name": "loopback"}
    env = {**os.environ, "SE_RESULTS_DIR": str(root / "results"),
           "FLWR_HOME": str(root / "flwr_home"), "SE_DATA_DIR": str(shared_data),
           "SE_DEPLOY_DIR": str(root / "runs"), "SE_DEPLOY_TIMEOUT": "400"}
    config = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else json.dumps(v)}"
                      for k, v in values.items())
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "deploy.sh"),
                           str(DEPLOYED["num-clients"]),
                           "--run-config", config, "--control-nice", "5"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    return proc, root


@pytest.fixture
def offline(monkeypatch):
    """No downloads, and no ``$SE_DATA_DIR``."""
    from task import locate

    def refuse(dataset, root):
        raise OSError("offline (test)")

    monkeypatch.setattr(locate, "_download", refuse)
    monkeypatch.delenv("SE_DATA_DIR", raising=False)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache (``$SE_CACHE_DIR``) under tmp_path."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("SE_CACHE_DIR", str(folder))
    return folder


TINY = {
    "dataset": "mnist", "num-clients": 8, "num-shards": 2, "clients-per-round": 4,
    "num-rounds": 2, "local-epochs": 1, "client-samples": 64, "test-samples": 500,
    "batch-size": 16,
}


@pytest.fixture
def run_server(tmp_path, make_grid, shared_data):
    """Factory: run the real ServerApp in-process on an InProcessGrid.

    ``run_server(overrides) -> (summary dict, grid)``; results go to tmp_path.
    """
    import json

    from server_app.app import main

    def run(overrides: dict | None = None, run_name: str = "t", **grid_kw):
        config = fused_run_config({**TINY, "results-dir": str(tmp_path),
                                   "run-name": run_name, "data-dir": str(shared_data),
                                   **(overrides or {})})
        grid = make_grid(int(config["num-clients"]), config, **grid_kw)
        main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                           run_config=config))
        return json.loads((tmp_path / run_name / "summary.json").read_text()), grid

    return run
