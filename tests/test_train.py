import torch

from task.model import build_model
from task.train import fisher_preconditioner, local_train, score_proba


def data(n=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 255, (n, 1, 28, 28), generator=g, dtype=torch.uint8),
            torch.randint(0, 10, (n,), generator=g))


def test_local_train_is_seeded_and_counts_fractional_epochs():
    x, y = data()
    torch.manual_seed(0)
    a = build_model("mnist", 10)
    b = build_model("mnist", 10)
    b.load_state_dict(a.state_dict())
    ra = local_train(a, x, y, epochs=0.5, batch_size=16, lr=0.1, seed=3)
    rb = local_train(b, x, y, epochs=0.5, batch_size=16, lr=0.1, seed=3)
    assert rb.steps == ra.steps
    assert ra.steps == 2 and ra.epochs == 0.5
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k


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
