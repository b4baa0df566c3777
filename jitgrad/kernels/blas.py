"""gemm for the kernels: C = op(X) @ op(Y) + beta * C on C-contiguous 2-D arrays.

It calls the cblas gemm of the library _core/blaslib.py found (numpy's own OpenBLAS by
default), so backward products share the forward's library and thread pool. The address
is registered with LLVM under a jitgrad-owned name that carries the integer width;
compiled code refers to that name, so it survives Numba's on-disk cache and is resolved
again in every process. BLAS_KEY is mixed into every kernel's cache key (_cache.add_key):
a kernel compiled against another library or integer width is never loaded. Calling gemm directly skips np.dot's
shape checks, whose error formatting took seconds of every first compile, and gives
`beta`, so adding a product into an existing gradient needs no temporary and no extra pass.

Where numpy's library exports no known cblas symbols (or JITGRAD_BLAS=scipy) the kernels
call Numba's own np.dot wrapper, `numba_xxgemm`, which forwards to SciPy's BLAS.
Under NUMBA_DISABLE_JIT the same function runs on numpy.
"""
import llvmlite.binding as ll
import numpy as np
from numba import njit, types
from numba.extending import overload
from numba.np.linalg import ensure_blas

from jitgrad._core.blaslib import BLAS_KEY, LIB
from jitgrad.kernels import _cache
from jitgrad.kernels.pointers import as_ptr

__all__ = ["BLAS_KEY", "gemm", "mm"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112   # cblas enums
_N, _T = ord("n"), ord("t")
_CBLAS = LIB.dgemm != 0
_cache.add_key(BLAS_KEY)


def _cblas(dtype, addr):
    """cblas_?gemm(order, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)."""
    name = f"jitgrad_cblas_{'d' if dtype is types.float64 else 's'}gemm_{'ilp64' if LIB.ilp64 else 'lp64'}"
    ll.add_symbol(name, addr)
    i, p, e = types.int64 if LIB.ilp64 else types.int32, types.CPointer(dtype), types.intc
    return types.ExternalFunction(name, types.void(e, e, e, i, i, i, dtype, p, i, p, i, dtype, p, i))


def _xxgemm(dtype):
    p = types.CPointer(dtype)
    sig = types.intc(types.char, types.char, types.char, types.intp, types.intp, types.intp,
                     p, p, types.intp, p, types.intp, p, p, types.intp)
    return types.ExternalFunction("numba_xxgemm", sig)


if _CBLAS:
    _GEMM = {types.float64: _cblas(types.float64, LIB.dgemm), types.float32: _cblas(types.float32, LIB.sgemm)}
else:
    _GEMM = {types.float64: (_xxgemm(types.float64), ord("d")), types.float32: (_xxgemm(types.float32), ord("s"))}


def gemm(x, tx, y, ty, c, beta):
    """c = op(x) @ op(y) + beta * c, op transposing when tx / ty (numpy version)."""
    r = (x.T if tx else x) @ (y.T if ty else y)
    if beta:
        c += r
    else:
        c[...] = r


@overload(gemm)
def _gemm_compiled(x, tx, y, ty, c, beta):
    if _CBLAS:
        fn = _GEMM[c.dtype]
        one = c.dtype(1.0)

        def impl(x, tx, y, ty, c, beta):
            m, n = c.shape
            k = x.shape[0] if tx else x.shape[1]
            if m == 0 or n == 0:
                return
            if k == 0:   # BLAS leaves C alone there (and a zero-sized operand has no valid ld)
                if not beta:
                    c[...] = 0
                return
            fn(_ROW_MAJOR, _TRANS if tx else _NO_TRANS, _TRANS if ty else _NO_TRANS, m, n, k,
               one, as_ptr(x.ctypes.data, c), x.shape[1], as_ptr(y.ctypes.data, c), y.shape[1],
               c.dtype.type(beta), as_ptr(c.ctypes.data, c), n)
        return impl

    ensure_blas()   # the fallback: loads SciPy's BLAS
    fn, kind = _GEMM[c.dtype]

    def impl_xx(x, tx, y, ty, c, beta):
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
    return impl_xx


@njit(nogil=True, cache=True)
def _mm(a, ta, b, tb, n, m):
    out = np.empty((n, m), a.dtype)
    gemm(a, ta, b, tb, out, 0.0)
    return out


def _mm_chosen(a, b):
    """a @ b (2-D host arrays) in the chosen BLAS: a transposed view is read as such."""
    if a.dtype != b.dtype or a.dtype.char not in "fd" or a.ndim != 2 or b.ndim != 2:
        return a.dot(b)
    ta = not a.flags.c_contiguous and a.T.flags.c_contiguous
    tb = not b.flags.c_contiguous and b.T.flags.c_contiguous
    return _mm(a.T if ta else np.ascontiguousarray(a), ta, b.T if tb else np.ascontiguousarray(b), tb,
               a.shape[0], b.shape[1])


# The forward's 2-D products (matmul, addmm, linear): numpy's own when the kernels share
# its library (ndarray.dot, with less dispatch than a compiled call); otherwise (MKL
# chosen) through gemm, so that both directions run in the chosen library.
mm = np.ndarray.dot if LIB.numpy_own else _mm_chosen
