"""Tests for coding.field: GF(2**31 - 1) constants and fixed-point quantisation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from coding import (
    MAX_MAGNITUDE,
    PRIME,
    QuantizationRangeError,
    dequantize,
    gf,
    quantization_step,
    quantize,
)

SETTINGS = settings(derandomize=True, max_examples=25, deadline=None)


def test_constants():
    assert PRIME == 2**31 - 1
    assert MAX_MAGNITUDE == 2**30 - 1
    assert quantization_step() == 2.0**-24
    assert quantization_step(10) == 2.0**-10


@SETTINGS
@given(
    scale_bits=st.integers(0, 30),
    data=st.data(),
)
def test_round_trip_within_one_step(scale_bits, data):
    limit = np.float32(MAX_MAGNITUDE / 2**scale_bits * 0.999)
    x = data.draw(
        hnp.arrays(
            np.float32,
            hnp.array_shapes(min_dims=1, max_dims=3, max_side=8),
            elements=st.floats(-float(limit), float(limit), width=32),
        )
    )
    q = quantize(x, scale_bits)
    assert q.dtype == np.int64 and q.shape == x.shape
    assert np.all((q >= 0) & (q < PRIME))
    back = dequantize(q, scale_bits)
    assert back.dtype == np.float32 and back.shape == x.shape
    assert np.all(np.abs(back.astype(np.float64) - x) <= quantization_step(scale_bits))


def test_exact_for_representable_values_and_sign_mapping():
    x = np.array([0.0, 1.0, -1.0, 0.5, -(2.0**-24), 63.0, -63.0], dtype=np.float32)
    q = quantize(x)
    assert q.tolist() == [
        0,
        2**24,
        PRIME - 2**24,
        2**23,
        PRIME - 1,
        63 * 2**24,
        PRIME - 63 * 2**24,
    ]
    assert np.array_equal(dequantize(q), x)


def test_sums_of_quantised_values_are_exact_mod_p():
    rng = np.random.default_rng(3)
    a = rng.normal(0, 1, 1000).astype(np.float32)
    b = rng.normal(0, 1, 1000).astype(np.float32)
    s = (quantize(a) + quantize(b)) % PRIME
    np.testing.assert_allclose(
        dequantize(s), a.astype(np.float64) + b, atol=2 * quantization_step()
    )


def test_largest_allowed_magnitude_passes_and_one_more_fails():
    top = MAX_MAGNITUDE / 2**24
    assert quantize(np.array([top, -top]), 24).tolist() == [
        MAX_MAGNITUDE,
        PRIME - MAX_MAGNITUDE,
    ]
    with pytest.raises(QuantizationRangeError) as info:
        quantize(np.array([0.0, -64.0, 3.0], dtype=np.float32))
    msg = str(info.value)
    assert "1073741824" in msg  # largest magnitude found: 64 * 2**24
    assert "1073741823" in msg  # largest allowed
    assert isinstance(info.value, ValueError)


def test_range_depends_on_scale():
    x = np.array([1000.0], dtype=np.float32)
    with pytest.raises(QuantizationRangeError):
        quantize(x, 24)
    np.testing.assert_array_equal(dequantize(quantize(x, 16), 16), x)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_raise(bad):
    with pytest.raises(QuantizationRangeError, match="non-finite"):
        quantize(np.array([1.0, bad], dtype=np.float32))


def test_empty_and_argument_errors():
    assert quantize(np.zeros((0, 3), np.float32)).shape == (0, 3)
    with pytest.raises(ValueError):
        quantize(np.ones(2, np.float32), scale_bits=31)
    with pytest.raises(ValueError):
        quantization_step(-1)
    with pytest.raises(TypeError):
        quantize(np.array(["a"]))
    with pytest.raises(ValueError):
        dequantize(np.array([PRIME]))
    with pytest.raises(ValueError):
        dequantize(np.array([-1]))
    with pytest.raises(TypeError):
        dequantize(np.array([1.5]))


def test_zero_dimensional_arrays_keep_their_shape():
    """A 0-d layer (BatchNorm's num_batches_tracked) stays 0-d both ways."""
    q = quantize(np.float32(-0.5), 16)
    assert isinstance(q, np.ndarray) and q.shape == () and int(q) == PRIME - 2**15
    back = dequantize(q, 16)
    assert isinstance(back, np.ndarray) and back.shape == () and float(back) == -0.5


def test_gf_is_the_prime_field():
    field = gf()
    assert field.order == PRIME and field.characteristic == PRIME
    assert int(field(3) * field(5) / field(5)) == 3
