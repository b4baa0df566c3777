"""Strided copy (with a dtype cast) and fill: the two kernels the array core needs.
Indexes are computed from the flat position with the shape and both arrays' strides,
so any view (transposed, broadcast with stride 0, sliced) is read or written in place."""
import numpy as np
from numba import cuda

from jitgrad.gpu import driver, ptx
from jitgrad.gpu.array import KERNELS


@cuda.jit
def _copy(src, soff, sst, dst, doff, dst_st, shape, n):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        r = i
        s = soff
        d = doff
        for k in range(len(shape) - 1, -1, -1):
            c = r % shape[k]
            r //= shape[k]
            s += c * sst[k]
            d += c * dst_st[k]
        dst[d] = src[s]
        i += step


@cuda.jit
def _fill(dst, doff, dst_st, shape, n, value):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        r = i
        d = doff
        for k in range(len(shape) - 1, -1, -1):
            c = r % shape[k]
            r //= shape[k]
            d += c * dst_st[k]
        dst[d] = value
        i += step


def _geometry(a):
    # kernels index with UniTuples; a 0-d array is one element of shape (1,)
    return (tuple(a.shape), tuple(a.estrides)) if a.shape else ((1,), (0,))


def copy(src, dst):
    """dst[...] = src, cast to dst's dtype; src already has dst's shape (or broadcasts as a view)."""
    n = dst.size
    if n == 0:
        return
    shape, dst_st = _geometry(dst)
    _, sst = _geometry(src)
    blocks, threads = driver.grid(n)
    _copy[blocks, threads](src.buf, src.offset, sst, dst.buf, dst.offset, dst_st, shape, n)


def fill(dst, value):
    n = dst.size
    if n == 0:
        return
    shape, dst_st = _geometry(dst)
    blocks, threads = driver.grid(n)
    _fill[blocks, threads](dst.buf, dst.offset, dst_st, shape, n, np.asarray(value).astype(dst.dtype)[()])


KERNELS["copy"] = copy
KERNELS["fill"] = fill

# copy casts between any two dtypes; fill's value is a numpy scalar of dst's dtype
PTX_SIGNATURES = {
    _copy: [(ptx.array(s), ptx.INT, ptx.index(r), ptx.array(d), ptx.INT, ptx.index(r), ptx.index(r), ptx.INT)
            for s in ptx.DTYPES for d in ptx.DTYPES for r in ptx.RANKS],
    _fill: [(ptx.array(d), ptx.INT, ptx.index(r), ptx.index(r), ptx.INT, ptx.scalar(d))
            for d in ptx.DTYPES for r in ptx.RANKS],
}
