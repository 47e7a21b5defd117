"""A task and an unlearning method of one's own, defined outside the repository.

The two files are the code blocks of docs/TASKS.md, written to a temporary folder
and put on ``sys.path`` (as ``PYTHONPATH`` does for a real run): the page is what
runs. One in-process run (the real ServerApp and ClientApp) takes the task through
learning, SE, FR, FE, RR, coded storage and the membership audit, with the method
beside them in summary.json and the printed tables.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from server_app.config import ConfigError
from server_app.preflight import validate_run_config
from task.config import fused_run_config

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "TASKS.md").read_text()


def page_file(name: str) -> str:
    """The code block of docs/TASKS.md whose first line is ``# <name>``."""
    found = re.findall(r"```python\n(# " + re.escape(name) + r".*?)```", PAGE, re.S)
    assert len(found) == 1, name
    return found[0]


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A folder outside the repository holding mytask.py and mymethod.py, on sys.path."""
    folder = tmp_path_factory.mktemp("outside")
    assert ROOT not in folder.parents
    for name in ("mytask.py", "mymethod.py"):
        (folder / name).write_text(page_file(name))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


RUN = {"task": "mytask:task", "num-clients": 8, "num-shards": 2,
       "clients-per-round": 4, "num-rounds": 2, "local-epochs": 1,
       "client-samples": 48, "test-samples": 200, "batch-size": 16, "lr": 0.1,
       "forget-clients": "3", "frameworks": "SE,FR,FE,RR,mymethod:FineTune",
       "storage": "coded", "blocks-per-shard": 2, "mia": True, "mia-samples": 64}


@pytest.fixture(scope="module")
def summary(outside, tmp_path_factory):
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity
    from server_app.app import main

    set_task_identity()
    results = tmp_path_factory.mktemp("results")
    config = fused_run_config({**RUN, "results-dir": str(results), "run-name": "own"})
    grid = InProcessGrid(client_app, 8, config)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))
    return json.loads((results / "own" / "summary.json").read_text())


@pytest.mark.inprocess  # the module's run (summary)
def test_own_task_learns_and_every_framework_and_the_audit_run(summary):
    assert summary["config"]["task"] == "mytask:task"
    assert summary["data"]["dataset"] == "blobs"
    assert summary["task"] == {"name": "blobs", "metric": "accuracy", "classes": True,
                               "perplexity": False}  # what the experiments read
    assert summary["learning"]["accuracy"] > 0.5  # ten separable blobs: chance is 0.1
    assert sorted(summary["frameworks"]) == ["FE", "FR", "FineTune", "RR", "SE"]
    for name, result in summary["frameworks"].items():
        assert 0.0 <= result["accuracy"] <= 1.0 and result["client_epochs"] > 0, name
        assert 0.0 <= result["mia_auc"] <= 1.0, name
    assert 0.0 <= summary["original"]["mia_auc"] <= 1.0
    assert summary["storage"]["SE_coded"]["server_bytes"] > 0
    assert summary["frameworks"]["SE"]["requests"][0]["slice_retrieval"] is not None


@pytest.mark.inprocess  # the module's run (summary)
def test_own_method_is_in_the_tables_like_the_built_in_ones(summary):
    from cli.report import render

    fine = summary["frameworks"]["FineTune"]
    assert fine["requests"][0]["impacted_shards"] == \
        summary["frameworks"]["SE"]["requests"][0]["impacted_shards"]
    # one round of the impacted shard's retained clients (L = 1 epoch each)
    assert fine["client_epochs"] == pytest.approx(3.0)
    text = render(summary)
    assert re.search(r"^\s*FineTune\s", text, re.M), text


def test_the_command_imports_the_task_before_any_engine(outside):
    from cli import config
    from cli.simulation import preflight

    merged = config.merge(config.defaults(), [{**RUN, "frameworks": "SE,FR"}])
    cfg, data_dir = preflight(merged.config)
    assert cfg.task().name == "blobs"
    assert data_dir == ""  # the blobs task makes its data: no folder to locate


@pytest.mark.parametrize("overrides, key, words", [
    ({"task": "no_such_module_xyz:task"}, "task", "cannot import 'no_such_module_xyz'"),
    ({"task": "mytask:nothing"}, "task", "has no attribute 'nothing'"),
    ({"task": "mytask:load"}, "task", "calling it failed"),
    ({"task": "mytask:np"}, "task", "not a task.interface.Task"),
    ({"task": "my task"}, "task", "package.module:attribute"),
    ({"backdoor-trigger": 3}, "backdoor-trigger", "no backdoor trigger (Task.stamp)"),
    ({"frameworks": "SE,mytask:Task"}, "frameworks", "not a strategies.ShardedStrategy"),
    ({"frameworks": "SE,no_such_module_xyz:M"}, "frameworks", "cannot import"),
])
def test_what_the_task_or_method_cannot_do_is_one_line_before_any_engine(
        outside, overrides, key, words):
    run = {**RUN, "frameworks": "SE", "storage": "uncoded", **overrides}
    with pytest.raises(ConfigError) as err:
        validate_run_config(fused_run_config(run), files=False)
    message = str(err.value)
    assert "\n" not in message and f"'{key}'" in message and words in message, message


@pytest.mark.parametrize("source, spec, words", [
    ("import sys\ndef task():\n    sys.exit(3)\n", "exits_in_factory:task",
     "calling it failed (SystemExit: 3)"),
    ("import sys\nsys.exit(3)\n", "exits_on_import:task", "cannot import"),
])
def test_a_plugin_calling_sys_exit_is_one_line_not_a_silent_exit(tmp_path, monkeypatch,
                                                                 source, spec, words):
    (tmp_path / f"{spec.split(':')[0]}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = {**RUN, "task": spec, "frameworks": "SE", "storage": "uncoded"}
    with pytest.raises(ConfigError) as err:
        validate_run_config(fused_run_config(run), files=False)
    message = str(err.value)
    assert "\n" not in message and "'task'" in message and words in message, message


OLD_TRAIN = """
import dataclasses
import mytask

def train(model, x, y, *, epochs, batch_size, lr, seed=0, device=None):
    raise AssertionError("never called: refused when the task is made")

task = dataclasses.replace(mytask.task, train=train)
"""


def test_a_train_of_the_old_keyword_form_is_one_line_before_any_engine(
        outside, tmp_path, monkeypatch):
    """A plug-in's ``train`` that cannot take local_train's arguments (the keyword
    form before the training keys became one settings object) is refused where
    the task is made, not in the first ClientApp."""
    (tmp_path / "oldtrain.py").write_text(OLD_TRAIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = {**RUN, "task": "oldtrain:task", "frameworks": "SE", "storage": "uncoded"}
    with pytest.raises(ConfigError) as err:
        validate_run_config(fused_run_config(run), files=False)
    message = str(err.value)
    assert "\n" not in message and "'task'" in message, message
    assert "must accept (model, x, y, settings, *, seed, grad_transform, device)" \
        in message, message


@pytest.mark.inprocess  # the module's run (summary)
def test_own_method_lands_in_the_experiment_suite(summary):
    from experiments import collect, report, suites
    from experiments.report import requests as report_requests
    from runstore.summary import RunSummary

    rows = collect.summary_rows("single", "own", RunSummary.from_json(summary), 1.0)
    assert collect.methods_in(rows) == ["FineTune"]
    assert {r["dataset"] for r in rows} == {"mytask:task"}
    assert {r["metric"] for r in rows} == {"accuracy"}
    section = "\n".join(report_requests.single_sections(rows))
    assert re.search(r"\| mytask:task \| iid \| FineTune \|", section), section
    specs = suites.plan("single", "tiny")
    mixed = suites.with_methods(specs, ("mymethod:FineTune",))
    for before, after in zip(specs, mixed, strict=True):
        runs_se = "SE" in before.config["frameworks"].split(",")
        assert after.config["frameworks"].endswith(",mymethod:FineTune") == runs_se
        assert (after.name == before.name + "-with-FineTune") == runs_se
    assert report.command({"experiment": "single", "suite": "tiny",
                           "methods": ["mymethod:FineTune"]}).endswith(
        "--methods mymethod:FineTune")


def test_own_task_lives_on_through_stages(outside, tmp_path):
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity
    from server_app.app import main

    set_task_identity()
    config = fused_run_config({**RUN, "frameworks": "SE,FR", "storage": "uncoded",
                               "forget-clients": "", "mia": False, "num-rounds": 1,
                               "num-stages": 2, "requests-per-stage": 1,
                               "results-dir": str(tmp_path), "run-name": "staged"})
    main(InProcessGrid(client_app, 8, config),
         Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                 run_config=config))
    staged = json.loads((tmp_path / "staged" / "summary.json").read_text())
    assert [s["stage"] for s in staged["stages"]] == [1, 2]
    assert all(len(s["forgotten"]) == 1 for s in staged["stages"])
    assert staged["stages"][-1]["accuracy"] > 0.3


# A character task of one's own: per-position targets, loss in nats per character.
# Its name is none of the built-in ones; what it is comes from its Task fields.
TEXT_MODULE = '''
import numpy as np
from torch import nn

from task.data import TaskData
from task.interface import Task


def load(settings):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, size=(40, settings.block_size + 1))
    return TaskData.from_arrays(ids[:32, :-1], ids[:32, 1:], ids[32:, :-1],
                                ids[32:, 1:], num_classes=5)


def model(num_classes):
    return nn.Sequential(nn.Embedding(num_classes, 8), nn.Linear(8, num_classes))


task = Task(name="chars", load=load, model=model, classes=False, perplexity=True)
'''


@pytest.fixture()
def text_plugin(tmp_path):
    """mytext.py (a per-position task, :data:`TEXT_MODULE`) on sys.path."""
    (tmp_path / "mytext.py").write_text(TEXT_MODULE)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("mytext", None)


def test_a_plugin_tasks_fields_decide_its_block_size_check_not_its_name(
        outside, text_plugin):
    base = {**RUN, "frameworks": "SE", "storage": "uncoded", "mia": False}
    # a per-position plug-in: block-size is its blocks' length, whatever `dataset` is
    with pytest.raises(ConfigError) as err:
        validate_run_config(fused_run_config({**base, "task": "mytext:task",
                                              "block-size": 1}), files=False)
    assert "'block-size'" in str(err.value) and "\n" not in str(err.value)
    validate_run_config(fused_run_config({**base, "task": "mytext:task",
                                          "block-size": 8}), files=False)
    # a class-label plug-in ignores block-size, even beside dataset='shakespeare'
    validate_run_config(fused_run_config({**base, "task": "mytask:task",
                                          "dataset": "shakespeare", "block-size": 1}),
                        files=False)


def test_a_tasks_headline_metric_is_its_own_declaration():
    from torch import nn

    from task.builtin import TASKS
    from task.interface import Task

    def load(settings):
        raise AssertionError("not loaded")

    def model(num_classes):
        return nn.Linear(2, num_classes)

    assert Task(name="x", load=load, model=model).headline_metric == "accuracy"
    assert Task(name="x", load=load, model=model,
                perplexity=True).headline_metric == "loss"
    assert Task(name="x", load=load, model=model,
                metric="loss").describe() == {"name": "x", "metric": "loss",
                                              "classes": True, "perplexity": False}
    with pytest.raises(ValueError, match="metric = 'f1'"):
        Task(name="x", load=load, model=model, metric="f1")
    # the built-in tasks keep their scores: images by accuracy, text by loss
    assert {n: t.headline_metric for n, t in TASKS.items()} == {
        "mnist": "accuracy", "fmnist": "accuracy", "cifar10": "accuracy",
        "shakespeare": "loss"}


def test_the_summary_records_the_task_and_reads_its_metric_back():
    from runstore.summary import LearningSummary, RunSummary

    learning = LearningSummary(0.4, 1.5, [0.4], [1.5], 1.0, 1.0, 1.0)
    summary = RunSummary(config={"task": "mytext:task"}, data_dir="", shards=[[0]],
                         shard_strategy={"name": "FedAvg"}, notes=[],
                         learning=learning,
                         task={"name": "chars", "metric": "loss", "classes": False,
                               "perplexity": True})
    back = RunSummary.from_json(json.loads(json.dumps(summary.to_json())))
    assert back.task == summary.task and back.headline_metric() == "loss"
    # written before the task block: no perplexity, so accuracy
    old = {k: v for k, v in summary.to_json().items() if k != "task"}
    assert RunSummary.from_json(old).headline_metric() == "accuracy"


BROKEN = '''
import dataclasses
import mytask

def _fails(*args):
    raise KeyError("boom\\nsecond line")

broken_load = dataclasses.replace(mytask.task, load=_fails)
broken_model = dataclasses.replace(mytask.task, model=_fails)
not_a_model = dataclasses.replace(mytask.task, model=lambda num_classes: "a model")
'''


@pytest.mark.parametrize("name, words", [
    ("broken_load", "its data cannot be loaded: KeyError: 'boom"),
    ("broken_model", "failed: KeyError: 'boom"),
    ("not_a_model", "returned a str, not a torch.nn.Module"),
])
@pytest.mark.parametrize("storage", ["uncoded", "coded"])
def test_a_plugins_failing_code_is_one_line_before_any_engine(outside, name, words,
                                                              storage):
    """The command's own checks with the data (cli.simulation.preflight) call the
    task's loader and model factory: their failures are one line, not a traceback
    and not a started engine."""
    from cli.simulation import preflight

    (outside / "broken.py").write_text(BROKEN)
    run = fused_run_config({**RUN, "task": f"broken:{name}", "storage": storage})
    with pytest.raises(ConfigError) as err:
        preflight(run)
    message = str(err.value)
    assert "\n" not in message and "'task'" in message and words in message, message
