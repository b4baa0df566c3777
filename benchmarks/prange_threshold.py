#!/usr/bin/env python
"""From which size does a numba.prange elementwise loop beat the serial one?

    python benchmarks/prange_threshold.py [--threads 2] [--repeats 200]

Times d[i] += g[i] * s[i] (a backward's multiply-accumulate) serial and with
parallel=True / prange at --threads threads, float32 and float64, over sizes 2^10 to
2^22, in two settings: alone, and right after a BLAS call (a 256 x 256 matmul in the
same BLAS pool jitgrad's products use, whose workers then spin for a while and compete
with Numba's threads for the cores). Each time is the minimum over --repeats calls (the
machine is shared: minima are the least disturbed), and the script prints, per dtype and
setting, the smallest size from which prange wins at every larger size measured.

Measured for issue 14 on the 2-core development machine (shared, load 1.3-1.8; Numba's
omp layer): alone, prange won from 2^15 float32 / 2^13-2^14 float64 elements (1.5-2x
from 2^16); right after a BLAS call it lost up to 2^20 elements (OpenBLAS's workers still
spin on the cores Numba's threads want: 30-50 us per call, ms when a worker was
descheduled) and won 1.2-1.3x from 2^20-2^22. The workqueue layer won only from 2^21.
In a backward sweep gemm calls sit between the elementwise kernels, so the threshold to
use there is 2^20 elements.
"""
import argparse
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args(argv)
    os.environ["JITGRAD_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, REPO_ROOT)
    import numba
    import numpy as np
    from numba import njit, prange

    import jitgrad
    from jitgrad._core import threads

    @njit(nogil=True)
    def serial(d, g, s):
        for i in range(d.size):
            d[i] += g[i] * s[i]

    @njit(nogil=True, parallel=True)
    def parallel(d, g, s):
        for i in prange(d.size):
            d[i] += g[i] * s[i]

    a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    print(f"threads: jitgrad {jitgrad.get_num_threads()}", end=", ")
    results = {}
    for dtype in (np.float32, np.float64):
        for size in [2 ** k for k in range(10, 23)]:
            d, g, s = (np.ones(size, dtype) for _ in range(3))
            serial(d, g, s)
            parallel(d, g, s)
            threads.sync_parallel()
            for after_blas in (False, True):
                best = {}
                for name, fn in (("serial", serial), ("prange", parallel)):
                    ts = []
                    for _ in range(args.repeats):
                        if after_blas:
                            a @ a
                        t0 = time.perf_counter()
                        fn(d, g, s)
                        ts.append(time.perf_counter() - t0)
                    best[name] = min(ts)
                results[(np.dtype(dtype).name, after_blas, size)] = best
    print(f"numba {numba.get_num_threads()} ({numba.threading_layer()} layer)")
    print(f"{'dtype':<8} {'after BLAS':<10} {'size':>9} {'serial us':>10} {'prange us':>10} {'speed-up':>8}")
    for (dt, after, size), b in results.items():
        print(f"{dt:<8} {str(after):<10} {size:>9} {b['serial'] * 1e6:>10.2f} {b['prange'] * 1e6:>10.2f} "
              f"{b['serial'] / b['prange']:>8.2f}")
    for dt in ("float32", "float64"):
        for after in (False, True):
            sizes = sorted(size for (d, a_, size) in results if d == dt and a_ == after)
            wins = [results[(dt, after, n)]["prange"] < results[(dt, after, n)]["serial"] for n in sizes]
            start = next((n for i, n in enumerate(sizes) if all(wins[i:])), None)
            print(f"{dt} {'after BLAS' if after else 'alone'}: prange wins from {start} elements on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
