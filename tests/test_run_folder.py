"""The run folder: foreign folders are never touched, saved files are verified."""

import json
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from runstore.folder import ModelsFileError, RunFolder, strict_json
from server_app.config import ConfigError, RunConfig


def _cfg(results, name="r") -> tuple:
    """Where RunFolder.start puts a run of ``results`` and ``name``, as the ServerApp
    resolves them from its run config."""
    cfg = RunConfig.of(results_dir=str(results), run_name=name, num_clients=8,
                       num_shards=2, clients_per_round=4)
    return cfg.output.resolved_results_dir(), cfg.resolved_run_name()


@pytest.mark.parametrize("content", ["models/SE.npz", "catalog.sqlite", "thesis.tex"])
def test_a_folder_that_is_no_run_folder_is_refused_and_kept(tmp_path, content):
    target = tmp_path / "r" / content
    target.parent.mkdir(parents=True)
    target.write_text("mine")
    with pytest.raises(ConfigError, match=r"'run-name' = 'r' .* not a run folder of "
                       "this app"):
        RunFolder.start(*_cfg(tmp_path))
    assert target.read_text() == "mine" and not list(tmp_path.glob("r.failed-*"))


def test_a_folder_with_only_our_lock_is_reused(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.lock").write_text("")
    folder = RunFolder.start(*_cfg(tmp_path))
    assert folder.path == tmp_path / "r"
    folder.release()


def test_results_dir_inside_a_run_folder_is_refused(tmp_path):
    run = tmp_path / "done"
    (run / "history").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match="'results-dir' .* inside the run folder"):
        RunFolder.start(*_cfg(run / "history", "sharded"))
    with pytest.raises(ConfigError, match="'results-dir' .* inside the run folder"):
        RunFolder.start(*_cfg(run, "models"))


def test_results_dir_that_is_a_file_and_a_lock_that_is_a_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="'results-dir' .* is a file"):
        RunFolder.start(*_cfg(tmp_path / "file"))
    (tmp_path / "r" / "run.lock").mkdir(parents=True)
    (tmp_path / "r" / "run.sqlite").write_text("")
    with pytest.raises(ConfigError, match="run.lock is not a lock file"):
        RunFolder.start(*_cfg(tmp_path))


def test_summary_json_is_strict_and_names_non_finite_values(tmp_path):
    folder = RunFolder.start(*_cfg(tmp_path))
    path = folder.finish({"learning": {"loss": math.nan},
                          "config": {"link-rate-mbps": math.inf}, "warnings": []})
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c))
    assert data["learning"]["loss"] is None and data["config"]["link-rate-mbps"] is None
    assert data["warnings"] == [
        "summary.learning.loss was nan (not a finite number), written as null",
        "summary.config.link-rate-mbps was inf (not a finite number), written as null"]
    assert strict_json([1.0, (2, -math.inf)]) == ([1.0, [2, None]],
                                                   [("summary[1][1]", -math.inf)])


def _models(value):
    return [ArrayRecord({"w": Array(np.full((2, 2), value + s, np.float32))})
            for s in range(2)]


def test_saved_models_are_verified_on_load(tmp_path):
    folder = RunFolder.start(*_cfg(tmp_path))
    se = folder.save_models("SE", _models(1.0))
    fr = folder.save_models("FR", _models(5.0))
    loaded = folder.load_models("SE", se)
    assert [m["w"].numpy()[0, 0] for m in loaded] == [1.0, 2.0]
    models = tmp_path / "r" / "models"
    (models / "SE.npz").write_bytes((models / "FR.npz").read_bytes())  # swapped
    with pytest.raises(ModelsFileError, match="SE.npz is not the file this run saved"):
        folder.load_models("SE", se)
    assert folder.load_models("FR", fr)[1]["w"].numpy()[0, 0] == 6.0
    (models / "FR.npz").unlink()
    with pytest.raises(ModelsFileError, match="FR.npz: cannot be read"):
        folder.load_models("FR", fr)
    folder.release()
