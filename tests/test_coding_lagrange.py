"""Tests for coding.lagrange and coding.decode: encoding, erasure and error decoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coding import (
    PRIME,
    DecodingError,
    berlekamp_welch,
    decode_erasures,
    decode_errors,
    dequantize,
    encode,
    encoding_matrix,
    evaluation_points,
    lagrange_matrix,
    quantization_step,
    quantize,
)

SETTINGS = settings(derandomize=True, max_examples=25, deadline=None)


def ref_matrix(src, dst):
    """Lagrange matrix with Python integers, straight from the formula."""
    out = np.zeros((len(dst), len(src)), dtype=np.int64)
    for i, z in enumerate(dst):
        for s, ws in enumerate(src):
            num, den = 1, 1
            for j, wj in enumerate(src):
                if j != s:
                    num = num * (int(z) - int(wj)) % PRIME
                    den = den * (int(ws) - int(wj)) % PRIME
            out[i, s] = num * pow(den, PRIME - 2, PRIME) % PRIME
    return out


def ref_encode(blocks, omegas, alphas):
    gen = ref_matrix(omegas, alphas).astype(object)
    return np.asarray((gen @ blocks.astype(object)) % PRIME, dtype=np.int64)


def random_points(rng, k, n):
    pts = rng.choice(PRIME - 1, size=k + n, replace=False).astype(np.int64) + 1
    return pts[:k], pts[k:]


def corrupt_rows(rng, y, rows, sparse=False):
    y = y.copy()
    for r in rows:
        if sparse:  # a single wrong column
            c = rng.integers(y.shape[1])
            y[r, c] = (y[r, c] + rng.integers(1, PRIME)) % PRIME
        else:
            y[r] = (y[r] + rng.integers(1, PRIME, y.shape[1])) % PRIME
    return y


def test_evaluation_points_defaults():
    om, al = evaluation_points(4, 6)
    assert om.tolist() == [1, 2, 3, 4] and al.tolist() == [5, 6, 7, 8, 9, 10]
    assert om.dtype == al.dtype == np.int64
    with pytest.raises(ValueError):
        evaluation_points(0, 3)


def test_encoding_matrix_matches_formula_and_partition_of_unity():
    rng = np.random.default_rng(0)
    for k, n in [(1, 3), (4, 10), (7, 5)]:
        om, al = random_points(rng, k, n)
        gen = encoding_matrix(om, al)
        assert gen.dtype == np.int64 and gen.shape == (n, k)
        assert np.array_equal(gen, ref_matrix(om, al))
        assert np.all(gen.astype(object).sum(axis=1) % PRIME == 1)  # sum_s L_s(z) = 1
    om, _ = evaluation_points(5, 1)
    assert np.array_equal(lagrange_matrix(om, om), np.eye(5, dtype=np.int64))


def test_point_validation():
    with pytest.raises(ValueError, match="distinct"):
        encoding_matrix([1, 2, 2], [5, 6])
    with pytest.raises(ValueError, match="distinct"):
        encoding_matrix([1, 2], [5, 6, 5])
    with pytest.raises(ValueError, match="disjoint"):
        encoding_matrix([1, 2], [2, 6])
    with pytest.raises(ValueError):
        encoding_matrix([1, PRIME], [5])
    with pytest.raises(ValueError):
        encode(np.zeros((3, 4), np.int64), [1, 2], [3, 4])
    with pytest.raises(ValueError):
        encode(np.full((2, 4), PRIME, np.int64), [1, 2], [3, 4])
    with pytest.raises(TypeError):
        encode(np.zeros((2, 4)), [1, 2], [3, 4])


@SETTINGS
@given(
    k=st.integers(1, 8),
    extra=st.integers(0, 12),
    d=st.integers(0, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_encode_matches_reference_and_erasure_decode_round_trips(k, extra, d, seed):
    rng = np.random.default_rng(seed)
    n = k + extra
    om, al = random_points(rng, k, n) if seed % 2 else evaluation_points(k, n)
    x = rng.integers(0, PRIME, (k, d), dtype=np.int64)
    x[:, : min(d, 3)] = PRIME - 1  # extreme values
    y = encode(x, om, al)
    assert y.dtype == np.int64 and y.shape == (n, d)
    assert np.array_equal(y, ref_encode(x, om, al))
    m = int(rng.integers(k, n + 1))
    present = rng.permutation(n)[:m]  # any erasure pattern, any order
    assert np.array_equal(decode_erasures(y[present], al[present], om), x)


def test_encode_large_d_crosses_chunks_and_out_buffer():
    rng = np.random.default_rng(1)
    k, n, d = 3, 7, 20_011
    om, al = evaluation_points(k, n)
    x = rng.integers(0, PRIME, (k, d), dtype=np.int64)
    y = encode(x, om, al)
    cols = rng.choice(d, 50, replace=False)
    assert np.array_equal(y[:, cols], ref_encode(x[:, cols], om, al))
    buf = np.empty((n, d), np.int64)
    assert encode(x, om, al, out=buf) is buf and np.array_equal(buf, y)
    small = np.empty((n, d), np.uint32)  # the stored form: 4 bytes an element
    assert encode(x, om, al, out=small) is small and np.array_equal(small, y)
    with pytest.raises(ValueError):
        encode(x, om, al, out=np.empty((n, d), np.int32))
    assert np.array_equal(decode_erasures(y[-k:], al[-k:], om), x)
    assert np.array_equal(encode(x.astype(np.uint32), om, al), y)  # other integer dtypes


def test_quantised_float_round_trip_through_the_code():
    rng = np.random.default_rng(2)
    k, n, d = 4, 100, 5000
    w = rng.normal(0, 0.1, (k, d)).astype(np.float32)
    om, al = evaluation_points(k, n)
    y = encode(quantize(w), om, al)
    got = dequantize(decode_erasures(y[[97, 3, 50, 12]], al[[97, 3, 50, 12]], om))
    assert np.all(np.abs(got - w) <= quantization_step())


def test_erasure_decode_errors():
    om, al = evaluation_points(3, 5)
    y = encode(np.ones((3, 4), np.int64), om, al)
    with pytest.raises(ValueError, match="not enough slices"):
        decode_erasures(y[:2], al[:2], om)
    with pytest.raises(ValueError, match="distinct"):
        decode_erasures(y[:3], [4, 5, 4], om)
    with pytest.raises(ValueError, match="rows"):
        decode_erasures(y[:3], al[:4], om)
    with pytest.raises(ValueError, match="disjoint"):
        decode_erasures(y[:3], [1, 5, 6], om)


def test_berlekamp_welch_scalar():
    rng = np.random.default_rng(4)
    k, m = 3, 11
    coeffs = rng.integers(0, PRIME, k)
    a = np.arange(10, 10 + m, dtype=np.int64)
    y = np.array(
        [
            sum(int(c) * pow(int(z), j, PRIME) for j, c in enumerate(coeffs)) % PRIME
            for z in a
        ]
    )
    y[[2, 7, 9, 0]] = (y[[2, 7, 9, 0]] + 5) % PRIME
    p, wrong = berlekamp_welch(y, a, k, 4)
    assert np.array_equal(p, coeffs) and wrong.tolist() == [0, 2, 7, 9]
    with pytest.raises(DecodingError):
        berlekamp_welch(y, a, k, 3)
    with pytest.raises(ValueError):
        berlekamp_welch(y, a, k, 5)


@SETTINGS
@given(
    k=st.integers(1, 6),
    redundancy=st.integers(0, 14),
    erased=st.integers(0, 4),
    d=st.integers(1, 200),
    sparse=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_errors_and_erasures_up_to_the_bound_are_corrected_exactly(
    k, redundancy, erased, d, sparse, seed
):
    rng = np.random.default_rng(seed)
    n = k + redundancy + erased
    om, al = random_points(rng, k, n)
    x = rng.integers(0, PRIME, (k, d), dtype=np.int64)
    y = encode(x, om, al)
    present = np.sort(rng.permutation(n)[: n - erased])
    m = present.size
    t = (m - k) // 2
    n_err = int(rng.integers(0, t + 1))
    wrong = np.sort(rng.choice(m, n_err, replace=False))
    received = corrupt_rows(rng, y[present], wrong, sparse=sparse)
    blocks, bad = decode_errors(received, al[present], om, rng_seed=seed)
    assert np.array_equal(blocks, x)
    assert np.array_equal(bad, wrong)


@pytest.mark.parametrize("k,m", [(4, 100), (4, 101), (1, 6), (3, 10), (5, 6), (2, 9)])
@pytest.mark.parametrize("sparse", [False, True])
def test_one_error_beyond_the_bound_is_detected(k, m, sparse):
    rng = np.random.default_rng(k * 1000 + m + sparse)
    om, al = evaluation_points(k, m)
    d = 300 if m >= 100 else 64
    x = rng.integers(0, PRIME, (k, d), dtype=np.int64)
    y = encode(x, om, al)
    t = (m - k) // 2
    for trial in range(3):
        wrong = rng.choice(m, t + 1, replace=False)
        received = corrupt_rows(rng, y, wrong, sparse=sparse)
        with pytest.raises(DecodingError):
            decode_errors(received, al, om, rng_seed=trial)


def test_max_errors_trades_correction_for_detection():
    rng = np.random.default_rng(5)
    k, m = 2, 12  # m - k = 10: t = 5
    om, al = evaluation_points(k, m)
    x = rng.integers(0, PRIME, (k, 50), dtype=np.int64)
    y = encode(x, om, al)
    # correcting at most 2, every pattern of 3..8 wrong slices is detected
    for n_err in range(3, 9):
        received = corrupt_rows(rng, y, rng.choice(m, n_err, replace=False))
        with pytest.raises(DecodingError):
            decode_errors(received, al, om, rng_seed=0, max_errors=2)
    received = corrupt_rows(rng, y, [4, 9])
    blocks, bad = decode_errors(received, al, om, rng_seed=0, max_errors=2)
    assert np.array_equal(blocks, x) and bad.tolist() == [4, 9]
    with pytest.raises(ValueError):
        decode_errors(y, al, om, max_errors=6)


def test_no_redundancy_and_single_parity():
    rng = np.random.default_rng(6)
    om, al = evaluation_points(3, 4)
    x = rng.integers(0, PRIME, (3, 10), dtype=np.int64)
    y = encode(x, om, al)
    blocks, bad = decode_errors(y[:3], al[:3], om)  # m == k: nothing to check against
    assert np.array_equal(blocks, x) and bad.size == 0
    blocks, bad = decode_errors(y, al, om)  # m == k + 1, t == 0
    assert np.array_equal(blocks, x) and bad.size == 0
    with pytest.raises(DecodingError):
        decode_errors(corrupt_rows(rng, y, [2]), al, om)
    with pytest.raises(ValueError, match="not enough slices"):
        decode_errors(y[:2], al[:2], om)
    with pytest.raises(ValueError, match="distinct"):
        decode_errors(y, [5, 6, 5, 7], om)


def test_error_decoding_is_deterministic_with_a_seed_and_handles_empty_d():
    rng = np.random.default_rng(7)
    om, al = evaluation_points(4, 20)
    x = rng.integers(0, PRIME, (4, 1000), dtype=np.int64)
    received = corrupt_rows(rng, encode(x, om, al), [0, 5, 19])
    a = decode_errors(received, al, om, rng_seed=123)
    b = decode_errors(received, al, om, rng_seed=123)
    assert (
        np.array_equal(a[0], b[0])
        and np.array_equal(a[1], b[1])
        and np.array_equal(a[0], x)
    )
    empty = np.zeros((20, 0), np.int64)
    blocks, bad = decode_errors(empty, al, om)
    assert blocks.shape == (4, 0) and bad.size == 0


@pytest.mark.parametrize("row", [0, 9])
def test_error_invisible_to_the_projection_is_still_caught(row):
    """An error orthogonal to the (seeded) projection vector escapes Berlekamp-Welch.

    Certification must still catch it: either the slice is among those decoded
    from (wrong blocks, retry with a fresh projection) or it is compared later.
    """
    rng = np.random.default_rng(8)
    k, m, d, seed = 3, 10, 40, 99
    om, al = evaluation_points(k, m)
    x = rng.integers(0, PRIME, (k, d), dtype=np.int64)
    y = encode(x, om, al)
    r = np.random.default_rng(seed).integers(0, PRIME, size=d, dtype=np.int64)
    err = [int(v) for v in rng.integers(1, PRIME, d)]
    partial = sum(e * int(rv) for e, rv in zip(err[:-1], r[:-1], strict=True))
    err[-1] = (-partial * pow(int(r[-1]), PRIME - 2, PRIME)) % PRIME
    assert sum(e * int(rv) for e, rv in zip(err, r, strict=True)) % PRIME == 0
    received = y.copy()
    received[row] = (received[row] + np.array(err, dtype=np.int64)) % PRIME
    blocks, bad = decode_errors(received, al, om, rng_seed=seed)
    assert np.array_equal(blocks, x) and bad.tolist() == [row]
