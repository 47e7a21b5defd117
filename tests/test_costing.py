"""Cost-only runs (experiments.costing) model the same seconds as real runs.

The per-client time-saved sweep (experiments/time_saved.py) rests on this: a
client that does not train but reports what a trained one would gives every
framework the same modelled wall time, to 1e-9, as the real run of the same
config, because the cost model reads sizes, not weights.
"""

import json

import pytest

from experiments.costing import app as cost_app
from experiments.grid import run_in_process

pytestmark = pytest.mark.inprocess

FRAMEWORKS = ("FR", "SISA", "SE", "SE-R", "FE", "RR", "FRec")


def _modelled(config: dict, folder, client_app=None) -> dict:
    path = run_in_process({**config, "results-dir": str(folder)}, client_app=client_app)
    summary = json.loads(path.read_text())
    return {name: (fw["modelled_wall_s"], fw["client_epochs"])
            for name, fw in summary["frameworks"].items()}


@pytest.mark.parametrize("forget", ["6", "1,4"])
def test_a_cost_only_run_models_the_seconds_of_the_real_run(tmp_path, shared_data, forget):
    config = {"dataset": "mnist", "num-clients": 8, "num-shards": 2,
              "clients-per-round": 4, "num-rounds": 4, "local-epochs": 2,
              "client-samples": 64, "test-samples": 100, "batch-size": 16,
              "mia": False, "retrain-ratio": 2.0, "frameworks": ",".join(FRAMEWORKS),
              "forget-clients": forget, "data-dir": str(shared_data), "run-name": "r"}
    real = _modelled(config, tmp_path / "real")
    cost = _modelled(config, tmp_path / "cost", cost_app)
    assert set(real) == set(FRAMEWORKS)
    for name in FRAMEWORKS:
        assert real[name][0] > 0
        assert cost[name][0] == pytest.approx(real[name][0], abs=1e-9), name
        assert cost[name][1] == real[name][1], name


def test_a_sweep_client_from_the_one_learning_models_what_its_own_learning_would(
        tmp_path, shared_data):
    """experiments.time_saved learns once and copies the learning into each client's
    run: the seconds, client-epochs and rounds replayed are those of a run that
    learned by itself, for every client (one who took part early or late)."""
    from experiments import time_saved

    config = {"dataset": "mnist", "num-clients": 8, "num-shards": 2,
              "clients-per-round": 4, "num-rounds": 4, "local-epochs": 2,
              "client-samples": 64, "test-samples": 100, "batch-size": 16,
              "retrain-ratio": 2.0, "data-dir": str(shared_data)}
    from experiments.costing import cost_only_summary

    learned = time_saved.learn_once(config, tmp_path / "sweep")
    for client in (1, 6):
        alone = time_saved.costs(cost_only_summary(
            {**config, "frameworks": "SE,FR", "forget-clients": str(client)},
            tmp_path / f"alone-{client}"))
        copied = time_saved.modelled(config, client, "SE,FR", learned)
        assert alone == copied and alone["SE"]["modelled_wall_s"] > 0, client
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["learned"]  # copies
    # removed
