"""Membership inference with shadow models (Shokri et al., IEEE S&P 2017).

``mia-shadows`` = k >= 1 replaces the audit's attack (fit on the original model)
with Shokri's: k shadow models are trained with the run's own recipe on data
disjoint from every client's (:func:`audits.audit.fit_shadow_attack`): each
shadow is a shard of its own, its random "in" half of a shadow pool split over as
many clients as a shard has, trained by FedAvg for G rounds of
``clients-per-round / num-shards`` clients x L local epochs with the run's
optimizer (:func:`task.train.local_train`). One attack model per class learns,
from the shadows' outputs, to tell their "in" samples from their "out" samples.
The attack is then applied to each evaluated model on its own (never fit on one
model and applied to another's outputs as if they were its
own): its outputs on the targets (the forgotten clients' training samples; only
clients that took part in at least one learning round) against as many held-out
samples of the same classes.

Which samples (:mod:`audits.mia_sets`): the non-members are training images
that no client holds (the rows past each client's ``client-samples`` cap: same
split and distribution as the targets), or, where they hold too few of a target
class, the second half of the test set; the shadow pool is the free training
images left, or, where fewer than 2 m remain (m = a shadow's "in" set, the
training samples of one shard), the first half of the test set. Targets,
non-members and shadow data share no sample.

Metrics: ROC AUC, F1 of the class "member" at the attack's 0.5 decision, and the
true-positive rate at 1% false positives (Carlini et al. 2022's low-FPR view).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import f1_score, roc_auc_score, roc_curve
from threadpoolctl import threadpool_limits

from audits.mia import check_labels, check_proba, membership_features

#: The false-positive rate at which ``tpr_at_1fpr`` is read.
LOW_FPR = 0.01


def tpr_at_fpr(is_member, score, fpr: float = LOW_FPR) -> float:
    """Largest true-positive rate of ``score``'s ROC curve with FPR <= ``fpr``.

    Parameters
    ----------
    is_member : array_like, {0, 1}, shape (N,)
        Ground truth (both classes present).
    score : array_like, float, shape (N,)
        The attack's member score.
    fpr : float
        The false-positive budget, in [0, 1].

    Returns
    -------
    float
        In [0, 1].
    """
    fprs, tprs, _ = roc_curve(np.asarray(is_member), np.asarray(score))
    return float(tprs[fprs <= fpr].max())


class ShadowAttack:
    """One attack classifier per class, trained on shadow models' outputs.

    Parameters
    ----------
    num_classes : int
        C; a class without both "in" and "out" shadow samples falls back to the
        attack of all classes together.
    seed : int
        Seeds the classifiers.
    features : callable
        ``features(proba, labels) -> (N, F)``: the task's attack features
        (:attr:`task.interface.Task.membership`; default :func:`membership_features`).
    """

    def __init__(self, num_classes: int, seed: int = 0,
                 features: Callable[[np.ndarray, np.ndarray], np.ndarray]
                 = membership_features) -> None:
        self.num_classes = num_classes
        self.seed = seed
        self.features = features
        self.models_: dict[int, HistGradientBoostingClassifier] = {}

    def _new(self) -> HistGradientBoostingClassifier:
        return HistGradientBoostingClassifier(
            max_iter=100, learning_rate=0.1, max_leaf_nodes=15, min_samples_leaf=10,
            l2_regularization=1.0, early_stopping=False, random_state=self.seed)

    def _features(self, proba, labels) -> np.ndarray:
        proba = check_proba(proba, "proba")
        labels = check_labels(labels, proba, "labels", "proba")
        return np.asarray(self.features(proba, labels), dtype=np.float64)

    def fit(self, proba: np.ndarray, labels: np.ndarray, is_in: np.ndarray
            ) -> ShadowAttack:
        """Fit on shadow outputs ``proba`` (N, C), true ``labels`` (N,), ``is_in`` (N,) 0/1.

        Raises
        ------
        ValueError
            Bad shapes or values (:func:`audits.mia.membership_features`),
            or ``is_in`` without both classes.
        """
        features = self._features(proba, labels)
        is_in = np.asarray(is_in).astype(np.int64)
        if is_in.shape != (len(features),) or len(set(is_in.tolist())) != 2:
            raise ValueError(f"is_in must be 0/1 of shape ({len(features)},) with both "
                             f"values, got shape {is_in.shape}")
        labels = np.asarray(labels)
        with threadpool_limits(limits=1):
            self.models_[-1] = self._new().fit(features, is_in)
            for c in range(self.num_classes):
                rows = labels == c
                if len(set(is_in[rows].tolist())) == 2:
                    self.models_[c] = self._new().fit(features[rows], is_in[rows])
        return self

    def member_score(self, proba: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Member probability (N,) of each sample under its class's attack model."""
        if not self.models_:
            raise RuntimeError("ShadowAttack is not fitted: call fit() first")
        features = self._features(proba, labels)
        labels = np.asarray(labels)
        out = np.empty(len(features))
        with threadpool_limits(limits=1):
            for c in np.unique(labels):
                rows = labels == c
                model = self.models_.get(int(c), self.models_[-1])
                out[rows] = model.predict_proba(features[rows])[:, 1]
        return out

    def score(self, target_proba, target_labels, heldout_proba, heldout_labels
              ) -> dict[str, float]:
        """``auc``, ``f1``, ``tpr_at_1fpr`` (floats in [0, 1]) and the counts scored.

        Targets are the positive class "member"; ``heldout`` should hold as many
        samples of the same classes.
        """
        s_t = self.member_score(target_proba, target_labels)
        s_h = self.member_score(heldout_proba, heldout_labels)
        truth = np.concatenate([np.ones(len(s_t)), np.zeros(len(s_h))])
        score = np.concatenate([s_t, s_h])
        return {"auc": float(roc_auc_score(truth, score)),
                "f1": float(f1_score(truth, score > 0.5, zero_division=0.0)),
                "tpr_at_1fpr": tpr_at_fpr(truth, score),
                "n_target": int(len(s_t)), "n_heldout": int(len(s_h))}


def shadow_splits(pool_size: int, in_size: int, shadows: int, seed: int
                  ) -> Sequence[tuple[np.ndarray, np.ndarray]]:
    """For each shadow, disjoint "in" and "out" index sets of ``in_size`` each.

    Raises
    ------
    ValueError
        If the pool holds fewer than 2 ``in_size`` samples.
    """
    if pool_size < 2 * in_size:
        raise ValueError(f"shadow pool of {pool_size} samples cannot give {in_size} in "
                         f"and {in_size} out samples")
    rng = np.random.default_rng([seed, 0x5AD])
    out = []
    for _ in range(shadows):
        perm = rng.permutation(pool_size)
        out.append((np.sort(perm[:in_size]), np.sort(perm[in_size:2 * in_size])))
    return out
