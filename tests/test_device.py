"""Run-config ``device`` and ``client-gpus``: the CPU unchanged, CUDA refused without one.

No test needs a GPU: CUDA's presence is patched where a test needs it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cli.simulation import check_client_gpus, federation_config
from server_app.config import ConfigError
from server_app.preflight import validate_run_config
from task.config import TaskConfig, default_run_config
from task.device import check_device, resolve_device
from task.train import fisher_preconditioner, local_train, predict_proba
from task.training_settings import TrainingSettings


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_auto_is_the_cpu_without_cuda(no_cuda):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert TaskConfig.from_run_config(default_run_config()).device == "auto"


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_is_one_line_before_any_engine(no_cuda, spec):
    with pytest.raises(ConfigError) as err:
        validate_run_config({"device": spec}, files=False)
    message = str(err.value)
    assert "\n" not in message and "'device'" in message and "not available" in message


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:-1", "cpu:0", ""])
def test_malformed_device_is_refused(spec):
    with pytest.raises(ValueError, match="'device'.*auto, cpu, cuda, cuda:N"):
        check_device(spec)


def test_cuda_with_a_gpu_names_the_devices_there_are(one_gpu):
    check_device("cuda")
    check_device("cuda:0")
    assert resolve_device("auto") == torch.device("cuda")
    with pytest.raises(ValueError, match="has 1 CUDA device"):
        check_device("cuda:1")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def test_the_cpu_device_gives_the_results_of_no_device():
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (40,), generator=torch.Generator().manual_seed(2))
    runs = []
    for device in (None, "cpu", torch.device("cpu")):
        model = _model()
        transform = fisher_preconditioner(model, x, y, samples=8, seed=3, device=device)
        result = local_train(model, x, y, TrainingSettings(
            lr=0.1, local_epochs=1.5, batch_size=16, momentum=0.5), seed=4,
            grad_transform=transform, device=device)
        runs.append((result.loss, model.state_dict(), predict_proba(model, x,
                                                                     device=device)))
    for loss, state, proba in runs[1:]:
        assert loss == runs[0][0]
        assert all(torch.equal(state[k], runs[0][1][k]) for k in state)
        assert (proba == runs[0][2]).all()


def test_client_gpus_reach_flwr_and_are_refused_without_cuda(no_cuda, monkeypatch):
    assert federation_config(8) == "num-supernodes=8 client-resources-num-cpus=1"
    assert federation_config(8, 0.25).endswith("client-resources-num-gpus=0.25")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match="'client-gpus' = 0.5"):
        check_client_gpus(0.5)
    check_client_gpus(0.0)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # the GPUs may be there
    check_client_gpus(0.5)
    with pytest.raises(ConfigError, match="'client-gpus'"):
        validate_run_config({"client-gpus": -1.0}, files=False)


def test_the_fisher_estimate_leaves_batchnorm_buffers_alone():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(20, 6), torch.randint(0, 3, (20,))
    fisher_preconditioner(model, x, y, samples=5, seed=0)  # batches of one sample
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert model.training and model[1].training
