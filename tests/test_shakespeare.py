"""Tiny Shakespeare end to end, and the local optimizer option (issue 5)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from server_app.config import ConfigError, RunConfig
from task.builtin import build_model
from task.train import fisher_preconditioner, local_train
from task.training_settings import TrainingSettings

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PRESET = tomllib.loads(
    (Path(__file__).resolve().parents[1] / "presets" / "shakespeare.toml").read_text())
LN_VOCAB = math.log(65)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_preset_is_valid_and_keeps_the_default_length():
    cfg = RunConfig.from_run_config(PRESET)
    assert cfg.data.dataset == "shakespeare" and cfg.training.optimizer == "adam"
    default = RunConfig()
    assert (cfg.training.num_rounds, cfg.training.local_epochs) == (
        default.training.num_rounds, default.training.local_epochs)


def test_tiny_run_learns_and_unlearns(run_server):
    summary, grid = run_server({
        "dataset": "shakespeare", "num-clients": 6, "num-shards": 2,
        "clients-per-round": 4, "num-rounds": 2, "local-epochs": 1,
        "client-samples": 24, "test-samples": 40, "forget-clients": "1",
        "mia-samples": 48, "optimizer": PRESET["optimizer"], "lr": PRESET["lr"],
        "batch-size": PRESET["batch-size"]})
    learning = summary["learning"]
    assert summary["config"]["optimizer"] == "adam"
    assert np.isfinite(learning["loss"]) and learning["loss"] < LN_VOCAB - 0.3
    losses = [r["loss"] for r in learning["rounds"]]
    assert losses[-1] < losses[0]
    assert learning["perplexity"] == pytest.approx(math.exp(learning["loss"]))
    frameworks = summary["frameworks"]
    assert set(frameworks) == {"SE", "FR", "FE", "RR", "SISA"}  # the defaults
    for name, result in frameworks.items():
        assert np.isfinite(result["loss"]) and result["loss"] < LN_VOCAB, name
        assert result["perplexity"] == pytest.approx(math.exp(result["loss"])), name
    # SE retrains one shard of two (L / r epochs, the last round L): fewer
    # client-epochs than FR
    assert frameworks["SE"]["client_epochs"] < frameworks["FR"]["client_epochs"]
    # the calibrated shard (Adam directions, stored magnitudes) stays a good model
    assert frameworks["SE"]["loss"] < summary["original"]["loss"] + 0.3
    assert "mia_f1" in summary["original"]
    sent = {kind for _, kind in grid.sent}
    assert {"train", "train.unlearn"} <= sent


def _text_data(n=16, t=16):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 65, (n, t), generator=g)
    return x, torch.roll(x, -1, dims=1)


def _trained(optimizer, transform=None, seed=0):
    x, y = _text_data()
    torch.manual_seed(0)
    model = build_model("shakespeare", 65, block_size=16)
    if transform is not None:
        transform = fisher_preconditioner(model, x, y, samples=4, seed=seed)
    settings = TrainingSettings(lr=0.01, local_epochs=1, batch_size=4, momentum=0.5,
                                optimizer=optimizer)
    result = local_train(model, x, y, settings, seed=seed, grad_transform=transform)
    return model, result


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_adam_differs_from_sgd_and_is_seeded():
    adam, r1 = _trained("adam")
    again, _ = _trained("adam")
    sgd, _ = _trained("sgd")
    assert r1.steps == 4
    assert torch.equal(_flat(adam), _flat(again))
    assert not torch.allclose(_flat(adam), _flat(sgd))


def test_fisher_preconditioning_acts_on_adam_steps():
    torch.manual_seed(0)
    start = _flat(build_model("shakespeare", 65, block_size=16))
    plain, _ = _trained("adam")
    fisher, _ = _trained("adam", transform=True)
    d_plain, d_fisher = _flat(plain) - start, _flat(fisher) - start
    # Adam cancels a fixed rescaling of the gradient, so P acts on the step
    assert torch.isfinite(d_fisher).all()
    assert not torch.allclose(d_plain, d_fisher)


def test_bad_optimizer_is_refused():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"optimizer": "rmsprop"})
    message = str(err.value)
    assert "'optimizer'" in message and "rmsprop" in message and "adam" in message
    x, y = _text_data()
    with pytest.raises(ValueError, match="optimizer"):
        local_train(build_model("shakespeare", 65, block_size=16), x, y,
                    TrainingSettings(lr=0.01, local_epochs=1, batch_size=4,
                                     optimizer="rmsprop"))
