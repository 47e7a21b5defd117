"""Run-config checks before any engine: non-finite values, combinations that
cannot finish, errors naming their key, partitions for any client count."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from server_app.config import ConfigError, RunConfig
from server_app.config.values import TEXT_CONTEXT
from server_app.preflight import (
    check_run,
    initial_magnitude,
    largest_scale_bits,
    validate_run_config,
)
from server_app.rounds.federation import assign_shards
from strategies.unlearning import FedRetrain

FLOAT_KEYS = [k for k, v in RunConfig().as_dict().items() if isinstance(v, float)]
INT_KEYS = [k for k, v in RunConfig().as_dict().items() if type(v) is int]


def _refused(config: dict, *words: str, files: bool = False) -> str:
    with pytest.raises(ConfigError) as err:
        validate_run_config(config, files=files)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


# ------------------------------------------------------------ 5: finite values


def test_every_float_key_is_covered():
    assert {"lr", "momentum", "proximal-mu", "server-lr", "round-timeout",
            "retrain-ratio", "link-rate-mbps"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_float_is_refused_naming_the_key(key, value):
    _refused({key: value}, f"'{key}'", repr(value), "a finite number")


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_int_is_a_config_error_not_a_crash(key, value):
    _refused({key: value}, f"'{key}'", "an integer")


@pytest.mark.parametrize("key, value, words", [
    ("proximal-mu", math.nan, "finite"),      # was: silently plain FedAvg
    ("server-lr", math.inf, "finite"),        # was: NaN losses in summary.json
    ("lr", math.inf, "finite"),               # was: every reply rejected
    ("retrain-ratio", math.inf, "finite"),    # was: failed when unlearning began
    ("round-timeout", math.inf, "finite"),
    ("lr", 10.5, "at most 10"),
    ("seed", -1, "[0, 4294967295]"),
    ("seed", 2**32, "[0, 4294967295]"),
    ("frameworks", "SE,FR,SE", "each once"),
    ("num-clients", 1e12, "at most 100000"),  # was: a huge allocation
    ("num-requests", 10**18, "at most 96"),     # 4 shards of 25, each keeps one
])
def test_issue_values_are_refused(key, value, words):
    _refused({key: value}, f"'{key}'", words)


def test_upper_bounds_admit_the_edge():
    cfg = validate_run_config({"lr": 10.0, "seed": 2**32 - 1}, files=False)
    assert cfg.training.lr == 10.0


def test_text_block_size_is_bounded_by_the_models_context():
    from task.nanogpt import GPTConfig

    assert GPTConfig(vocab_size=65).block_size == TEXT_CONTEXT
    _refused({"dataset": "shakespeare", "block-size": TEXT_CONTEXT + 1},
             "'block-size'", f"[2, {TEXT_CONTEXT}]")
    _refused({"dataset": "shakespeare", "block-size": 1}, "'block-size'")
    validate_run_config({"dataset": "mnist", "block-size": 256}, files=False)


# ------------------------------------------------- 6: combinations that cannot finish


def test_every_client_sampled_then_one_forgotten_is_accepted_with_a_note():
    cfg = {"num-clients": 20, "num-shards": 4, "clients-per-round": 20,
           "forget-clients": "3"}
    notes = check_run(validate_run_config(cfg, files=False), files=False).notes
    assert len(notes) == 1 and "keeps 19 clients" in notes[0] and "samples all 19" \
        in notes[0]
    sharded = {**cfg, "baseline-shards": 4}
    notes = check_run(validate_run_config(sharded, files=False), files=False).notes
    assert len(notes) == 1 and "fewer than the 5" in notes[0] and "all 4" in notes[0]


def test_fedretrain_samples_the_clients_that_remain():
    shards = [[0, 1, 2, 3], [4, 5, 6, 7]]
    fr = FedRetrain({3}, shards, {p: 100 + p for p in range(8)}, 8, 1)
    assert fr.sampled == [3, 4] and fr.clients_per_round == 7
    fr = FedRetrain({3}, shards, {p: 100 + p for p in range(8)}, 4, 1)
    assert fr.sampled == [2, 2] and fr.clients_per_round == 4


@pytest.mark.parametrize("config, words", [
    # 8 clients in 2 shards of 4: a shard keeps one client
    ({"num-requests": 4, "request-distribution": "adapt"},
     ["'num-requests' = 4", "at most 3", "clients-per-request = 1", "'adapt'"]),
    ({"num-requests": 2, "clients-per-request": 2, "request-distribution": "adapt"},
     ["'num-requests' = 2", "at most 1 with clients-per-request = 2"]),
    ({"clients-per-request": 4}, ["'clients-per-request' = 4", "at most 3"]),
    ({"num-requests": 7, "request-distribution": "even"},
     ["'num-requests' = 7", "at most 6"]),
])
def test_generated_requests_that_empty_a_shard_name_their_keys(config, words):
    _refused({"num-clients": 8, "num-shards": 2, "clients-per-round": 4, **config},
             *words)


def test_forget_clients_emptying_a_shard_is_refused():
    shard = assign_shards(8, 2, 0)[1]
    ids = ",".join(map(str, shard))
    _refused({"num-clients": 8, "num-shards": 2, "clients-per-round": 4,
              "forget-clients": ids}, "'forget-clients'", "every client of shard 1")


def test_baseline_shard_emptied_is_refused_only_when_a_baseline_runs():
    se, base = assign_shards(8, 2, 0), assign_shards(8, 4, 0)
    pick = next(b for b in base if not any(set(s) <= set(b) for s in se))
    config = {"num-clients": 8, "num-shards": 2, "clients-per-round": 4,
              "baseline-shards": 4, "forget-clients": ",".join(map(str, pick))}
    _refused(config, "'baseline-shards' = 4", "every client of shard")
    validate_run_config({**config, "frameworks": "SE"}, files=False)


def test_coded_shakespeare_at_30_bits_is_refused_with_the_largest_allowed():
    import tomllib
    from pathlib import Path

    preset = tomllib.loads(Path("presets/shakespeare.toml").read_text())
    assert initial_magnitude("shakespeare", 65, 0) == 1.0  # LayerNorm weights
    assert largest_scale_bits(1.0) == 26  # (2^30 - 1) / 2^26 = 16 >= 8 x 1.0
    _refused({**preset, "storage": "coded", "quant-scale-bits": 30},
             "'quant-scale-bits' = 30", "at most 26", "8x headroom")
    validate_run_config({**preset, "storage": "coded", "quant-scale-bits": 26},
                        files=False)
    validate_run_config({"storage": "coded"}, files=False)  # MNIST at 24 bits


def test_largest_scale_bits_edges():
    assert largest_scale_bits(0.0) == 30
    assert largest_scale_bits(2.0**27) == 0  # nothing fits 8 x 2^27 = 2^30
    assert largest_scale_bits(8.0) == 23  # (2^30 - 1) / 2^23 = 128 >= 8 x 8
    assert largest_scale_bits(2.0**11) == 0  # 16 bits hold 16384 < 8 x 2^11: none


# ------------------------------------------------------ 10: errors a user sees


@pytest.mark.parametrize("value, words", [
    ("-1", "comma-separated partition ids"),
    ("100", "0..99"),
    ("3,3", "each id once"),
])
def test_forget_clients_errors_name_the_key(value, words):
    _refused({"forget-clients": value}, "'forget-clients'", repr(value), words)


@pytest.mark.parametrize("config, key", [
    ({"forget-clients": "3", "frameworks": "none"}, "'forget-clients'"),
    ({"forget-clients": "3", "num-requests": 2}, "'num-requests'"),
    ({"forget-clients": "3", "clients-per-request": 2}, "'clients-per-request'"),
    ({"forget-clients": "3", "request-distribution": "adapt"}, "'request-distribution'"),
])
def test_forget_clients_never_silently_overrides_another_key(config, key):
    _refused(config, key)


def test_explicit_data_dir_without_the_dataset_is_an_error(tmp_path):
    _refused({"data-dir": str(tmp_path / "nonexistent")}, "'data-dir'", "nonexistent",
             "does not hold mnist", files=True)


def test_finished_run_name_is_refused_before_any_engine(tmp_path):
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "summary.json").write_text("{}")
    _refused({"results-dir": str(tmp_path), "run-name": "done"}, "'run-name'",
             files=True)


def test_validate_run_config_needs_no_engine_and_returns_the_settings():
    cfg = validate_run_config({"num-clients": 10, "num-shards": 2,
                               "clients-per-round": 4}, files=False)
    assert isinstance(cfg, RunConfig) and cfg.data.num_clients == 10


# ------------------------------------------------- end to end, in the ServerApp


def test_server_refuses_before_any_folder(run_server, tmp_path):
    with pytest.raises(ConfigError, match="'quant-scale-bits' = 30.*at most 29"):
        run_server({"storage": "coded", "blocks-per-shard": 2, "quant-scale-bits": 30})
    with pytest.raises(ConfigError, match="'forget-clients' = '8'"):
        run_server({"forget-clients": "8"})
    with pytest.raises(FileNotFoundError, match="'data-dir' = '/nonexistent'"):
        run_server({"data-dir": "/nonexistent"})
    assert not (tmp_path / "t").exists()


def test_every_client_sampled_fr_rr_sample_those_left(run_server):
    summary, _ = run_server({"clients-per-round": 8, "forget-clients": "3",
                             "frameworks": "FR,RR", "mia": False, "num-rounds": 1})
    for name in ("FR", "RR"):
        assert summary["frameworks"][name]["clients_per_round"] == 7
        assert summary["frameworks"][name]["requests"][0]["clients_per_round"] == 7
    assert any("samples all 7" in note for note in summary["notes"])


def test_small_noniid_federation_runs(run_server, tmp_path):
    summary, _ = run_server({"partition": "noniid", "frameworks": "none",
                             "num-rounds": 1})
    assert any("7314 samples per client" in n for n in summary["notes"])
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["learning"]


def test_noniid_partition_for_eight_clients(shared_data):
    from task.builtin import load_task_data
    from task.partition import noniid_client_size, partition_indices

    labels = load_task_data("mnist", str(shared_data)).train_y.numpy()
    parts = partition_indices(labels, 8, "noniid", seed=0)
    assert [len(p) for p in parts] == [7314] * 8 == [noniid_client_size(labels, 8, 0)] * 8
    assert {int(np.bincount(labels[p]).max()) for p in parts} == {round(0.8 * 7314)}
    again = partition_indices(labels, 8, "noniid", seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


# ------------------------------------------------- the run's plan (issue 53, step 3)


def test_the_server_plans_a_run_once_and_the_plan_is_frozen(tmp_path, shared_data,
                                                            monkeypatch):
    """``prepare`` draws the requests once (the check, the resume check and the
    ServerApp used to draw them three times) and hands on one frozen plan."""
    import dataclasses

    from conftest import TINY

    from server_app import app
    from server_app.run import plan as plan_module
    from task.config import default_run_config

    drawn = []
    real = plan_module.plan_requests
    monkeypatch.setattr(plan_module, "plan_requests",
                        lambda cfg: drawn.append(1) or real(cfg))
    run_config = {**default_run_config(), **TINY, "data-dir": str(shared_data),
                  "results-dir": str(tmp_path), "run-name": "p", "num-requests": 2}
    prepared = app.prepare(run_config)
    prepared.catalog.close()
    prepared.folder.release()
    plan, cfg = prepared.plan, prepared.cfg
    assert drawn == [1]
    assert plan.shard_lists() == assign_shards(8, 2, cfg.seed)
    assert len(plan.requests) == 2 and plan.forgotten() == sorted(
        {p for r in plan.requests for p in r})
    assert dict(plan.samples) == {p: 64 for p in range(8)} and not plan.node_of
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.requests = ()
    with pytest.raises(TypeError):
        plan.samples[0] = 1
