"""The fast encoders (coding.encode, coding.encode_quantized) against plain references."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coding import (
    MAX_MAGNITUDE,
    PRIME,
    QuantizationRangeError,
    _kernels,
    encode,
    encode_quantized,
    encoding_matrix,
    evaluation_points,
    quantize,
    random_field_elements,
)

SETTINGS = settings(derandomize=True, max_examples=30, deadline=None)
NEAR_TOP = np.array([PRIME - 1, PRIME - 2, PRIME - 3, 0, 1], np.int64)


def ref_encode(blocks: np.ndarray, omegas: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """G @ X mod p with Python integers (no delayed reduction, no chunks)."""
    gen = encoding_matrix(omegas, alphas).astype(object)
    return np.asarray((gen @ blocks.astype(object)) % PRIME, dtype=np.int64)


def ref_encode_quantized(record, omegas, alphas, scale_bits, block_len, padding):
    """quantize, zero-pad to K blocks, append the padding, then ref_encode."""
    t = 0 if padding is None else padding.shape[0]
    q = np.zeros((len(omegas) - t) * block_len, np.int64)
    q[:record.size] = quantize(record, scale_bits)
    blocks = q.reshape(-1, block_len)
    if t:
        blocks = np.concatenate([blocks, padding])
    return ref_encode(blocks, omegas, alphas)


def field_values(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Uniform elements with about a third drawn from the edges (p - 1, p - 2, 0, ...)."""
    x = rng.integers(0, PRIME, shape, dtype=np.int64)
    edge = rng.random(shape) < 0.35
    x[edge] = rng.choice(NEAR_TOP, int(edge.sum()))
    return x


def chunked(width: int | None):
    """Force the kernels' column-chunk width (None: their own choice)."""
    if width is None:
        return mock.patch.object(_kernels, "encode_chunk", _kernels.encode_chunk)
    return mock.patch.object(_kernels, "encode_chunk", lambda rows: width)


@pytest.mark.slow
@SETTINGS
@given(k=st.integers(1, 13), extra=st.integers(0, 16), d=st.integers(0, 300),
       chunk=st.one_of(st.none(), st.integers(1, 70)), seed=st.integers(0, 2**32 - 1))
def test_fast_encode_equals_the_reference(k, extra, d, chunk, seed):
    rng = np.random.default_rng(seed)
    n = k + extra
    om, al = evaluation_points(k, n)
    if seed % 2:  # arbitrary points: arbitrary coefficients, near p - 1 too
        pts = rng.choice(PRIME - 1, size=k + n, replace=False).astype(np.int64) + 1
        om, al = pts[:k], pts[k:]
    x = field_values(rng, (k, d))
    want = ref_encode(x, om, al)
    wide = np.full((n, d + 5), 7, np.uint32)
    with chunked(chunk):
        assert np.array_equal(encode(x, om, al), want)
        assert np.array_equal(encode(x, om, al, out=np.empty((n, d), np.uint32)), want)
        encode(x, om, al, out=wide[:, 2:d + 2])  # a column range of a wider array
    assert np.array_equal(wide[:, 2:d + 2], want)
    assert (wide[:, :2] == 7).all() and (wide[:, d + 2:] == 7).all()


@pytest.mark.slow
@SETTINGS
@given(k=st.integers(1, 10), t=st.integers(0, 3), extra=st.integers(0, 10),
       length=st.integers(0, 400), slack=st.integers(0, 9), bits=st.integers(0, 30),
       f64=st.booleans(), chunk=st.one_of(st.none(), st.integers(1, 50)),
       seed=st.integers(0, 2**32 - 1))
def test_fused_quantise_and_encode_equals_the_reference(
        k, t, extra, length, slack, bits, f64, chunk, seed):
    rng = np.random.default_rng(seed)
    om, al = evaluation_points(k + t, k + t + extra)
    top = MAX_MAGNITUDE / 2.0**bits
    if not f64 and float(np.float32(top)) > top:  # the largest float32 in range
        top = float(np.nextafter(np.float32(top), np.float32(0)))
    record = rng.uniform(-top, top, length)
    pick = rng.random(length)  # edges: the range ends, half steps (ties to even)
    record[pick < 0.1] = top
    record[(pick >= 0.1) & (pick < 0.2)] = -top
    half = (rng.integers(-50, 50, length) + 0.5) / 2.0**bits
    record[pick > 0.8] = half[pick > 0.8]
    record = record if f64 else record.astype(np.float32)
    block_len = max(1, -(-length // k)) + slack  # not a multiple of the chunk
    padding = random_field_elements((t, block_len), rng) if t else None
    want = ref_encode_quantized(record, om, al, bits, block_len, padding)
    with chunked(chunk):
        got = encode_quantized(record, om, al, bits, block_len, padding,
                               out=np.empty((len(al), block_len), np.uint32))
        assert np.array_equal(got, want)
        assert np.array_equal(encode_quantized(record, om, al, bits, block_len,
                                               padding), want)


def test_fused_encode_crosses_default_chunks_into_a_wide_buffer():
    rng = np.random.default_rng(3)
    k, t, n, block_len = 5, 2, 11, 3 * _kernels.encode_chunk(7) + 13
    om, al = evaluation_points(k + t, n)
    record = rng.normal(0, 1, k * block_len - 17).astype(np.float32)
    padding = random_field_elements((t, block_len), rng)
    wide = np.zeros((n, 3 * block_len), np.uint32)
    encode_quantized(record, om, al, 24, block_len, padding,
                     out=wide[:, block_len:2 * block_len])
    cols = np.sort(rng.choice(block_len, 200, replace=False))
    want = ref_encode_quantized(record, om, al, 24, block_len, padding)
    assert np.array_equal(wide[:, block_len:2 * block_len][:, cols], want[:, cols])
    assert not wide[:, :block_len].any() and not wide[:, 2 * block_len:].any()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 64.0, -64.0])
def test_fused_encode_refuses_what_quantize_refuses(bad):
    om, al = evaluation_points(2, 4)
    record = np.linspace(-1, 1, 50, dtype=np.float32)
    record[37] = bad
    with pytest.raises(QuantizationRangeError) as want:
        quantize(record)
    with pytest.raises(QuantizationRangeError) as got:
        encode_quantized(record, om, al, out=np.empty((4, 25), np.uint32))
    assert str(got.value) == str(want.value)


def test_fused_encode_names_bad_arguments():
    om, al = evaluation_points(3, 5)
    rec = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="block_len = 3: need >= 1 and K \\* block_len"):
        encode_quantized(rec, om, al, block_len=3)
    with pytest.raises(ValueError, match="record must be 1-dimensional"):
        encode_quantized(rec.reshape(2, 5), om, al)
    with pytest.raises(TypeError, match="record must be a float array"):
        encode_quantized(rec.astype(bool), om, al)
    with pytest.raises(ValueError, match="padding has 4 columns, block_len is 5"):
        encode_quantized(rec, om, al, padding=np.zeros((1, 4), np.int64))
    with pytest.raises(ValueError, match="3 padding blocks leave no data block"):
        encode_quantized(rec, om, al, padding=np.zeros((3, 4), np.int64))
    with pytest.raises(ValueError, match="padding has elements outside"):
        encode_quantized(rec, om, al, padding=np.full((1, 5), PRIME, np.int64))
    with pytest.raises(ValueError, match="scale_bits must lie in"):
        encode_quantized(rec, om, al, scale_bits=31)
    with pytest.raises(ValueError, match="out must be a writeable int64 or uint32"):
        encode_quantized(rec, om, al, out=np.empty((5, 8), np.uint32)[:, ::2])
    shared = np.zeros(40, np.float32)
    with pytest.raises(ValueError, match="out must not overlap"):
        encode_quantized(shared[:10], om, al,
                         out=shared.view(np.uint32)[5:25].reshape(5, 4))
    assert encode_quantized(np.zeros(0, np.float32), om, al).shape == (5, 1)
