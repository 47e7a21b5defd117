"""Decoding of Lagrange-coded slices over GF(2**31 - 1): erasures and errors.

Erasures (missing slices) are handled by interpolation from any ``k``
slices.  Errors (wrong slices: a faulty or malicious client spoils its whole
slice, so the error positions are the same in every column) are located with
the Berlekamp-Welch algorithm (L. R. Welch and E. R. Berlekamp, "Error
correction for algebraic block codes", US patent 4,633,470, 1986) applied to
one random linear projection of the slices, then the data is erasure-decoded
from slices not flagged and certified by re-encoding against every slice.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import _kernels
from .field import PRIME, as_field_array, gf
from .lagrange import _check_disjoint, _points, lagrange_matrix

__all__ = ["DecodingError", "decode_erasures", "decode_errors", "berlekamp_welch"]


class DecodingError(ValueError):
    """The slices cannot be decoded to data that is certified correct.

    Raised when there are more wrong slices than the decoder can correct: the
    Berlekamp-Welch system is inconsistent, the error locator does not divide,
    or the decoded blocks disagree with more slices than the bound allows.
    """


def _setup(
    slices: Any, alphas: Any, omegas: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    om = _points(omegas, "omegas")
    al = _points(alphas, "alphas_present")
    _check_disjoint(om, al)
    y = np.asarray(slices)
    if y.ndim != 2:
        raise ValueError(f"slices must be 2-dimensional (m, d), got shape {y.shape}")
    if y.shape[0] != al.size:
        raise ValueError(f"slices has {y.shape[0]} rows but {al.size} alphas were given")
    if al.size < om.size:
        raise ValueError(
            f"not enough slices to decode: {al.size} present, at least k = {om.size} needed"
        )
    return y, al, om


def decode_erasures(slices: Any, alphas_present: Any, omegas: Any) -> np.ndarray:
    """Recover the ``k`` data blocks from any ``m >= k`` correct slices.

    Interpolates the degree ``k - 1`` Lagrange polynomial through the first
    ``k`` slices given and evaluates it at the block points:
    ``blocks = lagrange_matrix(alphas_present[:k], omegas) @ slices[:k]``
    (mod p).  Exact; other slices are ignored (not checked: use
    :func:`decode_errors` when slices may be wrong).

    Parameters
    ----------
    slices : array_like of int, shape (m, d)
        Coded slices present, GF(p) elements in ``[0, p)`` (int64 preferred).
    alphas_present : array_like of int, shape (m,)
        The distinct slice points of those rows.
    omegas : array_like of int, shape (k,)
        The block points used when encoding.

    Returns
    -------
    numpy.ndarray of int64, shape (k, d)
        The data blocks, elements in ``[0, p)``.

    Raises
    ------
    ValueError
        If ``m < k``, points repeat or are shared between ``alphas_present``
        and ``omegas``, shapes disagree, or used elements lie outside ``[0, p)``.
    """
    y, al, om = _setup(slices, alphas_present, omegas)
    k = om.size
    used = as_field_array(y[:k], "slices", ndim=2)
    dec = lagrange_matrix(al[:k], om)
    out = np.empty((k, used.shape[1]), dtype=np.int64)
    _kernels.combine(dec, used, np.arange(k, dtype=np.int64), out)
    return out


def _poly_divmod(num: list[int], den: list[int]) -> tuple[list[int], list[int]]:
    """Divide polynomials over GF(p), coefficients ascending; ``den`` monic."""
    num = list(num)
    dd = len(den) - 1
    if len(num) <= dd:
        return [0], num
    quot = [0] * (len(num) - dd)
    for i in range(len(num) - 1, dd - 1, -1):
        c = num[i] % PRIME
        if c:
            quot[i - dd] = c
            for j in range(dd + 1):
                num[i - dd + j] = (num[i - dd + j] - c * den[j]) % PRIME
    return quot, num[:dd]


def _poly_eval(coeffs: list[int], x: np.ndarray) -> np.ndarray:
    acc = np.zeros(x.shape, dtype=np.int64)
    for c in reversed(coeffs):
        acc = (acc * x + c) % PRIME
    return acc


def berlekamp_welch(y: Any, alphas: Any, k: int, e: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode one scalar Reed-Solomon codeword with <= ``e`` errors (Berlekamp-Welch).

    Finds a monic error locator ``E`` of degree ``e`` and ``Q`` of degree
    ``< e + k`` with ``Q(alpha_i) = y_i E(alpha_i)`` for all ``i`` by solving the
    ``m x (2e + k)`` linear system over GF(p) with galois (row reduction;
    free variables set to 0), then ``P = Q / E``.  Any solution yields the same
    ``P`` when at most ``e`` values are wrong and ``2e + k <= m`` (Welch and
    Berlekamp, US patent 4,633,470, 1986).

    Parameters
    ----------
    y : array_like of int, shape (m,)
        Received values in ``[0, p)``.
    alphas : array_like of int, shape (m,)
        Distinct evaluation points.
    k : int
        Code dimension (the message polynomial has degree ``< k``).
    e : int
        Number of errors to correct, ``0 <= e <= (m - k) // 2``.

    Returns
    -------
    coeffs : numpy.ndarray of int64, shape (k,)
        Coefficients of ``P``, ascending powers.
    error_positions : numpy.ndarray of int64
        Sorted indices ``i`` with ``y_i != P(alpha_i)``; at most ``e``.

    Raises
    ------
    DecodingError
        If the system is inconsistent, ``E`` does not divide ``Q``, or more than
        ``e`` values disagree with ``P`` (more than ``e`` errors).
    ValueError
        If ``e`` is outside ``[0, (m - k) // 2]`` or the inputs are malformed.
    """
    yv = as_field_array(y, "y", ndim=1)
    a = _points(alphas, "alphas")
    k = operator.index(k)
    e = operator.index(e)
    m = a.size
    if yv.size != m:
        raise ValueError(f"y has {yv.size} values but {m} alphas were given")
    if k < 1 or not 0 <= e <= (m - k) // 2:
        raise ValueError(f"need k >= 1 and 0 <= e <= (m - k) // 2, got m={m}, k={k}, e={e}")
    field = gf()
    af = field(a)
    yf = field(yv)
    ncols = 2 * e + k
    powers = af[:, None] ** np.arange(e + k + 1)  # (m, e + k + 1)
    aug = field.Zeros((m, ncols + 1))
    aug[:, : e + k] = powers[:, : e + k]
    if e:
        aug[:, e + k : ncols] = -(yf[:, None] * powers[:, :e])
    aug[:, ncols] = yf * powers[:, e]
    rref = np.asarray(aug.row_reduce().view(np.ndarray), dtype=np.int64)
    sol = [0] * ncols
    for row in rref:
        nz = np.flatnonzero(row)
        if nz.size == 0:
            continue
        lead = int(nz[0])
        if lead == ncols:
            raise DecodingError(
                f"Berlekamp-Welch system inconsistent: more than e={e} errors "
                f"among {m} values (k={k})"
            )
        sol[lead] = int(row[ncols])
    q = sol[: e + k]
    loc = sol[e + k :] + [1]
    p_coef, rem = _poly_divmod(q, loc)
    if any(rem):
        raise DecodingError(
            f"Berlekamp-Welch error locator does not divide: more than e={e} "
            f"errors among {m} values (k={k})"
        )
    p_coef = (p_coef + [0] * k)[:k]
    if len(p_coef) > k:  # pragma: no cover - degree bound holds by construction
        raise DecodingError("decoded polynomial degree too high")
    wrong = np.flatnonzero(_poly_eval(p_coef, a) != yv)
    if wrong.size > e:
        raise DecodingError(
            f"decoded codeword disagrees with {wrong.size} values, "
            f"more than e={e} (m={m}, k={k})"
        )
    return np.asarray(p_coef, dtype=np.int64), wrong.astype(np.int64)


def decode_errors(
    slices: Any,
    alphas: Any,
    omegas: Any,
    rng_seed: int | np.random.SeedSequence | None = None,
    max_errors: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Recover the data blocks from ``m`` slices of which up to ``t`` are wrong.

    With ``m`` slices present (the caller passes only the slices it has, so
    missing ones are erasures) the decoder corrects up to
    ``t = floor((m - k) / 2)`` wrong slices; a wrong slice may differ in any
    or all of its ``d`` columns.  Steps:

    1. project: ``y = slices @ r`` (mod p) for a random ``r`` in GF(p)^d; ``y``
       is a scalar Reed-Solomon codeword of dimension ``k`` plus the projected
       errors (a wrong slice is missed only with probability ``1/p``);
    2. locate the wrong slices with :func:`berlekamp_welch` (galois solves the
       small linear system);
    3. erasure-decode from the first ``k`` slices not flagged;
    4. certify: re-encode and compare against every other slice present.  The
       result is returned only if it disagrees with at most ``e`` slices
       (``e = max_errors``, default ``t``).  Since the per-column code has
       minimum distance ``m - k + 1``, a returned result is the exact data
       whenever the true number of wrong slices is at most ``m - k - e``.
       If certification fails once (a projection miss) it retries with a
       fresh ``r``, then raises.

    Detection beyond the bound: with ``e = t`` and ``m - k`` odd, ``t + 1``
    wrong slices are always detected; with ``m - k`` even, ``t + 1`` random
    wrong slices are detected with overwhelming probability but an adversary
    who knows the data can craft ``t + 1`` wrong slices that decode to other
    data (no decoder can do better at radius ``t``).  Lower ``max_errors`` to
    trade correction for guaranteed detection of up to ``m - k - max_errors``.

    Parameters
    ----------
    slices : array_like of int, shape (m, d)
        Coded slices present, GF(p) elements in ``[0, p)`` (int64, C-contiguous
        avoids a copy).
    alphas : array_like of int, shape (m,)
        Distinct slice points of those rows.
    omegas : array_like of int, shape (k,)
        Block points used when encoding.
    rng_seed : int, SeedSequence or None, default None
        Seed of the projection vector; ``None`` draws fresh OS entropy (use
        that against adversarial clients; a fixed seed is for reproducibility
        and at worst turns a crafted attack into a DecodingError, never into
        wrong data).
    max_errors : int or None, default None
        Number of wrong slices to correct, ``0 <= max_errors <= t``; ``None``
        means ``t``.

    Returns
    -------
    blocks : numpy.ndarray of int64, shape (k, d)
        The data blocks, elements in ``[0, p)``.
    bad_indices : numpy.ndarray of int64
        Sorted row indices (into ``slices``) of the wrong slices, at most ``e``.

    Raises
    ------
    DecodingError
        If more slices are wrong than can be corrected (never returns unverified
        data).
    ValueError
        If ``m < k``, points repeat or are shared, shapes disagree, elements lie
        outside ``[0, p)``, or ``max_errors`` is out of range.
    """
    y_raw, al, om = _setup(slices, alphas, omegas)
    y = as_field_array(y_raw, "slices", ndim=2, check_range=False)
    m, d = y.shape
    k = om.size
    t = (m - k) // 2
    e = t if max_errors is None else operator.index(max_errors)
    if not 0 <= e <= t:
        raise ValueError(f"max_errors must lie in [0, {t}] for m={m}, k={k}; got {e}")
    rng = np.random.default_rng(rng_seed)
    proj_chunk = 16384
    last_bad = -1
    for _attempt in range(2):
        r = rng.integers(0, PRIME, size=d, dtype=np.int64)
        yp, n_out = _kernels.project(y, r, proj_chunk)
        if n_out:
            raise ValueError(f"slices has {n_out} elements outside [0, {PRIME})")
        _, flagged = berlekamp_welch(yp, al, k, e)
        good = np.setdiff1d(np.arange(m, dtype=np.int64), flagged)
        used = good[:k]
        dec = lagrange_matrix(al[used], om)
        blocks = np.empty((k, d), dtype=np.int64)
        _kernels.combine(dec, y, used, blocks)
        check = np.setdiff1d(np.arange(m, dtype=np.int64), used)
        gen = lagrange_matrix(om, al[check])
        mism = _kernels.mismatch_rows(gen, blocks, y, check, _kernels.chunk_columns(k))
        bad = check[mism]
        if bad.size <= e:
            return blocks, bad
        last_bad = bad.size
    raise DecodingError(
        f"decoded blocks disagree with {last_bad} of {m} slices, more than the "
        f"{e} wrong slices that can be corrected (k={k}): too many wrong slices"
    )
