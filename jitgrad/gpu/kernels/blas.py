"""Matrix products on the device: np.matmul (and np.dot) for DeviceArrays.

Two backends compute a (batched) product; `backend()` says which one runs:
  - "cupy": cuBLAS through cupy, when cupy is installed and a real GPU runs. The operands
    are handed to cupy as views of jitgrad's own memory (`__cuda_array_interface__`), so
    nothing is copied; cupy's matmul picks the cuBLAS gemm (batched, strided).
  - "numba": the kernels below, the fallback (and the only backend the CUDA simulator
    can run).

The numba backend has two kernels; `kernel_for(batch, m, n, k)` picks one:
  - "tiled" for products of at least TILED_MIN multiply-adds: each block computes
    TILE x TILE outputs of one batch entry, staging TILE x TILE tiles of both operands in
    shared memory per step of the inner dimension, so each value read from global memory
    serves TILE multiply-adds. Blocks loop over the output tiles grid-stride, so any grid
    covers any size (the simulator gets one block).
  - "small": one thread per output, a plain dot product. Below TILED_MIN the tiles' two
    barriers per step and their idle threads at the edges cost more than the reuse saves
    (under the simulator, where a barrier switches every Python thread, 100x more).
Both read operands as any strided view (a transpose is read in place), broadcast batch
dims through stride 0, and honour the output's strides, so `out[...] = alpha * a @ b +
beta * out` runs in place (addmm's epilogue, conv2d's output layout).
"""
import importlib

import numba
import numpy as np
from numba import cuda

from jitgrad.gpu import driver
from jitgrad.gpu.array import FUNCTIONS, KERNELS, UFUNCS, DeviceArray

# 16 x 16 = 256 threads a block on a GPU; the simulator runs each thread as a Python thread,
# so there a 4 x 4 tile keeps a block at 16
TILE = 4 if driver.simulated() else 16

# the dtypes the kernel multiplies (torch's CUDA matmul takes floats; numpy also ints)
DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))

_backend = None


def backend():
    """Which backend computes products: "cupy" (cuBLAS) or "numba" (the tiled kernel)."""
    global _backend
    backend = _backend
    if backend is None:
        # decided in a local and published once: a thread reading meanwhile must not see
        # "numba" while another is about to choose "cupy"
        backend = "numba"
        if not driver.simulated():
            try:
                importlib.import_module("cupy")
                backend = "cupy"
            except ImportError:
                pass
        _backend = backend
    return backend


def set_backend(name):
    """Force a backend ("cupy" or "numba"; None: choose again), for tests and benchmarks."""
    global _backend
    if name not in (None, "cupy", "numba"):
        raise ValueError(f"unknown matmul backend {name!r}")
    _backend = name


def _make_gemm(dtype):
    nbtype = numba.from_dtype(dtype)
    zero = nbtype(0)

    @cuda.jit
    def gemm(a, aoff, ab, ars, acs, b, boff, bb, brs, bcs, c, coff, cb, crs, ccs, bshape, m, n, k, alpha, beta):
        """c[i, j] = alpha * sum_q a[i, q] * b[q, j] + beta * c[i, j] per batch entry; ab, bb,
        cb: each operand's strides over the batch dims bshape (elements)."""
        sa = cuda.shared.array((TILE, TILE), nbtype)
        sb = cuda.shared.array((TILE, TILE), nbtype)
        ty = cuda.threadIdx.x // TILE
        tx = cuda.threadIdx.x % TILE
        tm = (m + TILE - 1) // TILE
        tn = (n + TILE - 1) // TILE
        nbatch = 1
        for d in bshape:
            nbatch *= d
        t = cuda.blockIdx.x
        while t < nbatch * tm * tn:
            r = t % (tm * tn)
            q = t // (tm * tn)
            ao = aoff
            bo = boff
            co = coff
            for d in range(len(bshape) - 1, -1, -1):
                x = q % bshape[d]
                q //= bshape[d]
                ao += x * ab[d]
                bo += x * bb[d]
                co += x * cb[d]
            i = (r // tn) * TILE + ty
            j = (r % tn) * TILE + tx
            acc = zero
            for k0 in range(0, k, TILE):
                sa[ty, tx] = a[ao + i * ars + (k0 + tx) * acs] if i < m and k0 + tx < k else zero
                sb[ty, tx] = b[bo + (k0 + ty) * brs + j * bcs] if k0 + ty < k and j < n else zero
                cuda.syncthreads()
                for p in range(TILE):
                    acc += sa[ty, p] * sb[p, tx]
                cuda.syncthreads()
            if i < m and j < n:
                o = co + i * crs + j * ccs
                v = acc * alpha
                if beta != 0:  # c is not read when beta is 0: it may be uninitialised
                    v += c[o] * beta
                c[o] = v
            t += cuda.gridDim.x

    return gemm


def _make_small_gemm(dtype):
    zero = numba.from_dtype(dtype)(0)

    @cuda.jit
    def gemm_small(a, aoff, ab, ars, acs, b, boff, bb, brs, bcs, c, coff, cb, crs, ccs, bshape, m, n, k, alpha,
                   beta):
        """The tiled gemm's product with one thread per output and no shared memory."""
        nbatch = 1
        for d in bshape:
            nbatch *= d
        t = cuda.grid(1)
        while t < nbatch * m * n:
            j = t % n
            i = (t // n) % m
            q = t // (m * n)
            ao = aoff
            bo = boff
            co = coff
            for d in range(len(bshape) - 1, -1, -1):
                x = q % bshape[d]
                q //= bshape[d]
                ao += x * ab[d]
                bo += x * bb[d]
                co += x * cb[d]
            acc = zero
            for p in range(k):
                acc += a[ao + i * ars + p * acs] * b[bo + p * brs + j * bcs]
            o = co + i * crs + j * ccs
            v = acc * alpha
            if beta != 0:
                v += c[o] * beta
            c[o] = v
            t += cuda.gridsize(1)

    return gemm_small


# one kernel of each kind per dtype (the shared tiles and the accumulator are typed), made
# at import so the PTX check sees them
_GEMMS = {"tiled": {dt: _make_gemm(dt) for dt in DTYPES}, "small": {dt: _make_small_gemm(dt) for dt in DTYPES}}

# multiply-adds from which a product runs tiled (an MLP layer's; not a small conv's per-sample one)
TILED_MIN = 1 << 16


def kernel_for(batch, m, n, k):
    """Which numba gemm computes a (batch x) m x k @ k x n product: "tiled" or "small"."""
    return "tiled" if batch * m * n * k >= TILED_MIN else "small"


def _batch_strides(x, bshape):
    """x's element strides over the broadcast batch dims bshape (0 where it broadcasts)."""
    lead = len(bshape) - (x.ndim - 2)
    st = [0] * lead
    for d, s in zip(x.shape[:-2], x.estrides[:-2]):
        st.append(s if d != 1 else 0)
    return tuple(st)


def gemm_into(a, b, out, alpha=1.0, beta=0.0, kernel=None):
    """out = alpha * a @ b + beta * out for DeviceArrays of at least 2 dims, all of out's
    dtype; a's and b's batch dims broadcast to out's. kernel: "tiled" or "small" to force
    the numba kernel (None: the backend's choice)."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    bshape = out.shape[:-2]
    if out.size == 0:
        return out
    if kernel is None and backend() == "cupy":
        _cupy_gemm(a, b, out, alpha, beta)
        return out
    one = bshape or (1,)  # the kernels always loop over at least one batch dim
    ab, bb, cb = (_batch_strides(x, bshape) or (0,) for x in (a, b, out))
    batch = int(np.prod(bshape, dtype=np.int64))
    kernel = kernel or kernel_for(batch, m, n, k)
    if kernel == "tiled":
        blocks, threads = driver.grid(batch * (-(-m // TILE)) * (-(-n // TILE)) * TILE * TILE)[0], TILE * TILE
    else:
        blocks, threads = driver.grid(batch * m * n)
    scalar = out.dtype.type
    _GEMMS[kernel][out.dtype][blocks, threads](
        a.buf, a.offset, ab, a.estrides[-2], a.estrides[-1], b.buf, b.offset, bb, b.estrides[-2], b.estrides[-1],
        out.buf, out.offset, cb, out.estrides[-2], out.estrides[-1], tuple(int(d) for d in one), m, n, k,
        scalar(alpha), scalar(beta))
    return out


# --- cuBLAS through cupy (runs on a real GPU only: untested under the simulator) ---------
class _Interface:
    """A strided view of a DeviceArray as the CUDA array interface, which cupy.asarray
    wraps without copying."""

    def __init__(self, x):
        self.__cuda_array_interface__ = {"shape": x.shape, "typestr": x.dtype.str, "strides": x.strides,
                                         "data": (x.ptr, False), "version": 3}


def _cupy_gemm(a, b, out, alpha, beta):
    cp = importlib.import_module("cupy")
    ca, cb, cc = (cp.asarray(_Interface(x)) for x in (a, b, out))
    if beta == 0 and alpha == 1 and out.is_c_contiguous():
        cp.matmul(ca, cb, out=cc)
        return
    prod = cp.matmul(ca, cb)
    cc[...] = prod * alpha + cc * beta if beta != 0 else prod * alpha


# --- numpy's entry points ------------------------------------------------------------------
def _operand(x, name):
    if isinstance(x, DeviceArray):
        return x
    if isinstance(x, np.ndarray) and x.ndim >= 1:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                           "cuda:0 and cpu!")
    raise ValueError(f"{name}: Input operand {0 if name == 'a' else 1} does not have enough dimensions "
                     "(has 0, gufunc core with signature (n?,k),(k,m?)->(n?,m?) requires 1)")


def matmul(a, b, out=None, dtype=None):
    """np.matmul for DeviceArrays: numpy's shapes (1-D operands promoted, then the added
    dim removed), batch broadcasting and result dtype."""
    a, b = _operand(a, "matmul"), _operand(b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: Input operand {0 if a.ndim == 0 else 1} does not have enough dimensions "
                         "(has 0, gufunc core with signature (n?,k),(k,m?)->(n?,m?) requires 1)")
    dt = np.dtype(dtype) if dtype is not None else np.result_type(a.dtype, b.dtype)
    if dt not in DTYPES:
        raise TypeError(f"numpy.matmul of {dt} is not supported on cuda tensors by jitgrad yet")
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
                         f"(n?,k),(k,m?)->(n?,m?) (size {b2.shape[-2]} is different from {a2.shape[-1]})")
    bshape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    shape = bshape + (a2.shape[-2], b2.shape[-1])
    a2, b2 = (x if x.dtype == dt else x.astype(dt) for x in (a2, b2))
    final = _squeezed(shape, a.ndim, b.ndim)
    if out is not None and (not isinstance(out, DeviceArray) or out.shape != final or out.dtype != dt
                            or (final != shape and not out.is_c_contiguous())):
        raise TypeError("numpy.matmul into other than a cuda array of the result's shape and dtype is not supported "
                        "on cuda tensors by jitgrad yet")
    res = DeviceArray.empty(shape, dt) if out is None else out.reshape(shape) if out.shape != shape else out
    gemm_into(a2, b2, res, 1.0, 0.0)
    return out if out is not None else res.reshape(final)


def _squeezed(shape, na, nb):
    """matmul's result shape once the dims added for 1-D operands are removed."""
    if nb == 1:
        shape = shape[:-1]
    if na == 1:
        shape = shape[:-2] + shape[-1:] if nb > 1 else shape[:-1]
    return shape


def _matmul_ufunc(method, inputs, kwargs):
    if method != "__call__":
        raise TypeError(f"numpy.matmul.{method} is not supported on cuda tensors by jitgrad yet")
    out = kwargs.pop("out", None)
    if isinstance(out, tuple):
        (out,) = out
    extra = set(kwargs) - {"dtype"}
    if extra:
        raise TypeError(f"numpy.matmul with {', '.join(sorted(extra))} is not supported on cuda tensors by jitgrad yet")
    return matmul(*inputs, out=out, dtype=kwargs.get("dtype"))


def dot(a, b, out=None):
    """np.dot for operands of at most 2 dims (where it is matmul)."""
    if a.ndim > 2 or b.ndim > 2:
        raise TypeError("numpy.dot of arrays with more than 2 dims is not supported on cuda tensors by jitgrad yet")
    return matmul(a, b, out=out)


UFUNCS[np.matmul] = _matmul_ufunc
FUNCTIONS[np.dot] = dot
KERNELS["gemm"] = gemm_into


def signature(*args):
    """numba types for a PTX signature: a dtype is a device buffer of it, "i" an int, an
    int n a UniTuple of n ints, ("s", dtype) a scalar (gpu/ptx.py compiles them)."""
    def one(a):
        if isinstance(a, str):  # (a numpy dtype compares equal to its code: "i" is int32)
            return numba.int64
        if isinstance(a, int):
            return numba.types.UniTuple(numba.int64, a)
        if isinstance(a, tuple):
            return numba.from_dtype(np.dtype(a[1]))
        return numba.from_dtype(np.dtype(a))[::1]
    return tuple(one(a) for a in args)


# operands are cast to the result's dtype before the kernel; batch tuples of any rank
PTX_SIGNATURES = {
    **{k: [signature(d, "i", r, "i", "i", d, "i", r, "i", "i", d, "i", r, "i", "i", r, "i", "i", "i", ("s", d), ("s", d))
           for r in (1, 2)] for kind in _GEMMS.values() for d, k in kind.items()},
}
