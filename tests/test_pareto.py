"""Speed against accuracy from the committed schedule files (experiments/pareto.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from experiments import pareto
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


def test_experiments_pareto_draws_one_figure_per_dataset(tmp_path, monkeypatch):
    files, figures = tmp_path / "wall", tmp_path / "figures"
    files.mkdir()
    for path in pareto.FILES.glob("explore-*-s*.json"):
        shutil.copy(path, files)
    monkeypatch.setattr(pareto, "FILES", files)
    monkeypatch.setattr(pareto, "FIGURES", figures)
    assert main(["pareto"]) == 0
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


def test_an_empty_folder_draws_nothing_and_says_so(tmp_path):
    with pytest.raises(ValueError, match="no explore"):
        pareto.redraw(tmp_path, tmp_path)
    assert not list(tmp_path.iterdir())
