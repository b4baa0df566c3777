"""numpy's array functions on the device: creation (numpy's `like=`), joining, `where`,
and the shape functions, which are views of the same buffer wherever numpy's are.

Most entries need no kernel of their own: a view is new (offset, shape, strides) over
the same buffer, and a join is one strided copy (gpu/kernels/copy.py) per input into a
slice of the result. Only `arange` and `where` compute values here. The helpers at the
top (device operands, the same-device check, scalars) serve reduce.py and indexing.py
too.
"""
import math
import operator

import numba
import numpy as np
from numba import cuda

from jitgrad.gpu import driver
from jitgrad.gpu.array import FUNCTIONS, KERNELS, DeviceArray

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


# -- the argument types kernels are launched with, for the PTX check (gpu/ptx.py reads each
# kernel module's PTX_SIGNATURES: {kernel: [argument type tuples]}) -----------------------------
TENSOR_DTYPES = ("float32", "float64", "int64", "int32", "bool")
INT = numba.types.int64  # a Python int argument (a size, an offset)


def scalar(dtype):
    return numba.from_dtype(np.dtype(dtype))


def array(dtype):
    """A device buffer (DeviceArray.buf: 1-D, C-contiguous)."""
    return numba.types.Array(scalar(dtype), 1, "C")


def index(rank=1):
    """A shape or strides tuple (one rank stands for all: they type the same code)."""
    return numba.types.UniTuple(numba.types.int64, rank)


# -- operands ------------------------------------------------------------------------------------
def is_scalar(x):
    """A Python number, numpy scalar or host 0-d array: a value, allowed beside CUDA data
    as PyTorch allows 0-d CPU tensors in CUDA ops."""
    return isinstance(x, (bool, int, float, complex, np.generic)) or (isinstance(x, np.ndarray) and x.ndim == 0)


def check_device(x):
    """x itself when it is a DeviceArray or a scalar; host data with dims is the other device."""
    if isinstance(x, DeviceArray) or is_scalar(x):
        return x
    if isinstance(x, (np.ndarray, list, tuple)):
        raise RuntimeError(MIXED)
    raise TypeError(f"unsupported operand type for a cuda array: {type(x).__name__}")


def scalar_value(x):
    """A scalar as numpy gives it to a ufunc: numpy scalars keep their dtype, Python numbers
    stay Python numbers (weak, NEP 50)."""
    if isinstance(x, np.ndarray):
        return x[()]
    return x


def full_device(shape, value, dtype):
    out = DeviceArray.empty(shape, dtype)
    KERNELS["fill"](out, value)
    return out


def as_device(x, dtype=None):
    """x as a DeviceArray (a scalar becomes a 0-d one; device data is not copied unless
    dtype asks for a cast)."""
    x = check_device(x)
    if isinstance(x, DeviceArray):
        return x if dtype is None or x.dtype == np.dtype(dtype) else x.astype(dtype)
    v = scalar_value(x)
    return full_device((), v, np.result_type(v) if dtype is None else dtype)


def _axis(axis, ndim):
    a = operator.index(axis)
    if not -ndim <= a < ndim:
        raise np.exceptions.AxisError(a, ndim)
    return a % ndim


def normalize_axes(axis, ndim):
    """axis (None, an int or a sequence) as a sorted tuple of non-negative dims."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    out = tuple(_axis(a, ndim) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError("duplicate value in 'axis'")
    return tuple(sorted(out))


def _shape(shape):
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)


# -- creation: numpy's like= hands these the arguments without `like` ---------------------------
def _zeros(shape, dtype=float, order="C", **_):
    return full_device(_shape(shape), 0, np.dtype(dtype))


def _ones(shape, dtype=None, order="C", **_):
    return full_device(_shape(shape), 1, np.dtype(dtype or float))


def _empty(shape, dtype=float, order="C", **_):
    return DeviceArray.empty(_shape(shape), np.dtype(dtype))


def _full(shape, fill_value, dtype=None, order="C", **_):
    if isinstance(fill_value, DeviceArray):
        out = DeviceArray.empty(_shape(shape), dtype or fill_value.dtype)
        KERNELS["copy"](fill_value.broadcast_to(out.shape), out)
        return out
    check_device(fill_value)
    dtype = np.dtype(dtype) if dtype is not None else np.asarray(fill_value).dtype
    return full_device(_shape(shape), scalar_value(np.asarray(fill_value)), dtype)


def _like_dtype(a, dtype):
    return np.dtype(dtype) if dtype is not None else a.dtype


def _shape_of(a, shape):
    return a.shape if shape is None else _shape(shape)


def _zeros_like(a, dtype=None, order="K", subok=True, shape=None, **_):
    return full_device(_shape_of(a, shape), 0, _like_dtype(a, dtype))


def _ones_like(a, dtype=None, order="K", subok=True, shape=None, **_):
    return full_device(_shape_of(a, shape), 1, _like_dtype(a, dtype))


def _empty_like(a, dtype=None, order="K", subok=True, shape=None, **_):
    return DeviceArray.empty(_shape_of(a, shape), _like_dtype(a, dtype))


def _full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None, **_):
    return _full(_shape_of(a, shape), fill_value, _like_dtype(a, dtype))


def _array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, **_):
    """np.array / np.asarray(..., like=dev): device data as is (or copied), host data moved
    to the device: the one way host values enter on purpose."""
    if isinstance(obj, DeviceArray):
        out = obj.astype(dtype) if dtype is not None and np.dtype(dtype) != obj.dtype else obj
        if copy is True and out is obj:
            out = obj.copy()
    else:
        out = DeviceArray.from_host(np.asarray(obj, dtype=dtype))
    if out.ndim < ndmin:
        out = out.reshape((1,) * (ndmin - out.ndim) + out.shape)
    return out


def _asarray(obj, dtype=None, order=None, copy=None, **_):
    return _array(obj, dtype=dtype, copy=bool(copy))


@cuda.jit
def _arange_kernel(out, start, step, n):
    i = cuda.grid(1)
    while i < n:
        out[i] = start + i * step
        i += cuda.gridsize(1)


def _arange(start, stop=None, step=None, dtype=None, **_):
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    if step == 0:
        raise ZeroDivisionError("division by zero")
    # numpy's rules: the length from the float span, the dtype from all three values
    n = max(0, int(np.ceil((stop - start) / step)))
    dtype = np.dtype(dtype) if dtype is not None else np.result_type(np.asarray(start), np.asarray(stop),
                                                                       np.asarray(step))
    out = DeviceArray.empty((n,), dtype)
    if n:
        blocks, threads = driver.grid(n)
        _arange_kernel[blocks, threads](out.buf, dtype.type(start), dtype.type(step), n)
    return out


def _eye(N, M=None, k=0, dtype=float, order="C", **_):
    M = N if M is None else M
    out = full_device((N, M), 0, np.dtype(dtype))
    diagonal(out, k).fill(1)
    return out


# -- views -----------------------------------------------------------------------------------------
def diagonal(a, offset=0, axis1=0, axis2=1):
    """numpy's diagonal as a view (numpy's own is a read-only view)."""
    a1, a2 = _axis(axis1, a.ndim), _axis(axis2, a.ndim)
    if a1 == a2:
        raise ValueError("axis1 and axis2 cannot be the same")
    n1, n2 = a.shape[a1], a.shape[a2]
    start = a.offset
    if offset >= 0:
        n = max(0, min(n1, n2 - offset))
        start += offset * a.estrides[a2] if n else 0
    else:
        n = max(0, min(n1 + offset, n2))
        start += -offset * a.estrides[a1] if n else 0
    rest = [d for d in range(a.ndim) if d not in (a1, a2)]
    return a._view(start, tuple(a.shape[d] for d in rest) + (n,),
                   tuple(a.estrides[d] for d in rest) + (a.estrides[a1] + a.estrides[a2],))


def _transpose(a, axes=None):
    return a.transpose() if axes is None else a.transpose(tuple(_axis(x, a.ndim) for x in axes))


def _moveaxis(a, source, destination):
    src = normalize_axes_ordered(source, a.ndim)
    dst = normalize_axes_ordered(destination, a.ndim)
    if len(src) != len(dst):
        raise ValueError("`source` and `destination` arguments must have the same number of elements")
    order = [d for d in range(a.ndim) if d not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return a.transpose(tuple(order))


def normalize_axes_ordered(axis, ndim):
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    out = tuple(_axis(x, ndim) for x in axes)
    if len(set(out)) != len(out):
        raise ValueError("repeated axis")
    return out


def _swapaxes(a, axis1, axis2):
    return a.swapaxes(_axis(axis1, a.ndim), _axis(axis2, a.ndim))


def _expand_dims(a, axis):
    axes = normalize_axes_ordered(axis, a.ndim + (len(axis) if isinstance(axis, (tuple, list)) else 1))
    shape, st, it = [], [], iter(zip(a.shape, a.estrides))
    for d in range(a.ndim + len(axes)):
        if d in axes:
            shape.append(1)
            st.append(0)
        else:
            n, s = next(it)
            shape.append(n)
            st.append(s)
    return a._view(a.offset, tuple(shape), tuple(st))


def _squeeze(a, axis=None):
    if axis is None:
        axes = tuple(d for d in range(a.ndim) if a.shape[d] == 1)
    else:
        axes = normalize_axes_ordered(axis, a.ndim)
        if any(a.shape[d] != 1 for d in axes):
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    keep = [d for d in range(a.ndim) if d not in axes]
    return a._view(a.offset, tuple(a.shape[d] for d in keep), tuple(a.estrides[d] for d in keep))


def _reshape(a, *args, **kwargs):
    shape = kwargs.get("shape", kwargs.get("newshape", args[0] if args else None))
    return a.reshape(_shape(shape))


def _flip(a, axis=None):
    axes = normalize_axes(axis, a.ndim)
    off = a.offset + sum((a.shape[d] - 1) * a.estrides[d] for d in axes if a.shape[d])
    return a._view(off, a.shape, tuple(-s if d in axes else s for d, s in enumerate(a.estrides)))


def _broadcast_to(a, shape, subok=False):
    return as_device(a).broadcast_to(_shape(shape))


def _ascontiguousarray(a, dtype=None, **_):
    a = as_device(a, dtype)
    return a if a.is_c_contiguous() else a.copy()


def _copy(a, order="K", subok=False):
    return a.copy()


def _ravel(a, order="C"):
    return a.reshape(-1)


def _result_type(*arrays_and_dtypes):
    return np.result_type(*(x.dtype if isinstance(x, DeviceArray) else x for x in arrays_and_dtypes))


def _repeat(a, repeats, axis=None):
    """Integer repeats: a broadcast view along a new axis, copied (per-element repeat
    counts are not supported yet)."""
    if not isinstance(repeats, (int, np.integer)):
        raise TypeError("numpy.repeat with per-element repeat counts is not supported on cuda tensors by jitgrad yet")
    if axis is None:
        a, axis = a.reshape(-1), 0
    axis = _axis(axis, a.ndim)
    wide = _expand_dims(a, axis + 1)
    shape = a.shape[:axis + 1] + (int(repeats),) + a.shape[axis + 1:]
    return wide.broadcast_to(shape).reshape(a.shape[:axis] + (a.shape[axis] * int(repeats),) + a.shape[axis + 1:])


# -- joining ---------------------------------------------------------------------------------------
def _concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    arrays = [check_device(x) for x in arrays]
    if not arrays:
        raise ValueError("need at least one array to concatenate")
    arrays = [as_device(x) for x in arrays]
    if axis is None:
        arrays, axis = [x.reshape(-1) for x in arrays], 0
    ref = arrays[0]
    if ref.ndim == 0:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    axis = _axis(axis, ref.ndim)
    for k, x in enumerate(arrays):
        if x.ndim != ref.ndim:
            raise ValueError("all the input array dimensions except for the concatenation axis must match exactly, "
                             f"but along dimension 0, the array at index 0 has {ref.ndim} dimension(s) and the array "
                             f"at index {k} has {x.ndim} dimension(s)")
        for d in range(ref.ndim):
            if d != axis and x.shape[d] != ref.shape[d]:
                raise ValueError("all the input array dimensions except for the concatenation axis must match "
                                 f"exactly, but along dimension {d}, the array at index 0 has size {ref.shape[d]} "
                                 f"and the array at index {k} has size {x.shape[d]}")
    shape = list(ref.shape)
    shape[axis] = sum(x.shape[axis] for x in arrays)
    res = DeviceArray.empty(shape, dtype or np.result_type(*(x.dtype for x in arrays)))
    at = 0
    for x in arrays:
        key = (slice(None),) * axis + (slice(at, at + x.shape[axis]),)
        KERNELS["copy"](x, res[key])
        at += x.shape[axis]
    if out is not None:
        KERNELS["copy"](res, out)
        return out
    return res


def _stack(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    arrays = [as_device(x) for x in arrays]
    if not arrays:
        raise ValueError("need at least one array to stack")
    if any(x.shape != arrays[0].shape for x in arrays):
        raise ValueError("all input arrays must have the same shape")
    axis = _axis(axis, arrays[0].ndim + 1)
    return _concatenate([_expand_dims(x, axis) for x in arrays], axis, out=out, dtype=dtype)


# -- where: the one three-operand selection ------------------------------------------------------
@cuda.jit
def _where_kernel(c, coff, cst, x, xoff, xst, y, yoff, yst, out, shape, n):
    i = cuda.grid(1)
    while i < n:
        r = i
        ci = coff
        xi = xoff
        yi = yoff
        for k in range(len(shape) - 1, -1, -1):
            q = r % shape[k]
            r //= shape[k]
            ci += q * cst[k]
            xi += q * xst[k]
            yi += q * yst[k]
        out[i] = x[xi] if c[ci] else y[yi]
        i += cuda.gridsize(1)


def geometry(a, shape):
    """a's (buf, offset, strides) broadcast to shape, for kernels that index with UniTuples
    (a 0-d shape is one element of shape (1,))."""
    v = a.broadcast_to(shape)
    return v.buf, v.offset, (v.estrides if shape else (0,))


def _where(condition, x=None, y=None):
    if x is None and y is None:
        return FUNCTIONS[np.nonzero](condition)
    if x is None or y is None:
        raise ValueError("either both or neither of x and y should be given")
    for v in (condition, x, y):
        check_device(v)
    dtype = np.result_type(*(v.dtype if isinstance(v, DeviceArray) else scalar_value(v) for v in (x, y)))
    c, x, y = as_device(condition), as_device(x, dtype), as_device(y, dtype)
    shape = np.broadcast_shapes(c.shape, x.shape, y.shape)
    out = DeviceArray.empty(shape, dtype)
    n = out.size
    if n:
        blocks, threads = driver.grid(n)
        _where_kernel[blocks, threads](*geometry(c, shape), *geometry(x, shape), *geometry(y, shape), out.buf,
                                       shape or (1,), n)
    return out


@cuda.jit
def _isclose_kernel(x, xoff, xst, y, yoff, yst, out, shape, n, rtol, atol, equal_nan):
    i = cuda.grid(1)
    while i < n:
        r = i
        xi = xoff
        yi = yoff
        for k in range(len(shape) - 1, -1, -1):
            q = r % shape[k]
            r //= shape[k]
            xi += q * xst[k]
            yi += q * yst[k]
        a = numba.float64(x[xi])
        b = numba.float64(y[yi])
        if a == b:  # equal infinities too
            out[i] = True
        elif a != a or b != b:
            out[i] = equal_nan and a != a and b != b
        elif abs(a) == math.inf or abs(b) == math.inf:  # unequal, one infinite: never close
            out[i] = False
        else:
            out[i] = abs(a - b) <= atol + rtol * abs(b)
        i += cuda.gridsize(1)


def _isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """numpy's isclose, computed in float64: |a - b| <= atol + rtol * |b|."""
    a, b = as_device(a), as_device(b)
    shape = np.broadcast_shapes(a.shape, b.shape)
    out = DeviceArray.empty(shape, np.bool_)
    n = out.size
    if n:
        blocks, threads = driver.grid(n)
        _isclose_kernel[blocks, threads](*geometry(a, shape), *geometry(b, shape), out.buf, shape or (1,), n,
                                         float(rtol), float(atol), bool(equal_nan))
    return out


def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(np.all(_isclose(a, b, rtol, atol, equal_nan)))


def _shape_fn(a):
    return a.shape


def _ndim_fn(a):
    return a.ndim


def _size_fn(a, axis=None):
    return a.size if axis is None else a.shape[axis]


def _clip(a, a_min=None, a_max=None, out=None, **kwargs):
    """numpy's clip function is its clip ufunc (gpu/kernels/elementwise.py's table)."""
    return np._core.umath.clip(a, a_min, a_max, **({"out": out} if out is not None else {}), **kwargs)


FUNCTIONS.update({
    np.zeros: _zeros, np.ones: _ones, np.empty: _empty, np.full: _full,
    np.zeros_like: _zeros_like, np.ones_like: _ones_like, np.empty_like: _empty_like, np.full_like: _full_like,
    np.array: _array, np.asarray: _asarray, np.asanyarray: _asarray, np.arange: _arange, np.eye: _eye,
    np.diagonal: diagonal, np.transpose: _transpose, np.moveaxis: _moveaxis, np.swapaxes: _swapaxes,
    np.expand_dims: _expand_dims, np.squeeze: _squeeze, np.reshape: _reshape, np.flip: _flip,
    np.broadcast_to: _broadcast_to, np.ascontiguousarray: _ascontiguousarray, np.copy: _copy, np.ravel: _ravel,
    np.result_type: _result_type, np.repeat: _repeat, np.concatenate: _concatenate, np.stack: _stack,
    np.where: _where, np.shape: _shape_fn, np.ndim: _ndim_fn, np.size: _size_fn, np.clip: _clip,
    np.isclose: _isclose, np.allclose: _allclose,
})

PTX_SIGNATURES = {
    _arange_kernel: [(array(d), scalar(d), scalar(d), INT) for d in TENSOR_DTYPES if d != "bool"],
    _where_kernel: [(array("bool"), INT, index(), array(d), INT, index(), array(d), INT, index(), array(d), index(),
                     INT) for d in TENSOR_DTYPES],
    _isclose_kernel: [(array(d), INT, index(), array(d), INT, index(), array("bool"), index(), INT, scalar("float64"),
                       scalar("float64"), scalar("bool")) for d in TENSOR_DTYPES],
}
