"""Membership inference attack on a model's softmax outputs.

The attack of Shokri et al., "Membership Inference Attacks Against Machine
Learning Models" (IEEE S&P 2017), in the form unlearning papers use to audit
forgetting (Sharding Eraser, IJCAI 2024, Sec. 5): a binary attack classifier is
trained on the ORIGINAL model's outputs for samples known to be members
(training samples of retained clients) and non-members (held-out test samples).
It is then applied to a model's outputs on the forgotten clients' training data
(the target) and on as many other held-out samples. We use the original model
itself in place of Shokri's shadow models: the server has it and knows which
samples trained it.

F1 here is the F1 score of the positive class "member". With balanced target
and held-out sets, an attack guessing at random with member rate q has
precision 0.5, recall q and F1 = q / (q + 0.5): 0.5 at q = 0.5, 0.67 when it
calls everything a member, and towards 0 when it calls everything a non-member.
After unlearning the target should look like held-out data, so F1 should fall
towards (or below) 0.5; a high F1 means the model still remembers the target.

Features (one row per sample):

- classifiers, ``proba`` (N, C): the softmax vector sorted in descending order
  (C values), the one-hot true label (C values, built from C so that a non-IID
  client missing classes still gets the full width), and the loss -log p[y]
  (2 C + 1 features);
- the character model, ``proba`` (N, T, V) with targets (N, T): the mean, min,
  max and standard deviation over the T positions of the per-character loss
  -log p[t, y_t] (4 features).

numpy and scikit-learn only; no Flower, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import (
    accuracy_score,
    f1_score,
    precision_score,
    recall_score,
    roc_auc_score,
)
from threadpoolctl import threadpool_limits

from task.membership import (  # noqa: F401 - re-exported: the audit's features
    PROBA_FLOOR,
    SUM_TOLERANCE,
    check_labels,
    check_proba,
    membership_features,
)

CLASSIFIERS = ("hgb",)


def _balanced(n_first: int, n_second: int, rng: np.random.Generator):
    """Index arrays taking min(n_first, n_second) samples from each side."""
    n = min(n_first, n_second)
    first = np.sort(rng.choice(n_first, size=n, replace=False))
    second = np.sort(rng.choice(n_second, size=n, replace=False))
    return first, second


def attack_metrics(is_member, predicted_member, member_score=None) -> dict:
    """Scores of membership predictions; the positive class is "member".

    Parameters
    ----------
    is_member : array_like, bool or {0, 1}, shape (N,)
        Ground truth: 1 for a member (target) sample, 0 for a held-out one.
    predicted_member : array_like, bool or {0, 1}, shape (N,)
        The attack's decisions.
    member_score : array_like, float, shape (N,), optional
        The attack's member probability; adds the threshold-free ``auc``.

    Returns
    -------
    dict
        ``f1``, ``precision``, ``recall``, ``accuracy`` (floats in [0, 1];
        precision is 0 when nothing is called a member), and ``auc`` (ROC AUC,
        only with ``member_score`` and both classes present).

    Raises
    ------
    ValueError
        If the two vectors are empty, not 1-D, or of different shapes.
    """
    truth = np.asarray(is_member).astype(np.int64)
    predicted = np.asarray(predicted_member).astype(np.int64)
    if truth.ndim != 1 or truth.shape != predicted.shape or truth.size == 0:
        raise ValueError(
            f"is_member and predicted_member must be non-empty and of the same "
            f"shape (N,), got shapes {truth.shape} and {predicted.shape}"
        )
    metrics = {
        "f1": float(f1_score(truth, predicted, pos_label=1, zero_division=0.0)),
        "precision": float(
            precision_score(truth, predicted, pos_label=1, zero_division=0.0)
        ),
        "recall": float(recall_score(truth, predicted, pos_label=1, zero_division=0.0)),
        "accuracy": float(accuracy_score(truth, predicted)),
    }
    if member_score is not None and 0 < truth.sum() < truth.size:
        metrics["auc"] = float(roc_auc_score(truth, np.asarray(member_score)))
    return metrics


class MembershipAttack:
    """A membership classifier trained on the original model's outputs.

    Parameters
    ----------
    classifier : {"hgb"}
        The attack model: scikit-learn's ``HistGradientBoostingClassifier``.
        Boosted trees, because the member signal is a threshold on the loss that
        depends on the true class, which trees find without feature scaling or a
        log transform of tiny losses (an overfit model's member losses are
        1e-5 .. 1e-3 nats). On an overfit MNIST MLP its AUC was about 0.79,
        against 0.70 for a single global loss threshold and 0.72 for a logistic
        regression on standardized features (measured when this was chosen; the
        other classifiers were then removed as unused).
    n_threads : int or None
        Threads (OpenMP and BLAS) used while fitting and predicting; ``None``
        leaves the libraries' default (all cores). The default 1 is fastest
        for the few thousand samples an attack sees, and avoids OpenMP
        oversubscription on a busy machine (there, all-cores fits of a few
        hundred samples took over 10 s instead of under 1 s).
    features : callable
        ``features(proba, labels) -> (N, F)`` attack features of checked outputs:
        the task's (:attr:`task.interface.Task.membership`), by default
        :func:`membership_features`.

    Attributes
    ----------
    num_classes_ : int
        C (classifiers) or V (character model) seen by ``fit``.
    sequence_ : bool
        Whether ``fit`` saw (N, T, V) character-model outputs.
    n_fit_ : int
        Samples per class the attack was trained on (after balancing).
    seed_ : int
        The seed given to ``fit``; the default seed of ``score``.
    """

    def __init__(self, classifier: str = "hgb", n_threads: int | None = 1,
                 features: Callable[[np.ndarray, np.ndarray], np.ndarray]
                 = membership_features) -> None:
        if classifier not in CLASSIFIERS:
            raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {classifier!r}")
        if n_threads is not None and n_threads < 1:
            raise ValueError(f"n_threads must be None or >= 1, got {n_threads}")
        self.classifier = classifier
        self.n_threads = n_threads
        self.features = features
        self.model_ = None

    def _threads(self):
        if self.n_threads is None:
            return nullcontext()
        return threadpool_limits(limits=self.n_threads)

    def _new_model(self, seed: int):
        return HistGradientBoostingClassifier(
            max_iter=100, learning_rate=0.1, max_leaf_nodes=15, min_samples_leaf=10,
            l2_regularization=1.0, early_stopping=False, random_state=seed)

    def _checked_features(self, proba, labels, proba_name: str, labels_name: str):
        proba = check_proba(proba, proba_name)
        labels = check_labels(labels, proba, labels_name, proba_name)
        if self.model_ is not None:
            sequence = proba.ndim == 3
            if sequence != self.sequence_ or proba.shape[-1] != self.num_classes_:
                expected = "(N, T, V)" if self.sequence_ else "(N, C)"
                raise ValueError(
                    f"{proba_name} has shape {proba.shape}, but the attack was fit on "
                    f"{expected} outputs with {self.num_classes_} classes"
                )
        return np.asarray(self.features(proba, labels), dtype=np.float64)

    def fit(self, member_proba, member_labels, nonmember_proba, nonmember_labels,
            seed: int = 0) -> MembershipAttack:
        """Train the attack on the original model's outputs.

        Parameters
        ----------
        member_proba : array_like, float, shape (N_m, C) or (N_m, T, V)
            Original model's softmax outputs on training samples (of retained
            clients): the "member" class.
        member_labels : array_like, int, shape (N_m,) or (N_m, T)
            Their true classes / next characters.
        nonmember_proba : array_like, float, shape (N_n, C) or (N_n, T', V)
            Original model's outputs on held-out (test) samples: "non-member".
        nonmember_labels : array_like, int, shape (N_n,) or (N_n, T')
            Their true classes / next characters.
        seed : int
            Seeds the balancing (the larger side is subsampled to the size of
            the smaller, without replacement) and the classifier.

        Returns
        -------
        MembershipAttack
            ``self``, fitted.

        Raises
        ------
        ValueError
            Empty inputs, bad shapes or dtypes, fewer than 2 classes, values
            that are not probabilities, or members and non-members with
            different class counts or kinds (classifier vs character model).
        """
        self.model_ = None
        members = self._checked_features(member_proba, member_labels,
                                         "member_proba", "member_labels")
        nonmembers = self._checked_features(nonmember_proba, nonmember_labels,
                                            "nonmember_proba", "nonmember_labels")
        m_shape, n_shape = np.shape(member_proba), np.shape(nonmember_proba)
        if len(m_shape) != len(n_shape) or m_shape[-1] != n_shape[-1]:
            raise ValueError(
                f"member_proba {m_shape} and nonmember_proba {n_shape} must both be "
                f"(N, C) or both (N, T, V) with the same number of classes"
            )
        rng = np.random.default_rng(seed)
        keep_m, keep_n = _balanced(len(members), len(nonmembers), rng)
        x = np.concatenate([members[keep_m], nonmembers[keep_n]])
        y = np.concatenate([np.ones(len(keep_m), np.int64),
                            np.zeros(len(keep_n), np.int64)])
        model = self._new_model(seed)
        with self._threads():
            model.fit(x, y)
        self.model_ = model
        self.sequence_ = len(m_shape) == 3
        self.num_classes_ = int(m_shape[-1])
        self.n_fit_ = len(keep_m)
        self.seed_ = seed
        return self

    def _require_fitted(self) -> None:
        if self.model_ is None:
            raise RuntimeError("MembershipAttack is not fitted: call fit() first")

    def score(self, proba_target, labels_target, proba_heldout, labels_heldout,
              seed: int | None = None) -> dict:
        """Membership-inference scores of target (members) vs held-out samples.

        Parameters
        ----------
        proba_target : array_like, float, shape (N_t, C) or (N_t, T, V)
            The attacked model's outputs on the target samples, e.g. the
            forgotten clients' training data: the positive class "member".
        labels_target : array_like, int, shape (N_t,) or (N_t, T)
            Their true classes / next characters.
        proba_heldout : array_like, float, shape (N_h, C) or (N_h, T', V)
            The attacked model's outputs on held-out samples, disjoint from
            those used in ``fit``: the negative class.
        labels_heldout : array_like, int, shape (N_h,) or (N_h, T')
            Their true classes / next characters.
        seed : int, optional
            Seeds the subsampling of the larger side to the size of the smaller
            (default: the seed given to ``fit``).

        Returns
        -------
        dict
            ``f1``, ``precision``, ``recall`` (of the class "member"),
            ``accuracy``, ``auc`` (ROC AUC of the member probability), all
            floats in [0, 1]; ``n_target`` and ``n_heldout``, the int sample
            counts scored from each side (equal). See the module docstring for
            what F1 means at chance.

        Raises
        ------
        ValueError
            Empty inputs, bad shapes or dtypes, or outputs of another kind or
            class count than those the attack was fit on.
        RuntimeError
            If the attack is not fitted.
        """
        self._require_fitted()
        target = self._checked_features(proba_target, labels_target,
                                        "proba_target", "labels_target")
        heldout = self._checked_features(proba_heldout, labels_heldout,
                                         "proba_heldout", "labels_heldout")
        rng = np.random.default_rng(self.seed_ if seed is None else seed)
        keep_t, keep_h = _balanced(len(target), len(heldout), rng)
        x = np.concatenate([target[keep_t], heldout[keep_h]])
        truth = np.concatenate([np.ones(len(keep_t), np.int64),
                                np.zeros(len(keep_h), np.int64)])
        with self._threads():
            member_score = self.model_.predict_proba(x)[:, 1]
        metrics = attack_metrics(truth, member_score > 0.5, member_score)
        metrics["n_target"] = len(keep_t)
        metrics["n_heldout"] = len(keep_h)
        return metrics


def mia_report(
    attack: MembershipAttack,
    models_proba: Mapping[str, tuple[np.ndarray, np.ndarray]],
    labels_target,
    labels_heldout,
    seed: int | None = None,
) -> dict[str, dict]:
    """Score several models (e.g. original, retrained, each framework) at once.

    Parameters
    ----------
    attack : MembershipAttack
        Fitted on the original model's outputs.
    models_proba : mapping of str to (target_proba, heldout_proba)
        Per model name, its softmax outputs on the target samples (N_t, C) or
        (N_t, T, V) and on the held-out samples (N_h, C) or (N_h, T', V).
    labels_target : array_like, int, shape (N_t,) or (N_t, T)
        True classes / next characters of the target samples.
    labels_heldout : array_like, int, shape (N_h,) or (N_h, T')
        True classes / next characters of the held-out samples.
    seed : int, optional
        Passed to ``MembershipAttack.score``; the same for every model, so all
        are scored on the same subsample.

    Returns
    -------
    dict of str to dict
        Per model name, the metrics of ``MembershipAttack.score``.
    """
    if not models_proba:
        raise ValueError("models_proba is empty: give at least one model's outputs")
    return {
        name: attack.score(target, labels_target, heldout, labels_heldout, seed=seed)
        for name, (target, heldout) in models_proba.items()
    }


#: Two-sided 95% normal quantile: the AUC interval is auc +- Z_95 * se.
Z_95 = 1.959963984540054


def auc_interval(auc: float, n_members: int, n_nonmembers: int,
                 z: float = Z_95) -> tuple[float, float]:
    """Normal-approximation confidence interval of a ROC AUC, clipped to [0, 1].

    The standard error is Hanley and McNeil's ("The meaning and use of the area
    under a receiver operating characteristic (ROC) curve", Radiology 1982,
    eq. 2): se^2 = (A (1 - A) + (n_m - 1)(Q1 - A^2) + (n_n - 1)(Q2 - A^2))
    / (n_m n_n), with Q1 = A / (2 - A) and Q2 = 2 A^2 / (1 + A). At A = 0.5 it
    is the Mann-Whitney null value sqrt((n_m + n_n + 1) / (12 n_m n_n)).

    Parameters
    ----------
    auc : float
        The AUC A, in [0, 1].
    n_members, n_nonmembers : int
        Samples scored on each side (>= 1): the attack's targets and held-out
        samples (``n_target``, ``n_heldout`` of :meth:`MembershipAttack.score`).
    z : float
        Normal quantile (> 0); the default gives a two-sided 95% interval.

    Returns
    -------
    (float, float)
        ``(low, high)``, A -/+ z se, within [0, 1].

    Raises
    ------
    ValueError
        An AUC outside [0, 1] (or NaN), a count below 1, or z <= 0.
    """
    if not 0.0 <= auc <= 1.0:
        raise ValueError(f"auc = {auc!r} is not allowed: a number in [0, 1]")
    if min(n_members, n_nonmembers) < 1:
        raise ValueError(f"sample counts {n_members}, {n_nonmembers} are not allowed: "
                         "at least 1 member and 1 non-member")
    if not z > 0:
        raise ValueError(f"z = {z!r} is not allowed: a number > 0")
    q1, q2 = auc / (2.0 - auc), 2.0 * auc * auc / (1.0 + auc)
    var = (auc * (1.0 - auc) + (n_members - 1) * (q1 - auc * auc)
           + (n_nonmembers - 1) * (q2 - auc * auc)) / (n_members * n_nonmembers)
    half = z * float(np.sqrt(max(var, 0.0)))
    return max(0.0, auc - half), min(1.0, auc + half)


def has_signal(auc: float, n_members: int, n_nonmembers: int,
               z: float = Z_95) -> bool:
    """Whether an attack tells members from non-members better than chance.

    True when the whole :func:`auc_interval` lies above 0.5. An interval that
    holds 0.5 is chance; one wholly below 0.5 (an attack that ranks members
    last) is no evidence of memorisation either, so it is no signal too.

    Parameters
    ----------
    auc, n_members, n_nonmembers, z
        As in :func:`auc_interval`.

    Returns
    -------
    bool

    Raises
    ------
    ValueError
        As :func:`auc_interval`.
    """
    return auc_interval(auc, n_members, n_nonmembers, z)[0] > 0.5
