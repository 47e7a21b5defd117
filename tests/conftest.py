"""Shared fixtures: an in-process Grid that runs the real ClientApp per node."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from experiments.grid import InProcessGrid, set_task_identity
from task.config import fused_run_config

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

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


SHARED_MODULES = ("tests/test_hosts.py",)
"""Modules whose tests share module fixtures and build on each other: one worker each."""


def pytest_xdist_make_scheduler(config, log):
    """One test at a time to the worker that frees first; a shared module whole.

    Each test is its own work unit, except the tests of :data:`SHARED_MODULES`,
    which go to one worker together, first (the largest unit). pytest-xdist's
    own ``xdist_group`` marks do not group under pytest 9.2 (xdist 3.8 renames
    ``item._nodeid``, which pytest 9.2 no longer reads), so the unit is named
    here.
    """
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_MODULES else nodeid

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
