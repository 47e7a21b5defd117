"""The L-BFGS arithmetic of server-side recovery (numpy in, numpy out).

:func:`lbfgs_product` is B v for the compact L-BFGS Hessian approximation that
FedRecover (Cao et al., IEEE S&P 2023, Alg. 2) builds from (s, y) pairs;
:func:`flat` and :func:`unflat` turn a model's floating layers into one vector
and back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def lbfgs_product(pairs: Sequence[tuple[np.ndarray, np.ndarray]], v: np.ndarray
                  ) -> np.ndarray:
    """B v for the L-BFGS Hessian approximation B of ``pairs`` (compact form).

    ``B = sigma I - [sigma S, Y] M^-1 [sigma S^T; Y^T]`` with
    ``M = [[sigma S^T S, L], [L^T, -D]]``, ``S^T Y = L + D + U`` (strictly lower,
    diagonal, strictly upper) and ``sigma = s^T y / s^T s``, the curvature along
    the newest pair (Byrd, Nocedal and Schnabel 1994, eq. 2.17; FedRecover
    Alg. 2). The usual ``y^T y / s^T y`` is the largest curvature consistent with
    the pair; with noisy pairs (s^T y small against |s| |y|) it multiplied the
    directions the pairs never saw by up to 100x. Pairs that
    break the curvature condition ``s^T y > 0`` are left out (B would not be
    positive definite); with none left, B = 0 (the stored update is used as is).

    Parameters
    ----------
    pairs : Sequence[tuple[ndarray, ndarray]]
        (s, y), oldest first, each float64 of shape (d,).
    v : ndarray
        float64, shape (d,).

    Returns
    -------
    ndarray
        float64, shape (d,).
    """
    good = [(s, y) for s, y in pairs if float(s @ y) > 1e-12 * float(s @ s)]
    if not good:
        return np.zeros_like(v)
    s_mat = np.stack([s for s, _ in good], axis=1)  # S, (d, m)
    y_mat = np.stack([y for _, y in good], axis=1)  # Y, (d, m)
    s_new, y_new = good[-1]
    sigma = float(s_new @ y_new) / float(s_new @ s_new)
    sy = s_mat.T @ y_mat
    lower = np.tril(sy, -1)
    middle = np.block([[sigma * (s_mat.T @ s_mat), lower],
                       [lower.T, -np.diag(np.diag(sy))]])
    rhs = np.concatenate([sigma * (s_mat.T @ v), y_mat.T @ v])
    coef = np.linalg.lstsq(middle, rhs, rcond=None)[0]
    m = s_mat.shape[1]
    return sigma * v - (sigma * (s_mat @ coef[:m]) + y_mat @ coef[m:])


def flat(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """The floating layers of ``arrays`` as one float64 vector (sorted keys)."""
    return np.concatenate([np.ravel(np.asarray(arrays[k], np.float64))
                           for k in sorted(arrays)
                           if np.issubdtype(np.asarray(arrays[k]).dtype, np.inexact)]
                          or [np.zeros(0)])


def unflat(vector: np.ndarray, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``vector`` cut back into ``like``'s floating layers; other layers copied."""
    out, at = {}, 0
    for key in sorted(like):
        value = np.asarray(like[key])
        if np.issubdtype(value.dtype, np.inexact):
            out[key] = vector[at:at + value.size].reshape(value.shape).astype(value.dtype)
            at += value.size
        else:
            out[key] = value.copy()
    return {k: out[k] for k in like}
