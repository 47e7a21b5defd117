"""Compile the numba kernels once, at install (``python -m coding.warmup``).

The kernels of :mod:`coding._kernels` are compiled on first use and cached
in the environment by the code's content (``cache=True``, :mod:`coding._cache`):
15-20 s on 2 cores the first time, well under a second from the cache.
``simulate.sh`` runs this right after installing, so a user's coded runs (and
the test suite on a fresh clone) do not pay it, Flower's copies of the app under
``$FLWR_HOME`` included. It calls the public encoders and decoders with every input
and output dtype the app passes them (int64 blocks, float32 / float64
records, int64 / uint32 slices), on a few hundred elements.
"""

from __future__ import annotations

import time

import numpy as np

from .decode import decode_erasures, decode_errors
from .lagrange import encode, encode_quantized, evaluation_points


def compile_kernels() -> float:
    """Compile (or load from the cache) every kernel signature the app uses.

    Returns
    -------
    float
        Seconds it took.

    Raises
    ------
    AssertionError
        A round trip did not give back its blocks (a broken build).
    """
    start = time.perf_counter()
    k, n, d = 3, 6, 300
    omegas, alphas = evaluation_points(k, n)
    blocks = np.arange(k * d, dtype=np.int64).reshape(k, d)
    for dtype in (np.int64, np.uint32):
        slices = encode(blocks, omegas, alphas, out=np.empty((n, d), dtype))
        assert np.array_equal(decode_erasures(slices[1:], alphas[1:], omegas), blocks)
        assert np.array_equal(decode_errors(slices, alphas, omegas, rng_seed=0)[0], blocks)
        for real in (np.float32, np.float64):
            record = np.linspace(-1, 1, k * d, dtype=real)
            encode_quantized(record, omegas, alphas, out=np.empty((n, d), dtype))
    return time.perf_counter() - start


if __name__ == "__main__":
    print(f"coding kernels compiled in {compile_kernels():.1f} s")
