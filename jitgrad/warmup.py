"""Compile (or load from Numba's on-disk cache) the backward engine for float64 and float32.

    python -m jitgrad.warmup

The first run in a fresh environment compiles the scheduler and its kernels (tens of
seconds, once); afterwards they load from the cache in well under a second. The cache
lives in JITGRAD_CACHE_DIR (default ~/.cache/jitgrad), next to the generated module.
"""
import time


def warmup(verbose=True):
    import jitgrad

    t0 = time.perf_counter()
    for dtype in (jitgrad.float64, jitgrad.float32):
        # one backward reaches the scheduler, which compiles every kernel it may call
        x = jitgrad.ones(2, 3, dtype=dtype, requires_grad=True)
        (x * 2.0).sum().backward()
        # the compiled forwards of conv, pool and layer_norm (jitgrad/kernels/conv.py, norm.py)
        F = jitgrad.nn.functional
        img = jitgrad.ones(1, 1, 4, 4, dtype=dtype)
        F.max_pool2d(F.conv2d(img, jitgrad.ones(1, 1, 3, 3, dtype=dtype)), 2)
        F.layer_norm(img, (4,))
        # and the optimizers' compiled updates (jitgrad/optim/_kernels.py)
        for opt in (jitgrad.optim.Adam([x]), jitgrad.optim.SGD([x], lr=0.1, momentum=0.9)):
            opt.step()
        if verbose:
            print(f"jitgrad: backward engine, conv/norm forwards and optimizers ready for {dtype} ({time.perf_counter() - t0:.1f} s so far)")
    return time.perf_counter() - t0


if __name__ == "__main__":
    warmup()
