"""gemm for the kernels: C = op(X) @ op(Y) + beta * C on C-contiguous 2-D arrays.

It calls the BLAS wrapper Numba itself uses for np.dot (`numba_xxgemm` in Numba's helper
library, which forwards to SciPy's BLAS). Being an external symbol it survives Numba's
on-disk cache, and calling it directly skips np.dot's shape checks, whose error
formatting took seconds of every first compile, and gives `beta`, so that adding a
product into an existing gradient needs no temporary and no extra pass.
Under NUMBA_DISABLE_JIT the same function runs on numpy.
"""
import numpy as np
from numba import types
from numba.extending import overload
from numba.np.linalg import ensure_blas

from jitgrad.kernels.pointers import as_ptr


def _xxgemm(dtype):
    p = types.CPointer(dtype)
    sig = types.intc(types.char, types.char, types.char, types.intp, types.intp, types.intp,
                     p, p, types.intp, p, types.intp, p, p, types.intp)
    return types.ExternalFunction("numba_xxgemm", sig)


_GEMM = {types.float64: (_xxgemm(types.float64), ord("d")), types.float32: (_xxgemm(types.float32), ord("s"))}
_N, _T = ord("n"), ord("t")


def gemm(x, tx, y, ty, c, beta):
    """c = op(x) @ op(y) + beta * c, op transposing when tx / ty (numpy version)."""
    r = (x.T if tx else x) @ (y.T if ty else y)
    if beta:
        c += r
    else:
        c[...] = r


@overload(gemm)
def _gemm_compiled(x, tx, y, ty, c, beta):
    ensure_blas()
    fn, kind = _GEMM[c.dtype]

    def impl(x, tx, y, ty, c, beta):
        # row-major C (m x n) is column-major C^T, so BLAS computes C^T = op(Y)^T op(X)^T
        m, n = c.shape
        k = x.shape[0] if tx else x.shape[1]
        if m == 0 or n == 0:
            return
        if k == 0:
            if not beta:
                c[...] = 0
            return
        scal = np.empty(2, c.dtype)
        scal[0] = 1.0
        scal[1] = beta
        fn(kind, _T if ty else _N, _T if tx else _N, n, m, k,
           as_ptr(scal.ctypes.data, scal), as_ptr(y.ctypes.data, c), y.shape[1],
           as_ptr(x.ctypes.data, c), x.shape[1], as_ptr(scal.ctypes.data + scal.itemsize, scal),
           as_ptr(c.ctypes.data, c), n)
    return impl
