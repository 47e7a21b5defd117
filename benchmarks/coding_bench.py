"""Throughput of the coded-sharding codec (coding/) against galois's own routines.

Usage::

    .venv/bin/python benchmarks/coding_bench.py [--d 1000000 --n 100 --k 4]

Work: ``k`` data blocks of ``d`` float32 parameters each (quantised to
GF(2**31 - 1)), encoded into ``n`` Lagrange-coded slices.  Every row reports
DATA PARAMETERS PER SECOND = ``k * d / seconds`` (for a galois row:
``k * columns / seconds``), whatever the operation touches: encode writes
``n * d`` slice elements (``n k d`` multiply-adds), the error decoder reads
``n * d``.  The "fused" rows start from the float32 parameters and quantise
inside the encoder (:func:`coding.encode_quantized`, the coded recorder's
path); the plain encode rows start from quantised int64 blocks.  Column
"load": the 1-minute load average after the row's runs (2 CPUs; above about 1
the encoder did not have both cores).

Timing: each function first runs on a small input (numba and galois JIT
compilation excluded), then once untimed at full size (on this VM the first
touch of fresh memory is slow; that run pays it), then ``--repeat`` timed runs
whose median is printed.

References, in the same run: galois's own ``GF(G) @ GF(X)`` matrix product on a
column slice of the same encoding work, and ``galois.ReedSolomon`` decoding of
the same number of errors.  galois cannot build RS(100, 4) over GF(2**31 - 1)
(no primitive 100-th root of unity: 100 does not divide p - 1), so it uses the
smallest n0 >= n dividing p - 1, RS(n0, k + n0 - n), shortened to (n, k): for
n=100, k=4 that is RS(126, 30) shortened by 26, with the same n, k and t.  The
galois rows are extrapolated linearly to parameters per second.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import coding  # noqa: E402
from cli.tables import table  # noqa: E402
from coding import PRIME  # noqa: E402

Row = tuple[str, str, float, float, float | None]
CPU_SECONDS: list[float] = []
LOADS: list[float] = []


def median_time(fn: Callable[[], Any], repeat: int, warm: bool = True) -> tuple[float, Any]:
    """Median wall seconds of ``repeat`` calls (after one untimed call if ``warm``).

    Also records the median process CPU seconds in ``CPU_SECONDS[-1]``: with
    2 numba threads, CPU/wall near 2 means the run had both cores to itself;
    much lower means other processes competed for the CPUs; and the 1-minute
    load average after the runs in ``LOADS[-1]``.
    """
    result = fn() if warm else None
    times, cpus = [], []
    for _ in range(repeat):
        result = None
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    CPU_SECONDS.append(statistics.median(cpus))
    LOADS.append(os.getloadavg()[0])
    return statistics.median(times), result


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--d", type=int, default=1_000_000, help="params per data block")
    ap.add_argument("--n", type=int, default=100, help="coded slices (clients)")
    ap.add_argument("--k", type=int, default=4, help="data blocks (shards)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs (median)")
    ap.add_argument("--galois-cols", type=int, default=2000, help="GF matmul columns")
    ap.add_argument("--rs-cols", type=int, default=200, help="galois RS codewords")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=4, help="S, for the shard rows")
    ap.add_argument("--shard-blocks", type=int, default=20,
                    help="K blocks a shard, for the shard rows")
    ap.add_argument("--privacy-t", type=int, default=2, help="T, for the shard rows")
    return ap.parse_args(argv)


def ours(args: argparse.Namespace, rows: list[Row]) -> dict[str, Any]:
    """Time quantize, encode, erasure decode and error decode at full size."""
    k, n, d, rep = args.k, args.n, args.d, args.repeat
    t = (n - k) // 2
    rng = np.random.default_rng(args.seed)
    om, al = coding.evaluation_points(k, n)

    # small warm-up: numba compilation (or cache load) and galois JIT
    small = coding.quantize(rng.normal(0, 1, (k, 5000)).astype(np.float32))
    ys = coding.encode(small, om, al)
    coding.decode_erasures(ys[:k], al[:k], om)
    ys[:t] = rng.integers(0, PRIME, (t, ys.shape[1]))
    coding.decode_errors(ys, al, om, rng_seed=1)

    x = rng.normal(0, 0.05, (k, d)).astype(np.float32)
    sec, blocks = median_time(lambda: coding.quantize(x), rep)
    rows.append(("quantize float32 -> GF(p)", f"{k}x{d}", sec, k * d / sec, None))

    mat = f"({n}x{k}) @ ({k}x{d})"
    sec, slices = median_time(lambda: coding.encode(blocks, om, al), rep)
    rows.append((f"encode (n={n}), new output array", mat, sec, k * d / sec, 10e6))
    buf = np.empty_like(slices)
    sec, _ = median_time(lambda: coding.encode(blocks, om, al, out=buf), rep)
    assert np.array_equal(buf, slices)
    rows.append((f"encode (n={n}), out= buffer", mat, sec, k * d / sec, 10e6))
    buf = np.empty(slices.shape, np.uint32)  # the stored form: half the bytes
    sec, _ = median_time(lambda: coding.encode(blocks, om, al, out=buf), rep)
    assert np.array_equal(buf, slices)
    rows.append((f"encode (n={n}), out= uint32 buffer", mat, sec, k * d / sec, 35e6))
    fused(args, x, slices, buf, rows)
    buf = None

    pick = np.sort(rng.choice(n, k, replace=False))
    have, have_al = slices[pick].copy(), al[pick]
    sec, dec = median_time(lambda: coding.decode_erasures(have, have_al, om), rep)
    assert np.array_equal(dec, blocks), "erasure decode mismatch"
    rows.append(
        (f"erasure decode ({k} slices)", f"{k} of {n} slices", sec, k * d / sec, 30e6)
    )

    bad = np.sort(rng.choice(n, t, replace=False))
    received = slices.copy()
    received[bad] = rng.integers(0, PRIME, (t, d))
    sec, (dec, found) = median_time(
        lambda: coding.decode_errors(received, al, om, rng_seed=args.seed), rep
    )
    assert np.array_equal(dec, blocks), "error decode mismatch"
    assert np.array_equal(found, bad), "wrong slices not identified"
    work = f"{n} slices, {t} wrong"
    rows.append((f"error decode ({t} wrong slices)", work, sec, k * d / sec, 1e6))

    extra = np.setdiff1d(np.arange(n), bad)[0]
    received[extra] = (received[extra] + 1) % PRIME  # one more wrong slice
    c0, t0 = time.process_time(), time.perf_counter()
    try:
        coding.decode_errors(received, al, om, rng_seed=args.seed)
        verdict = "NOT DETECTED"
    except coding.DecodingError:
        verdict = "DecodingError"
    sec = time.perf_counter() - t0
    CPU_SECONDS.append(time.process_time() - c0)
    LOADS.append(os.getloadavg()[0])
    work = f"{n} slices, {t + 1} wrong"
    rows.append((f"  {t + 1} wrong -> {verdict}", work, sec, k * d / sec, None))

    step = coding.quantization_step()
    assert np.max(np.abs(coding.dequantize(dec) - x)) <= step, "round trip"
    return {"om": om, "al": al, "blocks": blocks, "slices": slices, "bad": bad}


def fused(args: argparse.Namespace, x: np.ndarray, slices: np.ndarray,
          buf: np.ndarray, rows: list[Row]) -> None:
    """Time quantise + encode in one kernel (float32 in, uint32 slices out).

    The path :class:`history.coded.recorder.CodedRecorder` takes each round:
    the k blocks are one float32 record cut into blocks of d; into a reused
    buffer, into a new array (first-touch page faults included), and with the
    recorder's own K = n / 2 blocks (coded-loss-budget 0.5, T = 0) for the same
    k d parameters.  The floor row only writes the same bytes (one thread): the
    memory-bandwidth bound of an encoder that writes n d uint32 elements.
    """
    k, n, d, rep = args.k, args.n, args.d, args.repeat
    om, al = coding.evaluation_points(k, n)
    record = x.reshape(-1)
    mat = f"({n}x{k}) @ q({k}x{d})"
    sec, _ = median_time(lambda: coding.encode_quantized(record, om, al, 24, d, out=buf),
                         rep)
    assert np.array_equal(buf, slices)
    rows.append(("quantize+encode fused, out= uint32", mat, sec, k * d / sec, 35e6))
    sec, _ = median_time(lambda: buf.fill(1), rep)
    rows.append(("  floor: fill that buffer (numpy, 1 thread)", f"{n}x{d} uint32", sec,
                 k * d / sec, None))
    sec, _ = median_time(lambda: coding.encode_quantized(
        record, om, al, 24, d, out=np.empty((n, d), np.uint32)), rep)
    rows.append(("quantize+encode fused, new uint32 array", mat, sec, k * d / sec, None))
    kk = max(1, n // 2)
    om, al = coding.evaluation_points(kk, n)
    width = -(-k * d // kk)
    out = np.empty((n, width), np.uint32)
    sec, _ = median_time(lambda: coding.encode_quantized(record, om, al, 24, width,
                                                         out=out), rep)
    rows.append((f"  ... K = n/2 = {kk} blocks (recorder's K)",
                 f"({n}x{kk}) @ q({kk}x{width})", sec, k * d / sec, None))


def shard_rows(args: argparse.Namespace, rows: list[Row]) -> str:
    """Unlearning one shard: decode all shards (one code) vs its own (a code a shard).

    The same history (S records of d parameters) and the same bytes per client:
    one code over all shards has k = K data blocks of S d / K elements and must
    decode all of them (every shard's record) to get one shard; a code per shard
    has K blocks of d / K a shard and decodes only the impacted one, from K
    slices (K + T with T-private padding). Rate: the shard's d parameters / s.
    """
    s, k, d, n, t = args.shards, args.shard_blocks, args.d, args.n, args.privacy_t
    rng = np.random.default_rng(args.seed + 2)
    cases = [(f"decode all {s} shards (one code)", k, 0, s * d),
             ("decode its own shard (a code a shard)", k, 0, d),
             (f"  ... with T = {t} private padding", k, t, d)]
    for name, kk, tt, total in cases:
        om, al = coding.evaluation_points(kk + tt, n)
        width = -(-total // kk)
        blocks = rng.integers(0, PRIME, (kk, width), dtype=np.int64)
        slices = coding.encode(coding.pad_private(blocks, tt, rng), om, al)
        have, have_al = slices[:kk + tt].copy(), al[:kk + tt]
        sec, dec = median_time(functools.partial(coding.decode_erasures, have,
                                                 have_al, om), args.repeat)
        assert np.array_equal(dec[:kk], blocks), name
        work = f"{kk + tt} slices x {width} (fetched {have.nbytes // 2 / 1e6:.1f} MB)"
        rows.append((name, work, sec, d / sec, None))
    return (f"shard rows: S = {s} shards of d = {d} parameters, K = {k} blocks, "
            f"n = {n}; params/s = one shard's d parameters recovered per second; "
            "fetched = uint32 slice bytes the shard's server receives.")


def reference(args: argparse.Namespace, rows: list[Row], st: dict[str, Any]) -> str:
    """Time galois's GF matrix product and ReedSolomon decoding on slices."""
    import galois

    k, n, d = args.k, args.n, args.d
    t = (n - k) // 2
    rng = np.random.default_rng(args.seed + 1)
    field = coding.gf()
    gen = coding.encoding_matrix(st["om"], st["al"])
    blocks, slices = st["blocks"], st["slices"]

    cols = min(args.galois_cols, d)
    g_gf, x_gf = field(gen), field(blocks[:, :cols])
    _ = field(gen[:, :k]) @ field(blocks[:, :10])  # warm-up (JIT)
    sec, prod = median_time(lambda: g_gf @ x_gf, args.repeat)
    got = np.asarray(prod.view(np.ndarray), dtype=np.int64)
    assert np.array_equal(got, slices[:, :cols])
    work = f"({n}x{k}) @ ({k}x{cols})"
    rows.append((f"galois GF(G) @ GF(X), {cols} cols", work, sec, k * cols / sec, None))

    n0 = next(m for m in range(n, 100 * n) if (PRIME - 1) % m == 0)
    k0 = k + (n0 - n)
    t_build = time.perf_counter()
    rs = galois.ReedSolomon(n0, k0, field=field)
    t_build = time.perf_counter() - t_build
    rcols = min(args.rs_cols, d)
    msg = field(np.ascontiguousarray(blocks[:, :rcols].T))  # one codeword per column
    codewords = rs.encode(msg)  # shortened: (rcols, n)
    codewords[:, st["bad"]] = field(rng.integers(0, PRIME, (rcols, t)))
    rs.decode(codewords[:2])  # warm-up (JIT)
    sec, rs_msg = median_time(lambda: rs.decode(codewords), 1, warm=False)
    assert np.array_equal(rs_msg, msg), "galois RS decode mismatch"
    name = f"galois RS({n0},{k0})->({n},{k}), {t} wrong"
    rows.append((name, f"{rcols} codewords", sec, k * rcols / sec, None))
    return (
        f"galois reference code: RS({n0},{k0}) over GF(p) shortened by {n0 - n} to "
        f"({n},{k}) (galois has no RS({n},{k}) over GF(p): {n} does not divide "
        f"p - 1); building it took {t_build:.1f} s (not timed)."
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    args = parse(argv)
    import numba

    k, n, d = args.k, args.n, args.d
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, numba threads "
        f"{numba.get_num_threads()}, numpy {np.__version__}, numba {numba.__version__}"
    )
    print(
        f"work: k={k} blocks x d={d} float32 params, n={n} slices, "
        f"t={(n - k) // 2} wrong slices, GF({PRIME})"
    )
    print(f"params/s = DATA parameters k*d / wall seconds; median of {args.repeat} runs")
    print(f"load average at the start: {os.getloadavg()[0]:.2f} (2 CPUs)")
    print("after a small warm-up (JIT excluded) and one untimed full-size run.\n")
    rows: list[Row] = []
    st = ours(args, rows)
    note = reference(args, rows, st)
    st = None  # free the full-size slices before the shard rows
    note += "\n" + shard_rows(args, rows)
    cells = []
    for (name, work, sec, rate, target), cpu, load in zip(rows, CPU_SECONDS, LOADS,
                                                          strict=True):
        tgt = "" if target is None else f">={target / 1e6:g}M"
        ok = "" if target is None else ("ok" if rate >= target else "BELOW")
        cells.append([name, work, f"{sec:.4f}", f"{cpu:.3f}", f"{rate:.3g}", tgt, ok,
                      f"{load:.2f}"])
    print(table(["operation", "work", "wall s", "cpu s", "params/s", "target", "met",
                 "load"], cells, align="<<"))
    print("\n" + note)
    print("galois rows are extrapolated linearly from their column slice.")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (2 CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
