"""Speed against accuracy from the committed schedule files (experiments/pareto.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from experiments import doc_tables, pareto
from experiments.run import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_committed_table_is_what_the_committed_files_make():
    runs = pareto.load()
    assert runs, "no schedule file committed"
    committed = (pareto.FILES / "explore.md").read_text()
    assert committed == pareto.table(runs) + "\n", \
        "explore.md differs from its files: ./simulate.sh experiments pareto"


def test_each_cell_seed_is_one_file_and_one_point_per_framework():
    runs = pareto.load()
    seen = [(r["cell"], r["seed"]) for r in runs]
    assert len(seen) == len(set(seen))
    for dataset, cells in pareto.points(runs).items():
        for cell, by_name in cells.items():
            seeds = sum(1 for r in runs if r["cell"] == cell)
            assert all(len(xy) == seeds for xy in by_name.values()), (dataset, cell)
            # FR against itself: wall 1, gap 0, in every seed
            assert by_name["FR"] == [(1.0, 0.0)] * seeds


@pytest.mark.parametrize("page, begin, end, make", [
    (doc_tables.RESULTS, doc_tables.SUMMARY_BEGIN, doc_tables.SUMMARY_END,
     doc_tables.summary_block),
    (doc_tables.README, doc_tables.HEADLINE_BEGIN, doc_tables.HEADLINE_END,
     doc_tables.headline_block)],
    ids=["RESULTS", "README"])
def test_the_generated_blocks_are_what_the_committed_files_make(page, begin, end, make):
    """Issue 44, item 1: the per-dataset tables are generated, never typed."""
    made = make(pareto.load(pareto.FILES / pareto.SHIPPED), pareto.load(pareto.PAPER_SCALE))
    assert doc_tables.block(page, begin, end) == f"\n\n{made}\n", \
        f"{page.name}'s generated block differs from its files: " \
        "./simulate.sh experiments pareto"


def test_paper_scale_files_hold_the_papers_topology():
    """A file under docs/results/paper-scale/ is the paper's cell, or it is refused.

    The paper's Sec. 5.1: C = 100, S = 4, 20 clients a round, L = 10, G = 30;
    the single-request cell, non-IID or IID; SE as shipped beside the paper's SE.
    """
    import tomllib

    paper = tomllib.loads((pareto.ROOT / "presets" / "paper.toml").read_text())
    for data in pareto.load(pareto.PAPER_SCALE):
        cfg = data["config"]
        for key in ("num-clients", "num-shards", "clients-per-round", "local-epochs",
                    "num-rounds"):
            assert cfg[key] == paper[key], (data["cell"], key)
        assert cfg["partition"] in ("noniid", "iid"), data["cell"]
        assert cfg["num-requests"] == 1, data["cell"]
        assert {"FR", "SISA", "SE", "SE-paper"} <= set(data["frameworks"]), data["cell"]
        # SE runs as it ships: the preset's paper-SE schedule keys were dropped
        assert not [k for k in cfg if k.startswith("method.")
                    or k in ("calibration-final", "replay-refill")], data["cell"]


def test_results_opens_with_the_summary():
    text = doc_tables.RESULTS.read_text()
    assert text.index(doc_tables.SUMMARY_BEGIN) < text.index("## The experiment suite")
    readme = doc_tables.README.read_text().splitlines()
    assert any(doc_tables.HEADLINE_BEGIN in line for line in readme[:40])


def test_summary_rows_are_every_framework_with_spread_and_ratios():
    runs = [r for r in pareto.load() if r["cell"] == pareto.load()[0]["cell"]]
    table = doc_tables.summary_tables(runs)
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 1 + len(runs[0]["frameworks"])  # the original first
    assert rows[0].startswith("| original (before forgetting) |")
    fr = next(row for row in rows if row.startswith("| FR |"))
    assert "| 1.00 ± 0.00 |" in fr  # FR over itself, each seed's ratio 1
    assert all(" ± " in row for row in rows)
    assert all(row.count("|") == 7 for row in rows)
    seeds = sorted(r["seed"] for r in runs)
    assert f"seeds {', '.join(map(str, seeds))}" in table
    from statistics import stdev  # the one convention: sample sd, n - 1

    se = [r["frameworks"]["SE"]["accuracy"] * 100 for r in runs]
    assert f" ± {stdev(se):.2f} |" in next(row for row in rows if row.startswith("| SE |"))


def test_experiments_pareto_draws_one_figure_per_dataset(tmp_path, monkeypatch):
    files, figures = tmp_path / "wall", tmp_path / "figures"
    files.mkdir()
    for path in pareto.FILES.glob("explore-*-s*.json"):
        shutil.copy(path, files)
    results, readme = tmp_path / "RESULTS.md", tmp_path / "README.md"
    results.write_text(
        f"# R\n\n{doc_tables.SUMMARY_BEGIN}\nold\n{doc_tables.SUMMARY_END}\n\n## Rest\n")
    readme.write_text(f"{doc_tables.HEADLINE_BEGIN}\nold\n{doc_tables.HEADLINE_END}\n")
    monkeypatch.setattr(pareto, "FILES", files)
    monkeypatch.setattr(pareto, "FIGURES", figures)
    monkeypatch.setattr(doc_tables, "RESULTS", results)
    monkeypatch.setattr(doc_tables, "README", readme)
    monkeypatch.setattr(pareto, "PAPER_SCALE", tmp_path / "paper-scale")
    assert main(["pareto"]) == 0
    assert results.read_text() == (
        f"# R\n\n{doc_tables.SUMMARY_BEGIN}\n\n{doc_tables.NO_RUNS}"
        f"\n{doc_tables.SUMMARY_END}\n\n## Rest\n")
    assert "old" not in readme.read_text()
    datasets = {r["config"]["dataset"] for r in pareto.load(files)}
    drawn = sorted(figures.glob("pareto_*.png"))
    assert [p.name for p in drawn] == sorted(f"pareto_{d}.png" for d in datasets)
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in drawn)
    assert (files / "explore.md").read_text() == pareto.table(pareto.load(files)) + "\n"


def test_a_file_without_fr_is_refused_by_name(tmp_path):
    data = json.loads(next(pareto.FILES.glob("explore-*-s*.json")).read_text())
    del data["frameworks"]["FR"]
    (tmp_path / "explore-x-s0.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="explore-x-s0.json: no FR"):
        pareto.load(tmp_path)


def test_an_empty_folder_or_a_page_without_the_block_writes_nothing(tmp_path):
    results, readme = tmp_path / "RESULTS.md", tmp_path / "README.md"
    results.write_text(f"{doc_tables.SUMMARY_BEGIN}\n{doc_tables.SUMMARY_END}\n")
    readme.write_text(f"{doc_tables.HEADLINE_BEGIN}\n{doc_tables.HEADLINE_END}\n")
    with pytest.raises(ValueError, match="no explore"):
        doc_tables.redraw(tmp_path, tmp_path, results, readme)
    readme.write_text("# no block\n")
    with pytest.raises(ValueError, match="README.md: no generated block"):
        doc_tables.redraw(pareto.FILES, tmp_path, results, readme)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "RESULTS.md"]
    assert readme.read_text() == "# no block\n"


def test_pareto_refuses_the_options_of_a_run(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["pareto", "--suite", "paper"])
    assert stop.value.code == 2
    assert "takes no options: --suite given" in capsys.readouterr().err


def test_an_iid_paper_scale_cell_gets_its_own_tables_and_stays_out_of_the_headline():
    """IID cells at the paper's scale: their own section, no paper figure beside them.

    The paper's reductions (and the README's headline) are its non-IID cells'.
    """
    noniid = pareto.load(pareto.PAPER_SCALE)
    iid = json.loads(json.dumps(noniid[0]))
    iid["config"]["partition"], iid["cell"] = "iid", iid["cell"].replace("noniid", "iid")
    block = doc_tables.summary_block([], [*noniid, iid])
    both, iid_part = block.split("### At the paper's scale, IID")
    dataset = iid["config"]["dataset"]
    assert f"#### {dataset}, IID" in iid_part and f"Cell `{iid['cell']}`" in iid_part
    assert "the paper reports" not in iid_part and "the paper reports" in both
    assert f"Cell `{iid['cell']}`" not in both
    assert doc_tables.headline_block([], [*noniid, iid]) == \
        doc_tables.headline_block([], noniid)


def _cell(tmp_path, epochs: dict[str, float], remade: dict | None) -> list[dict]:
    """A one-file results folder whose frameworks trained ``epochs``; maybe remade."""
    fw = {n: {"accuracy": 0.9, "client_epochs": e, "client_rounds": 3,
              "modelled_wall_s": 100.0 + e, "wall_breakdown": {}}
          for n, e in epochs.items()}
    name = "explore-c-s0.json"
    (tmp_path / name).write_text(json.dumps({"cell": "c", "seed": 0, "frameworks": fw,
                                             "config": {"dataset": "mnist"}}))
    if remade is not None:
        (tmp_path / pareto.MODELLED).mkdir()
        (tmp_path / pareto.MODELLED / name).write_text(json.dumps(
            {"commit": "abc1234", "fingerprint": "f", "frameworks": remade}))
    return pareto.load(tmp_path)


def test_remade_times_replace_the_measured_ones_where_the_schedule_is_the_same(tmp_path):
    """Issue 52, item 2: a file's times are the cost model's once remade; a framework
    whose schedule the code changed keeps no time beside its old accuracy."""
    same = {"modelled_wall_s": 7.5, "wall_breakdown": {"rounds": 3},
            "same_schedule": True}
    changed = {"modelled_wall_s": 2.0, "wall_breakdown": {}, "same_schedule": False}
    [run] = _cell(tmp_path, {"FR": 60.0, "SISA": 15.0, "SE": 10.0, "SE-R": 8.0},
                  {"FR": same, "SISA": same, "SE": {**same, "modelled_wall_s": 3.0},
                   "SE-R": changed})
    fw = run["frameworks"]
    assert (fw["FR"]["modelled_wall_s"], fw["SE"]["modelled_wall_s"]) == (7.5, 3.0)
    assert fw["SE-R"]["modelled_wall_s"] is None and fw["SE-R"]["stale"]
    assert run["times"]["source"] == "cost model"
    assert "| SE-R | 0.9000 | +0.00 | 8 | 3 | stale |" in pareto.table([{
        **run, "machine": {}, "commit": "abc", "learned_accuracy": 0.9}])
    assert doc_tables._saved([run], "SE-R") == "stale"
    assert doc_tables._saved([run], "SE") == "60.0%"


def test_a_run_of_the_cost_model_code_keeps_its_own_times_for_every_framework(tmp_path):
    """A file that records the fingerprint of the code that ran it (explore.record)
    was priced by the cost model itself: its times stand, SE-R's data-dependent
    schedule included, and no cost-only run is needed."""
    fw = {n: {"accuracy": 0.9, "client_epochs": e, "client_rounds": 3,
              "modelled_wall_s": e / 10, "wall_breakdown": {}}
          for n, e in {"FR": 600.0, "SISA": 150.0, "SE-R": 42.0}.items()}
    (tmp_path / "explore-c-s0.json").write_text(json.dumps(
        {"cell": "c", "seed": 0, "commit": "abc1234", "fingerprint": "f" * 64,
         "frameworks": fw, "config": {"dataset": "mnist"}}))
    [run] = pareto.load(tmp_path)
    assert run["times"] == {"source": "cost model", "commit": "abc1234",
                            "fingerprint": "f" * 64}
    assert run["frameworks"]["SE-R"]["modelled_wall_s"] == 4.2
    assert not any(f.get("stale") for f in run["frameworks"].values())
    assert pareto.times(run) == "times: cost model, commit abc1234"


def test_a_file_not_remade_says_its_times_were_measured(tmp_path):
    [run] = _cell(tmp_path, {"FR": 60.0, "SE": 10.0}, None)
    assert run["times"] == {"source": "measured"}
    assert run["frameworks"]["FR"]["modelled_wall_s"] == 160.0
    assert pareto.times(run) == "times: measured before the cost model"


@pytest.mark.parametrize("folder", [pareto.PAPER_SCALE, pareto.PAPER_SCALE / "clients",
                                    pareto.PAPER_SCALE / "baselines", pareto.FILES,
                                    pareto.FILES / pareto.SHIPPED],
                         ids=["paper-scale", "clients", "baselines", "wall", "shipped"])
def test_every_file_priced_by_its_own_run_is_of_todays_code(folder):
    """Issue 52, item 6: a file that records its own fingerprint (its times the cost
    model's of that code) fails here once the code changed since; its fingerprint is
    the code at its recorded commit (``remodel --stamp`` cannot label a file made by
    other code). Remake: rerun it, or ``python -m experiments.remodel --folder F``."""
    import subprocess

    from experiments.time_saved import fingerprint, fingerprint_at

    today, checked = fingerprint(), {}
    for path in sorted(folder.glob("explore-*-s*.json")):
        made = json.loads(path.read_text())
        if "fingerprint" not in made or (folder / pareto.MODELLED / path.name).is_file():
            continue
        assert made["fingerprint"] == today, f"{path}: made by other code; remake it"
        known = subprocess.run(["git", "cat-file", "-e", made["commit"]], cwd=pareto.ROOT,
                               capture_output=True, check=False).returncode == 0
        if known and made["commit"] not in checked:  # absent from a shallow clone
            checked[made["commit"]] = fingerprint_at(made["commit"])
        if known:
            assert checked[made["commit"]] == made["fingerprint"], path


@pytest.mark.parametrize("folder", [pareto.PAPER_SCALE, pareto.PAPER_SCALE / "clients",
                                    pareto.PAPER_SCALE / "baselines", pareto.FILES,
                                    pareto.FILES / pareto.SHIPPED],
                         ids=["paper-scale", "clients", "baselines", "wall", "shipped"])
def test_every_remade_file_is_of_todays_code_and_its_source(folder):
    """Issue 52, item 6: a remade file made by code that changed since fails here
    (remake: ``python -m experiments.remodel --folder F``)."""
    from experiments.time_saved import fingerprint

    today = fingerprint()
    for path in sorted((folder / pareto.MODELLED).glob("*.json")):
        made = json.loads(path.read_text())
        assert made["fingerprint"] == today, f"{path}: made by other code; remake it"
        source = json.loads((folder / made["source"]).read_text())
        assert made["source_commit"] == source["commit"], f"{path}: its source changed"
        assert set(made["frameworks"]) == set(source["frameworks"]), path


def test_remake_lists_what_other_code_made_and_the_commands_that_remake_it():
    """experiments/remake.py: with another fingerprint every remade file, sweep and
    the default run are stale, and each folder is remade by one remodel command, each
    sweep by its own; with today's, nothing (the claims tests hold)."""
    from experiments import remake

    files = remake.stale(today="0" * 64)
    assert len(files["modelled"]) == sum(len(list(
        (remake.RESULTS / f / "modelled").glob("*.json"))) for f in remake.MODELLED)
    assert files["sweep"] and files["default-run"] == [remake.DEFAULT_RUN]
    todo = remake.commands(files)
    remodels = [c for c in todo if "experiments.remodel" in c]
    assert len(remodels) == len({p.parent.parent for p in files["modelled"]}
                                | {p.parent for p in files["own"]})
    assert [c[-1] for c in todo if "experiments.time_saved" in c] == [
        p.stem for p in files["sweep"]]
    runs = [c for c in todo if "--into" in c]
    assert files["verification"] and [c[-1] for c in runs] == [
        str(p) for p in files["verification"]]
    for command, path in zip(runs, files["verification"], strict=True):
        stem, seed = path.stem.rsplit("seed", 1)
        preset, *pairs = remake.VERIFIED[stem + "seed"]
        assert command[2:3] == [preset] and f"seed={seed}" in command
        assert all(pair in command for pair in pairs)
    assert todo[-1][-2:] == ["experiments.verified_tables", "--write"]
    assert not any(remake.stale().values())


def test_a_change_to_the_audits_alone_makes_the_audited_runs_stale():
    """The verification runs and the default run report audits: code of the audits
    that changed since (another audit fingerprint) makes them stale, and only them."""
    from experiments import remake

    files = remake.stale(audited="0" * 64)
    assert files["verification"] and files["default-run"] == [remake.DEFAULT_RUN]
    assert not (files["modelled"] or files["own"] or files["sweep"])


def test_stamping_adds_the_audit_fingerprint_only_where_the_commit_had_todays_audits(
        tmp_path, monkeypatch):
    from experiments import remake, time_saved

    folder = tmp_path / "verification"
    folder.mkdir()
    base = {"fingerprint": time_saved.fingerprint()}
    (folder / "verify-seed0.json").write_text(json.dumps({**base, "commit": "A"}))
    (folder / "verify-seed1.json").write_text(json.dumps({**base, "commit": "B"}))
    (folder / "memorize-seed0.json").write_text(json.dumps({"fingerprint": "x",
                                                            "commit": "A"}))
    monkeypatch.setattr(remake, "RESULTS", tmp_path)
    then = {"A": time_saved.audit_fingerprint(), "B": "0" * 64}
    monkeypatch.setattr(remake, "fingerprint_at", lambda commit, root, code: then[commit])
    stamped = remake.stamp_audits()
    assert stamped == [folder / "verify-seed0.json"]
    read = {p.name: json.loads(p.read_text()) for p in folder.glob("*.json")}
    assert read["verify-seed0.json"]["audit_fingerprint"] == then["A"]
    assert "audit_fingerprint" not in read["verify-seed1.json"]
    assert "audit_fingerprint" not in read["memorize-seed0.json"]


def test_remake_jobs_run_the_commands_at_once_and_the_tables_after_them(tmp_path,
                                                                       monkeypatch):
    """``remake --run --jobs N``: every command runs, N at a time, each with one
    thread, the tables after every other; a failing command fails the remake."""
    import subprocess
    import sys

    from experiments import remake

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    log = tmp_path / "log"

    def writes(word: str, *marks: str) -> list[str]:
        code = ("import os, sys; open(sys.argv[1], 'a').write(sys.argv[2] + "
                "os.environ['OMP_NUM_THREADS'] + chr(10))")
        return [sys.executable, "-c", code, str(log), word, *marks]

    todo = [writes("t", "experiments.verified_tables"), writes("r"),
            writes("s", "experiments.time_saved"), writes("v", "--into")]
    assert [c[4] for c in remake.by_length(todo)] == ["s", "v", "r", "t"]
    remake.run_all(todo, jobs=2)
    lines = log.read_text().split()
    assert sorted(lines[:3]) == ["r1", "s1", "v1"] and lines[3] == "t1"
    with pytest.raises(subprocess.CalledProcessError):
        remake.run_all([[sys.executable, "-c", "raise SystemExit(3)"], writes("r")], 2)


def test_the_paper_scale_baselines_get_their_own_tables(tmp_path, monkeypatch):
    """Issue 52, item 4: FE, RR and FRec at the paper's scale, in their own tables once
    a file is committed; the paper-scale caption names the datasets not run yet."""
    noniid = pareto.load(pareto.PAPER_SCALE)
    monkeypatch.setattr(doc_tables, "BASELINES", tmp_path)
    before = doc_tables.summary_block([], noniid)
    assert "unsharded baselines" not in before
    assert "FRec (each on an unsharded federation learned beside the shards) are not " \
        "run yet at this scale." in before
    run = json.loads(json.dumps(noniid[0]))
    fr = run["frameworks"]["FR"]
    run["frameworks"] = {n: {**fr, "accuracy": fr["accuracy"] - 0.01 * i}
                         for i, n in enumerate(("FR", "FE", "RR", "FRec", "SE"))}
    run["cell"] += "-baselines"
    (tmp_path / "explore-paper-x-s0.json").write_text(json.dumps(run))
    block = doc_tables.summary_block([], noniid)
    dataset = run["config"]["dataset"]
    head, tables = block.split("### At the paper's scale, the unsharded baselines")
    assert f"#### {dataset}, baselines" in tables and "| FE |" in tables
    assert "| FE |" not in head.split("### At the paper's scale, forgotten")[0]
    others = [d for d in doc_tables._datasets(noniid) if d != dataset]
    assert f"are in their own tables below; not run yet on {', '.join(others)}." in head


def test_the_fingerprint_reads_code_not_comments_or_docstrings(tmp_path):
    """experiments.time_saved.fingerprint: a comment, a docstring or a line break in
    the code that shapes the numbers leaves it as it was; a changed value does not."""
    from experiments.time_saved import ROOT, SHAPING, fingerprint

    root = tmp_path / "copy"
    for entry in SHAPING:
        source = ROOT / entry
        target = root / entry
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    before = fingerprint(root)
    assert before == fingerprint(ROOT)
    loop = root / "server_app/rounds/loop.py"
    text = loop.read_text()
    edited = text.replace('"""', '"""Reworded. ', 1)  # the module's docstring
    first_def = edited.index("\ndef ")
    edited = edited[:first_def] + "\n# a comment\n\n" + edited[first_def:]
    loop.write_text(edited)
    assert fingerprint(root) == before
    loop.write_text(text.replace(" = 0\n", " = 1\n", 1))
    assert " = 0\n" in text and fingerprint(root) != before


def test_a_framework_with_another_schedule_in_a_file_without_a_fingerprint_is_left_out(
        tmp_path):
    """Issue 52, item 6: SE-R's accuracy in a file made before code fingerprints,
    whose cost-only remake trains another schedule, is not today's SE-R's: the
    summary leaves its row out and says so; in a fingerprinted file it stays."""
    same = {"modelled_wall_s": 7.5, "wall_breakdown": {}, "same_schedule": True}
    changed = {"modelled_wall_s": 2.0, "wall_breakdown": {}, "same_schedule": False}
    [run] = _cell(tmp_path, {"FR": 60.0, "SISA": 15.0, "SE": 10.0, "SE-R": 8.0},
                  {"FR": same, "SISA": same, "SE": same, "SE-R": changed})
    run = {**run, "commit": "abc1234", "machine": {}, "learned_accuracy": 0.9,
           "config": {**run["config"], "partition": "noniid", "num-clients": 4,
                      "num-shards": 2, "clients-per-round": 2, "num-rounds": 3,
                      "local-epochs": 1}}
    assert pareto.outdated(run, "SE-R") and not pareto.outdated(run, "SE")
    text = doc_tables.summary_tables([run])
    assert "| SE-R |" not in text and "| SE |" in text
    assert "Not shown: SE-R." in text
    assert "SE-R" not in doc_tables.headline_table([run])
    fingerprinted = {**run, "fingerprint": "f" * 64}
    assert not pareto.outdated(fingerprinted, "SE-R")
    assert "| SE-R |" in doc_tables.summary_tables([fingerprinted])
