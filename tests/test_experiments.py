"""The experiment suite (experiments/): tiny end-to-end runs and the derivations."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from experiments import collect, compare, report, suites
from experiments.engines import run_config_toml
from experiments.report import requests as report_requests
from experiments.report import storage as report_storage
from experiments.run import Progress, RunSetup, execute, main, rebuild_report
from runstore.summary import RequestCost
from server_app.config.methods import names
from server_app.preflight import validate_run_config

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_all(tmp_path_factory, shared_data):
    """``all`` on the tiny preset, once for the module: (results, out, stderr)."""
    out = tmp_path_factory.mktemp("experiments") / "all-tiny"
    stream = io.StringIO()
    results = execute("all", "tiny", RunSetup(out, str(shared_data)), stream=stream)
    return results, out, stream.getvalue()


def test_built_in_frameworks_join_the_suite_beside_se():
    specs = suites.plan("concurrent", "quick")
    mixed = suites.with_methods(specs, ("SE-R", "FRec", "fr"))
    for before, after in zip(specs, mixed, strict=True):
        names = before.config["frameworks"].split(",")
        if "SE" in names:
            want = names + ["SE-R", "FRec"] + ([] if "FR" in names else ["FR"])
            assert after.config["frameworks"].split(",") == want
            validate_run_config(after.config, files=False)
        else:
            assert after == before


def test_an_unknown_method_is_refused_before_any_run(capsys):
    """A misspelled ``--methods`` is one line and exit 2, not a suite of failed runs."""
    from experiments.run import main

    with pytest.raises(ValueError, match=r"--methods 'FX': run-config 'frameworks' ="):
        suites.with_methods(suites.plan("single", "quick"), ("FX",))
    with pytest.raises(SystemExit) as stop:
        main(["single", "--methods", "FX", "--out", "/nonexistent/never-made"])
    assert stop.value.code == 2
    assert "--methods 'FX'" in capsys.readouterr().err


@pytest.mark.parametrize("args, words", [
    (["--methods", "nope_module:Method"], "cannot import 'nope_module'"),
    (["--datasets", "nope"], "--datasets 'nope': ValueError: dataset='nope'"),
    (["--data-dir", "/nonexistent"], "no run of single can run here: mnist:"),
    (["--out", "FILE"], "is a file, not a folder"),
])
def test_a_command_that_would_run_nothing_is_refused_before_writing(
        args, words, tmp_path, capsys):
    """Found by a hostile review: these exited 0 with "0 runs done" and a report, or
    started every run to fail it, or ended in a traceback."""
    from experiments.run import main

    (tmp_path / "FILE").write_text("")
    args = [str(tmp_path / "FILE") if a == "FILE" else a for a in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as stop:
        main(["single", "--suite", "tiny", *args, *out])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]  # nothing written


def test_every_suite_config_is_valid():
    for suite in suites.SUITES:
        specs = suites.plan("all", suite)
        assert len({s.name for s in specs}) == len(specs)
        for spec in specs:
            # every check a launcher makes before any engine (requests, coded range)
            validate_run_config(spec.config, files=False)


def test_plans_cover_the_paper_experiments():
    quick = suites.plan("all", "quick")
    single = {(s.tags["dataset"], s.tags["partition"]) for s in quick
              if s.experiment == "single"}
    assert single == {(d, p) for d in ("mnist", "fmnist", "cifar10", "shakespeare")
                      for p in ("iid", "noniid")}
    seeds = [s.tags["seed"] for s in quick if s.tags.get("mia_stability")]
    assert sorted(seeds) == [0, 1, 2]
    conc = [s for s in quick if s.experiment == "concurrent"]
    assert {s.tags["dataset"] for s in conc} == {"cifar10", "shakespeare"}
    assert {s.tags["K"] for s in conc} == {1, 2, 4, 8}
    assert {(s.tags["mode"], s.tags["distribution"]) for s in conc} == {
        ("concurrent", "even"), ("concurrent", "adapt"), ("sequential", "even"),
        ("sequential", "adapt")}
    assert all(s.config["frameworks"] == (suites.COMPARED if s.tags["mode"] == "concurrent"
                                          else "SE") for s in conc)
    assert suites.COMPARED == "SE,FR,FE,RR,SISA"
    storage = {s.config["storage"] for s in quick if s.experiment == "storage"}
    assert storage == {"uncoded", "coded"}
    paper = suites.plan("single", "paper")[0].config
    assert (paper["num-clients"], paper["num-shards"], paper["clients-per-round"],
            paper["local-epochs"], paper["num-rounds"]) == (100, 4, 20, 10, 30)
    with pytest.raises(ValueError, match="experiment"):
        suites.plan("nope", "quick")


def test_trained_suite_runs_the_quick_experiments_on_all_the_data():
    def cells(suite):
        return sorted((s.experiment, s.name) for s in suites.plan("all", suite))

    assert cells("trained") == cells("quick")
    for spec in suites.plan("all", "trained"):
        assert spec.config.get("client-samples", 0) == 0  # every client's whole share
        rounds = {"mnist": 12, "fmnist": 12}.get(spec.config["dataset"], 8)
        if spec.experiment != "storage":
            assert spec.config["num-rounds"] == rounds


@pytest.mark.subprocess
def test_parallel_jobs_give_the_sequential_results(tiny_all, tmp_path, shared_data):
    results, out, _ = tiny_all
    stream = io.StringIO()
    # the storage experiment's two runs: one for each job process
    parallel = execute("storage", "tiny", RunSetup(tmp_path / "p", str(shared_data)),
                       stream=stream, jobs=2)
    sequential = [r for r in results["runs"] if r["spec"]["experiment"] == "storage"]
    assert len(sequential) == 2
    assert [r["spec"]["name"] for r in parallel["runs"]] == [
        r["spec"]["name"] for r in sequential]  # the plan's order, not finishing order
    for par, seq in zip(parallel["runs"], sequential, strict=True):
        assert par["status"] == seq["status"] == "done"
        a = json.loads((tmp_path / "p" / par["summary"]).read_text())
        b = json.loads((out / seq["summary"]).read_text())
        assert a["learning"]["shard_accuracy"] == b["learning"]["shard_accuracy"]
        assert {f: v["accuracy"] for f, v in a["frameworks"].items()} == {
            f: v["accuracy"] for f, v in b["frameworks"].items()}
    done = [line for line in stream.getvalue().splitlines() if ": done in " in line]
    for run in parallel["runs"]:  # one progress line each (then the storage table's)
        assert sum(f" {run['spec']['name']}: done in " in line for line in done) == 1


def test_jobs_are_checked_before_any_run(capsys):
    for argv in (["all", "--jobs", "0"], ["all", "--jobs", "2", "--engine", "flwr"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        assert "--jobs" in capsys.readouterr().err


def test_only_keeps_the_matching_runs_and_refuses_a_typo(capsys, tmp_path):
    specs = suites.with_methods(suites.plan("single", "trained"), ("SE-R",))
    kept = suites.select(specs, ("*-noniid-s0-with-*", "single-mnist-iid-s2*"))
    assert [s.name for s in kept] == [
        "single-mnist-iid-s2-with-SE-R", "single-mnist-noniid-s0-with-SE-R",
        "single-fmnist-noniid-s0-with-SE-R", "single-cifar10-noniid-s0-with-SE-R",
        "single-shakespeare-noniid-s0-with-SE-R"]
    assert suites.select(specs, ()) == specs
    with pytest.raises(SystemExit):
        main(["single", "--suite", "tiny", "--only", "*-noniid-s0,nope*",
              "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--only 'nope*' matches none of the runs: single-mnist-iid-s0," in err
    assert not (tmp_path / "out").exists()  # refused before any run


def test_shakespeare_takes_the_text_presets_training_keys():
    config = suites.dataset_config("quick", "shakespeare")
    preset = ROOT / "presets" / "shakespeare.toml"
    if preset.is_file():
        text = tomllib.loads(preset.read_text())
        assert config["optimizer"] == text.get("optimizer", config["optimizer"])
    assert config["dataset"] == "shakespeare"


def test_run_config_toml_round_trips():
    config = {"dataset": "mnist", "num-rounds": 3, "lr": 0.05, "mia": False,
              "frameworks": "SE,FR", "results-dir": "/tmp/a b"}
    assert tomllib.loads(run_config_toml(config)) == config


def test_progress_estimates_time_left():
    stream = io.StringIO()
    progress = Progress([1.0, 1.0, 2.0], stream)
    progress.start(0, "single", "a")
    progress.finish(0, "single", "a", 10.0)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[single] run 1/3 a: started") and "left ?" in lines[0]
    assert "run 1/3 a: done in 10s" in lines[1] and "left ~30s" in lines[1]


def _row(experiment, framework, **kw):
    base = {"experiment": experiment, "framework": framework, "seed": 0,
            "run": f"{experiment}-{kw.get('dataset', 'mnist')}"}
    return {**base, **kw}


def test_headline_and_reductions_from_rows():
    rows = []
    for dataset in ("mnist", "shakespeare"):
        for name, seconds, epochs in (("SE", 1.0, 2.0), ("FR", 4.0, 16.0),
                                      ("FE", 2.0, 8.0), ("RR", 5.0, 16.0)):
            rows.append(_row("single", name, dataset=dataset, partition="noniid",
                             retrain_compute_s=seconds, client_epochs=epochs))
            # IID cells are not the paper's setting: left out of the headline
            rows.append(_row("single", name, dataset=dataset, partition="iid",
                             retrain_compute_s=1.0, client_epochs=1.0))
    heads = compare.headline(rows, {"reduction_vs_FE": 0.99, "run": "s"})
    images, text, store = heads
    assert images["paper"] == 0.66 and images["cells"] == ["mnist-noniid"]
    assert text["paper"] == 0.8762 and text["cells"] == ["shakespeare-noniid"]
    assert images["time_vs_FR"] == pytest.approx(0.75)
    assert images["epochs_vs_FE"] == pytest.approx(0.75)
    assert text["time_vs_RR"] == pytest.approx(0.8)
    assert store["storage_vs_FE"] == 0.99
    assert compare.reduction(None, 3.0) is None and compare.reduction(1.0, 0) is None


def test_mia_stability_and_mnist_check():
    rows = [_row("single", name, dataset="mnist", partition="iid", seed=seed,
                 mia_f1=f1)
            for seed, f1s in ((0, (0.7, 0.5, 0.52)), (1, (0.72, 0.48, 0.5)),
                              (2, (0.68, 0.5, 0.49)))
            for name, f1 in zip(("original", "FR", "SE"), f1s, strict=True)]
    stab = compare.mia_stability(rows)
    assert stab["config"] == "mnist-iid" and stab["seeds"] == [0, 1, 2]
    assert stab["models"]["original"]["range"] == pytest.approx(0.04)
    assert stab["models"]["FR"]["mean"] == pytest.approx(0.49333, abs=1e-4)
    check = compare.mnist_mia_check(rows)
    not_run = {f"f1_{name}": None for name in names()}  # a column per method
    assert check == [{"partition": "iid", "f1_original": 0.7, **not_run, "f1_SE": 0.52,
                      "f1_FR": 0.5, "fr_below_original": "yes",
                      "noise": pytest.approx(0.02), "se_within_005_of_fr": True}]


@pytest.mark.parametrize("fr_seed0, verdict", [(0.49, "yes"), (0.699, "inside the noise"),
                                               (0.71, "no")])
def test_mnist_mia_check_weighs_the_gap_against_the_seed_spread(fr_seed0, verdict):
    # original's F1 over seeds 0.7, 0.72, 0.68 (std 0.02); FR's std stays below that
    rows = [_row("single", name, dataset="mnist", partition="iid", seed=seed,
                 mia_f1=f1)
            for seed, f1s in ((0, (0.7, fr_seed0, 0.52)), (1, (0.72, fr_seed0, 0.5)),
                              (2, (0.68, fr_seed0 + 0.01, 0.49)))
            for name, f1 in zip(("original", "FR", "SE"), f1s, strict=True)]
    rows += [_row("single", name, dataset="mnist", partition="noniid", mia_f1=f1)
             for name, f1 in (("original", 0.5), ("FR", 0.499), ("SE", 0.5))]
    iid, noniid = sorted(compare.mnist_mia_check(rows), key=lambda c: c["partition"])
    assert iid["noise"] == pytest.approx(0.02) and iid["fr_below_original"] == verdict
    # no seeds ran the non-IID cell: its 0.001 gap is not weighed
    assert noniid["noise"] is None and noniid["fr_below_original"] == "yes"


def test_concurrent_points_expectations():
    rows = [{"experiment": "concurrent", "framework": "SE", "run": "c", "dataset": "d",
             "num_shards": 4, "num_clients": 100, "request_distribution": "even",
             "request_mode": "concurrent", "num_requests": 2,
             "se_mean_shard_cost_s": 2.0, "se_measured_shard_s": 4.0,
             "retrain_compute_s": 4.5, "client_epochs": 8.0, "impacted_shards": 2},
            {"experiment": "concurrent", "framework": "SE", "run": "s", "dataset": "d",
             "num_shards": 4, "request_distribution": "even",
             "request_mode": "sequential", "num_requests": 2,
             "se_mean_shard_cost_s": 3.0}]
    se_requests = {"s": [
        RequestCost(0, [3], shard_compute_s={0: 2.0}, client_epochs=4.0, compute_s=2.1,
                    impacted_shards=[0]),
        RequestCost(1, [9], shard_compute_s={1: 4.0}, client_epochs=4.0, compute_s=4.2,
                    impacted_shards=[1])]}
    points = compare.concurrent_points(rows, se_requests)
    conc = points[0]
    # c from the other run's single-client first request (2.0), not its own row
    assert conc["mean_shard_cost_s"] == 2.0 and conc["c_source"].startswith("1 other")
    assert conc["expected_s"] == pytest.approx(4 * 2.0 * (1 - 0.75 ** 2))
    assert conc["impacted_expected"] == pytest.approx(4 * (1 - 0.75 ** 2))
    assert conc["impacted_simulated"] == pytest.approx(conc["impacted_expected"], abs=0.1)
    seq = [p for p in points if p["mode"] == "sequential"]
    assert [p["K"] for p in seq] == [1, 2]
    assert [p["measured_s"] for p in seq] == [2.0, 6.0]
    assert [p["expected_s"] for p in seq] == [3.0, 6.0]
    assert seq[-1]["impacted_shards"] == 2


def test_storage_block_degrades_without_coded_storage():
    rows = [_row("storage", "FE", storage="uncoded", comm_time_s=3.0),
            _row("storage", "SE", storage="uncoded", comm_time_s=1.0)]
    storage = {"storage-mnist": {
        "server_bytes": 900, "FE": {"server_bytes": 1000},
        "SE_uncoded": {"server_bytes": 900}, "SE_coded": None}}
    block = compare.storage_block(rows, storage)
    assert block["server_bytes"] == {"FE": 1000, "SE uncoded": 900, "SE coded": None}
    assert block["reduction_vs_FE"] is None and not block["coded_available"]
    assert block["comm_s"]["FE"] == 3.0
    text = "\n".join(report_storage.storage_section(block, {}))
    assert "Coded storage was not available" in text
    assert compare.storage_block([], {}) is None


def test_all_tiny_end_to_end(tiny_all):
    results, out, progress = tiny_all
    failed = [r["spec"]["name"] for r in results["runs"] if r["status"] != "done"]
    assert not failed, [r["error"] for r in results["runs"] if r["error"]]
    experiments = {r["spec"]["experiment"] for r in results["runs"]}
    assert experiments == {"single", "concurrent", "storage"}
    for entry in results["runs"]:
        summary = out / entry["summary"]
        assert summary.is_file()
        assert not (summary.parent / "history").exists()  # stores removed
    assert results["storage_sweep"]
    # progress: one line per step with i/N and the time left
    total = len(results["runs"]) + (results["storage_sweep_source"] ==
                                    "experiments/storage.py")
    assert f"run 1/{total}" in progress and f"run {total}/{total}" in progress
    assert "left" in progress


def test_csv_has_the_expected_columns(tiny_all):
    results, out, _ = tiny_all
    with open(out / "results.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == collect.COLUMNS
        rows = list(reader)
    single = {r["framework"] for r in rows if r["run"] == "single-mnist-iid-s0"}
    assert single == {"original", *suites.COMPARED.split(",")}
    se = next(r for r in rows if r["run"] == "single-mnist-iid-s0"
              and r["framework"] == "SE")
    # SE may replay nothing (issue 14: the request's clients never trained)
    assert (float(se["retrain_compute_s"]) > 0) == (int(se["rounds_replayed"]) > 0)
    assert 0 <= float(se["mia_f1"]) <= 1
    fe2 = [r for r in rows if r["run"] == "single-mnist-iid-s0-fe2"]
    assert [r["framework"] for r in fe2] == ["original", "FE(dt=2)"]
    assert fe2[1]["calibration_interval"] == "2" and float(fe2[1]["modelled_wall_s"]) > 0
    conc = [r for r in rows if r["experiment"] == "concurrent"
            and r["framework"] != "original"]
    assert {r["framework"] for r in conc if r["request_mode"] == "concurrent"} == \
        set(suites.COMPARED.split(","))  # issue 14: every framework on the same batch
    assert all(r["framework"] == "SE" for r in conc if r["request_mode"] == "sequential")
    assert all(r["se_expected_shard_s"] != "" for r in conc if r["framework"] == "SE")
    assert (out / "storage_sweep.csv").stat().st_size > 0
    stored = json.loads((out / "results.json").read_text())
    assert stored["experiment"] == "all" and stored["wall_s"] > 0


def test_rows_carry_the_retrained_shards_accuracy(tiny_all):
    results, out, _ = tiny_all
    def impacted(summary):
        return sorted({s for r in summary.frameworks["SE"].requests
                       for s in r.impacted_shards or []})

    entry, summary = next(
        (r, s) for r in results["runs"] if r["spec"]["experiment"] == "concurrent"
        and "FR" in r["spec"]["config"]["frameworks"]
        and impacted(s := collect.load_summary(out, r)))
    rows = {r["framework"]: r for r in collect.load_rows({"runs": [entry]}, out)}
    se, shards = summary.frameworks["SE"], impacted(summary)
    assert len(se.shard_accuracy) == summary.config["num-shards"] > 1
    assert rows["SE"]["impacted_shard_accuracy"] == pytest.approx(
        sum(se.shard_accuracy[s] for s in shards) / len(shards))
    assert rows["SE"]["impacted_shard_accuracy_original"] == pytest.approx(
        sum(summary.learning.shard_accuracy[s] for s in shards) / len(shards))
    # one model: nothing to add to its accuracy
    assert "impacted_shard_accuracy" not in rows["FR"]
    text = (out / "report.md").read_text()
    assert f"| {rows['SE']['impacted_shard_accuracy']:.3f} (" in text


def test_figures_are_nonempty_pngs(tiny_all):
    results, out, _ = tiny_all
    expected = {"single_retraining", "single_accuracy", "single_mia", "concurrent",
                "storage", "storage_sweep"}
    assert {Path(f).stem for f in results["figures"]} == expected
    for name in expected:
        data = (out / "figures" / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_report_has_the_headline_comparison(tiny_all):
    results, out, _ = tiny_all
    text = (out / "report.md").read_text()
    assert "## Headline comparison with the paper" in text
    for paper in ("66.0%", "87.6%", "98.0%"):
        assert paper in text
    assert "less server storage" in text  # coded SE's measured reduction
    assert "./simulate.sh experiments all --suite tiny" in text
    assert "MIA stability" in text and "Concurrent and sequential" in text
    # every framework side by side on each concurrent batch, client rounds measured
    side = text.split("Every framework on the same concurrent batch")[1]
    for name in ("SE", "FR", "FE", "RR"):
        assert re.search(rf"\| even \| 1 \| {name} \| [0-9.]+ \|", side), name
    assert "client rounds" in side
    assert "## The distance to FR in two" in text  # SISA runs in the suites
    assert "2 CPU cores" in text or "CPU cores" in text
    for fig in results["figures"]:
        assert f"]({fig})" in text
    before = text
    rebuild_report(out)  # --report-only redraws from results.json alone
    assert (out / "report.md").read_text() == before


def test_report_only_refuses_a_folder_without_its_runs_and_writes_nothing(tmp_path, capsys):
    """A committed results folder keeps no runs/: a one-line refusal, no traceback."""
    out = tmp_path / "committed"
    shutil.copytree(ROOT / "docs/results/side-by-side/concurrent-cifar10-shakespeare", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit) as stop:
        main(["all", "--report-only", "--out", str(out)])
    assert stop.value.code == 2
    assert "lack their summary.json" in capsys.readouterr().err.splitlines()[-1]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(SystemExit):
        main(["all", "--report-only", "--out", str(tmp_path / "nothing")])
    assert "no results.json to redraw from" in capsys.readouterr().err


def test_a_storage_sweep_without_blocks_per_shard_still_renders():
    """results.json files older than the field redraw (they once stopped at a KeyError)."""
    results = json.loads((ROOT / "docs/results/tiny-suite/results.json").read_text())
    assert all("blocks_per_shard" not in r for r in results["storage_sweep"])
    text = "\n".join(report_storage._sweep_section(results))
    assert "K blocks a shard (not recorded in this file)" in text


def test_cli_reuses_finished_runs(tiny_all, shared_data, capsys, tmp_path):
    _, done, _ = tiny_all
    out = tmp_path / "again"
    shutil.copytree(done, out)
    code = main(["storage", "--suite", "tiny", "--out", str(out),
                 "--data-dir", str(shared_data)])
    assert code == 0
    err = capsys.readouterr().err
    assert "storage-mnist-coded: reused" in err
    assert "report:" in err


@pytest.mark.subprocess
def test_simulate_sh_has_the_experiments_command():
    proc = subprocess.run([str(ROOT / "simulate.sh"), "experiments", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "single" in proc.stdout and "--suite" in proc.stdout
    assert "--preset" not in proc.stdout  # run presets are ./simulate.sh's


FAKE_SIMULATE_SH = """#!{python}
import json, os, sys, tomllib
from pathlib import Path
args = sys.argv[1:]
config = tomllib.loads(Path(args[args.index("--run-config") + 1]).read_text())
config = config.get("tool", {{}}).get("flwr", {{}}).get("app", {{}}).get("config", config)
Path(os.environ["FLWR_HOME"]).mkdir(parents=True)
(Path(os.environ["FLWR_HOME"]) / "call.json").write_text(json.dumps(
    {{"args": args, "cwd": os.getcwd(), "config": config}}))
if config["run-name"] != "fails":
    folder = Path(config["results-dir"]) / config["run-name"]
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({{"config": config}}))
"""


@pytest.mark.subprocess
def test_flwr_engine_hands_the_configuration_to_simulate_sh(tmp_path, monkeypatch,
                                                             shared_data):
    """``run_one(..., "flwr")`` runs ``./simulate.sh --supernodes C --run-config FILE``
    with the spec's keys, in a FLWR_HOME of its own; ``test_e2e`` runs simulate.sh
    itself on Flower's engine, so here a stand-in records the call."""
    from experiments import engines

    (tmp_path / "simulate.sh").write_text(FAKE_SIMULATE_SH.format(python=sys.executable))
    (tmp_path / "simulate.sh").chmod(0o755)
    monkeypatch.setattr(engines, "ROOT", tmp_path)
    spec = next(s for s in suites.plan("storage", "tiny") if s.tags["storage"] == "coded")
    out = tmp_path / "out"
    path = engines.run_one(spec, out, str(shared_data), "flwr")
    assert path == out / "runs" / spec.name / "summary.json"
    call = json.loads((out / ".flwr_home" / "call.json").read_text())
    assert call["args"][:2] == ["--supernodes", str(spec.config["num-clients"])]
    assert call["cwd"] == str(tmp_path)
    assert {k: call["config"][k] for k in spec.config} == spec.config
    assert call["config"]["data-dir"] == str(shared_data.resolve())
    assert json.loads(path.read_text())["config"]["storage"] == "coded"
    failing = dataclasses.replace(spec, name="fails")
    with pytest.raises(RuntimeError, match="without .*fails/summary.json"):
        engines.run_one(failing, tmp_path / "out2", str(shared_data), "flwr")


def test_experiments_take_suites_not_run_presets(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["all", "--preset", "quick"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--suite quick|trained|paper|tiny" in err and "presets/NAME.toml" in err
    with pytest.raises(SystemExit):
        main(["all", "--suite", "glance"])
    assert "invalid choice: 'glance'" in capsys.readouterr().err


def test_paper_suite_is_the_paper_run_preset():
    from flwr.common.config import flatten_dict

    preset = flatten_dict(tomllib.loads((ROOT / "presets" / "paper.toml").read_text()))
    assert suites.base("paper") == preset
    for spec in suites.plan("all", "paper"):
        assert {k: spec.config[k] for k in preset if k != "num-clients"} == {
            k: v for k, v in preset.items() if k != "num-clients"}


def test_storage_table_renders_as_before():
    rows = [{"clients": 20, "rounds": 10, "blocks_per_shard": 10, "privacy_t": 0,
             "fe_server": 16.5e6,
             "se_uncoded_server": 27.2e6, "se_coded_server": 17500,
             "se_coded_client_max": 710000, "distribution_comm_s": 12.3},
            {"clients": 200, "rounds": 30, "blocks_per_shard": 98, "privacy_t": 2,
             "fe_server": 397.7e6,
             "se_uncoded_server": 427.7e6, "se_coded_server": 260700,
             "se_coded_client_max": 19.32e6, "distribution_comm_s": 1234.5}]
    from experiments import storage

    assert storage.render(rows).splitlines() == [
        "  C   G   K + T  FE server  uncoded SE server  coded SE server  coded/FE  "
        "coded SE per client  FE, uncoded SE per client  distribution comm",
        "---  --  ------  ---------  -----------------  ---------------  --------  "
        "-------------------  -------------------------  -----------------",
        " 20  10  10 + 0   16.50 MB           27.20 MB          17.5 kB    0.106%  "
        "            0.71 MB                          0               12 s",
        "200  30  98 + 2  397.70 MB          427.70 MB          0.26 MB    0.066%  "
        "           19.32 MB                          0            1,234 s"]


@pytest.mark.subprocess
def test_storage_table_script_is_a_thin_caller():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "storage_table.py"),
                           "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--clients" in proc.stdout and "--rounds" in proc.stdout


def test_run_in_process_takes_pyprojects_keys_only(tmp_path):
    from experiments.grid import run_in_process
    from server_app.config import ConfigError

    with pytest.raises(ConfigError, match="'num-client' is not known.*num-clients"):
        run_in_process({"num-client": 8, "results-dir": str(tmp_path),
                        "run-name": "x"})
    assert not (tmp_path / "x").exists()


@pytest.mark.inprocess
def test_a_scratch_run_returns_its_summary_and_leaves_no_folder(shared_data, monkeypatch,
                                                                  tmp_path):
    import tempfile

    from experiments.grid import summary_in_scratch
    from tests.conftest import TINY

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    summary = summary_in_scratch({**TINY, "num-rounds": 1, "frameworks": "none",
                                  "data-dir": str(shared_data), "mia": False})
    assert summary["config"]["num-clients"] == TINY["num-clients"]
    assert len(summary["learning"]["rounds"]) == 1
    # the results folder went with the run (torch may leave its own cache there)
    assert not list(tmp_path.glob("se-scratch.*"))


def test_grid_sends_a_message_once_and_keeps_none_alive():
    import gc
    import weakref

    from flwr.app import Message, RecordDict

    from experiments.grid import NODE_ID_BASE, InProcessGrid

    absent = NODE_ID_BASE  # never answers: no ClientApp needed
    grid = InProcessGrid(lambda message, context: None, 2, {}, absent=[absent])
    message = Message(RecordDict(), dst_node_id=absent, message_type="query")
    assert grid.send_and_receive([message]) == []
    with pytest.raises(RuntimeError, match="only once"):
        grid.send_and_receive([message])
    alive = weakref.ref(message)
    del message
    gc.collect()
    assert alive() is None  # the grid holds no reference to what it sent
    again = Message(RecordDict(), dst_node_id=absent, message_type="query")
    assert grid.send_and_receive([again]) == [] and grid.messages_sent == 2


def test_no_module_loads_a_project_file_by_path():
    sources = [p for folder in ("experiments", "benchmarks", "cli", "server_app",
                                "strategies", "scripts", "tests")
               for p in (ROOT / folder).rglob("*.py")]
    banned = ("spec_from_file_location", "exec_module", "SourceFileLoader", "runpy")
    offenders = [str(p.relative_to(ROOT)) for p in sources
                 if p.name != "test_experiments.py"
                 and any(word in p.read_text() for word in banned)]
    assert offenders == []


def test_storage_sweep_prunes_the_stores_as_a_run_does(tmp_path, monkeypatch):
    from experiments import storage
    from history.store import HistoryStore

    calls, prune = [], HistoryStore.prune_models

    def recorded(store, interval):
        calls.append((store.root.name, interval))
        return prune(store, interval)

    monkeypatch.setattr(HistoryStore, "prune_models", recorded)
    rows = storage.measure(20, [1, 3], tmp_path)
    assert calls == [("fe", None), ("se", 1)] * 2  # at each checkpoint, as learn() does
    # FE keeps W^0 and the last model: two more rounds add only their updates
    update_bytes = 4 * rows[0]["params"] * 4  # C / 5 = 4 float32 updates a round
    grown = rows[1]["fe_server"] - rows[0]["fe_server"]
    assert 2 * update_bytes <= grown < 2.2 * update_bytes


def test_model_quality_is_checked_against_the_trained_goals():
    rows = [_row("single", "original", dataset="cifar10", partition="iid", accuracy=0.44,
                 loss=1.6),
            _row("single", "original", dataset="shakespeare", partition="noniid",
                 accuracy=0.37, loss=2.2),
            _row("single", "SE", dataset="shakespeare", partition="noniid",
                 accuracy=0.1, loss=9.0)]
    lines = "\n".join(report._quality_section(rows)).splitlines()
    table = [line for line in lines if line.startswith("| cifar10") or
             line.startswith("| shakespeare")]
    assert table == ["| cifar10 | iid | 0.440 | 1.600 | accuracy >= 0.45 | no |",
                     "| shakespeare | noniid | 0.370 | 2.200 | loss <= 2.30 nats/char "
                     "| yes |"]


def test_a_cells_later_run_fills_but_does_not_replace_the_original_row():
    audited = _row("single", "original", dataset="mnist", partition="iid",
                   accuracy=0.98, mia_f1=0.5)
    fe2 = _row("single", "original", dataset="mnist", partition="iid", accuracy=0.98,
               mia_f1=None, rounds_replayed=3, run="single-mnist-iid-s0-fe2")
    cell = compare.single_cells([audited, fe2])[("mnist", "iid")]
    assert cell["original"]["mia_f1"] == 0.5  # the FE(dt=2) run has no audit
    assert cell["original"]["run"] == "single-mnist" and \
        cell["original"]["rounds_replayed"] == 3
    table = "\n".join(report_requests.single_sections([audited, fe2]))
    assert "| mnist | iid | original | 0.980 |" in table and "| 0.500 |" in table


def _die(*args, **kwargs):  # a job process killed mid-run (module level: picklable)
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.subprocess
def test_a_killed_job_process_fails_its_runs_not_the_suite(tmp_path, shared_data,
                                                           monkeypatch):
    from concurrent.futures import ProcessPoolExecutor

    from experiments import run as runner

    class Killing(ProcessPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            return super().submit(_die, *args, **kwargs)

    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", Killing)
    specs = suites.plan("single", "tiny")[:2]
    results = {"runs": []}
    progress = Progress([1.0, 1.0], io.StringIO(), jobs=2)
    runner._run_parallel(specs, progress, results,
                         runner.RunSetup(tmp_path, str(shared_data)), 2)
    assert [r["status"] for r in results["runs"]] == ["failed", "failed"]
    assert "BrokenProcessPool" in results["runs"][0]["error"]
    assert json.loads((tmp_path / "results.json").read_text())["runs"]


def test_uncoded_storage_comes_from_the_uncoded_runs_own_store():
    rows = [_row("storage", "SE", storage="coded", run="sc"),
            _row("storage", "SE", storage="uncoded", run="su")]
    coded_block = {"FE": {"server_bytes": 100}, "SE_coded": {"server_bytes": 1},
                   "SE_uncoded": {"server_bytes": 150, "source": "serialized records"}}
    uncoded_block = {"FE": {"server_bytes": 100},
                     "SE_uncoded": {"server_bytes": 120, "source": "store"}}
    block = compare.storage_block(rows, {"sc": coded_block, "su": uncoded_block})
    assert block["server_bytes"] == {"FE": 100, "SE uncoded": 120, "SE coded": 1}
    assert block["uncoded_reduction_vs_FE"] == pytest.approx(-0.2)


def _run_summary(task_config: dict, *, task: dict | None = None,
                 perplexity: float | None = None, accuracy: float = 0.5,
                 loss: float = 1.0):
    """A one-shard summary with its original's and SE's scores (no real run)."""
    from runstore.summary import (
        FrameworkSummary,
        LearningSummary,
        ModelScores,
        RunSummary,
    )

    learning = LearningSummary(accuracy, loss, [accuracy], [loss], 1.0, 1.0, 1.0,
                               perplexity=perplexity)
    return RunSummary(
        config={"dataset": "mnist", "task": "", "partition": "iid", "seed": 0,
                **task_config},
        data_dir="", shards=[[0, 1]], shard_strategy={"name": "FedAvg"}, notes=[],
        learning=learning, original=ModelScores(accuracy, loss),
        frameworks={"SE": FrameworkSummary(accuracy=accuracy, loss=loss)}, task=task)


# Plug-in tasks whose names are none of the built-in ones: a character model scored
# by its loss, and an image task scored by its accuracy (Task.describe()).
TEXT_PLUGIN = {"name": "chars", "metric": "loss", "classes": False, "perplexity": True}
IMAGE_PLUGIN = {"name": "digits", "metric": "accuracy", "classes": True,
                "perplexity": False}


def _plugin_rows():
    text = _run_summary({"task": "mytext:task", "dataset": "shakespeare"},
                        task=TEXT_PLUGIN, accuracy=1.0, loss=1.4)
    images = _run_summary({"task": "mydigits:task", "dataset": "mnist"},
                          task=IMAGE_PLUGIN, accuracy=1.0, loss=0.01)
    return (collect.summary_rows("single", "single-text", text, 1.0)
            + collect.summary_rows("single", "single-images", images, 1.0))


def test_rows_carry_the_tasks_metric_not_its_name():
    rows = _plugin_rows()
    assert {(r["dataset"], r["metric"]) for r in rows} == {
        ("mytext:task", "loss"), ("mydigits:task", "accuracy")}
    assert "metric" in collect.COLUMNS
    # summaries written before the task block: the perplexity says "loss"
    old_text = _run_summary({"dataset": "shakespeare"}, perplexity=4.0)
    old_images = _run_summary({"dataset": "cifar10"})
    assert {r["metric"] for r in collect.summary_rows("single", "a", old_text, 1.0)} \
        == {"loss"}
    assert {r["metric"] for r in collect.summary_rows("single", "b", old_images, 1.0)} \
        == {"accuracy"}


def test_figure_panels_follow_the_metric_and_unknown_tasks_sort_last(tmp_path):
    from experiments import figures

    rows = _plugin_rows() + [
        _row("single", "original", dataset="shakespeare", partition="iid",
             metric="loss", loss=2.0),
        _row("single", "original", dataset="mnist", partition="iid",
             metric="accuracy", accuracy=0.98)]
    panels = figures.accuracy_panels(rows)
    assert [k for k, _ in panels["accuracy"]] == [("mnist", "iid"),
                                                  ("mydigits:task", "iid")]
    assert [k for k, _ in panels["loss"]] == [("shakespeare", "iid"),
                                              ("mytext:task", "iid")]
    # only a loss-scored plug-in: one panel, the loss one
    only_text = [r for r in rows if r["dataset"] == "mytext:task"]
    assert list(figures.accuracy_panels(only_text)) == ["loss"]
    assert figures.single_accuracy(rows, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes().startswith(PNG_MAGIC)


def test_accuracy_note_skips_tasks_scored_by_loss_whatever_their_name():
    notes = "\n".join(report._notes(_plugin_rows(), []))
    # both originals score accuracy 1.0: only the accuracy-scored task is noted
    assert "mydigits:task-iid: the original model's test accuracy is 1.000" in notes
    assert "mytext:task" not in notes


def test_paper_claims_keep_to_the_papers_datasets():
    rows = []
    for dataset in ("mytext:task", "mydigits:task"):
        for name in ("SE", "FR", "FE", "RR"):
            rows.append(_row("single", name, dataset=dataset, partition="noniid",
                             retrain_compute_s=1.0, client_epochs=1.0))
    images, text, _ = compare.headline(rows, None)
    assert images["cells"] == [] and text["cells"] == []  # no paper figure for them
    assert len(compare.single_reductions(rows)) == 2  # their own reductions stay


def test_the_report_splits_each_sharded_frameworks_distance_to_fr():
    """Issue 42, item 1: isolation (SISA - FR) plus approximation (X - SISA)."""
    from experiments.report.gaps import gap_section

    def row(run, name, value, metric="accuracy"):
        return {"run": run, "framework": name, "metric": metric,
                "accuracy": value if metric == "accuracy" else None,
                "loss": value if metric == "loss" else None}

    rows = [row("a", "original", 0.91), row("a", "FR", 0.90), row("a", "SISA", 0.88),
            row("a", "SE", 0.87), row("a", "FE", 0.86),
            row("t", "FR", 1.50, "loss"), row("t", "SISA", 1.56, "loss"),
            row("t", "SE", 1.60, "loss"), row("n", "SE", 0.5), row("n", "FR", 0.6)]
    text = "\n".join(gap_section(rows))
    assert "| a | SE | -2.00 points | -1.00 points | -3.00 points |" in text
    assert "| t | SE | +0.06 nats | +0.04 nats | +0.10 nats |" in text
    assert "| a | FE |" not in text and "| n |" not in text  # baseline; no SISA
    assert gap_section([r for r in rows if r["framework"] != "SISA"]) == []
