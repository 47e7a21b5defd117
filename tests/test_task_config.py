"""Tests of task.config: one list of choices, one source of run-config defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import tomli

from task.config import (
    DATASETS,
    PARTITIONS,
    TaskConfig,
    default_run_config,
    fused_run_config,
)

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_one_list_of_choices():
    import server_app.config.run_config as server
    import server_app.config.training as training
    from task import config, text, train, training_settings

    # one schema of the data keys: the ServerApp's section is the ClientApp's base
    assert server.DataConfig is config.DataConfig
    assert issubclass(TaskConfig, config.DataConfig)
    assert config.DATASETS is DATASETS and config.PARTITIONS is PARTITIONS
    # and of the local-training keys: the ServerApp's section is the messages' base
    assert issubclass(training.TrainingConfig, training_settings.LocalTraining)
    # local_train reads the optimizer TrainingSettings checked; it keeps no list
    assert not hasattr(train, "OPTIMIZERS") and training_settings.OPTIMIZERS
    assert not hasattr(text, "SCHEMES")


def test_defaults_are_pyproject_toml():
    from flwr.common.config import flatten_dict

    # dotted keys (method.se.calibration-final) flattened, as Flower reads them
    project = tomli.loads(PYPROJECT.read_text())
    table = flatten_dict(project["tool"]["flwr"]["app"]["config"])
    assert default_run_config() == table
    defaults = default_run_config()
    defaults["num-clients"] = -1  # a fresh dict each call
    assert default_run_config()["num-clients"] == table["num-clients"]


def test_server_defaults_match_pyproject_toml():
    from server_app.config import RunConfig

    assert RunConfig.from_run_config(default_run_config()) == RunConfig()


def test_task_config_from_pyproject_defaults():
    cfg = TaskConfig.from_run_config(default_run_config())
    assert cfg == TaskConfig(dataset="mnist", partition="iid", num_clients=100, seed=0,
                             data_dir="", block_size=64, client_samples=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1  # type: ignore[misc]


@pytest.mark.parametrize("key", ["dataset", "partition", "num-clients", "seed",
                                 "data-dir", "block-size", "client-samples"])
def test_task_config_refuses_a_missing_key(key):
    config = default_run_config()
    del config[key]
    with pytest.raises(ValueError) as info:
        TaskConfig.from_run_config(config)
    message = str(info.value)
    assert f"run config lacks '{key}'" in message and "\n" not in message


@pytest.mark.parametrize("key, value, expected", [
    ("num-clients", "8", "run-config 'num-clients' = '8' must be an integer"),
    ("num-clients", True, "run-config 'num-clients' = True must be an integer"),
    ("seed", 1.5, "run-config 'seed' = 1.5 must be an integer"),
    ("dataset", 3, "run-config 'dataset' = 3 must be a string"),
    ("dataset", "svhn", "run-config 'dataset' = 'svhn' is not allowed: one of"),
    ("partition", "shards", "run-config 'partition' = 'shards' is not allowed: one of"),
    ("num-clients", 0, "run-config 'num-clients' = 0 is not allowed: a positive integer"),
    ("client-samples", -1, "run-config 'client-samples' = -1 is not allowed"),
])
def test_task_config_refuses_bad_values(key, value, expected):
    with pytest.raises(ValueError, match=expected.replace("(", r"\(")):
        TaskConfig.from_run_config({**default_run_config(), key: value})


def test_task_config_block_size_checked_by_the_task_not_the_dataset_name():
    from task.builtin import TASKS

    # TaskConfig types block-size; whether its value matters is the task's
    # (Task.check_settings: tasks with per-position targets), whatever `dataset` says
    image = TaskConfig.from_run_config({**default_run_config(), "block-size": 1})
    text = TaskConfig.from_run_config({**default_run_config(), "dataset": "shakespeare",
                                       "block-size": 1})
    with pytest.raises(ValueError, match="must be an integer"):
        dataclasses.replace(image, block_size="8")
    for settings in (image, text):
        TASKS["mnist"].check_settings(settings)  # images ignore block-size
        with pytest.raises(ValueError, match="block-size=1"):
            TASKS["shakespeare"].check_settings(settings)
    cfg = TaskConfig.from_run_config({**default_run_config(), "num-clients": 8.0})
    assert cfg.num_clients == 8 and isinstance(cfg.num_clients, int)


def test_fused_run_config_is_flowers_merge():
    fused = fused_run_config({"num-clients": 8, "dataset": "fmnist"})
    assert fused == {**default_run_config(), "num-clients": 8, "dataset": "fmnist"}
    with pytest.raises(ValueError, match="'num-client' is not one of") as info:
        fused_run_config({"num-client": 8})
    assert "\n" not in str(info.value)


def test_client_app_without_a_key_fails_naming_it(make_grid):
    # A ClientApp whose run config lacks a key (no pyproject defaults merged)
    # fails naming it (Flower turns that into an error reply) instead of
    # training on a guessed default.
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    from task.builtin import build_model

    grid = make_grid(1, {})
    context = grid.contexts[1000]
    del context.run_config["seed"]
    content = RecordDict({"arrays": ArrayRecord(build_model("mnist", 10).state_dict()),
                          "config": ConfigRecord({"lr": 0.1, "local-epochs": 1,
                                                  "batch-size": 8})})
    message = Message(content, dst_node_id=1000, message_type="train")
    with pytest.raises(ValueError, match="run config lacks 'seed'"):
        grid.send_and_receive([message])


def test_task_follows_dataset_unless_named():
    from server_app.config import RunConfig
    from task.builtin import TASKS
    from task.config import task_spec
    from task.registry import get_task

    assert RunConfig.of(dataset="fmnist").task() is TASKS["fmnist"]
    assert RunConfig.of(dataset="fmnist", task="cifar10").task() is TASKS["cifar10"]
    assert task_spec("", "shakespeare") == "shakespeare"
    assert get_task("examples.digits:task").name == "digits"
    assert RunConfig.of(task="examples.digits:task").resolved_run_name().startswith(
        "examples.digits.task-iid-")
