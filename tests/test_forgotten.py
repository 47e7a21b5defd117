"""Accuracy over forgotten clients drawn before the runs (experiments/forgotten.py)."""

from __future__ import annotations

import json

from experiments import forgotten


def _write(folder, client: int, scores: dict[str, float]) -> None:
    fw = {n: {"accuracy": a, "client_epochs": 1.0, "client_rounds": 1,
              "modelled_wall_s": 10.0 if n == "FR" else 4.0, "wall_breakdown": {}}
          for n, a in scores.items()}
    (folder / f"explore-paper-mnist-noniid-c{client}-s0.json").write_text(json.dumps(
        {"cell": f"paper-mnist-noniid-c{client}", "seed": 0, "frameworks": fw,
         "config": {"dataset": "mnist", "forget-clients": str(client)}}))


def test_the_gap_to_sisa_is_paired_per_client_with_its_sample_sd(tmp_path):
    _write(tmp_path, 34, {"FR": 0.98, "SISA": 0.97, "SE": 0.96, "SE-paper": 0.95})
    _write(tmp_path, 6, {"FR": 0.99, "SISA": 0.90, "SE": 0.91, "SE-paper": 0.90})
    _write(tmp_path, 92, {"SISA": 0.80, "SE": 0.78, "SE-paper": 0.80})
    runs = forgotten.by_dataset(tmp_path)["mnist"]
    assert sorted(round(g, 6) for g in forgotten.gaps(runs, "SE")) == [-2.0, -1.0, 1.0]
    table = forgotten.table(tmp_path)
    # mean -0.67, sample SD of (-1, 1, -2) = 1.53; FR for two clients only
    se_row = next(r for r in table.splitlines() if r.startswith("| mnist (%) | SE |"))
    assert "| 6, 34, 92 |" in se_row and "| -0.67 ± 1.53 (3) |" in se_row
    assert "| mnist (%) | FR | 6, 34 |" in table
    # SE's wall over the mean of FR's two runs, for all three clients
    assert "| 0.40 ± 0.00 (3) |" in se_row
    # three clients: the goal is judged over five
    assert "within the bound so far, 3 of 5 clients run" in forgotten.goal_line(tmp_path)
    for c in (61, 65):
        _write(tmp_path, c, {"SISA": 0.80, "SE": 0.80})
    assert "goal reached" in forgotten.goal_line(tmp_path)
    # a dataset the headline shows without any client file is named, not dropped
    line = forgotten.goal_line(tmp_path, datasets=["mnist", "cifar10"])
    assert line.endswith(" Not run yet: cifar10.") and "mnist" in line


def test_a_mean_gap_beyond_one_point_misses_the_goal(tmp_path):
    _write(tmp_path, 34, {"FR": 0.98, "SISA": 0.97, "SE": 0.95})
    _write(tmp_path, 6, {"FR": 0.98, "SISA": 0.97, "SE": 0.955})
    line = forgotten.goal_line(tmp_path)
    assert "mnist -1.75 ± 0.35 (2) points, beyond the bound so far, 2 of 5" in line


def test_no_files_give_no_line(tmp_path):
    assert forgotten.goal_line(tmp_path / "absent") == ""
    assert forgotten.by_dataset(tmp_path / "absent") == {}
