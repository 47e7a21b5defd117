"""experiments/learned.py: a run started from a copy of a finished learning.

The copy stands for the run's own learning: its summary equals a fresh run's in
everything but the seconds measured on this machine; a learning of other
settings, a folder that is not one finished learning, or an existing run folder
is refused.
"""

from __future__ import annotations

import json
import re

import pytest

from experiments.grid import run_in_process
from experiments.learned import LearnedCopyError, copy_learned, learning_config

pytestmark = pytest.mark.inprocess

RUN = {"num-clients": 8, "num-shards": 2, "clients-per-round": 4, "num-rounds": 3,
       "local-epochs": 1, "client-samples": 48, "test-samples": 200, "batch-size": 16,
       "dataset": "mnist", "mia": False, "frameworks": "FR,SISA,SE,SE-R,FE",
       "forget-clients": "3"}
MEASURED = re.compile(r"compute_s|seconds|wall_time_s|measured|retrain_wall_s|^wall_s$"
                      r"|expected_total_s|mean_shard_cost_s")
"""Keys of summary.json measured on this machine (they differ run to run)."""


def _modelled(value: object) -> object:
    """``value`` without the measured keys and the run's name."""
    if isinstance(value, dict):
        return {k: _modelled(v) for k, v in value.items()
                if not MEASURED.search(k) and k != "run-name"}
    if isinstance(value, list):
        return [_modelled(v) for v in value]
    return value


@pytest.fixture(scope="module")
def learned(tmp_path_factory, shared_data):
    results = tmp_path_factory.mktemp("learned")
    base = {**RUN, "data-dir": str(shared_data), "results-dir": str(results)}
    run_in_process({**learning_config(base), "run-name": "learned"})
    return base, results / "learned"


def test_a_copied_learning_gives_the_run_a_fresh_run_gives(learned):
    base, folder = learned
    fresh = json.loads(run_in_process({**base, "run-name": "fresh"}).read_text())
    copy_learned(folder, {**base, "run-name": "copied"})
    copied = json.loads(run_in_process({**base, "run-name": "copied"}).read_text())
    assert set(fresh["frameworks"]) == {"FR", "SISA", "SE", "SE-R", "FE"}
    assert _modelled(copied) == _modelled(fresh)
    # and it did not learn again: its learning's measured seconds are the copy's
    once = json.loads((folder / "summary.json").read_text())["learning"]
    assert copied["learning"]["wall_time_s"] == once["wall_time_s"]
    assert fresh["learning"]["wall_time_s"] != once["wall_time_s"]


def test_a_learning_of_other_settings_or_no_learning_is_refused(learned):
    base, folder = learned
    with pytest.raises(LearnedCopyError, match=r"other settings than the run's \(seed\)"):
        copy_learned(folder, {**base, "seed": 1, "run-name": "other-seed"})
    copy_learned(folder, {**base, "forget-clients": "5", "run-name": "twice"})
    with pytest.raises(LearnedCopyError, match="exists"):
        copy_learned(folder, {**base, "run-name": "twice"})
    run_in_process({**base, "forget-clients": "5", "run-name": "twice"})
    with pytest.raises(LearnedCopyError, match="not one finished learning"):
        copy_learned(folder.parent / "twice", {**base, "run-name": "from-a-run"})
