"""Compile (or load from Numba's on-disk cache) the backward engine for float64 and float32.

    python -m jitgrad.warmup          # the engine, both dtypes (seconds, once)
    python -m jitgrad.warmup --all    # and every backward kernel and compiled forward (minutes)

Nothing needs this: each kernel compiles the first time a graph uses it and is cached
from then on (jitgrad/engine/kernel_table.py), and a first use says so on stderr. It is
for paying those costs up front: in CI before the tests, or when building an image
whose users should never wait (--all). The cache lives in JITGRAD_CACHE_DIR (default
~/.cache/jitgrad, the generated module) and Numba's cache (next to the sources, or
NUMBA_CACHE_DIR).
"""
import argparse
import time

import jitgrad
from jitgrad._core.layout import DT_OF
from jitgrad.engine.compiled import scheduler


def warmup(verbose=True, everything=False):
    t0 = time.perf_counter()
    for dtype in (jitgrad.float64, jitgrad.float32):
        # a one-element graph runs inline in the sweep: it compiles the engine and no kernel
        x = jitgrad.ones((), dtype=dtype, requires_grad=True)
        (x * 2.0).backward()
        if everything:
            tables = scheduler().KERNELS
            tables.ensure(DT_OF[x._data.dtype], range(tables.nops))
            _forwards(dtype, x)
        if verbose:
            print(f"jitgrad: backward engine{' and kernels' if everything else ''} ready for {dtype} "
                  f"({time.perf_counter() - t0:.1f} s so far)")
    return time.perf_counter() - t0


def _forwards(dtype, x):
    """The compiled forwards that eager ops call directly (conv, pooling, norms) and the
    optimizers' updates."""
    F = jitgrad.nn.functional
    img = jitgrad.ones(1, 1, 4, 4, dtype=dtype)
    F.max_pool2d(F.conv2d(img, jitgrad.ones(1, 1, 3, 3, dtype=dtype)), 2)
    F.layer_norm(img, (4,))
    for opt in (jitgrad.optim.Adam([x]), jitgrad.optim.SGD([x], lr=0.1, momentum=0.9)):
        opt.step()
    with jitgrad.random.fork_rng():  # torch's random kernels (_core/rng.py), the stream left as it was
        jitgrad.randn(17, dtype=dtype), jitgrad.randn(1, dtype=dtype), jitgrad.randperm(3)
        jitgrad.empty(2, dtype=dtype).exponential_()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m jitgrad.warmup", description=__doc__.splitlines()[0])
    p.add_argument("--all", action="store_true", help="also every backward kernel and compiled forward")
    args = p.parse_args(argv)
    warmup(everything=args.all)


if __name__ == "__main__":
    main()
