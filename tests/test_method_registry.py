"""One class per unlearning method (issue 41, item 1; issue 42, item 1; issue 53).

A built-in method is one module with its class plus one ``register`` line. This
module registers one from a temporary module (as docs/DEVELOPING.md shows) and runs
it beside SE, FR and SISA, the exact shard reference, through the real ServerApp:
it must reach summary.json, the experiment CSV and the report like the others.
"""

from __future__ import annotations

import csv
import json
import sys

import pytest
from flwr.app import Context, RecordDict

from server_app.config import ConfigError, RunConfig, methods
from task.config import fused_run_config
from tests.conftest import TINY

# The temporary built-in: every one of SE's shards retrained from W^0 (an exact
# method that ignores which shards the request touched).
MODULE = '''
from dataclasses import dataclass

from server_app.config.methods import MethodSettings, UnlearningMethod
from server_app.unlearning.builtin.shard_retrain import ShardRetrain
from server_app.unlearning.frameworks import Framework


class AllShards(UnlearningMethod):
    name = "AllShards"
    exact = True
    reads_history = False
    colour = "#000000"
    summary = "every shard from W^0, for a number of rounds of its own"

    @dataclass(frozen=True)
    class Settings(MethodSettings):
        rounds: int = 0  # 0: learning's

        def validate(self):
            if self.rounds < 0:
                raise self.refuse("rounds", "an integer >= 0")

    @classmethod
    def build(cls, request):
        stage, training = request.stage, request.stage.cfg.training
        shards = range(len(stage.sharded.shards))
        strategy = ShardRetrain(request.forget, stage.sharded.shards,
                                stage.sharded.node_of, shards,
                                clients_per_round=training.clients_per_round,
                                num_rounds=request.settings.rounds or training.num_rounds,
                                base_strategy=training.shard_strategy,
                                seed=request.stage.cfg.seed,
                                **training.shard_strategy_options)
        return Framework(strategy, [stage.initial] * len(shards), strategy.num_rounds,
                         list(shards))
'''
RUN = {**TINY, "forget-clients": "1", "frameworks": "SE,FR,SISA,AllShards",
       "storage": "uncoded", "mia": False, "method.allshards.rounds": 1}


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """``AllShards`` registered from a temporary module on sys.path."""
    folder = tmp_path_factory.mktemp("method")
    (folder / "all_shards_method.py").write_text(MODULE)
    sys.path.insert(0, str(folder))
    methods.register("AllShards", "all_shards_method:AllShards")
    yield "AllShards"
    methods.unregister("AllShards")
    sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def summary(registered, shared_data, tmp_path_factory):
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid
    from server_app.app import main

    results = tmp_path_factory.mktemp("results")
    own = {k: v for k, v in RUN.items() if k.startswith("method.")}  # not in pyproject
    config = {**fused_run_config({**{k: v for k, v in RUN.items() if k not in own},
                                  "results-dir": str(results), "run-name": "reg",
                                  "data-dir": str(shared_data)}), **own}
    grid = InProcessGrid(client_app, TINY["num-clients"], config)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))
    return json.loads((results / "reg" / "summary.json").read_text())


def test_a_registered_method_is_a_valid_framework_and_a_name_is_taken_once(registered):
    cfg = RunConfig.from_run_config({**fused_run_config({**TINY,
                                                        "frameworks": "se,allshards"}),
                                     "method.allshards.rounds": 3})
    assert cfg.unlearning.framework_list == ["SE", "AllShards"]
    assert cfg.method_settings("AllShards").rounds == 3  # its own setting, its own key
    assert cfg.as_dict()["method.allshards.rounds"] == 3
    with pytest.raises(ConfigError, match="'method.allshards.rounds' = -1 .*>= 0"):
        RunConfig.from_run_config({**TINY, "method.allshards.rounds": -1})
    with pytest.raises(ValueError, match="taken"):
        methods.register("allSHARDS", "x:y")
    with pytest.raises(ConfigError, match="frameworks"):
        RunConfig.from_run_config(fused_run_config({**TINY, "frameworks": "SE,NoSuch"}))


@pytest.mark.inprocess  # the module's run (summary)
def test_the_registered_method_and_sisa_run_beside_se_and_fr(summary):
    frameworks = summary["frameworks"]
    assert list(frameworks) == ["SE", "FR", "SISA", "AllShards"]
    original = summary["learning"]["shard_accuracy"]
    sisa = frameworks["SISA"]
    impacted = sisa["requests"][0]["impacted_shards"]
    assert impacted == frameworks["SE"]["requests"][0]["impacted_shards"]
    assert sisa["client_epochs"] > 0
    # SISA leaves the shards the request did not touch exactly as they were
    for s, accuracy in enumerate(sisa["shard_accuracy"]):
        if s not in impacted:
            assert accuracy == original[s]
    # AllShards retrains every shard, for its own 1 round (SISA: learning's rounds)
    assert frameworks["AllShards"]["requests"][0]["impacted_shards"] == [0, 1]
    assert frameworks["AllShards"]["client_rounds"] == 1 < sisa["client_rounds"]
    assert summary["config"]["method.allshards.rounds"] == 1


@pytest.mark.inprocess
def test_the_registered_method_reaches_the_csv_and_the_report(summary, tmp_path):
    from experiments import collect
    from experiments.report import requests as report_requests
    from runstore.summary import RunSummary

    rows = collect.summary_rows("single", "reg", RunSummary.from_json(summary), 1.0)
    collect.write_csv(tmp_path / "results.csv", rows)
    with open(tmp_path / "results.csv") as f:
        written = {r["framework"]: r for r in csv.DictReader(f)}
    assert set(written) == {"original", "SE", "FR", "SISA", "AllShards"}
    assert float(written["AllShards"]["client_epochs"]) > 0
    assert collect.methods_in(rows) == []  # registered: not a method of one's own
    section = "\n".join(report_requests.single_sections(rows))
    for name in ("SISA", "AllShards"):
        assert f"| {name} |" in section, section


def test_pyproject_lists_every_builtin_setting_at_its_default():
    """``flwr run --run-config`` takes only keys pyproject.toml has (Flower's
    ``fuse_dicts``): each built-in's own settings are there, at the class's defaults."""
    import dataclasses

    from task.config import default_run_config

    listed = {k: v for k, v in default_run_config().items() if k.startswith("method.")}
    shipped = [m for m in methods.builtins() if m.__module__.startswith("server_app.")]
    declared = {key: getattr(m.Settings(), name) for m in shipped
                for key, name in m.Settings.keys().items()}
    assert listed == declared
    assert all(dataclasses.is_dataclass(m.Settings) for m in shipped)


def test_the_exact_methods_are_named_by_their_description(registered):
    cfg = RunConfig.from_run_config(RUN)
    assert cfg.unlearning.with_fields(exact=True) == ["FR", "SISA", "AllShards"]
    assert cfg.unlearning.with_fields(on_baseline=True) == ["FR"]


@pytest.mark.inprocess
def test_every_framework_says_where_its_modelled_wall_time_went(summary):
    """Issue 42, item 2: the parts of ``wall_breakdown`` sum to ``modelled_wall_s``."""
    for name, result in summary["frameworks"].items():
        for entry in [result, *result["requests"]]:
            parts = entry["wall_breakdown"]
            seconds = sum(v for k, v in parts.items() if k.endswith("_s"))
            assert seconds == pytest.approx(entry["modelled_wall_s"], rel=1e-9), name
            assert parts["client_training_s"] > 0, name
        assert result["wall_breakdown"]["client_rounds"] == result["client_rounds"]
    # SE's preparation round asks no client when no slot is refilled; it still counts
    assert summary["frameworks"]["SE"]["wall_breakdown"]["rounds"] >= \
        summary["frameworks"]["SE"]["client_rounds"]


@pytest.mark.inprocess
def test_the_printed_report_splits_the_gap_and_the_wall_time(summary):
    """Issue 42, items 1-2: the price of isolation and of approximation, the parts."""
    from cli.report import render

    text = render(summary)
    frameworks = summary["frameworks"]
    isolation = (frameworks["SISA"]["accuracy"] - frameworks["FR"]["accuracy"]) * 100
    approximation = (frameworks["SE"]["accuracy"] - frameworks["SISA"]["accuracy"]) * 100
    assert f"price of isolation (SISA - FR): {isolation:+.2f} points" in text
    assert f"price of approximation (SE - SISA): {approximation:+.2f} points" in text
    assert "price of approximation (FR" not in text  # FR is the other yardstick
    assert "where the modelled wall time went" in text
    se, fr = frameworks["SE"]["modelled_wall_s"], frameworks["FR"]["modelled_wall_s"]
    assert (f"SE / FR modelled wall time: {se / fr:.3f} (SE {se:.1f} s, FR {fr:.1f} s)"
            in text)


def test_the_default_run_compares_se_with_fr_and_the_exact_shard_reference():
    """The README's promise: ``./simulate.sh`` prints SE's wall time next to FR's and
    SISA's accuracy (the report's lines, checked above, need all three to run)."""
    from cli.config import defaults
    from server_app.config.unlearning import UnlearningConfig

    default = defaults()["frameworks"]
    assert {methods.proposed(), methods.reference(), methods.shard_reference()} <= \
        set(default.split(","))
    assert UnlearningConfig().frameworks == default  # the dataclass agrees


REFERENCED = '''
from dataclasses import dataclass

from server_app.config.methods import MethodSettings, UnlearningMethod
from server_app.unlearning.builtin.shard_retrain import ShardRetrain
from server_app.unlearning.frameworks import Framework


class FineTune(UnlearningMethod):
    name = "FineTune"
    summary = "the request's shards fine-tuned on their retained clients"

    @dataclass(frozen=True)
    class Settings(MethodSettings):
        rounds: int = 1

    @classmethod
    def build(cls, request):
        stage, training = request.stage, request.stage.cfg.training
        held = sorted({stage.sharded.shard_of[p] for p in request.clients})
        strategy = ShardRetrain(request.forget, stage.sharded.shards,
                                stage.sharded.node_of, held,
                                clients_per_round=training.clients_per_round,
                                num_rounds=request.settings.rounds,
                                seed=stage.cfg.seed)
        models = list(request.current or stage.sharded_models)
        return Framework(strategy, models, strategy.num_rounds, held)
'''


@pytest.mark.slow
def test_a_method_with_one_setting_is_referenced_by_u_lira_with_its_own_strategy(
        tmp_path, monkeypatch):
    """Issue 53: one module and one ``register`` line. The method is not exact, so
    the U-LiRA audit references it (the config check counts it), and its
    references unlearn with the strategy it builds for a real request, for the
    rounds its own setting (``method.finetune.rounds``) asks, the forgotten
    client asked nothing: no reference code of its own."""
    import torch

    from experiments.grid import set_task_identity
    from server_app.config.audit import ulira_methods
    from server_app.stages.references import learn_reference, recipe

    (tmp_path / "fine_tune_method.py").write_text(REFERENCED)
    monkeypatch.syspath_prepend(str(tmp_path))
    methods.register("FineTune", "fine_tune_method:FineTune")
    try:
        cfg = RunConfig.from_run_config({**fused_run_config(
            {**TINY, "frameworks": "SE,FineTune", "mia": True, "mia-shadows": 1,
             "mia-unlearn-references": 6, "num-rounds": 1}),
            "method.finetune.rounds": 3})  # a built-in's key: the server reads it
        assert "FineTune" in ulira_methods() and "FR" not in ulira_methods()
        assert methods.registered("FineTune").is_referenced()
        rule = recipe(cfg).rules["FineTune"]
        assert rule.shape == "shard"
        set_task_identity()
        torch.manual_seed(0)
        parts = [(torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,)))
                 for _ in range(3)]
        task = type("T", (), {"num_classes": 10})()
        final, learned = learn_reference(cfg, task, parts, seed=2, per_round=3)
        before = len(learned.grid.sent)
        gone = rule.unlearn(task, parts, learned, {0}, 2, rule.from_first)
        asked = learned.grid.sent[before:]
        assert len(asked) == 3 * 2  # 3 rounds of the 2 retained clients
        assert 1 not in {node for node, _ in asked}
        assert any(not (gone[k] == final[k]).all() for k in final)
    finally:
        methods.unregister("FineTune")


def test_a_config_recorded_before_the_namespaced_keys_reads_in_todays_keys():
    """experiments.remodel reruns recorded configs: an old flat key's value goes to
    every key it became (SE-R's and FRec's schedule both), the rest stays."""
    from server_app.config.methods import in_current_keys

    old = {"recovery-memory": 3, "calibration-final": 0, "seed": 1}
    assert in_current_keys(old) == {"method.se-r.memory": 3, "method.frec.memory": 3,
                                    "method.se.calibration-final": 0, "seed": 1}


def test_a_description_that_contradicts_itself_is_refused_when_written():
    with pytest.raises(ValueError, match="'Exacting': exact = True and referenced = True"):
        type("Exacting", (methods.UnlearningMethod,),
             {"name": "Exacting", "exact": True, "referenced": True})
