"""Numba kernels for the O(d) arithmetic over GF(2**31 - 1).

All arrays hold field elements as int64 in ``[0, p)``.  Products are formed in
uint64 from operands known to be below ``2**32`` (so LLVM can use the 32x32->64
bit ``pmuludq`` vector multiply), folded once with the Mersenne identity
``x mod p == ((x & p) + (x >> 31)) mod p`` to a value below ``2**32``, summed,
and fully reduced at the end.  Work is split into column chunks so scratch
memory stays bounded (a few hundred KiB per thread) whatever ``d`` is.
"""

from __future__ import annotations

import threading

import numba
import numpy as np

# numba's fallback "workqueue" threading layer must not be entered from two
# Python threads at once; the kernels already use every core, so serialise.
_LOCK = threading.Lock()

_P = np.uint64(2**31 - 1)
_LOW32 = np.uint64(0xFFFFFFFF)
_S31 = np.uint64(31)
_PI = np.int64(2**31 - 1)


def chunk_columns(rows: int) -> int:
    """Column-chunk width so a ``rows x chunk`` uint64 scratch stays ~256 KiB."""
    return int(min(8192, max(512, 32768 // max(1, rows))))


@numba.njit(cache=True, inline="always")
def _reduce(a):  # pragma: no cover - compiled
    a = (a & _P) + (a >> _S31)
    a = (a & _P) + (a >> _S31)
    if a >= _P:
        a -= _P
    return a


@numba.njit(parallel=True, cache=True)
def _combine_nb(coef, x, rows, out, chunk):  # pragma: no cover - compiled
    """out[i, :] = sum_s coef[i, s] * x[rows[s], :]  (mod p).

    coef (r, k) int64, x (m, d) int64, rows (k,) int64 indices into x,
    out (r, d) int64, chunk: column-chunk width.
    """
    r, k = coef.shape
    d = x.shape[1]
    nch = (d + chunk - 1) // chunk
    for b in numba.prange(nch):
        c0 = b * chunk
        c1 = min(d, c0 + chunk)
        w = c1 - c0
        acc = np.empty(w, np.uint64)
        xu = np.empty((k, w), np.uint64)
        for s in range(k):
            src = rows[s]
            for c in range(w):
                xu[s, c] = np.uint64(x[src, c0 + c]) & _LOW32
        for i in range(r):
            g = np.uint64(coef[i, 0]) & _LOW32
            for c in range(w):
                t = g * xu[0, c]
                acc[c] = (t & _P) + (t >> _S31)
            for s in range(1, k):
                g = np.uint64(coef[i, s]) & _LOW32
                for c in range(w):
                    t = g * xu[s, c]
                    acc[c] += (t & _P) + (t >> _S31)
            for c in range(w):
                out[i, c0 + c] = np.int64(_reduce(acc[c]))


@numba.njit(parallel=True, cache=True)
def _mismatch_rows_nb(coef, x, y, check, chunk):  # pragma: no cover - compiled
    """Which rows y[check[i]] differ from sum_s coef[i, s] * x[s, :] (mod p).

    coef (r, k) int64, x (k, d) int64, y (m, d) int64, check (r,) int64
    indices into y.  Returns a bool array (r,).  The re-encoding is fused with
    the comparison (nothing of size d is materialised); within a chunk a row
    is first tested on one column, so wrong rows cost almost nothing.
    """
    r, k = coef.shape
    d = x.shape[1]
    nch = (d + chunk - 1) // chunk
    flags = np.zeros((max(nch, 1), r), np.bool_)
    for b in numba.prange(nch):
        c0 = b * chunk
        c1 = min(d, c0 + chunk)
        w = c1 - c0
        acc = np.empty(w, np.uint64)
        xu = np.empty((k, w), np.uint64)
        for s in range(k):
            for c in range(w):
                xu[s, c] = np.uint64(x[s, c0 + c]) & _LOW32
        for i in range(r):
            yi = check[i]
            a = np.uint64(0)
            for s in range(k):
                t = (np.uint64(coef[i, s]) & _LOW32) * xu[s, 0]
                a += (t & _P) + (t >> _S31)
            if np.int64(_reduce(a)) != y[yi, c0]:
                flags[b, i] = True
                continue
            g = np.uint64(coef[i, 0]) & _LOW32
            for c in range(w):
                t = g * xu[0, c]
                acc[c] = (t & _P) + (t >> _S31)
            for s in range(1, k):
                g = np.uint64(coef[i, s]) & _LOW32
                for c in range(w):
                    t = g * xu[s, c]
                    acc[c] += (t & _P) + (t >> _S31)
            ndiff = 0
            for c in range(w):
                ndiff += np.int64(_reduce(acc[c])) != y[yi, c0 + c]
            if ndiff:
                flags[b, i] = True
    res = np.zeros(r, np.bool_)
    for b in range(nch):
        for i in range(r):
            if flags[b, i]:
                res[i] = True
    return res


@numba.njit(parallel=True, cache=True)
def _project_nb(y, vec, chunk):  # pragma: no cover - compiled
    """Return ((y @ vec) mod p, n_out_of_range) for y (m, d), vec (d,) int64.

    Also counts the elements of y outside [0, p) (a fused range check: the
    projection is only meaningful when that count is 0).
    """
    m, d = y.shape
    nch = (d + chunk - 1) // chunk
    part = np.zeros((max(nch, 1), m), np.uint64)
    nbad = np.zeros(max(nch, 1), np.int64)
    for b in numba.prange(nch):
        c0 = b * chunk
        c1 = min(d, c0 + chunk)
        w = c1 - c0
        vu = np.empty(w, np.uint64)
        for c in range(w):
            vu[c] = np.uint64(vec[c0 + c]) & _LOW32
        for i in range(m):
            a = np.uint64(0)
            top = np.uint64(0)  # negatives become huge as uint64
            for c in range(w):
                v = np.uint64(y[i, c0 + c])
                top = max(top, v)
                t = (v & _LOW32) * vu[c]
                a += (t & _P) + (t >> _S31)
            part[b, i] = _reduce(a)
            if top >= _P:
                for c in range(w):
                    v = y[i, c0 + c]
                    nbad[b] += (v < 0) | (v >= _PI)
    out = np.zeros(m, np.int64)
    for i in range(m):
        a = np.uint64(0)
        for b in range(nch):
            a += part[b, i]  # each < 2**31, fine for < 2**32 chunks
        out[i] = np.int64(_reduce(a))
    return out, nbad.sum()


def in_field(flat: np.ndarray) -> bool:
    """Return True when every element of the int64 array lies in [0, p)."""
    return bool(flat.size == 0 or (flat.min() >= 0 and flat.max() < _PI))


def combine(
    coef: np.ndarray, x: np.ndarray, rows: np.ndarray, out: np.ndarray, chunk: int
) -> None:
    """Set ``out[i] = sum_s coef[i, s] * x[rows[s]]`` (mod p), in place."""
    with _LOCK:
        _combine_nb(coef, x, rows, out, chunk)


def mismatch_rows(
    coef: np.ndarray, x: np.ndarray, y: np.ndarray, check: np.ndarray, chunk: int
) -> np.ndarray:
    """Return bool (r,): does ``y[check[i]]`` differ from ``coef[i] @ x`` (mod p)."""
    with _LOCK:
        return _mismatch_rows_nb(coef, x, y, check, chunk)


def project(y: np.ndarray, vec: np.ndarray, chunk: int) -> tuple[np.ndarray, int]:
    """Return ``(y @ vec) mod p`` as int64 (m,), and how many y are outside [0, p)."""
    with _LOCK:
        out, nbad = _project_nb(y, vec, chunk)
    return out, int(nbad)
