"""The shipped plug-in tasks (examples/): ResNet-20 on CIFAR-10 and digits as vectors.

ResNet-20's BatchNorm buffers go through coded storage and SE's calibration: the
decoded W^0 and client updates hold every float buffer within half a quantisation
step and every int64 ``num_batches_tracked`` exactly, in its dtype. The digits
task (a ``datasets.Dataset``, split by Flower Datasets' DirichletPartitioner) runs
through SE and FR.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from coding import dequantize, quantization_step, quantize
from history import CodedHistory, CodedRecorder, StoreError
from history.files import read_arrays
from server_app.config import ConfigError, RunConfig
from server_app.preflight import validate_run_config
from server_app.rounds.federation import Federation
from task.config import fused_run_config
from task.train import local_train
from task.training_settings import TrainingSettings

SCALE_BITS = 24
STEP = quantization_step(SCALE_BITS)


def _run(config: dict, tmp_path, name: str):
    from client_app.app import app as client_app
    from experiments.grid import InProcessGrid, set_task_identity
    from server_app.app import main

    set_task_identity()
    config = fused_run_config({**config, "results-dir": str(tmp_path), "run-name": name})
    grid = InProcessGrid(client_app, int(config["num-clients"]), config)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))
    return json.loads((tmp_path / name / "summary.json").read_text()), grid


def _check_decoded(got: dict, want: dict) -> None:
    """Floats within half a step, integer buffers exact, every dtype kept."""
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        if np.issubdtype(value.dtype, np.integer):
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            assert np.max(np.abs(got[key].astype(np.float64) - value)) <= STEP / 2, key


def test_resnet20_buffers_survive_coded_storage_exactly(tmp_path):
    """A recorder round trip of ResNet-20's W^0 and one trained update."""
    from client_app.app import app as client_app
    from examples.resnet import task
    from experiments.grid import InProcessGrid, set_task_identity

    set_task_identity()
    torch.manual_seed(0)
    model = task.model(10)
    w0 = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a ClientApp trains (SE_TORCH_THREADS)
    try:
        local_train(model, x, torch.randint(0, 10, (8,)),
                    TrainingSettings(lr=0.05, local_epochs=1, batch_size=4))
    finally:
        torch.set_num_threads(threads)
    trained = {k: v.numpy() for k, v in model.state_dict().items()}
    update = {k: trained[k] - w0[k] for k in w0}
    assert update["bn.num_batches_tracked"] == 2 and update["bn.running_var"].any()
    grid = InProcessGrid(client_app, 4, {})
    node_of = {p: 1000 + p for p in range(4)}
    recorder = CodedRecorder.create(tmp_path / "h", Federation(node_of, [[0, 1], [2, 3]]),
                                    blocks_per_shard=2, scale_bits=SCALE_BITS)
    for s in (0, 1):
        recorder.put_shard_model(s, 0, w0)
    recorder.end_round(0, grid)
    recorder.put_update(0, 1, 1, update, 8, 0.1)
    for s in (0, 1):
        recorder.put_shard_model(s, 1, trained)
    recorder.end_round(1, grid)
    recorder.mark_complete()
    recorder.close()
    history = CodedHistory.open(tmp_path / "h", grid, node_of)
    _check_decoded(history.shard_model(1, 0), w0)
    _check_decoded(history.update(0, 1, 1), update)
    for key, value in update.items():  # the floats are the fixed point's values
        if value.dtype.kind == "f":
            np.testing.assert_array_equal(history.update(0, 1, 1)[key],
                                          dequantize(quantize(value, SCALE_BITS),
                                                     SCALE_BITS))


@pytest.mark.inprocess
def test_resnet20_runs_through_coded_storage_and_calibration(tmp_path, shared_data):
    from examples.resnet import task
    from server_app.run.context import initial_model

    config = {"task": "examples.resnet:task", "data-dir": str(shared_data),
              "num-clients": 4, "num-shards": 2, "clients-per-round": 4,
              "num-rounds": 2, "local-epochs": 1, "client-samples": 16,
              "test-samples": 50, "batch-size": 8, "forget-clients": "3",
              "frameworks": "SE", "mia": False, "storage": "coded",
              "blocks-per-shard": 2}
    summary, grid = _run(config, tmp_path, "resnet")
    se = summary["frameworks"]["SE"]
    assert se["requests"][0]["rounds_replayed"] >= 1  # calibration rounds ran
    history = CodedHistory.open(tmp_path / "resnet" / "history" / "sharded", grid,
                                {p: 1000 + p for p in range(4)})
    cfg = RunConfig.from_run_config(fused_run_config(config))
    w0 = {k: v.numpy() for k, v in initial_model(cfg, 10).items()}
    batches = math.ceil(16 / 8)  # one local epoch of 16 samples
    for shard in (0, 1):
        _check_decoded(history.shard_model(shard, 0), w0)
        for rnd in history.rounds(shard):
            for pid, _ in history.participants(shard, rnd):
                if pid == 3:  # forgotten: its updates were erased once read
                    with pytest.raises(StoreError, match="client 3 in shard"):
                        history.update(shard, rnd, pid)
                    continue
                update = history.update(shard, rnd, pid)
                counters = [k for k in update if k.endswith("num_batches_tracked")]
                assert len(counters) == 19  # one per BatchNorm layer
                for key in counters:
                    assert update[key].dtype == np.int64 and update[key] == batches
    models = read_arrays(tmp_path / "resnet" / "models" / "SE.npz")
    for key, value in models.items():
        if key.endswith("num_batches_tracked"):
            assert value.dtype == np.int64 and value >= batches
        if key.endswith("running_var"):
            assert np.isfinite(value).all() and (value > 0).all(), key
    assert summary["data"]["dataset"] == "cifar10" and task.name == "cifar10-resnet20"


@pytest.mark.inprocess
def test_digits_runs_through_se_and_fr(tmp_path):
    summary, _ = _run({"task": "examples.digits:task", "partition": "dirichlet",
                       "partition-alpha": 1.0, "num-clients": 8, "num-shards": 2,
                       "clients-per-round": 4, "num-rounds": 3, "local-epochs": 2,
                       "batch-size": 16, "lr": 0.1, "forget-clients": "3",
                       "frameworks": "SE,FR", "mia-samples": 100}, tmp_path, "digits")
    assert summary["data"]["dataset"] == "digits"
    assert summary["learning"]["accuracy"] > 0.5  # chance: 0.1
    assert sorted(summary["frameworks"]) == ["FR", "SE"]
    for result in summary["frameworks"].values():
        assert result["accuracy"] > 0.3 and 0.0 <= result["mia_auc"] <= 1.0


def test_digits_has_no_trigger_and_says_so():
    with pytest.raises(ConfigError, match="'backdoor-trigger'.*no backdoor trigger"):
        validate_run_config(fused_run_config({
            "task": "examples.digits:task", "forget-clients": "3",
            "backdoor-trigger": 2}), files=False)
