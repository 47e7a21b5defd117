"""TrainingSettings: one carrier of local training from the ServerApp to the clients."""

from __future__ import annotations

import dataclasses
import math

import pytest
from flwr.app import ConfigRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from task.config import OPTIMIZERS
from task.train import local_seed
from task.training_settings import (
    KEYS,
    LEARNING_KEYS,
    PRECONDITIONS,
    TrainingSettings,
    data_dir_of,
)
from task.values import ConfigError

finite = {"allow_nan": False, "allow_infinity": False}
SETTINGS = st.builds(
    TrainingSettings,
    lr=st.floats(min_value=1e-12, max_value=10.0, **finite),
    local_epochs=st.floats(min_value=1e-6, max_value=1000.0, **finite)
    | st.integers(1, 1000),
    batch_size=st.integers(1, 2**20),
    optimizer=st.sampled_from(OPTIMIZERS),
    momentum=st.floats(min_value=0.0, max_value=1.0, exclude_max=True, **finite),
    seed=st.integers(0, 2**32 - 1),
    data_dir=st.text(),
    server_round=st.integers(0, 10**6),
    proximal_mu=st.floats(min_value=0.0, max_value=1e6, **finite),
    precondition=st.sampled_from(PRECONDITIONS),
    fisher_samples=st.integers(1, 10**6),
    fisher_damping=st.floats(min_value=0.0, max_value=1e6, **finite),
)


@settings(max_examples=200, deadline=None)
@given(SETTINGS)
def test_record_round_trip_is_the_identity(training):
    record = training.to_record()
    assert isinstance(record, ConfigRecord)
    back = TrainingSettings.from_record(record)
    assert back == training
    assert all(type(getattr(back, f)) is type(getattr(training, f)) for f in KEYS)
    assert back.to_record() == record


def test_keys_cover_every_field_in_order():
    assert list(KEYS) == [f.name for f in dataclasses.fields(TrainingSettings)]


def test_the_servers_record_is_the_learning_keys():
    from server_app.config import RunConfig
    from server_app.run.context import train_config

    cfg = RunConfig.of(lr=0.1, local_epochs=3, optimizer="adam", momentum=0.0, seed=7)
    from task.config import RUN_CONFIG_KEY, client_settings

    record = train_config(cfg, "/data")
    assert list(record) == [*LEARNING_KEYS, RUN_CONFIG_KEY]  # and the run's for clients
    assert dict(record) == {"lr": 0.1, "local-epochs": 3.0, "batch-size": 32,
                            "optimizer": "adam", "momentum": 0.0, "seed": 7,
                            "data-dir": "/data",
                            RUN_CONFIG_KEY: client_settings(cfg.as_dict())}
    assert TrainingSettings.from_record(record) == cfg.training.local_settings(7, "/data")


def test_the_client_reads_what_the_strategies_add():
    # Flower's FedAvg adds server-round, its FedProx proximal-mu; a replay adds
    # history-round and its own local-epochs, the sharded strategy shard, and
    # RapidRetrain (strategies.unlearning.FedRetrain) its Fisher keys
    base = TrainingSettings(lr=0.1, local_epochs=2, batch_size=8, seed=3)
    sent = ConfigRecord({**dict(base.to_record()), "server-round": 4,
                         "proximal-mu": 0.01, "history-round": 2, "shard": 1,
                         "local-epochs": 0.5, "precondition": "fisher",
                         "fisher-samples": 16, "fisher-damping": 0.5})
    read = TrainingSettings.from_record(sent)  # history-round, shard: not its own
    assert read == dataclasses.replace(
        base, server_round=4, proximal_mu=0.01, local_epochs=0.5,
        precondition="fisher", fisher_samples=16, fisher_damping=0.5)
    assert read.local_seed("learn", 5) == local_seed(3, "learn", 4, 5)  # as before
    assert read.local_seed("learn", 5) != read.local_seed("unlearn", 5)


def test_minimal_record_takes_the_clients_defaults():
    read = TrainingSettings.from_record(ConfigRecord({"lr": 0.05, "local-epochs": 1,
                                                      "batch-size": 32}))
    assert (read.optimizer, read.momentum, read.seed, read.data_dir) == ("sgd", 0.0,
                                                                          0, "")
    assert read.local_epochs == 1.0 and isinstance(read.local_epochs, float)


@pytest.mark.parametrize("values, words", [
    ({"lr": math.nan}, "'lr' = nan must be a finite number"),
    ({"lr": math.inf}, "'lr' = inf must be a finite number"),
    ({"lr": 0.0}, "'lr' = 0.0 is not allowed: a positive number, at most 10"),
    ({"lr": 10.5}, "'lr' = 10.5 is not allowed: a positive number, at most 10"),
    ({"local-epochs": 0.0}, "'local-epochs' = 0.0 is not allowed: a positive number"),
    ({"batch-size": 2**20 + 1}, "'batch-size' = 1048577 is not allowed: a positive"),
    ({"local-epochs": "2"}, "'local-epochs' = '2' must be a number"),
    ({"batch-size": 1.5}, "'batch-size' = 1.5 must be an integer"),
    ({"optimizer": "rmsprop"}, "'optimizer' = 'rmsprop' is not allowed: one of sgd, adam"),
    ({"momentum": 1.0}, "'momentum' = 1.0 is not allowed: a number in [0, 1)"),
    ({"precondition": "kfac"}, "'precondition' = 'kfac' is not allowed: one of"),
    ({"seed": True}, "'seed' = True must be an integer"),
])
def test_bad_values_are_refused_naming_the_key(values, words):
    record = ConfigRecord({"lr": 0.05, "local-epochs": 1, "batch-size": 32, **values})
    with pytest.raises(ConfigError) as err:
        TrainingSettings.from_record(record)
    assert words in str(err.value) and str(err.value).startswith("train-message config")


def test_a_missing_required_key_is_named():
    with pytest.raises(ConfigError, match="lacks 'batch-size'"):
        TrainingSettings.from_record(ConfigRecord({"lr": 0.05, "local-epochs": 1}))


def test_strings_are_stripped_as_the_server_strips_them():
    record = ConfigRecord({"lr": 0.05, "local-epochs": 1, "batch-size": 32,
                           "optimizer": " adam ", "data-dir": " /d "})
    read = TrainingSettings.from_record(record)
    assert (read.optimizer, read.data_dir) == ("adam", "/d")
    assert data_dir_of(record) == "/d" and data_dir_of(ConfigRecord()) == ""


def test_one_schema_of_the_local_training_keys():
    # declared once (task/), read by the run config (L an int) and the messages
    from server_app.config import RunConfig
    from server_app.config.training import TrainingConfig
    from task.training_settings import LocalTraining

    local = [f.name for f in dataclasses.fields(LocalTraining)]
    assert issubclass(TrainingConfig, LocalTraining)
    assert issubclass(TrainingSettings, LocalTraining)
    assert [f.name for f in dataclasses.fields(TrainingSettings)][:5] == local
    cfg = RunConfig.from_run_config({"local-epochs": 3, "lr": 0.1})
    assert cfg.training.local_epochs == 3 and isinstance(cfg.training.local_epochs, int)
    sent = cfg.training.local_settings(0)
    assert sent.local_epochs == 3.0 and isinstance(sent.local_epochs, float)
    with pytest.raises(ConfigError, match="'local-epochs' = 1.5 must be an integer"):
        RunConfig.from_run_config({"local-epochs": 1.5})  # L is whole; L / r is not


def test_one_converter_for_both_apps():
    import server_app.config.values as server_values
    import task.config
    import task.values

    assert server_values.coerce is task.values.coerce
    assert server_values.ConfigError is task.values.ConfigError
    assert not hasattr(task.config, "_typed")
