"""Both apps read a run-config value alike (issue 41, item 3).

Written against the apps' entry points only (the ClientApp's
:class:`task.config.TaskConfig`, the ServerApp's :class:`RunConfig`, the
ClientApp itself), so it also runs against the code from before the shared
converter, where every case here but the control (an integral float) failed:
the client kept a string's spaces the server strips, took NumPy integers the
server refused, let NaN through to its own later checks (other words), trained
on a NaN learning rate, and truncated a backdoor trigger of 2.5 to 2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from server_app.config import RunConfig
from task.config import TaskConfig, default_run_config

# run-config key -> the ServerApp's DataConfig field holding it
SHARED = {"dataset": "dataset", "partition": "partition", "data-dir": "data_dir",
          "task": "task", "num-clients": "num_clients",
          "partition-alpha": "partition_alpha", "client-samples": "client_samples"}


def _both(overrides: dict):
    """(client's value or error, server's value or error) per key of SHARED."""
    run_config = {**default_run_config(), **overrides}
    sides = []
    for read in (lambda: TaskConfig.from_run_config(run_config),
                 lambda: RunConfig.from_run_config(run_config).data):
        try:
            settings = read()
        except ValueError as err:
            sides.append(("error", str(err)))
        else:
            sides.append({key: getattr(settings, name) for key, name in SHARED.items()})
    return sides


@pytest.mark.parametrize("overrides", [
    {"dataset": " fmnist "},                 # a string with spaces
    {"partition": "dirichlet\t", "data-dir": "  /data/x  "},
    {"task": " mnist "},
    {"num-clients": np.int64(100)},          # a NumPy integer
    {"client-samples": 10.0},                # an integral float is an integer
])
def test_both_apps_read_the_same_settings(overrides):
    client, server = _both(overrides)
    assert client == server


@pytest.mark.parametrize("key, value", [
    ("partition-alpha", math.nan), ("partition-alpha", math.inf),
    ("num-clients", math.nan), ("dataset", 3), ("num-clients", True),
])
def test_both_apps_refuse_with_the_same_words(key, value):
    client, server = _both({key: value})
    assert client[0] == server[0] == "error"
    assert client[1] == server[1]  # one converter, one message
    assert f"'{key}' = {value!r} must be" in client[1]


def test_the_client_app_refuses_a_nan_learning_rate(make_grid):
    # the ServerApp refuses lr = nan in its run config; a message carrying one
    # (a plug-in strategy's) is refused by the client too, naming the key,
    # instead of training to NaN weights
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    from task.builtin import build_model

    grid = make_grid(1, {})
    content = RecordDict({"arrays": ArrayRecord(build_model("mnist", 10).state_dict()),
                          "config": ConfigRecord({"lr": math.nan, "local-epochs": 1,
                                                  "batch-size": 8})})
    message = Message(content, dst_node_id=1000, message_type="train")
    with pytest.raises(ValueError, match="'lr' = nan must be a finite number"):
        grid.send_and_receive([message])


@pytest.mark.parametrize("key, value", [("backdoor-trigger", 2.5),
                                        ("backdoor-fraction", "0.5")])
def test_the_backdoor_settings_are_typed_alike(key, value):
    from task.backdoor import Backdoor

    run_config = {**default_run_config(), key: value}
    errors = []
    for read in (Backdoor.from_run_config, RunConfig.from_run_config):
        with pytest.raises(ValueError) as err:
            read(run_config)  # the client used to take int(2.5) = 2, float("0.5")
        errors.append(str(err.value))
    assert errors[0] == errors[1]
