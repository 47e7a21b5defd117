"""A built-in task is one module plus one registry line (issue 41, item 2).

A temporary module (a toy task written against :class:`task.interface.Task`) is
registered in :data:`task.tasks.BUILTIN_TASKS` under a new name; the run-config
checks then accept ``dataset`` = that name, the apps' registry resolves it through
the same import as a plug-in, the experiment suites plan it from its facts, and a
whole in-process run learns on it. The four shipped built-ins go the same way.
"""

from __future__ import annotations

import json
import sys

import pytest
from flwr.app import Context, RecordDict

from server_app.config import ConfigError
from server_app.preflight import validate_run_config
from task.config import TaskConfig, fused_run_config
from task.registry import get_task, is_builtin, task_of
from task.tasks import BUILTIN_TASKS

MODULE = '''
"""A toy built-in: 8 features, 3 classes, a linear model."""
import numpy as np
from torch import nn

from task.data import TaskData
from task.interface import Task


def load(settings):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    return TaskData.from_arrays(x[:96], y[:96], x[96:], y[96:], num_classes=3)


def model(num_classes):
    return nn.Linear(8, num_classes)


task = Task(name="toy", load=load, model=model, num_classes=3)
'''

RUN = {"dataset": "toy", "num-clients": 4, "num-shards": 2, "clients-per-round": 4,
       "num-rounds": 2, "local-epochs": 1, "client-samples": 16, "test-samples": 24,
       "batch-size": 8, "lr": 0.1, "forget-clients": "1", "frameworks": "SE",
       "storage": "uncoded", "mia": False}


@pytest.fixture()
def toy(tmp_path, monkeypatch):
    """toytask.py on sys.path, one registry line (``"toy": "toytask:task"``) and,
    for the suites, the toy's facts (:data:`experiments.facts.BUILTIN_FACTS`)."""
    from experiments.facts import BUILTIN_FACTS, ExperimentFacts

    (tmp_path / "toytask.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(BUILTIN_FACTS, "toy", ExperimentFacts(
        roles={"tiny": ("single",)}, client_samples={"tiny": 16}, goal=("accuracy", 0.5)))
    monkeypatch.setitem(BUILTIN_TASKS, "toy", "toytask:task")
    yield
    get_task.cache_clear()  # forget the toy; the shipped built-ins stay imported
    sys.modules.pop("toytask", None)


def test_the_shipped_built_ins_are_their_modules_tasks():
    import task.tasks.cifar10 as cifar10
    import task.tasks.mnist as idx
    import task.tasks.shakespeare as text

    shipped = {"mnist": idx.mnist, "fmnist": idx.fmnist, "cifar10": cifar10.task,
               "shakespeare": text.task}
    assert list(BUILTIN_TASKS) == list(shipped)
    for name, task in shipped.items():
        assert get_task(name) is task and task.name == name and is_builtin(task)
    from experiments.facts import BUILTIN_FACTS  # the suites' facts, one per built-in

    assert list(BUILTIN_FACTS) == list(BUILTIN_TASKS)


def test_a_new_built_in_is_accepted_by_the_run_config_checks(toy):
    with pytest.raises(ConfigError, match="'dataset'"):
        validate_run_config(fused_run_config({**RUN, "dataset": "toy2"}), files=False)
    validate_run_config(fused_run_config(RUN), files=False)
    settings = TaskConfig(dataset="toy", partition="iid", num_clients=4, seed=0,
                          data_dir="", block_size=64, client_samples=0)
    task = task_of(settings)
    assert task is sys.modules["toytask"].task and is_builtin(task)


def test_a_new_built_in_is_planned_by_the_suites_from_its_facts(toy):
    from experiments import compare, suites

    names = [spec.name for spec in suites.plan("single", "tiny")]
    assert "single-toy-iid-s0" in names and "single-toy-noniid-s0" in names
    spec = next(s for s in suites.plan("single", "tiny") if s.tags["dataset"] == "toy")
    assert spec.config["client-samples"] == 16
    assert suites.quality_goal("toy") == ("accuracy", 0.5)
    assert all("toy" not in datasets for _, _, datasets in compare.paper_time_claims())


@pytest.mark.inprocess
def test_a_new_built_in_is_used_by_a_whole_run(toy, tmp_path):
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity
    from server_app.app import main

    set_task_identity()
    config = fused_run_config({**RUN, "results-dir": str(tmp_path), "run-name": "toy"})
    grid = InProcessGrid(client_app, 4, config)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))
    summary = json.loads((tmp_path / "toy" / "summary.json").read_text())
    assert summary["task"]["name"] == "toy"
    assert summary["task"]["metric"] == "accuracy"
