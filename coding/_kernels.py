"""Numba kernels for the O(d) arithmetic over GF(2**31 - 1).

Inputs hold field elements as int64 in ``[0, p)``; encoding outputs may be
uint32 (every element fits 31 bits).  Products are formed in uint64 from
operands known to be below ``2**32`` (so LLVM uses the 32x32->64 bit
``vpmuludq`` vector multiply).  The encoders (:func:`combine`,
:func:`encode_real`) sum four raw products (below ``2**64``) before folding
once with the Mersenne identity ``x mod p == ((x & p) + (x >> 31)) mod p``;
the checks fold every product.  Work is split into column chunks so scratch
memory stays bounded (tens to a few hundred KiB per thread) whatever ``d`` is.
"""

from __future__ import annotations

import threading

import numba
import numpy as np

from . import _cache

# the cache by the file's content, so that Flower's copies of the app find it
_cache.install()

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


def encode_chunk(rows: int) -> int:
    """Column-chunk width of :func:`combine`: ``rows x chunk`` uint32 scratch ~32 KiB."""
    return int(min(2048, max(512, 8192 // max(1, rows))))


@numba.njit(cache=True)
def _coef32(coef):  # pragma: no cover - compiled
    """Return coef (r, k) int64 in [0, p) as uint32 (r, m4), zero-padded to m4 = 4j >= k."""
    r, k = coef.shape
    gu = np.zeros((r, (k + 3) // 4 * 4), np.uint32)
    for i in range(r):
        for s in range(k):
            gu[i, s] = np.uint32(coef[i, s])
    return gu


@numba.njit(cache=True, inline="always")
def _coefs4(g, i, s):  # pragma: no cover - compiled
    """g[i, s:s + 4] as four uint64 scalars (hoisted: the stores may alias g)."""
    return (np.uint64(g[i, s]), np.uint64(g[i, s + 1]), np.uint64(g[i, s + 2]),
            np.uint64(g[i, s + 3]))


@numba.njit(cache=True, inline="always")
def _emit_rows(gu, xu, out, rstride, c0, w, acc):  # pragma: no cover - compiled
    """Row i of out: out[i rstride + c0:][:w] = sum_s gu[i, s] xu[s, :w] (mod p).

    gu (r, m4) and xu (m4, >= w) uint32 below p, m4 a multiple of 4; acc
    (2, >= w) uint64 scratch.  Rows go in pairs sharing each load of xu (an
    odd last row is computed twice).  Four products (each < 2**62, zero-extended
    32-bit operands: one ``vpmuludq`` each) sum below 2**64 without reduction;
    with m4 > 4 each group of four is folded once (``(t & p) + (t >> 31) <
    2**34``) into acc and reduced at the end.
    """
    r, m4 = gu.shape
    for i in range(0, r, 2):
        j = min(i + 1, r - 1)
        row = out[i * rstride + c0:i * rstride + c0 + w]  # from 0: vector stores
        row2 = out[j * rstride + c0:j * rstride + c0 + w]
        if m4 == 4:  # one group: no accumulator pass
            g0, g1, g2, g3 = _coefs4(gu, i, 0)
            h0, h1, h2, h3 = _coefs4(gu, j, 0)
            for c in range(w):
                x0, x1 = np.uint64(xu[0, c]), np.uint64(xu[1, c])
                x2, x3 = np.uint64(xu[2, c]), np.uint64(xu[3, c])
                row[c] = _reduce(g0 * x0 + g1 * x1 + g2 * x2 + g3 * x3)
                row2[c] = _reduce(h0 * x0 + h1 * x1 + h2 * x2 + h3 * x3)
            continue
        acc[:, :w] = 0
        for s in range(0, m4, 4):
            g0, g1, g2, g3 = _coefs4(gu, i, s)
            h0, h1, h2, h3 = _coefs4(gu, j, s)
            for c in range(w):
                x0, x1 = np.uint64(xu[s, c]), np.uint64(xu[s + 1, c])
                x2, x3 = np.uint64(xu[s + 2, c]), np.uint64(xu[s + 3, c])
                t = g0 * x0 + g1 * x1 + g2 * x2 + g3 * x3
                u = h0 * x0 + h1 * x1 + h2 * x2 + h3 * x3
                acc[0, c] += (t & _P) + (t >> _S31)
                acc[1, c] += (u & _P) + (u >> _S31)
        for c in range(w):
            row[c] = _reduce(acc[0, c])
            row2[c] = _reduce(acc[1, c])


@numba.njit(parallel=True, cache=True)
def _combine_nb(coef, x, rows, out, rstride, chunk):  # pragma: no cover - compiled
    """out[i, :] = sum_s coef[i, s] * x[rows[s], :]  (mod p).

    coef (r, k) int64, x (m, d) int64, rows (k,) int64 indices into x; out
    int64 or uint32, 1-D, row i at [i rstride, i rstride + d); chunk: the
    column-chunk width.
    """
    k = coef.shape[1]
    d = x.shape[1]
    gu = _coef32(coef)
    nch = (d + chunk - 1) // chunk
    for b in numba.prange(nch):
        c0 = b * chunk
        w = min(d, c0 + chunk) - c0
        acc = np.empty((2, w), np.uint64)
        xu = np.zeros((gu.shape[1], w), np.uint32)
        for s in range(k):
            _load_into(xu[s], x[rows[s], c0:c0 + w])
        _emit_rows(gu, xu, out, rstride, c0, w, acc)


@numba.njit(cache=True, inline="always")
def _load_into(dst, src):  # pragma: no cover - compiled
    """dst[:len(src)] = src as uint32 (slices indexed from 0: vector loads)."""
    for c in range(src.shape[0]):
        dst[c] = np.uint32(src[c])


@numba.njit(cache=True, inline="always")
def _quantize_into(dst, src, scale, limit):  # pragma: no cover - compiled
    """dst[:len(src)] = src quantised to [0, p) as uint32; return how many failed.

    v = rint(x scale) (half to even, float64, as :func:`coding.quantize`); a
    value with |v| > limit, NaN or infinite is counted and stored as 0.
    """
    bad = 0
    for c in range(src.shape[0]):
        v = np.rint(np.float64(src[c]) * scale)
        ok = abs(v) <= limit  # False for NaN and infinities too
        bad += not ok
        iv = np.int64(v if ok else 0.0)
        dst[c] = np.uint32(iv + (_PI if iv < 0 else 0))
    return bad


@numba.njit(parallel=True, cache=True)
def _encode_real_nb(coef, record, scale, limit, block, pad, out, rstride,
                    chunk):  # pragma: no cover - compiled
    """Set out = coef @ [quantised blocks of record; pad] (mod p), fused; return # bad.

    coef (r, K + T) int64; record (L,) float32/64, L <= K block, data block j
    is record[j block:(j + 1) block] (zero-padded); pad (T, block) int64 field
    elements; out as for _combine_nb (r rows of block).  Values v =
    rint(x scale) with |v| > limit (or not finite) are counted and coded as 0.
    """
    k = coef.shape[1]
    kd = k - pad.shape[0]
    gu = _coef32(coef)
    nch = (block + chunk - 1) // chunk
    bad = np.zeros(max(nch, 1), np.int64)
    for b in numba.prange(nch):
        c0 = b * chunk
        w = min(block, c0 + chunk) - c0
        acc = np.empty((2, w), np.uint64)
        xu = np.zeros((gu.shape[1], w), np.uint32)
        for s in range(kd):  # rows past the record's end stay 0 (zero padding)
            start = min(record.shape[0], s * block + c0)
            stop = min(record.shape[0], s * block + c0 + w)
            bad[b] += _quantize_into(xu[s], record[start:stop], scale, limit)
        for s in range(kd, k):
            _load_into(xu[s], pad[s - kd, c0:c0 + w])
        _emit_rows(gu, xu, out, rstride, c0, w, acc)
    return bad.sum()


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


def _flat_rows(out: np.ndarray) -> tuple[np.ndarray, int]:
    """A 2-D array with contiguous rows as (1-D C-contiguous view, row stride).

    The kernels index rows of a 1-D view from 0, so numba knows the stores are
    contiguous (a strided 2-D view would compile to scatter instructions).
    """
    n, d = out.shape
    if n == 0 or d == 0:
        return np.zeros(0, out.dtype), d  # nothing to write
    rstride = out.strides[0] // out.itemsize
    span = (n - 1) * rstride + d
    return np.lib.stride_tricks.as_strided(out, (span,), (out.itemsize,)), rstride


def combine(coef: np.ndarray, x: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """Set ``out[i] = sum_s coef[i, s] * x[rows[s]]`` (mod p), in place.

    ``out`` (r, d) int64 or uint32 with contiguous rows (rows may be strided).
    """
    flat, rstride = _flat_rows(out)
    with _LOCK:
        _combine_nb(coef, x, rows, flat, rstride, encode_chunk(coef.shape[1]))


def encode_real(coef: np.ndarray, record: np.ndarray, scale_bits: int, block: int,
                pad: np.ndarray, out: np.ndarray) -> int:
    """Quantise ``record`` and set ``out = coef @ [its blocks; pad]`` (mod p) in one pass.

    Returns how many values could not be quantised (``out`` is then not valid).
    """
    limit = float((int(_PI) - 1) // 2)
    flat, rstride = _flat_rows(out)
    with _LOCK:
        return int(_encode_real_nb(coef, record, float(2**scale_bits), limit, block,
                                   pad, flat, rstride, encode_chunk(coef.shape[1])))


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
