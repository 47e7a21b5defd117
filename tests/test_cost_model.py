"""Issue 52, item 1: modelled time from a cost model, not from a busy machine's clock.

The cost formula (samples x epochs x seconds per sample; bytes over the link plus a
base delay; stragglers by partition id), the device profiles and their checks, and
the goal: the same run config run twice, once beside three CPU-burning processes,
gives every framework the same modelled times.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server_app.config import ConfigError, RunConfig
from server_app.config.profile import (
    DEFAULT_PROFILE,
    ProfileError,
    Stragglers,
    TaskCost,
    load_profile,
    shipped_profiles,
)
from server_app.rounds.costs import CostModel
from task.tasks import BUILTIN_TASKS


def test_training_is_samples_times_epochs_times_the_cost_per_sample():
    costs = CostModel(TaskCost(0.002, 0.01))
    assert costs.train_s(0, 300, 2.0) == pytest.approx(300 * 2.0 * 0.002)
    assert costs.train_s(0, 300, 0.5) == pytest.approx(300 * 0.5 * 0.002)
    # RapidRetrain's Fisher: one gradient per sample, at most the samples held
    assert costs.train_s(0, 300, 1.0, fisher_samples=32) == pytest.approx(
        300 * 0.002 + 32 * 0.01)
    assert costs.train_s(0, 10, 1.0, fisher_samples=32) == pytest.approx(
        10 * 0.002 + 10 * 0.01)


def test_a_transfer_is_the_base_delay_plus_bits_over_the_rate():
    costs = CostModel(link_rate_mbps=8.0, base_delay_s=0.1)
    assert costs.transfer_s(1_000_000) == pytest.approx(0.1 + 1.0)
    assert costs.transfers_s(3, 3_000_000) == pytest.approx(
        3 * costs.transfer_s(1_000_000))
    assert CostModel().transfer_s(0) == 0.1  # the paper's Sec. 5 delay by default


def test_server_work_is_priced_by_its_sizes():
    costs = CostModel(configure_s_per_param=1e-9, aggregate_s_per_param=2e-9,
                      decode_s_per_op=3e-9)
    assert costs.configure_s(5, 1000) == pytest.approx(5e-6)
    assert costs.aggregate_s(5, 1000) == pytest.approx(1e-5)
    assert costs.decode_s(1000) == pytest.approx(3e-6)


def test_stragglers_are_drawn_by_partition_id_alone():
    mix = Stragglers(fraction=0.2, slowdown=4.0, seed=7)
    first = [p for p in range(1000) if mix.factor(p) > 1]
    assert first == [p for p in range(1000) if mix.factor(p) > 1]  # every call alike
    assert 150 < len(first) < 250  # about a fifth
    assert {mix.factor(p) for p in range(1000)} == {1.0, 4.0}
    other = [p for p in range(1000) if Stragglers(0.2, 4.0, 8).factor(p) > 1]
    assert other != first  # the seed chooses them
    costs = CostModel(TaskCost(0.001, 0.0), stragglers=mix)
    slow, fast = first[0], next(p for p in range(1000) if p not in first)
    assert costs.train_s(slow, 100, 1.0) == pytest.approx(4 * costs.train_s(fast, 100, 1.0))
    assert Stragglers().factor(slow) == 1.0


def test_shipped_profiles_cover_every_built_in_task():
    assert {DEFAULT_PROFILE, "gpu-assumed", "phone-slow", "cpu-stragglers"} <= set(
        shipped_profiles())
    for name in shipped_profiles():
        profile = load_profile(name)
        for task in BUILTIN_TASKS:
            cost, estimated = profile.task_cost(task, 1000)
            assert not estimated and cost.train_s_per_sample > 0, (name, task)
        assert len(profile.digest) == 64


def test_the_calibrated_profile_says_where_and_how_it_was_measured():
    profile = load_profile("")
    assert profile.name == DEFAULT_PROFILE and profile.measured
    for key in ("machine", "command", "commit", "date", "threads"):
        assert profile.calibration[key], key
    assert "calibrate_profile.py" in profile.calibration["command"]


def test_assumed_profiles_are_labelled_as_not_measured():
    base = load_profile(DEFAULT_PROFILE)
    gpu, phone = load_profile("gpu-assumed"), load_profile("phone-slow")
    assert not gpu.measured and "not measured" in gpu.description.lower()
    assert gpu.tasks["mnist"].train_s_per_sample == pytest.approx(
        0.05 * base.tasks["mnist"].train_s_per_sample)
    assert phone.link_rate_mbps == 10.0 and not phone.measured
    costs = CostModel.of(phone, "mnist", 100.0, 0)
    assert costs.link_rate_mbps == 10.0  # the profile's link replaces link-rate-mbps
    assert CostModel.of(base, "mnist", 100.0, 0).link_rate_mbps == 100.0
    mix = load_profile("cpu-stragglers")
    assert mix.stragglers.fraction == 0.2 and mix.stragglers.slowdown == 4.0


def test_a_task_the_profile_lacks_is_estimated_from_its_parameters():
    profile = load_profile("")
    cost, estimated = profile.task_cost("my-plugin", 10_000)
    assert estimated
    assert cost.train_s_per_sample == pytest.approx(
        10_000 * profile.fallback["train_s_per_param_sample"])
    costs = CostModel.of(profile, "my-plugin", 100.0, 10_000)
    assert costs.estimated and costs.describe()["estimated"]


@pytest.mark.parametrize("value", ["nope", "/no/such/profile.toml", "README.md"])
def test_an_unknown_profile_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="'device-profile'") as err:
        RunConfig.of(device_profile=value)
    assert "\n" not in str(err.value) and DEFAULT_PROFILE in str(err.value)


def test_a_bad_profile_file_is_refused_in_one_line(tmp_path):
    text = open(load_profile("").source).read()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("[stragglers]\nfraction = 0.0",
                                "[stragglers]\nfraction = 1.5"))
    with pytest.raises(ConfigError, match="stragglers.fraction = 1.5") as err:
        RunConfig.of(device_profile=str(bad))
    assert "\n" not in str(err.value)
    broken = tmp_path / "broken.toml"
    broken.write_text("name = [")
    with pytest.raises(ProfileError, match="cannot be read"):
        load_profile(str(broken))
    assert RunConfig.of(device_profile="phone-slow").training.profile().name == \
        "phone-slow"


# ---- the goal: the same modelled times under load -----------------------------------
LOADED = {"forget-clients": "3", "mia": False, "storage": "coded", "blocks-per-shard": 2,
          "frameworks": "SE,FR,FE,RR,SISA,SE-R,FRec"}
BURN = "while True: pass"


def _modelled(summary: dict) -> dict:
    """Every modelled time of every framework (and of each of its requests)."""
    out = {}
    for name, result in summary["frameworks"].items():
        for i, entry in enumerate([result, *result["requests"]]):
            out[f"{name}[{i}].modelled_wall_s"] = entry["modelled_wall_s"]
            out.update({f"{name}[{i}].{k}": v for k, v in entry["wall_breakdown"].items()})
    return out


@pytest.mark.inprocess
def test_modelled_times_do_not_move_with_the_machines_load(run_server):
    quiet, _ = run_server(LOADED, run_name="quiet")
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(3)]
    try:
        busy, _ = run_server(LOADED, run_name="busy")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    a, b = _modelled(quiet), _modelled(busy)
    assert set(a) == set(b) and len(a) > 7 * 8
    assert {k: (a[k], b[k]) for k in a if abs(a[k] - b[k]) > 1e-9} == {}
    assert all(quiet["frameworks"][n]["modelled_wall_s"] > 0 for n in quiet["frameworks"])
    # the measured seconds stay beside the modelled ones
    for name, result in busy["frameworks"].items():
        assert result["measured_train_s"] > 0 and result["measured_wall_s"] > 0, name
    profile = load_profile("")
    assert busy["cost_model"]["profile"] == DEFAULT_PROFILE
    assert busy["cost_model"]["digest"] == profile.digest
    assert busy["cost_model"]["train_s_per_sample"] == \
        profile.tasks["mnist"].train_s_per_sample
    se = busy["frameworks"]["SE"]["wall_breakdown"]
    assert se["retrieval_s"] > 0  # coded: the slices' transfer and decoding, modelled


# ---- the calibration benchmark writes a profile the runs read ------------------------
def _calibrate_module():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import calibrate_profile

    return calibrate_profile


def test_the_calibration_benchmark_writes_a_profile_runs_can_use(tmp_path):
    bench = _calibrate_module()
    tasks = [{"name": "a", "spec": "pkg.a:task", "train_s_per_sample": 1e-4,
              "fisher_s_per_sample": 1e-3, "parameters": 1000},
             {"name": "b", "spec": "pkg.b:task", "train_s_per_sample": 4e-4,
              "fisher_s_per_sample": 2e-3, "parameters": 2000}]
    server = {"configure_s_per_param": 1e-10, "aggregate_s_per_param": 2e-9,
              "decode_s_per_op": 3e-9}
    out = tmp_path / "mine.toml"
    out.write_text(bench.toml_profile("mine", tasks, server, {
        "machine": 'a "quoted" CPU', "command": "python x", "commit": "abc",
        "load_average_before": [0.1, 0.2, 0.3]}))
    profile = load_profile(str(out))
    assert profile.name == "mine" and profile.measured
    assert profile.tasks["b"] == TaskCost(4e-4, 2e-3)
    assert profile.server == server
    assert profile.calibration["machine"] == 'a "quoted" CPU'
    assert profile.fallback["train_s_per_param_sample"] == pytest.approx(2e-7)


@pytest.mark.slow
def test_the_calibration_benchmark_times_a_plugin_task(tmp_path):
    out = tmp_path / "digits.toml"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "calibrate_profile.py"
    subprocess.run([sys.executable, str(script), "--tasks",
                    "examples.digits:task", "--batches", "2", "--warmup", "1",
                    "--name", "digits-here", "--out", str(out)], check=True,
                   capture_output=True, timeout=300)
    profile = load_profile(str(out))
    cost, estimated = profile.task_cost("digits", 0)
    assert not estimated and cost.train_s_per_sample > 0 and cost.fisher_s_per_sample > 0
    assert "examples.digits:task" in profile.calibration["command"]


def test_the_command_hands_the_serverapp_a_profile_path_resolved(tmp_path, monkeypatch):
    from cli import config
    from cli.simulation import absolute_paths

    monkeypatch.chdir(tmp_path)
    merged = config.resolve(None, ["device-profile='mine.toml'"])
    assert absolute_paths(merged).config["device-profile"] == str(tmp_path / "mine.toml")
    named = config.resolve(None, ["device-profile='phone-slow'"])
    assert absolute_paths(named).config["device-profile"] == "phone-slow"
