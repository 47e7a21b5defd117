"""Tests of task.model and task.nanogpt."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from task.builtin import build_model
from task.model import CNN
from task.nanogpt import CharGPT, GPTConfig
from task.tasks import cifar10


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models train fastest (and steadiest on a busy machine) on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _only_parameters(model: torch.nn.Module) -> None:
    params = dict(model.named_parameters())
    state = model.state_dict()
    assert list(state) == list(params)
    assert all(p.requires_grad for p in params.values())
    assert not list(model.buffers())


@pytest.mark.parametrize("dataset, shape, n_params", [
    ("mnist", (1, 28, 28), 80_202),
    ("fmnist", (1, 28, 28), 80_202),
    ("cifar10", (3, 32, 32), 259_914),
])
def test_cnn_shapes_and_state_dict(dataset, shape, n_params):
    torch.manual_seed(0)
    model = build_model(dataset, 10)
    assert isinstance(model, CNN)
    images = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
    logits = model(images)
    assert logits.shape == (5, 10) and logits.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == n_params
    _only_parameters(model)
    # Float input in [0, 1] means the same as uint8 / 255.
    assert torch.allclose(model(images.float() / 255), logits, atol=1e-5)


def test_cnn_normalisation():
    mean, std = cifar10.NORMALISATION
    model = CNN(3, 32, 10, mean, std, channels=(4, 8), hidden=16)
    images = torch.full((1, 3, 32, 32), 255, dtype=torch.uint8)
    out = model.normalise(images)
    expected = [(1 - m) / s for m, s in zip(mean, std, strict=True)]
    assert torch.allclose(out[0, :, 0, 0], torch.tensor(expected))
    assert isinstance(model.mean[0], float)
    with pytest.raises(ValueError, match="mean has 2 values"):
        CNN(3, 32, 10, (0.5, 0.5), 0.2)
    with pytest.raises(ValueError, match="image_size=8"):
        CNN(1, 8, 10, 0.1, 0.3)


def test_cnn_learns():
    torch.manual_seed(0)
    model = build_model("mnist", 10)
    y = torch.arange(32) % 10
    x = torch.randint(0, 60, (32, 1, 28, 28), dtype=torch.uint8)
    for i, label in enumerate(y.tolist()):  # a bright bar in a class-specific row
        x[i, 0, 2 + 2 * label : 4 + 2 * label, 4:24] = 255
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        loss = functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_build_model_errors_and_overrides():
    with pytest.raises(ValueError, match="dataset='svhn'"):
        build_model("svhn", 10)
    small = build_model("mnist", 10, channels=(2, 4), hidden=8)
    assert small.fc1.out_features == 8


# ---------------------------------------------------------------- CharGPT


def test_chargpt_shapes_and_state_dict():
    torch.manual_seed(0)
    model = build_model("shakespeare", 65)
    assert isinstance(model, CharGPT)
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size) == (4, 4, 16, 64)
    assert not cfg.tie_weights
    idx = torch.randint(0, 65, (3, 64))
    logits = model(idx)
    assert logits.shape == (3, 64, 65) and logits.dtype == torch.float32
    assert model(idx[:, :10]).shape == (3, 10, 65)
    assert sum(p.numel() for p in model.parameters()) == 16_256
    _only_parameters(model)
    with pytest.raises(ValueError, match="exceeds block_size=64"):
        model(torch.zeros(1, 65, dtype=torch.int64))


def test_chargpt_is_causal():
    torch.manual_seed(0)
    model = CharGPT(GPTConfig(vocab_size=65)).eval()
    idx = torch.randint(0, 65, (2, 64))
    changed = idx.clone()
    changed[:, 40] = (changed[:, 40] + 7) % 65
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.equal(a[:, :40], b[:, :40])
    assert not torch.allclose(a[:, 40:], b[:, 40:])


def test_chargpt_tied_head():
    model = CharGPT(GPTConfig(vocab_size=65, tie_weights=True))
    assert model.lm_head.weight is model.wte.weight
    assert sum(p.numel() for p in model.parameters()) == 16_256 - 65 * 16


def test_chargpt_learns():
    torch.manual_seed(0)
    model = CharGPT(GPTConfig(vocab_size=10, block_size=16))
    idx = torch.arange(16).remainder(10).repeat(8, 1)
    target = (idx + 1) % 10
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    for _ in range(60):
        opt.zero_grad()
        loss = functional.cross_entropy(model(idx).flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
    assert loss.item() < 0.5


@pytest.mark.parametrize("kwargs, message", [
    ({"n_embd": 10, "n_head": 4}, "divisible"),
    ({"vocab_size": 0}, "vocab_size=0"),
    ({"dropout": 1.0}, "dropout=1.0"),
])
def test_gptconfig_errors(kwargs, message):
    args = {"vocab_size": 65, **kwargs}
    with pytest.raises(ValueError, match=message):
        GPTConfig(**args)
