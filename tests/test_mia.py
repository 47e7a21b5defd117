"""Tests of audits.mia: the membership inference attack (Shokri 2017)."""

from __future__ import annotations

import numpy as np
import pytest

from audits.audit import with_signal
from audits.mia import (
    Z_95,
    MembershipAttack,
    attack_metrics,
    auc_interval,
    has_signal,
    membership_features,
    mia_report,
)

C = 10


def _proba(labels, p_true, num_classes=C):
    """Softmax-like rows: p_true on the label, the rest spread evenly."""
    labels = np.asarray(labels)
    rest = (1.0 - np.asarray(p_true, dtype=np.float64)) / (num_classes - 1)
    proba = np.repeat(np.expand_dims(rest, -1), num_classes, axis=-1)
    np.put_along_axis(proba, labels[..., None], np.expand_dims(p_true, -1), axis=-1)
    return proba.astype(np.float32)


def _separable(n, seed, member, margin=0.0):
    """Members: p[y] in [0.97, 1]; non-members: p[y] in [0.1, 0.6].

    ``margin`` narrows both ranges, so that fresh samples lie strictly inside
    the clusters the attack was fit on (trees put split thresholds at bin edges
    of the training values, not in the middle of the gap).
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, C, size=n)
    low, high = (0.97, 1.0) if member else (0.1, 0.6)
    p_true = rng.uniform(low + margin, high - margin, n)
    return _proba(labels, p_true), labels


@pytest.fixture(scope="module")
def separable_attack():
    members, nonmembers = _separable(200, 1, True), _separable(150, 2, False)
    return MembershipAttack().fit(*members, *nonmembers, seed=0)


# --- metrics on hand-made cases ------------------------------------------------

def test_attack_metrics_hand_written_vector():
    # TP = 3, FN = 1, FP = 1, TN = 3: precision = recall = F1 = accuracy = 3/4.
    truth = [1, 1, 1, 1, 0, 0, 0, 0]
    predicted = [1, 1, 1, 0, 1, 0, 0, 0]
    m = attack_metrics(truth, predicted)
    assert m == pytest.approx({"f1": 0.75, "precision": 0.75, "recall": 0.75,
                               "accuracy": 0.75})
    # TP = 4, FP = 4: precision 1/2, recall 1, F1 = 2/3 (calling all members).
    m = attack_metrics(truth, [1] * 8, member_score=np.linspace(1, 0, 8))
    assert m["precision"] == pytest.approx(0.5)
    assert m["recall"] == 1.0
    assert m["f1"] == pytest.approx(2 / 3)
    assert m["auc"] == 1.0
    # Nothing called a member: precision, recall and F1 are 0 (no warning).
    m = attack_metrics(truth, [0] * 8)
    assert (m["f1"], m["precision"], m["recall"], m["accuracy"]) == (0, 0, 0, 0.5)


def test_features_classifier_layout():
    proba = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]])
    features = membership_features(proba, np.array([1, 2]))
    assert features.shape == (2, 7) and features.dtype == np.float64
    np.testing.assert_allclose(features[:, :3], [[0.7, 0.2, 0.1], [0.5, 0.25, 0.25]])
    np.testing.assert_array_equal(features[:, 3:6], [[0, 1, 0], [0, 0, 1]])
    np.testing.assert_allclose(features[:, 6], -np.log([0.7, 0.25]))


def test_features_one_hot_has_full_width_for_missing_classes():
    # A non-IID client whose samples are all of class 0 still gets C columns.
    features = membership_features(_proba([0, 0, 0], [0.9, 0.8, 0.7]), [0, 0, 0])
    assert features.shape == (3, 2 * C + 1)
    assert features[:, C:2 * C].sum(axis=0).tolist() == [3] + [0] * (C - 1)


def test_features_sequence_loss_statistics():
    labels = np.array([[0, 1, 2, 3]])
    p_true = np.array([[0.5, 0.25, 1.0, 0.125]])
    features = membership_features(_proba(labels, p_true, num_classes=5), labels)
    loss = -np.log(p_true[0])
    np.testing.assert_allclose(
        features[0], [loss.mean(), loss.min(), loss.max(), loss.std()], rtol=1e-6
    )


def test_separable_attack_scores_derivable(separable_attack):
    # Fresh members vs non-members inside the fitted clusters: all right.
    perfect = separable_attack.score(*_separable(80, 3, True, margin=0.01),
                                     *_separable(120, 4, False, margin=0.1))
    assert perfect == pytest.approx({"f1": 1.0, "precision": 1.0, "recall": 1.0,
                                     "accuracy": 1.0, "auc": 1.0,
                                     "n_target": 80, "n_heldout": 80})
    # A model that forgot the target: its outputs look like held-out data, so
    # nothing is called a member: recall 0, precision 0 (by convention), F1 0.
    forgot = separable_attack.score(*_separable(50, 5, False, margin=0.1),
                                    *_separable(50, 6, False, margin=0.1))
    assert (forgot["f1"], forgot["precision"], forgot["recall"]) == (0, 0, 0)
    assert forgot["accuracy"] == 0.5
    assert (forgot["n_target"], forgot["n_heldout"]) == (50, 50)


def test_score_is_seeded(separable_attack):
    rng = np.random.default_rng(7)
    labels = rng.integers(0, C, 300)
    target = (_proba(labels[:100], rng.uniform(0.4, 1.0, 100)), labels[:100])
    heldout = (_proba(labels[100:], rng.uniform(0.4, 1.0, 200)), labels[100:])
    first = separable_attack.score(*target, *heldout)
    assert first == separable_attack.score(*target, *heldout, seed=0)
    assert first["n_target"] == first["n_heldout"] == 100


def test_mia_report_scores_each_model(separable_attack):
    labels_t, labels_h = np.arange(40) % C, np.arange(60) % C
    remembered = _proba(labels_t, np.full(40, 0.99))
    forgotten = _proba(labels_t, np.full(40, 0.3))
    heldout = _proba(labels_h, np.full(60, 0.3))
    report = mia_report(separable_attack, {"original": (remembered, heldout),
                                           "retrained": (forgotten, heldout)},
                        labels_t, labels_h)
    assert list(report) == ["original", "retrained"]
    assert report["original"]["f1"] == 1.0
    assert report["retrained"]["f1"] == 0.0
    assert report["original"]["n_target"] == 40


def test_sequence_attack_separates_low_loss_blocks():
    rng = np.random.default_rng(0)

    def blocks(n, low, high, t=8, v=6):
        labels = rng.integers(0, v, size=(n, t))
        return _proba(labels, rng.uniform(low, high, (n, t)), num_classes=v), labels

    attack = MembershipAttack().fit(*blocks(60, 0.7, 1.0), *blocks(60, 0.05, 0.6, t=5))
    assert attack.sequence_ and attack.num_classes_ == 6
    m = attack.score(*blocks(40, 0.7, 1.0), *blocks(40, 0.05, 0.6))
    assert m["f1"] > 0.95


# --- validation ----------------------------------------------------------------

def _good(n=20):
    return _separable(n, 11, True)


@pytest.mark.parametrize("proba, labels, match", [
    (np.zeros((0, C), np.float32), np.zeros(0, np.int64), r"member_proba is empty"),
    (_proba([0, 1], [1.0, 1.0], num_classes=2)[:, :1], np.array([0, 0]),
     r"member_proba has fewer than 2 classes.*\(2, 1\)"),
    (np.ones((4, C), np.int64), np.zeros(4, np.int64), r"member_proba.*dtype int64"),
    (np.ones((4,), np.float32), np.zeros(4, np.int64), r"member_proba.*shape \(4,\)"),
    (np.full((4, C), 2.0), np.zeros(4, np.int64), r"member_proba.*\[0, 1\]"),
    (np.full((4, C), 0.5), np.zeros(4, np.int64), r"member_proba.*sum to 1"),
    (np.full((4, C), np.nan), np.zeros(4, np.int64), r"member_proba.*NaN"),
    (_good()[0], np.zeros(19, np.int64), r"member_labels must have shape \(20,\).*\(19,\)"),
    (_good()[0], np.zeros(20, np.float64), r"member_labels.*integer.*float64"),
    (_good()[0], np.full(20, C), r"member_labels.*\[0, 10\)"),
])
def test_fit_rejects_bad_members(proba, labels, match):
    with pytest.raises(ValueError, match=match):
        MembershipAttack().fit(proba, labels, *_good())


def test_fit_rejects_mismatched_members_and_nonmembers():
    labels = np.arange(20) % 5
    with pytest.raises(ValueError, match=r"nonmember_proba \(20, 5\)"):
        MembershipAttack().fit(*_good(), _proba(labels, np.full(20, 0.5), 5), labels)


def test_score_rejects_other_kinds_and_bad_input(separable_attack):
    labels = np.arange(20) % 5
    with pytest.raises(ValueError, match=r"proba_target has shape \(20, 5\)"):
        separable_attack.score(_proba(labels, np.full(20, 0.5), 5), labels, *_good())
    seq_labels = np.zeros((20, 3), np.int64)
    with pytest.raises(ValueError, match=r"proba_heldout has shape \(20, 3, 10\)"):
        separable_attack.score(*_good(), _proba(seq_labels, np.full((20, 3), 0.5)),
                               seq_labels)
    with pytest.raises(ValueError, match=r"labels_heldout must have shape \(20,\)"):
        separable_attack.score(*_good(), _good()[0], np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"models_proba is empty"):
        mia_report(separable_attack, {}, *_good())


def test_attack_metrics_rejects_mismatched_vectors():
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(2,\)"):
        attack_metrics([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="non-empty"):
        attack_metrics([], [])


def test_unfitted_and_unknown_classifier():
    with pytest.raises(RuntimeError, match="not fitted"):
        MembershipAttack().score(*_good(), *_good())
    with pytest.raises(ValueError, match="classifier must be one of"):
        MembershipAttack("svm")
    with pytest.raises(ValueError, match="n_threads"):
        MembershipAttack(n_threads=0)


# --- a real overfit model ---------------------------------------------------------

N_TRAIN = 300  # training images of each MLP
EPOCHS = 300   # full-batch Adam steps: training loss ~5e-4, test accuracy ~0.84


@pytest.fixture(scope="module")
def mnist_outputs(shared_data):
    """Softmax outputs of an overfit MLP (A) and one trained on other images (B).

    A is trained on 300 MNIST training images (the members), B on a disjoint
    300; held-out samples are 300 MNIST test images. Returns the outputs of A
    and B on A's members and on the held-out images, and their labels.
    """
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train = torchvision.datasets.MNIST(root=str(shared_data), train=True,
                                           download=False)
        test = torchvision.datasets.MNIST(root=str(shared_data), train=False,
                                          download=False)
        gen = torch.Generator().manual_seed(0)
        order = torch.randperm(len(train), generator=gen)
        members, others = order[:N_TRAIN], order[N_TRAIN:2 * N_TRAIN]
        heldout = torch.randperm(len(test), generator=gen)[:N_TRAIN]
        x = train.data.float().div(255).reshape(-1, 784)
        x_test = test.data.float().div(255).reshape(-1, 784)

        def fit_mlp(index):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                        torch.nn.Linear(128, 10))
            optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
            for _ in range(EPOCHS):
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x[index]),
                                                         train.targets[index])
                loss.backward()
                optimizer.step()
            return model

        def proba(model, inputs):
            with torch.no_grad():
                return torch.softmax(model(inputs), dim=1).numpy()

        original, other = fit_mlp(members), fit_mlp(others)
        return {
            "original": (proba(original, x[members]), proba(original, x_test[heldout])),
            "never_trained": (proba(other, x[members]), proba(other, x_test[heldout])),
            "labels": (train.targets[members].numpy(), test.targets[heldout].numpy()),
        }
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_attack_on_overfit_model(mnist_outputs):
    half = N_TRAIN // 2
    member_p, heldout_p = mnist_outputs["original"]
    member_y, heldout_y = mnist_outputs["labels"]
    # Fit on half the members vs half the held-out images (original model).
    attack = MembershipAttack().fit(member_p[:half], member_y[:half],
                                    heldout_p[:half], heldout_y[:half], seed=0)
    # Score the other halves, through the original and a never-trained model.
    # Measured (seed 0): original F1 0.71 (AUC 0.80); never-trained F1 0.40
    # (AUC 0.49). Over data/model seeds 0-5 original F1 0.68-0.77 (std 0.03),
    # never-trained F1 0.37-0.47, AUC 0.46-0.54.
    report = mia_report(attack, {
        name: (target[half:], heldout[half:])
        for name, (target, heldout) in mnist_outputs.items() if name != "labels"
    }, member_y[half:], heldout_y[half:])
    original, never = report["original"], report["never_trained"]
    assert original["n_target"] == original["n_heldout"] == N_TRAIN - half
    assert original["f1"] > 0.6
    assert original["auc"] > 0.7
    assert never["f1"] < original["f1"] - 0.1
    assert abs(never["auc"] - 0.5) < 0.12


# --- does the audit have signal: the AUC's 95% interval ---------------------------
@pytest.mark.parametrize("n_members, n_nonmembers", [(600, 600), (50, 200), (1, 1)])
def test_auc_interval_at_chance_is_the_mann_whitney_null_width(n_members, n_nonmembers):
    # at A = 0.5, Var(AUC) = (n_m + n_n + 1) / (12 n_m n_n) (Mann-Whitney U / n_m n_n)
    half = Z_95 * np.sqrt((n_members + n_nonmembers + 1) / (12 * n_members * n_nonmembers))
    low, high = auc_interval(0.5, n_members, n_nonmembers)
    assert low == pytest.approx(max(0.0, 0.5 - half))
    assert high == pytest.approx(min(1.0, 0.5 + half))


def test_auc_interval_matches_the_spread_of_auc_over_seeded_draws():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    n, shift = 100, 0.8  # members' scores N(0.8, 1), non-members' N(0, 1): AUC ~0.71
    truth = np.r_[np.ones(n), np.zeros(n)]
    aucs = [roc_auc_score(truth, np.r_[rng.normal(shift, 1, n), rng.normal(0, 1, n)])
            for _ in range(400)]
    low, high = auc_interval(float(np.mean(aucs)), n, n)
    assert (high - low) / (2 * Z_95) == pytest.approx(np.std(aucs), rel=0.15)


@pytest.mark.parametrize("auc, n_members, n_nonmembers, signal", [
    (0.4888, 600, 600, False),  # the default run's original model: 0.456-0.521
    (0.55, 600, 600, True),     # 0.518-0.582: above chance with 600 a side ...
    (0.55, 50, 50, False),      # ... but not with 50 (0.437-0.663)
    (0.79, 200, 200, True),     # an overfit model (presets/memorize.toml's scale)
    (0.2, 600, 600, False),     # below chance: no evidence of memorisation
    (1.0, 5, 5, True),          # perfect separation: the interval is [1, 1]
    (0.5, 1, 1, False),
])
def test_has_signal_only_when_the_interval_lies_above_chance(auc, n_members,
                                                              n_nonmembers, signal):
    assert has_signal(auc, n_members, n_nonmembers) is signal
    assert (auc_interval(auc, n_members, n_nonmembers)[0] > 0.5) is signal


@pytest.mark.parametrize("args, match", [
    ((1.2, 10, 10), "auc = 1.2"), ((float("nan"), 10, 10), "auc = nan"),
    ((0.6, 0, 10), "sample counts 0, 10"), ((0.6, 10, 10, 0.0), "z = 0.0"),
])
def test_auc_interval_rejects_bad_input_naming_it(args, match):
    with pytest.raises(ValueError, match=match):
        auc_interval(*args)


def test_with_signal_gives_every_model_its_interval_and_the_original_the_verdict():
    results = with_signal({
        "original": {"auc": 0.4888, "f1": 0.54, "n_target": 600, "n_heldout": 600},
        "SE": {"auc": 0.60, "f1": 0.6, "n_target": 600, "n_heldout": 600},
        "FR": {"auc": 0.5, "f1": 0.5},  # no counts: left as it is
    })
    original, se = results["original"], results["SE"]
    assert original["signal"] is False and "signal" not in se
    assert original["auc_low"] < 0.5 < original["auc_high"]
    assert 0.5 < se["auc_low"] < 0.60 < se["auc_high"]
    assert results["FR"] == {"auc": 0.5, "f1": 0.5}
    assert with_signal({"original": {"auc": 0.79, "n_target": 200,
                                     "n_heldout": 200}})["original"]["signal"] is True
