"""Lagrange (Reed-Solomon) encoding of data blocks over GF(2**31 - 1).

Following Lagrange Coded Computing (Yu, Li, Raviv, Kalan, Soltanolkotabi and
Avestimehr, "Lagrange Coded Computing: Optimal Design for Resiliency,
Security and Privacy", AISTATS 2019) as used for coded sharding by Lin et al.,
"Scalable Federated Unlearning via Isolated and Coded Sharding" (IJCAI 2024):
the ``k`` data blocks ``X_1..X_k`` sit at distinct points ``omega_1..omega_k``
of the Lagrange polynomial

    u(z) = sum_s X_s prod_{j != s} (z - omega_j) / (omega_s - omega_j),

of degree ``k - 1``, and client ``i`` stores the coded slice ``u(alpha_i)``.
The slices form codewords (one per column) of an MDS code of length ``n`` and
dimension ``k``: any ``k`` of them determine the data, and ``n`` of them
correct up to ``floor((n - k) / 2)`` wrong ones (see :mod:`coding.decode`).
"""

from __future__ import annotations

import operator
import os
from typing import Any

import numpy as np

from . import _kernels
from .field import (
    DEFAULT_SCALE_BITS,
    PRIME,
    QuantizationRangeError,
    as_field_array,
    check_scale_bits,
    gf,
    quantize,
)

__all__ = ["evaluation_points", "encoding_matrix", "lagrange_matrix", "encode",
           "encode_quantized", "random_field_elements", "pad_private"]


def evaluation_points(k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Default evaluation points: ``omegas = 1..k`` and ``alphas = k+1..k+n``.

    Parameters
    ----------
    k : int
        Number of data blocks (``>= 1``).
    n : int
        Number of coded slices (``>= 1``).

    Returns
    -------
    omegas : numpy.ndarray of int64, shape (k,)
        Points of the data blocks, ``[1, 2, ..., k]``.
    alphas : numpy.ndarray of int64, shape (n,)
        Points of the coded slices, ``[k + 1, ..., k + n]``, disjoint from
        ``omegas``.

    Raises
    ------
    ValueError
        If ``k < 1``, ``n < 1`` or ``k + n >= p``.
    """
    k = operator.index(k)
    n = operator.index(n)
    if k < 1 or n < 1:
        raise ValueError(f"need k >= 1 and n >= 1, got k={k}, n={n}")
    if k + n >= PRIME:
        raise ValueError(f"k + n = {k + n} points do not fit in GF({PRIME}) without 0")
    return np.arange(1, k + 1, dtype=np.int64), np.arange(k + 1, k + n + 1, dtype=np.int64)


def _points(a: Any, name: str) -> np.ndarray:
    pts = as_field_array(a, name, ndim=1)
    if pts.size == 0:
        raise ValueError(f"{name} must hold at least one point")
    if np.unique(pts).size != pts.size:
        vals, counts = np.unique(pts, return_counts=True)
        raise ValueError(
            f"{name} must be distinct; repeated: {vals[counts > 1][:10].tolist()}"
        )
    return pts


def _check_disjoint(omegas: np.ndarray, alphas: np.ndarray) -> None:
    common = np.intersect1d(omegas, alphas)
    if common.size:
        raise ValueError(
            "slice points alphas must be disjoint from block points omegas; "
            f"shared: {common[:10].tolist()}"
        )


def lagrange_matrix(src: Any, dst: Any) -> np.ndarray:
    """Lagrange matrix: values of a degree ``< len(src)`` polynomial at src -> at dst.

    ``L[i, s] = prod_{j != s} (dst_i - src_j) / (src_s - src_j)`` over GF(p),
    computed with galois (``galois.GF(2**31 - 1)``) in the barycentric form
    ``L[i, s] = l(dst_i) w_s / (dst_i - src_s)``, ``l(x) = prod_j (x - src_j)``,
    ``w_s = 1 / prod_{j != s} (src_s - src_j)``: O(n k) element-wise field
    operations (a 1000 x 500 matrix in well under a second).
    :func:`encoding_matrix` is ``lagrange_matrix(omegas, alphas)`` and erasure
    decoding uses ``lagrange_matrix(alphas_used, omegas)``.

    Parameters
    ----------
    src : array_like of int, shape (k,)
        Distinct interpolation points in ``[0, p)``.
    dst : array_like of int, shape (n,)
        Evaluation points in ``[0, p)`` (may coincide with ``src``).

    Returns
    -------
    numpy.ndarray of int64, shape (n, k), elements in ``[0, p)``

    Raises
    ------
    ValueError
        If ``src`` has repeated points, or points lie outside ``[0, p)``.
    """
    src = _points(src, "src")
    dst = as_field_array(dst, "dst", ndim=1)
    field = gf()
    k = src.size
    s_f = field(src)
    diff = field(dst)[:, None] - s_f[None, :]  # (n, k): dst_i - src_j
    cross = s_f[:, None] - s_f[None, :]  # (k, k): src_s - src_j
    cross[np.arange(k), np.arange(k)] = 1
    weights = field.Ones(k) / np.multiply.reduce(cross, axis=1)  # barycentric w_s
    hit = np.asarray(diff == 0)  # dst_i = src_s: row i is the unit vector e_s
    safe = diff.copy()
    safe[hit] = 1
    ell = np.multiply.reduce(safe, axis=1)  # prod_j (dst_i - src_j), zeros left out
    # L[i, s] = ell_i w_s / (dst_i - src_s), O(n k) field operations
    out = (ell[:, None] * weights[None, :]) / safe
    rows = hit.any(axis=1)
    out[rows] = 0
    out[hit] = 1
    return np.asarray(out.view(np.ndarray), dtype=np.int64)


def encoding_matrix(omegas: Any, alphas: Any) -> np.ndarray:
    """Generator matrix ``G`` of the Lagrange code: slices = ``G @ blocks`` (mod p).

    ``G[i, s] = prod_{j != s} (alpha_i - omega_j) / (omega_s - omega_j)`` over
    GF(2**31 - 1), the Lagrange basis polynomial of ``omega_s`` evaluated at
    ``alpha_i`` (Yu et al., AISTATS 2019).  Built with galois (small matrices).

    Parameters
    ----------
    omegas : array_like of int, shape (k,)
        Distinct block points in ``[0, p)``.
    alphas : array_like of int, shape (n,)
        Distinct slice points in ``[0, p)``, disjoint from ``omegas``.

    Returns
    -------
    numpy.ndarray of int64, shape (n, k), elements in ``[0, p)``

    Raises
    ------
    ValueError
        On repeated points, points outside ``[0, p)``, or an ``alpha`` equal
        to an ``omega``.
    """
    om = _points(omegas, "omegas")
    al = _points(alphas, "alphas")
    _check_disjoint(om, al)
    return lagrange_matrix(om, al)


def encode(
    blocks: Any, omegas: Any, alphas: Any, out: np.ndarray | None = None
) -> np.ndarray:
    """Encode ``k`` data blocks into ``n`` Lagrange-coded slices over GF(p).

    Slice ``i`` is ``u(alpha_i) = sum_s G[i, s] * blocks[s]`` (mod p) with
    ``G = encoding_matrix(omegas, alphas)``.  The ``O(n k d)`` product runs in
    a parallel numba kernel (sums of four 32x32->64 bit products, one Mersenne
    fold per four) in column chunks, so the only memory of size ``d`` is the
    output.  :func:`encode_quantized` also fuses the quantisation.

    Parameters
    ----------
    blocks : array_like of int, shape (k, d)
        Data blocks as GF(p) elements in ``[0, p)`` (for example the output of
        :func:`coding.quantize`), int64 preferred (other integer dtypes are
        converted).
    omegas : array_like of int, shape (k,)
        Distinct block points, e.g. from :func:`evaluation_points`.
    alphas : array_like of int, shape (n,)
        Distinct slice points, disjoint from ``omegas``.
    out : numpy.ndarray of int64 or uint32, shape (n, d), optional
        Writeable buffer to write the slices into, each row contiguous (rows
        may be strided: a column range of a wider C-contiguous array); reusing
        a buffer avoids first-touch page faults of a fresh allocation; must
        not overlap ``blocks``. A uint32 buffer (every element of GF(p) fits
        31 bits) halves the bytes written: the slices as they are stored and
        sent.

    Returns
    -------
    numpy.ndarray of int64 or uint32, shape (n, d)
        Coded slices, elements in ``[0, p)`` (``out`` when given, else int64).

    Raises
    ------
    ValueError
        If shapes disagree, points are invalid (see :func:`encoding_matrix`),
        an element lies outside ``[0, p)``, or ``out`` is unsuitable.
    TypeError
        If ``blocks`` is not an integer array.
    """
    x = as_field_array(blocks, "blocks", ndim=2)
    gen = encoding_matrix(omegas, alphas)
    n, k = gen.shape
    if x.shape[0] != k:
        raise ValueError(f"blocks has {x.shape[0]} rows but there are {k} omegas")
    out = _output(out, (n, x.shape[1]), x)
    _kernels.combine(gen, x, np.arange(k, dtype=np.int64), out)
    return out


def _output(out: np.ndarray | None, shape: tuple[int, int], *inputs: np.ndarray
            ) -> np.ndarray:
    """``out`` checked (or a new int64 array): the encoders' output buffer."""
    if out is None:
        return np.empty(shape, dtype=np.int64)
    if not (isinstance(out, np.ndarray) and out.dtype in (np.int64, np.uint32)
            and out.shape == shape and out.flags.writeable
            and (shape[1] <= 1 or out.strides[1] == out.itemsize)):
        raise ValueError(
            "out must be a writeable int64 or uint32 array of shape "
            f"{shape} with contiguous rows")
    if any(np.may_share_memory(out, a) for a in inputs):
        raise ValueError("out must not overlap the encoder's input")
    return out


def random_field_elements(shape: Any, rng: np.random.Generator | None = None
                          ) -> np.ndarray:
    """Uniformly random GF(p) elements (the padding blocks of T-private coding).

    Parameters
    ----------
    shape : int or tuple of int
        Shape of the result.
    rng : numpy.random.Generator, optional
        Source of randomness for reproducible tests; default ``None`` draws
        from the operating system (``os.urandom``), which is what privacy needs.

    Returns
    -------
    numpy.ndarray of int64, the given shape, elements uniform on ``[0, p)``
        31 random bits per element; the one value ``p`` = 2^31 - 1 outside
        the field is redrawn (rejection sampling, so the result is exactly
        uniform).
    """
    size = int(np.prod(shape))
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        if rng is None:
            raw = np.frombuffer(os.urandom(4 * todo.size), dtype=np.uint32)
        else:
            raw = rng.integers(0, 2**32, todo.size, dtype=np.uint32)
        vals = (raw & np.uint32(PRIME)).astype(np.int64)
        ok = vals < PRIME
        out[todo[ok]] = vals[ok]
        todo = todo[~ok]
    return out.reshape(shape)


def pad_private(blocks: Any, t: int, rng: np.random.Generator | None = None
                ) -> np.ndarray:
    """The ``k`` data blocks followed by ``t`` uniformly random padding blocks.

    Lagrange coded computing with T-privacy (Yu et al., AISTATS 2019, Sec. 3):
    encoding ``k + t`` blocks (data at ``omega_1..omega_k``, random padding at
    ``omega_{k+1}..omega_{k+t}``) makes any ``t`` slices uniformly distributed
    and independent of the data, because the ``t x t`` part of the generator
    matrix that multiplies the padding is invertible (an MDS code); decoding
    needs ``k + t`` slices, of which the first ``k`` decoded blocks are the data.

    Parameters
    ----------
    blocks : array_like of int, shape (k, d)
        Data blocks as GF(p) elements.
    t : int
        Number of padding blocks (``>= 0``; 0 returns the blocks unchanged).
    rng : numpy.random.Generator, optional
        See :func:`random_field_elements` (None: operating-system randomness).

    Returns
    -------
    numpy.ndarray of int64, shape (k + t, d)

    Raises
    ------
    ValueError
        If ``t < 0`` or an element of ``blocks`` lies outside ``[0, p)``.
    """
    x = as_field_array(blocks, "blocks", ndim=2)
    t = operator.index(t)
    if t < 0:
        raise ValueError(f"t must be >= 0, got {t}")
    if t == 0:
        return x
    return np.concatenate([x, random_field_elements((t, x.shape[1]), rng)])


def encode_quantized(
    record: Any, omegas: Any, alphas: Any, scale_bits: int = DEFAULT_SCALE_BITS,
    block_len: int | None = None, padding: Any = None, out: np.ndarray | None = None,
) -> np.ndarray:
    """Quantise a real record, cut it into blocks and encode them, in one pass.

    Equals ``encode(pad_private(blocks, T), omegas, alphas)`` where ``blocks``
    is ``quantize(record, scale_bits)`` zero-padded to ``K * block_len``
    elements and reshaped to ``(K, block_len)``, ``K = len(omegas) - T`` and
    the ``T`` padding blocks are ``padding``; but the quantised blocks are
    formed column chunk by column chunk inside the encoding kernel (no int64
    copy of the record, no float64 temporaries).

    Parameters
    ----------
    record : array_like of float, shape (L,)
        Real values (float32 normally; float64 is read as is, integers as
        float64), ``L <= K * block_len``.
    omegas : array_like of int, shape (K + T,)
        Distinct block points; the first K carry the data, the last T the padding.
    alphas : array_like of int, shape (n,)
        Distinct slice points, disjoint from ``omegas``.
    scale_bits : int, default 24
        Fractional bits of the fixed point, in ``[0, 30]`` (see :func:`coding.quantize`).
    block_len : int, optional
        Elements per block, ``>= 1``; default ``max(1, ceil(L / K))``.
    padding : array_like of int, shape (T, block_len), optional
        Padding blocks as GF(p) elements (e.g. :func:`random_field_elements`);
        default none (T = 0).
    out : numpy.ndarray of int64 or uint32, shape (n, block_len), optional
        As for :func:`encode` (contiguous rows, may be a column range of a
        wider array); must not overlap ``record`` or ``padding``.

    Returns
    -------
    numpy.ndarray of int64 or uint32, shape (n, block_len)
        Coded slices in ``[0, p)`` (``out`` when given, else int64).

    Raises
    ------
    coding.QuantizationRangeError
        A value is NaN, infinite or beyond the quantisation range (the message
        of :func:`coding.quantize`); ``out`` then holds no valid slices.
    ValueError
        Bad points or ``scale_bits``, ``record`` not 1-D, ``block_len < 1`` or
        too short for ``record``, ``padding`` of the wrong shape or outside
        ``[0, p)``, no data block left (``T >= len(omegas)``), or unsuitable ``out``.
    TypeError
        ``record`` is not a float or integer array.
    """
    b = check_scale_bits(scale_bits)
    rec = np.asarray(record)
    if not (np.issubdtype(rec.dtype, np.floating) or np.issubdtype(rec.dtype, np.integer)):
        raise TypeError(f"record must be a float array, got dtype {rec.dtype}")
    if rec.ndim != 1:
        raise ValueError(f"record must be 1-dimensional, got shape {rec.shape}")
    if rec.dtype not in (np.float32, np.float64):
        rec = rec.astype(np.float64)
    rec = np.ascontiguousarray(rec)
    gen = encoding_matrix(omegas, alphas)
    pad, block_len = _padding(padding, gen.shape[1], rec.size, block_len)
    out = _output(out, (gen.shape[0], block_len), rec, pad)
    if _kernels.encode_real(gen, rec, b, block_len, pad, out):
        quantize(rec, b)  # raises QuantizationRangeError naming the largest value
        raise QuantizationRangeError(
            f"record has values outside GF({PRIME}) at scale 2**{b}")
    return out


def _padding(padding: Any, k: int, size: int, block_len: int | None
             ) -> tuple[np.ndarray, int]:
    """The (T, block_len) padding blocks and block_len, checked against K = k - T."""
    if padding is not None and np.ndim(padding) != 2:
        raise ValueError(f"padding must be 2-dimensional, got shape {np.shape(padding)}")
    t = 0 if padding is None else np.shape(padding)[0]
    if t >= k:
        raise ValueError(f"{t} padding blocks leave no data block among {k} omegas")
    if block_len is None:
        block_len = max(1, -(-size // (k - t)))
    block_len = operator.index(block_len)
    if block_len < 1 or size > (k - t) * block_len:
        raise ValueError(f"block_len = {block_len}: need >= 1 and K * block_len >= "
                         f"record length {size} (K = {k - t} data blocks)")
    if padding is None:
        return np.zeros((0, block_len), np.int64), block_len
    pad = as_field_array(padding, "padding", ndim=2)
    if pad.shape[1] != block_len:
        raise ValueError(f"padding has {pad.shape[1]} columns, block_len is {block_len}")
    return pad, block_len
