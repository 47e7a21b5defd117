import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from task.builtin import build_model
from task.train import (
    epoch_schedule,
    fisher_preconditioner,
    local_train,
    score_proba,
)
from task.training_settings import TrainingSettings


def data(n=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 255, (n, 1, 28, 28), generator=g, dtype=torch.uint8),
            torch.randint(0, 10, (n,), generator=g))


class Recorder(nn.Module):
    """A linear classifier on one feature that records the sample ids it is fed."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1, 3)
        self.seen: list[list[int]] = []

    def forward(self, x):
        self.seen.append([int(v) for v in x[:, 0]])
        return self.fc(x)


def recorded(n, epochs, batch_size, seed=0):
    """(TrainResult, the ids of every mini-batch) of a run over samples 0..n-1."""
    model = Recorder()
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
    result = local_train(model, x, torch.arange(n) % 3, TrainingSettings(
        lr=0.01, local_epochs=epochs, batch_size=batch_size), seed=seed)
    return result, model.seen


def test_local_train_is_seeded_and_counts_fractional_epochs():
    x, y = data()
    torch.manual_seed(0)
    a = build_model("mnist", 10)
    b = build_model("mnist", 10)
    b.load_state_dict(a.state_dict())
    settings = TrainingSettings(lr=0.1, local_epochs=0.5, batch_size=16)
    ra = local_train(a, x, y, settings, seed=3)
    rb = local_train(b, x, y, settings, seed=3)
    assert (rb.loss, rb.steps, rb.epochs, rb.samples) == \
        (ra.loss, ra.steps, ra.epochs, ra.samples)
    assert ra.steps == 2 and ra.epochs == 0.5 and ra.samples == 32
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k


def test_a_client_smaller_than_its_batch_makes_every_pass():
    # 10 samples, batch 32, 2 epochs: two passes of one batch of 10 (was 1 step, 3.2)
    result, seen = recorded(10, 2, 32)
    assert result.steps == 2 and result.epochs == 2.0 and result.samples == 20
    assert [sorted(b) for b in seen] == [list(range(10))] * 2
    assert seen[0] != seen[1]  # a fresh order every pass


def test_one_epoch_is_one_pass_with_a_smaller_last_batch():
    # 200 samples, batch 32, 1 epoch: 6 x 32 + 8 (was 7 x 32 = 224 samples, 1.12)
    result, seen = recorded(200, 1, 32)
    assert result.steps == 7 and result.epochs == 1.0 and result.samples == 200
    assert [len(b) for b in seen] == [32] * 6 + [8]
    assert sorted(i for b in seen for i in b) == list(range(200))


@pytest.mark.parametrize("n, epochs, batch, sizes, exact", [
    (10, 1.5, 32, [10, 5], 1.5),            # a full pass, then half of one
    (200, 1.5, 32, [32] * 6 + [8] + [32] * 3 + [4], 1.5),
    (64, 0.5, 16, [16, 16], 0.5),           # L / r = 2 / 4
    (7, 2 / 3, 2, [2, 2, 1], 5 / 7),        # round(14 / 3) = 5 samples
    (3, 0.1, 32, [1], 1 / 3),               # round(0.3) = 0: at least one sample
    (10, 1 - 1e-12, 4, [4, 4, 2], 1.0),     # float round-off of an integer L / r
    (10, 2 + 1e-12, 32, [10, 10], 2.0),
])
def test_fractional_epochs_end_with_a_partial_pass(n, epochs, batch, sizes, exact):
    assert epoch_schedule(n, epochs, batch) == sizes
    result, seen = recorded(n, epochs, batch)
    assert [len(b) for b in seen] == sizes
    assert result.steps == len(sizes) and result.epochs == exact
    full = math.floor(exact)
    for p in range(full):  # every whole pass sees every sample once
        done = sum(sizes[:p * math.ceil(n / batch)])
        ids = [i for b in seen for i in b][done:done + n]
        assert sorted(ids) == list(range(n))
    partial = [i for b in seen for i in b][full * n:]
    assert len(set(partial)) == len(partial)  # a partial pass repeats no sample


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 500), batch=st.integers(1, 64),
       epochs=st.one_of(st.integers(1, 5), st.floats(0.01, 5.0)))
def test_schedule_sees_exactly_the_samples_asked_for(n, batch, epochs):
    sizes = epoch_schedule(n, epochs, batch)
    full = math.floor(epochs)
    rest = epochs - full
    want = full * n + (max(1, round(rest * n)) if rest > 1e-9 else 0)
    assert sum(sizes) == want and all(1 <= s <= batch for s in sizes)
    # full passes: ceil(n / batch) steps each
    assert sizes[:full * math.ceil(n / batch)] == \
        [min(batch, n - i) for i in range(0, n, batch)] * full


def test_same_seed_same_order_other_seed_other_order():
    _, a = recorded(50, 1.5, 8, seed=4)
    _, b = recorded(50, 1.5, 8, seed=4)
    _, c = recorded(50, 1.5, 8, seed=5)
    assert a == b and a != c


@pytest.mark.parametrize("n, epochs, batch", [
    (0, 1, 32), (10, 0, 32), (10, -1, 32), (10, float("nan"), 32),
    (10, float("inf"), 32), (10, 1, 0)])
def test_bad_schedules_are_refused(n, epochs, batch):
    with pytest.raises(ValueError, match="must be positive and finite"):
        epoch_schedule(n, epochs, batch)


def test_client_app_reports_the_epochs_it_made(make_grid, shared_data):
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    grid = make_grid(1, {"dataset": "mnist", "num-clients": 8, "client-samples": 10,
                         "data-dir": str(shared_data)})
    torch.manual_seed(0)
    arrays = ArrayRecord(build_model("mnist", 10).state_dict())
    for epochs, want in ((2, 2.0), (0.5, 0.5)):
        config = ConfigRecord({"lr": 0.05, "local-epochs": epochs, "batch-size": 32})
        message = Message(RecordDict({"arrays": arrays, "config": config}),
                          dst_node_id=1000, message_type="train")
        metrics = grid.send_and_receive([message])[0].content["metrics"]
        assert metrics["local-epochs"] == want and metrics["num-examples"] == 10


def test_fisher_preconditioner_scales_lie_in_0_2():
    x, y = data()
    torch.manual_seed(0)
    model = build_model("mnist", 10)
    transform = fisher_preconditioner(model, x, y, samples=8, damping=1.0)
    grads = [torch.ones_like(p) for p in model.parameters()]
    transform(grads)
    for g in grads:
        assert float(g.min()) > 0 and float(g.max()) <= 2.0 + 1e-6


def test_score_proba_by_hand():
    import numpy as np

    proba = np.array([[0.5, 0.5], [0.9, 0.1]])
    loss, acc = score_proba(proba, np.array([1, 0]))
    assert acc == 0.5
    assert abs(loss - (-(np.log(0.5) + np.log(0.9)) / 2)) < 1e-9
