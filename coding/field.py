"""The prime field GF(p), p = 2**31 - 1, and fixed-point quantisation into it.

Field elements are stored as ``numpy.int64`` values in ``[0, p)``.  Because
``p < 2**31`` the product of two elements is ``< 2**62`` and fits a 64-bit
integer, so all O(d) arithmetic runs on plain machine integers (see
:mod:`coding._kernels`); :func:`gf` returns the galois field class used only
for small matrices (generator, decoding and Berlekamp-Welch systems).

Quantisation maps a real ``x`` to the signed integer ``v = round(x * 2**b)``
and stores ``v mod p`` (so ``-|v|`` becomes ``p - |v|``).  Sums of quantised
values stay exact as long as the true signed sum stays within
``(p - 1) // 2`` in magnitude, which is why :func:`quantize` refuses values
beyond that bound instead of wrapping silently.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import numpy as np

from ._kernels import in_field

__all__ = [
    "PRIME",
    "MAX_MAGNITUDE",
    "DEFAULT_SCALE_BITS",
    "QuantizationRangeError",
    "quantize",
    "dequantize",
    "quantization_step",
    "gf",
    "as_field_array",
]

PRIME: int = 2**31 - 1
"""The field modulus p = 2**31 - 1 (a Mersenne prime)."""

MAX_MAGNITUDE: int = (PRIME - 1) // 2
"""Largest signed integer magnitude representable without ambiguity: 2**30 - 1."""

DEFAULT_SCALE_BITS: int = 24
"""Default number of fractional bits of the fixed-point representation."""

_PRIMITIVE_ELEMENT = 7  # 7 is a primitive root modulo 2**31 - 1 (Park & Miller 1988)


class QuantizationRangeError(ValueError):
    """A value cannot be represented in GF(p) at the requested scale.

    Raised by :func:`quantize` when ``|round(x * 2**scale_bits)|`` exceeds
    ``(p - 1) // 2`` or when the input holds NaN or infinity.
    """


def check_scale_bits(scale_bits: int) -> int:
    """Return ``scale_bits`` as an int after checking it lies in ``[0, 30]``.

    Raises
    ------
    TypeError
        If it is not an integer.
    ValueError
        If it is outside ``[0, 30]``.
    """
    try:
        b = operator.index(scale_bits)
    except TypeError:
        raise TypeError(
            f"scale_bits must be an integer, got {type(scale_bits).__name__}"
        ) from None
    if not 0 <= b <= 30:
        raise ValueError(f"scale_bits must lie in [0, 30], got {b}")
    return b


def quantization_step(scale_bits: int = DEFAULT_SCALE_BITS) -> float:
    """Return the quantisation step ``2**-scale_bits``.

    Parameters
    ----------
    scale_bits : int, default 24
        Number of fractional bits, in ``[0, 30]``.

    Returns
    -------
    float
        The spacing between consecutive representable values.  A round trip
        ``dequantize(quantize(x))`` is within one step of ``x`` (half a step
        from rounding plus at most a quarter step from the final float32
        rounding).

    Raises
    ------
    ValueError
        If ``scale_bits`` is outside ``[0, 30]``.
    """
    return float(2.0 ** -check_scale_bits(scale_bits))


def quantize(x: Any, scale_bits: int = DEFAULT_SCALE_BITS) -> np.ndarray:
    """Map real values to GF(p) elements by signed fixed-point rounding.

    Computes ``v = round(x * 2**scale_bits)`` (round half to even, in float64)
    and returns ``v`` for ``v >= 0`` and ``p - |v|`` for ``v < 0``.

    Parameters
    ----------
    x : array_like of float (normally float32), any shape
        Values to quantise.
    scale_bits : int, default 24
        Number of fractional bits, in ``[0, 30]``.  At 24 bits the largest
        representable magnitude is ``(2**30 - 1) / 2**24`` (about 64.0).

    Returns
    -------
    numpy.ndarray of int64, same shape as ``x``
        Field elements in ``[0, p)``, p = 2**31 - 1.

    Raises
    ------
    QuantizationRangeError
        If any value is NaN or infinite, or if ``|round(x * 2**scale_bits)|``
        exceeds ``(p - 1) // 2 = 2**30 - 1``; the message names the largest
        magnitude found and the largest allowed.  Values are never wrapped.
    TypeError
        If ``x`` is not a floating or integer array.
    ValueError
        If ``scale_bits`` is outside ``[0, 30]``.
    """
    b = check_scale_bits(scale_bits)
    arr = np.asarray(x)
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"quantize expects a float array, got dtype {arr.dtype}")
    scaled = np.rint(arr.astype(np.float64, copy=False) * float(2**b))
    if scaled.size == 0:
        return np.zeros(arr.shape, dtype=np.int64)
    finite = np.isfinite(scaled)
    if not finite.all():
        n_bad = int(np.count_nonzero(~finite))
        raise QuantizationRangeError(
            f"cannot quantise {n_bad} non-finite value(s) (NaN or infinity) "
            f"into GF({PRIME})"
        )
    largest = float(np.max(np.abs(scaled)))
    if largest > MAX_MAGNITUDE:
        raise QuantizationRangeError(
            f"value out of range for GF({PRIME}) at scale 2**{b}: "
            f"largest magnitude found |round(x * 2**{b})| = {largest:.0f} "
            f"(|x| = {largest / 2**b:.9g}), largest allowed {MAX_MAGNITUDE} "
            f"(|x| <= {MAX_MAGNITUDE / 2**b:.9g}); use fewer scale_bits or clip"
        )
    v = np.asarray(scaled).astype(np.int64)  # rint of a 0-d array is a scalar
    v[v < 0] += PRIME
    return v


def dequantize(q: Any, scale_bits: int = DEFAULT_SCALE_BITS) -> np.ndarray:
    """Inverse of :func:`quantize`: GF(p) elements back to float32.

    Elements ``q > p // 2`` are read as the negative number ``q - p``; the
    signed integer is multiplied by ``2**-scale_bits`` in float64 and rounded
    to float32.

    Parameters
    ----------
    q : array_like of int, any shape
        Field elements in ``[0, p)``, p = 2**31 - 1.
    scale_bits : int, default 24
        Number of fractional bits used when quantising, in ``[0, 30]``.

    Returns
    -------
    numpy.ndarray of float32, same shape as ``q``

    Raises
    ------
    ValueError
        If an element lies outside ``[0, p)`` or ``scale_bits`` is outside
        ``[0, 30]``.
    TypeError
        If ``q`` is not an integer array.
    """
    b = check_scale_bits(scale_bits)
    arr = as_field_array(q, "q", ndim=None)
    signed = np.where(arr > PRIME // 2, arr - PRIME, arr)
    scaled = signed.astype(np.float64)
    scaled *= 2.0**-b  # in place: a 0-d array stays an array, not a scalar
    return scaled.astype(np.float32)


@functools.lru_cache(maxsize=1)
def gf() -> Any:
    """Return the galois field class ``galois.GF(2**31 - 1)`` (created once).

    Use it for small matrices only: galois is fast for element-wise ufuncs and
    small linear algebra at this prime, but its large matrix products fall back
    to Python integers.  The first call costs about a second (galois import
    and JIT compilation).

    Returns
    -------
    type
        A ``galois.FieldArray`` subclass for GF(p), primitive element 7.
    """
    import galois

    return galois.GF(PRIME, primitive_element=_PRIMITIVE_ELEMENT, verify=False)


def as_field_array(
    a: Any, name: str, ndim: int | None = None, check_range: bool = True
) -> np.ndarray:
    """Validate and convert to a C-contiguous int64 array of GF(p) elements.

    Parameters
    ----------
    a : array_like of int
        Input values; must already lie in ``[0, p)``.
    name : str
        Name used in error messages.
    ndim : int or None
        Required number of dimensions (``None``: any).
    check_range : bool, default True
        Check that int64 input lies in ``[0, p)`` (one parallel pass); callers
        that fuse the check into their own pass set it to False.

    Returns
    -------
    numpy.ndarray of int64, C-contiguous (no copy when already so)

    Raises
    ------
    TypeError
        If the dtype is not an integer dtype.
    ValueError
        If the number of dimensions is wrong or an element is outside ``[0, p)``.
    """
    arr = np.asarray(a)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"{name} must be an integer array of GF({PRIME}) elements, "
            f"got dtype {arr.dtype}"
        )
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {arr.shape}")
    if arr.dtype != np.int64:
        if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= PRIME:
            raise ValueError(f"{name} has elements outside [0, {PRIME})")
        arr = arr.astype(np.int64)
    arr = np.asarray(arr, order="C")  # ascontiguousarray would make 0-d arrays 1-d
    if check_range and arr.size:
        if not in_field(arr.reshape(-1)):
            raise ValueError(
                f"{name} has elements outside [0, {PRIME}) "
                f"(min {int(arr.min())}, max {int(arr.max())})"
            )
    return arr
