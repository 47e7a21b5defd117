import pytest

from server_app.config import ConfigError, RunConfig


def test_defaults_are_valid_and_match_pyproject():
    import tomllib
    from pathlib import Path

    from flwr.common.config import flatten_dict

    defaults = flatten_dict(tomllib.loads(Path("pyproject.toml").read_text())["tool"][
        "flwr"]["app"]["config"])  # [method.se] tables as Flower flattens them
    cfg = RunConfig.from_run_config(defaults)
    assert cfg == RunConfig()  # the dataclass defaults are the pyproject defaults
    assert cfg.as_dict() == defaults


@pytest.mark.parametrize("key, value, words", [
    ("dataset", "imagenet", "mnist, fmnist, cifar10"),
    ("partition", "lda", "iid, noniid, dirichlet, pathological"),
    ("partition-alpha", 0.0, "(0, 1e+06]"),
    ("partition-alpha", -1.0, "smaller = more skewed"),
    ("partition-alpha", float("nan"), "a finite number"),
    ("classes-per-client", 0, "a positive integer"),
    ("classes-per-client", 1.5, "an integer"),
    ("num-shards", 101, "at most num-clients"),
    ("clients-per-round", 22, "multiple of num-shards"),
    ("clients-per-round", 104, "at most 100"),
    ("local-epochs", 0, "positive integer"),
    ("num-rounds", -1, "positive integer"),
    ("lr", 0.0, "positive number"),
    ("lr", "fast", "a number"),
    ("num-clients", 2.5, "an integer"),
    ("shard-strategy", "FedFoo", "FedAvg"),
    ("frameworks", "SE,XY", "comma-separated list"),
    ("retrain-ratio", 0, "positive number"),
    ("retrain-ratio", -2.0, "positive number"),
    ("request-mode", "parallel", "sequential, concurrent"),
    ("request-distribution", "random", "even, adapt"),
    ("forget-clients", "3;4", "comma-separated partition ids"),
    ("forget-clients", "-1", "partition ids in 0..99"),
    ("forget-clients", "100", "partition ids in 0..99"),
    ("forget-clients", "3,3", "each id once"),
    ("proximal-mu", float("nan"), "a finite number"),
    ("retrain-ratio", float("inf"), "a finite number"),
    ("block-size", 0, "positive integer"),
    ("run-name", "../escape", "plain folder name"),
    # every numeric key has a sane range; ints stay within int64 (Flower's protobuf)
    ("retrain-ratio", 1e308, "local-epochs / r in [0.001, 1000]"),
    ("retrain-ratio", 1e-300, "local-epochs / r in [0.001, 1000]"),
    ("retrain-ratio", 1e-320, "local-epochs / r in [0.001, 1000]"),
    ("local-epochs", 1e300, "within int64"),
    ("local-epochs", 1001, "at most 1000"),
    ("batch-size", 2**64, "within int64"),
    ("batch-size", 2**20 + 1, "at most 1048576"),
    ("num-rounds", 100_001, "at most 100000"),
    ("link-rate-mbps", 5e-324, "a number in [0.001, 1e+09]"),
    ("round-timeout", 1e300, "a number in [0.001, 1e+07]"),
    ("server-lr", 1e9, "or a finite number in (0, 1000]"),
    ("forget-clients", "\u00b2", "comma-separated partition ids"),
    ("forget-clients", "\u0661", "comma-separated partition ids"),
    ("frameworks", ",", "at least one framework, or 'none'"),
    ("run-name", "a\x00b", "plain folder name"),
    ("run-name", "a b", "plain folder name"),
    ("run-name", "x" * 101, "1..100 characters"),
    ("run-name", ".hidden", "no leading dot"),
])
def test_bad_values_name_key_value_and_allowed(key, value, words):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({key: value})
    message = str(err.value)
    assert f"'{key}'" in message and repr(value) in message and words in message


def test_a_shard_of_one_client_is_said_in_the_singular():
    with pytest.raises(ConfigError, match="4 shards has only 1 client$"):
        RunConfig.from_run_config({"num-clients": 4, "num-shards": 4,
                                   "clients-per-round": 8})


def test_lists_parse():
    cfg = RunConfig.from_run_config({"frameworks": "se, fr", "forget-clients": "3,17"})
    assert cfg.unlearning.framework_list == ["SE", "FR"]
    assert cfg.unlearning.forget_client_list == [3, 17]
    assert RunConfig.from_run_config({"frameworks": "none"}).unlearning.framework_list == []


def test_relative_results_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = RunConfig.from_run_config({"results-dir": "out"})
    assert cfg.output.resolved_results_dir() == tmp_path / "out"


def test_a_preset_reads_as_flat_run_config_keys_as_a_run_reads_it():
    """presets/paper.toml's dotted method keys come back flat (Flower's
    flatten_dict), the form every run-config merge and script takes them in."""
    from cli.config import preset_values, resolve

    values = preset_values("paper")
    assert "method" not in values and values["method.se.calibration-final"] == 0
    assert resolve("paper").overrides == values
