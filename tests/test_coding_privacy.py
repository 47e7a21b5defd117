"""T-private Lagrange coding: any T slices are uniform, any K + T decode.

Every column of the blocks is coded with its own independent padding, so one
encoding of d columns gives d independent samples of what T colluding clients
see; a chi-square test checks that their joint values are uniform on GF(p)^T
whatever the data.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from coding import (
    PRIME,
    decode_erasures,
    decode_errors,
    encode,
    evaluation_points,
    pad_private,
    random_field_elements,
)

K, T, N, D = 3, 2, 7, 20_000
BINS = 8  # per coordinate: T = 2 slices -> 64 cells, about 312 samples a cell


def _data(kind: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if kind == "zeros":
        return np.zeros((K, D), np.int64)
    if kind == "constant":
        return np.full((K, D), PRIME // 3, np.int64)
    return rng.integers(0, PRIME, (K, D), dtype=np.int64)  # "random"


def _joint_p_value(slices: np.ndarray) -> float:
    """Chi-square p-value of the T slices' joint bins against uniform on GF(p)^T."""
    bins = slices * BINS // PRIME  # (T, D) bin indices in [0, BINS)
    cells = np.ravel_multi_index(tuple(bins), (BINS,) * len(slices))
    counts = np.bincount(cells, minlength=BINS ** len(slices))
    return float(chisquare(counts).pvalue)


@pytest.mark.parametrize("kind", ["zeros", "constant", "random"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_t_slices_are_uniform_whatever_the_data(kind, seed):
    omegas, alphas = evaluation_points(K + T, N)
    padded = pad_private(_data(kind), T, np.random.default_rng(seed))
    slices = encode(padded, omegas, alphas)
    for pair in itertools.combinations(range(N), T):  # every coalition of T clients
        assert _joint_p_value(slices[list(pair)]) > 1e-4, (kind, seed, pair)


def test_the_chi_square_test_sees_non_private_slices():
    """Control: without padding, slices of structured data are far from uniform."""
    omegas, alphas = evaluation_points(K, N)
    slices = encode(_data("constant"), omegas, alphas)
    assert _joint_p_value(slices[:T]) < 1e-12


def test_any_k_plus_t_slices_decode_and_fewer_do_not():
    data = _data("random")[:, :64]
    omegas, alphas = evaluation_points(K + T, N)
    slices = encode(pad_private(data, T), omegas, alphas)  # OS randomness
    for rows in itertools.combinations(range(N), K + T):
        rows = list(rows)
        decoded = decode_erasures(slices[rows], alphas[rows], omegas)
        np.testing.assert_array_equal(decoded[:K], data)
    with pytest.raises(ValueError, match="not enough slices"):
        decode_erasures(slices[:K + T - 1], alphas[:K + T - 1], omegas)
    wrong = slices.copy()  # floor((N - K - T) / 2) = 1 wrong slice is corrected
    wrong[4, ::5] = (wrong[4, ::5] + 99) % PRIME
    decoded, bad = decode_errors(wrong, alphas, omegas, 1)
    np.testing.assert_array_equal(decoded[:K], data)
    assert bad.tolist() == [4]


def test_random_field_elements_are_in_the_field_and_seedable():
    a = random_field_elements((3, 1000), np.random.default_rng(5))
    b = random_field_elements((3, 1000), np.random.default_rng(5))
    assert a.dtype == np.int64 and a.shape == (3, 1000)
    assert ((a >= 0) & (a < PRIME)).all() and np.array_equal(a, b)
    assert not np.array_equal(random_field_elements(1000), random_field_elements(1000))
    assert pad_private(a, 0) is not None and pad_private(a, 0).shape == (3, 1000)
    with pytest.raises(ValueError, match="t must be >= 0"):
        pad_private(a, -1)
