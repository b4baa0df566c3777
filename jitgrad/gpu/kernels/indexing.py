"""Advanced indexing on the device, with numpy's semantics: integer and boolean arrays
mixed with slices, ints, None and Ellipsis, for reading (a gather), assignment (a
scatter) and `np.add.at` (a scatter with atomic adds); and what is built on them:
take, take_along_axis, put_along_axis, nonzero / flatnonzero, bincount.

A key is planned on the host into one gather over a view: the basic part (slices,
ints, None) becomes the view's offset and strides, every index array is broadcast to
their common shape B and stacked into one int64 (K, |B|) device array, and each output
position reads its view coordinates either from its own position or from the index
arrays. Where B goes in the result follows numpy: in place when the advanced indices
are adjacent in the key, first otherwise. Boolean masks become index arrays through a
device compaction (their count is copied to the host: the result's size depends on
it). Index values are checked on the device before any read or write; a bad one sets
a flag that the host turns into numpy's IndexError.
"""
import math

import numpy as np
from numba import cuda

from jitgrad.gpu import driver
from jitgrad.gpu.array import FUNCTIONS, KERNELS, UFUNC_METHODS, DeviceArray
from jitgrad.gpu.kernels.functions import (
    INT,
    MIXED,
    TENSOR_DTYPES,
    _arange,
    array,
    as_device,
    check_device,
    full_device,
    geometry,
    index,
    is_scalar,
    scalar_value,
)

NO_SOURCE = -(1 << 30)  # a view dim whose coordinate is always 0

INVALID = ("only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) and integer or boolean arrays "
           "are valid indices")


# -- kernels -------------------------------------------------------------------------------------------
@cuda.jit
def _check(idx, bsize, ksize, kaxis, n, err):
    """err = (1, axis, value) for some index out of [-size, size) (the first thread to
    find one claims err[0], so axis and value belong together)."""
    i = cuda.grid(1)
    while i < n:
        k = i // bsize
        c = idx[i]
        if c < -ksize[k] or c >= ksize[k]:
            if cuda.atomic.compare_and_swap(err, 0, 1) == 0:
                err[1] = kaxis[k]
                err[2] = c
        i += cuda.gridsize(1)


@cuda.jit(device=True)
def _source(i, off, vshape, vst, vsrc, idx, bsize, bdiv, ostr, oshape):
    """The view element that output position i reads (or writes)."""
    b = (i // bdiv) % bsize
    p = off
    for v in range(len(vshape)):
        s = vsrc[v]
        if s >= 0:
            c = (i // ostr[s]) % oshape[s]
        elif s == NO_SOURCE:
            c = 0
        else:
            c = idx[(-s - 1) * bsize + b]
            if c < 0:
                c += vshape[v]
        p += c * vst[v]
    return p


@cuda.jit
def _gather(src, off, vshape, vst, vsrc, idx, bsize, bdiv, ostr, oshape, n, out):
    i = cuda.grid(1)
    while i < n:
        out[i] = src[_source(i, off, vshape, vst, vsrc, idx, bsize, bdiv, ostr, oshape)]
        i += cuda.gridsize(1)


@cuda.jit(device=True)
def _value_at(i, voff, vstr, oshape):
    q = voff
    for k in range(len(oshape) - 1, -1, -1):
        q += (i % oshape[k]) * vstr[k]
        i //= oshape[k]
    return q


@cuda.jit
def _scatter(dst, off, vshape, vst, vsrc, idx, bsize, bdiv, ostr, oshape, n, val, voff, vstr):
    i = cuda.grid(1)
    while i < n:
        dst[_source(i, off, vshape, vst, vsrc, idx, bsize, bdiv, ostr, oshape)] = val[_value_at(i, voff, vstr, oshape)]
        i += cuda.gridsize(1)


@cuda.jit
def _scatter_add(dst, off, vshape, vst, vsrc, idx, bsize, bdiv, ostr, oshape, n, val, voff, vstr):
    i = cuda.grid(1)
    while i < n:
        p = _source(i, off, vshape, vst, vsrc, idx, bsize, bdiv, ostr, oshape)
        cuda.atomic.add(dst, p, val[_value_at(i, voff, vstr, oshape)])
        i += cuda.gridsize(1)


# -- compaction: the positions of nonzero elements, in order --------------------------------------------
@cuda.jit(device=True)
def _nz(m, moff, mshape, mst, j):
    q = moff
    for k in range(len(mshape) - 1, -1, -1):
        q += (j % mshape[k]) * mst[k]
        j //= mshape[k]
    return m[q] != 0


@cuda.jit
def _count_chunks(m, moff, mshape, mst, n, chunk, nchunks, counts):
    c = cuda.grid(1)
    while c < nchunks:
        total = 0
        for j in range(c * chunk, min(n, (c + 1) * chunk)):
            if _nz(m, moff, mshape, mst, j):
                total += 1
        counts[c] = total
        c += cuda.gridsize(1)


@cuda.jit
def _scan(counts, nchunks, starts):
    # one thread: the chunk counts are few (at most MAX_CHUNKS)
    if cuda.grid(1) == 0:
        acc = 0
        for c in range(nchunks):
            starts[c] = acc
            acc += counts[c]
        starts[nchunks] = acc


@cuda.jit
def _write_chunks(m, moff, mshape, mst, n, chunk, nchunks, starts, out):
    c = cuda.grid(1)
    while c < nchunks:
        at = starts[c]
        for j in range(c * chunk, min(n, (c + 1) * chunk)):
            if _nz(m, moff, mshape, mst, j):
                out[at] = j
                at += 1
        c += cuda.gridsize(1)


@cuda.jit
def _unravel(flat, cnt, shape, out):
    i = cuda.grid(1)
    while i < cnt:
        r = flat[i]
        for k in range(len(shape) - 1, -1, -1):
            out[k * cnt + i] = r % shape[k]
            r //= shape[k]
        i += cuda.gridsize(1)


MAX_CHUNKS = 4096


def flatnonzero_of(m):
    """The C-order flat positions of m's nonzero elements, int64, on the device: chunks
    counted in parallel, their starts scanned, then each chunk written in order. The
    total (one int) comes to the host: it is the result's size."""
    n = m.size
    if n == 0:
        return DeviceArray.empty((0,), np.int64)
    nchunks = min(n, MAX_CHUNKS)
    chunk = -(-n // nchunks)
    nchunks = -(-n // chunk)
    shape, st = (m.shape, m.estrides) if m.shape else ((1,), (0,))
    counts = driver.alloc(nchunks, np.int64)
    starts = driver.alloc(nchunks + 1, np.int64)
    blocks, threads = driver.grid(nchunks)
    _count_chunks[blocks, threads](m.buf, m.offset, shape, st, n, chunk, nchunks, counts)
    _scan[1, 1](counts, nchunks, starts)
    total = int(starts[nchunks:nchunks + 1].copy_to_host()[0])
    out = DeviceArray.empty((total,), np.int64)
    if total:
        _write_chunks[blocks, threads](m.buf, m.offset, shape, st, n, chunk, nchunks, starts, out.buf)
    return out


def nonzero(a):
    if a.ndim == 0:
        raise ValueError("Calling nonzero on 0d arrays is not allowed. Use np.atleast_1d(scalar).nonzero() instead. "
                         "If the context of this error is of the form `arr[nonzero(cond)]`, just use `arr[cond]`.")
    flat = flatnonzero_of(a)
    cnt = flat.size
    coords = DeviceArray.empty((a.ndim, cnt), np.int64)
    if cnt:
        blocks, threads = driver.grid(cnt)
        _unravel[blocks, threads](flat.buf, cnt, a.shape, coords.buf)
    return tuple(coords[k] for k in range(a.ndim))


def _flatnonzero(a):
    return flatnonzero_of(as_device(a))


# -- planning a key ------------------------------------------------------------------------------------
def _index_array(k):
    """An index item that is an array, as a device array: host indices are moved to the
    device, as PyTorch takes CPU index tensors for CUDA data."""
    if isinstance(k, DeviceArray):
        arr = k
    else:
        host = np.asarray(k)
        if isinstance(k, list) and host.size == 0:
            host = host.astype(np.int64)
        elif isinstance(k, list) and host.dtype.kind not in "biu":
            raise IndexError(INVALID)  # numpy's message for a list, not an array, of non-integers
        arr = DeviceArray.from_host(host)
    if arr.dtype.kind not in "biu":
        raise IndexError("arrays used as indices must be of integer (or boolean) type")
    return arr


def _items(a, key):
    """key as a list of ("slice", s) / ("none",) / ("int", i) / ("array", int array) /
    ("mask", bool array) / ("dummy", n: a 0-d bool's length) with Ellipsis expanded."""
    key = key if isinstance(key, tuple) else (key,)
    items = []
    for k in key:
        if k is None:
            items.append(("none",))
        elif k is Ellipsis:
            items.append(("ellipsis",))
        elif isinstance(k, slice):
            items.append(("slice", k))
        elif isinstance(k, (bool, np.bool_)):
            items.append(("dummy", int(bool(k))))
        elif isinstance(k, (int, np.integer)):
            items.append(("int", int(k)))
        elif isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
            items.append(("int", int(k)))  # numpy takes a 0-d integer array as an integer
        elif isinstance(k, (DeviceArray, np.ndarray, list)):
            arr = _index_array(k)
            if arr.dtype.kind == "b":
                items.append(("mask", arr) if arr.ndim else ("dummy", int(bool(arr.item()))))
            else:
                items.append(("array", arr))
        elif hasattr(k, "__index__"):
            items.append(("int", int(k.__index__())))
        else:
            raise IndexError(INVALID)
    used = sum(it[1].ndim if it[0] == "mask" else it[0] in ("slice", "int", "array") for it in items)
    if used > a.ndim:
        raise IndexError(f"too many indices for array: array is {a.ndim}-dimensional, but {used} were indexed")
    ell = [j for j, it in enumerate(items) if it[0] == "ellipsis"]
    if len(ell) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    fill = [("slice", slice(None))] * (a.ndim - used)
    if ell:
        items = items[:ell[0]] + fill + items[ell[0] + 1:]
    else:
        items = items + fill
    return items


def _expand_masks(a, items):
    """Each boolean mask becomes one index array per dim it covers (its nonzero)."""
    out, d = [], 0
    for it in items:
        if it[0] == "mask":
            m = it[1]
            for j in range(m.ndim):
                if m.shape[j] != a.shape[d + j]:
                    raise IndexError(f"boolean index did not match indexed array along axis {d + j}; size of axis "
                                     f"is {a.shape[d + j]} but size of corresponding boolean axis is {m.shape[j]}")
            out.extend(("array", c) for c in nonzero(m))
            d += m.ndim
            continue
        out.append(it)
        d += it[0] in ("slice", "int", "array")
    return out


class Plan:
    """One gather/scatter: the view (offset, and per view dim: size, stride, where its
    coordinate comes from), the stacked index arrays, and the output shape."""

    def __init__(self, a, key):
        items = _expand_masks(a, _items(a, key))
        adv = [j for j, it in enumerate(items) if it[0] in ("int", "array", "dummy")]
        arrays = [(j, it[1]) for j, it in enumerate(items) if it[0] == "array"]
        dummies = [it[1] for it in items if it[0] == "dummy"]
        try:
            self.bshape = np.broadcast_shapes(*(x.shape for _, x in arrays), *((n,) for n in dummies))
        except ValueError:
            shapes = " ".join("(" + ",".join(str(n) for n in x.shape) + ("," if x.ndim == 1 else "") + ")"
                              for _, x in arrays)
            raise IndexError(f"shape mismatch: indexing arrays could not be broadcast together with shapes "
                             f"{shapes} ") from None
        adjacent = adv == list(range(adv[0], adv[0] + len(adv))) if adv else True
        basic = []  # (size, stride) of the non-advanced output dims, in key order
        where_b = 0
        self.offset, d = a.offset, 0
        vdims = []  # (size, stride, source) with source an output dim of `basic`, or ("k", k)
        k_of = {j: k for k, (j, _) in enumerate(arrays)}
        self.ksize, self.kaxis = [], []
        for j, it in enumerate(items):
            if adv and j == adv[0]:
                where_b = len(basic)
            kind = it[0]
            if kind == "none":
                basic.append(1)
            elif kind == "slice":
                start, stop, step = it[1].indices(a.shape[d])
                n = len(range(start, stop, step))
                self.offset += start * a.estrides[d] if n else 0
                vdims.append((n, a.estrides[d] * step, len(basic)))
                basic.append(n)
                d += 1
            elif kind == "int":
                i = it[1]
                if not -a.shape[d] <= i < a.shape[d]:
                    raise IndexError(f"index {i} is out of bounds for axis {d} with size {a.shape[d]}")
                self.offset += (i % a.shape[d]) * a.estrides[d]
                d += 1
            elif kind == "array":
                vdims.append((a.shape[d], a.estrides[d], ("k", k_of[j])))
                self.ksize.append(a.shape[d])
                self.kaxis.append(d)
                d += 1
        nb = len(self.bshape)
        if not adjacent:
            where_b = 0
        self.out_shape = tuple(basic[:where_b]) + tuple(self.bshape) + tuple(basic[where_b:])

        def out_dim(s):  # a `basic` dim's place in the output
            return s if s < where_b else s + nb

        self.vshape = tuple(n for n, _, _ in vdims) or (1,)
        self.vst = tuple(s for _, s, _ in vdims) or (0,)
        self.vsrc = tuple(-(src[1] + 1) if isinstance(src, tuple) else out_dim(src) for _, _, src in vdims) \
            or (NO_SOURCE,)
        ostr, acc = [], 1
        for n in reversed(self.out_shape):
            ostr.append(acc)
            acc *= n
        self.ostr = tuple(reversed(ostr)) or (1,)
        self.oshape = tuple(self.out_shape) or (1,)
        self.bsize = math.prod(self.bshape)
        self.bdiv = self.ostr[where_b + nb - 1] if nb else 1
        self.idx = self._stack([x for _, x in arrays])

    def _stack(self, arrays):
        """The index arrays broadcast to B, as one contiguous int64 (K, |B|) device array,
        checked against their dims' sizes."""
        if not arrays or self.bsize == 0:
            return driver.alloc(1, np.int64)
        (x, *more) = arrays
        if not more and x.dtype == np.int64 and x.offset == 0 and x.shape == self.bshape and x.is_c_contiguous():
            idx = x  # already the layout (a flat index array): no copy
        else:
            idx = DeviceArray.empty((len(arrays),) + tuple(self.bshape), np.int64)
            for k, x in enumerate(arrays):
                KERNELS["copy"](x.broadcast_to(self.bshape), idx[k])
        err = driver.alloc(3, np.int64)
        KERNELS["fill"](DeviceArray(err, 0, (3,), (1,), np.dtype(np.int64)), 0)
        n = idx.size
        blocks, threads = driver.grid(n)
        _check[blocks, threads](idx.buf, self.bsize, tuple(self.ksize), tuple(self.kaxis), n, err)
        flag, axis, value = err.copy_to_host()
        if flag:
            raise IndexError(f"index {value} is out of bounds for axis {axis} with size {self.ksize[self.kaxis.index(axis)]}")
        return idx.buf

    def launch_args(self):
        return (self.offset, self.vshape, self.vst, self.vsrc, self.idx, max(self.bsize, 1), self.bdiv, self.ostr,
                self.oshape, math.prod(self.out_shape))


def getitem_advanced(a, key):
    plan = Plan(a, key)
    out = DeviceArray.empty(plan.out_shape, a.dtype)
    if out.size:
        blocks, threads = driver.grid(out.size)
        _gather[blocks, threads](a.buf, *plan.launch_args(), out.buf)
    return out


def _values(plan, dst, value):
    """value as a device array of the indexing result's shape (a broadcast view), cast
    to dst's dtype; host arrays with dims are another device."""
    if not (isinstance(value, DeviceArray) or is_scalar(value)):
        raise RuntimeError(MIXED) if isinstance(value, (np.ndarray, list, tuple)) else TypeError(
            f"cannot assign {type(value).__name__} to a cuda array")
    v = as_device(value if isinstance(value, DeviceArray) else scalar_value(value), dst.dtype)
    try:
        return v.broadcast_to(plan.out_shape)
    except ValueError:
        raise ValueError(f"shape mismatch: value array of shape {v.shape} could not be broadcast to indexing "
                         f"result of shape {plan.out_shape}") from None


def _scatter_into(kernel, a, key, value):
    plan = Plan(a, key)
    v = _values(plan, a, value)
    if v.buf is a.buf:  # the values read while a is written (a[i] = a[j]): read a copy, as numpy
        v = v.copy().broadcast_to(plan.out_shape)
    n = math.prod(plan.out_shape)
    if n:
        buf, voff, vstr = geometry(v, plan.out_shape)
        blocks, threads = driver.grid(n)
        kernel[blocks, threads](a.buf, *plan.launch_args(), buf, voff, vstr)


def setitem_advanced(a, key, value):
    """a[key] = value. Repeated indices: one of the values wins (which one is not defined,
    as in PyTorch on CUDA)."""
    _scatter_into(_scatter, a, key, value)


_ATOMIC_ADD = {np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64)}


def add_at(inputs, kwargs):
    """np.add.at(a, indices, values): repeated indices all add (atomic adds)."""
    if len(inputs) != 3 or kwargs:
        raise TypeError("numpy.add.at takes (a, indices, values) on cuda tensors")
    a, key, value = inputs
    if not isinstance(a, DeviceArray):
        check_device(a)
        raise TypeError("numpy.add.at into a host array with cuda values: " + MIXED)
    if a.dtype not in _ATOMIC_ADD:
        raise TypeError(f"numpy.add.at on a cuda array of dtype {a.dtype} is not supported by jitgrad yet "
                        "(CUDA has no atomic add for it)")
    _scatter_into(_scatter_add, a, key if isinstance(key, tuple) else (key,), value)


# -- functions built on indexing -----------------------------------------------------------------------
def _take(a, indices, axis=None, out=None, mode="raise"):
    if mode != "raise" or out is not None:
        raise TypeError("numpy.take with out= or mode= is not supported on cuda tensors by jitgrad yet")
    if axis is None:
        return getitem_advanced(a.reshape(-1), _as_key(indices))
    axis = axis % a.ndim if -a.ndim <= axis < a.ndim else _bad_axis(axis, a.ndim)
    return getitem_advanced(a, (slice(None),) * axis + _as_key(indices))


def _as_key(indices):
    # a scalar index keeps numpy's take result (no dim); arrays index as arrays
    return (int(indices),) if isinstance(indices, (int, np.integer)) else (_index_array(indices),)


def _bad_axis(axis, ndim):
    raise np.exceptions.AxisError(axis, ndim)


def _along_axis_key(arr, indices, axis):
    """numpy's fancy-index equivalent of take_along_axis: aranges on the other dims."""
    indices = _index_array(indices)
    if indices.dtype.kind == "b":
        raise IndexError("`indices` must be an integer array")
    if indices.ndim != arr.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    key = []
    for d, n in enumerate(arr.shape):
        if d == axis:
            key.append(indices)
        else:
            shape = [1] * arr.ndim
            shape[d] = n
            key.append(_arange(n, dtype=np.int64).reshape(shape))
    return tuple(key)


def _along_axis(arr, axis):
    if axis is None:
        return arr.reshape(-1), 0
    if not -arr.ndim <= axis < arr.ndim:
        _bad_axis(axis, arr.ndim)
    return arr, axis % arr.ndim


def _take_along_axis(arr, indices, axis=-1):
    arr, axis = _along_axis(arr, axis)
    return getitem_advanced(arr, _along_axis_key(arr, indices, axis))


def _put_along_axis(arr, indices, values, axis):
    flat, axis = _along_axis(arr, axis)
    setitem_advanced(flat, _along_axis_key(flat, indices, axis), values)


@cuda.jit
def _bincount_kernel(x, n, weights, out):
    i = cuda.grid(1)
    while i < n:
        cuda.atomic.add(out, x[i], weights[i])
        i += cuda.gridsize(1)


@cuda.jit
def _bincount_ones(x, n, out):
    i = cuda.grid(1)
    while i < n:
        cuda.atomic.add(out, x[i], 1)
        i += cuda.gridsize(1)


def _bincount(x, weights=None, minlength=0):
    x = as_device(x)
    if x.ndim != 1:
        raise ValueError("object too deep for desired array" if x.ndim > 1 else "object of too small depth for "
                                                                               "desired array")
    if x.dtype.kind not in "biu":
        raise TypeError("Cannot cast array data from dtype('float64') to dtype('int64') according to the rule 'safe'")
    x = x.astype(np.int64)
    n = x.size
    if n and int(np.min(x)) < 0:
        raise ValueError("'list' argument must have no negative elements")
    size = max(int(np.max(x)) + 1 if n else 0, int(minlength))
    if weights is None:
        out = full_device((size,), 0, np.int64)
        if n:
            blocks, threads = driver.grid(n)
            _bincount_ones[blocks, threads](x.buf, n, out.buf)
        return out
    w = as_device(check_device(weights))
    if w.shape != x.shape:
        raise ValueError("The weights and list don't have the same length.")
    w = w.astype(np.float64)  # a contiguous copy, as x
    out = full_device((size,), 0, np.float64)
    if n:
        blocks, threads = driver.grid(n)
        _bincount_kernel[blocks, threads](x.buf, n, w.buf, out.buf)
    return out


def _nonzero(a):
    return nonzero(as_device(a))


@cuda.jit
def _mark(x, n, lo, marks):
    i = cuda.grid(1)
    while i < n:
        marks[x[i] - lo] = True
        i += cuda.gridsize(1)


@cuda.jit
def _shift(pos, n, lo, out):
    i = cuda.grid(1)
    while i < n:
        out[i] = pos[i] + lo
        i += cuda.gridsize(1)


UNIQUE_SPAN = 1 << 26  # the most distinct values a unique's marks may cover (64 MiB of bools)


def _unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None, **_):
    """The sorted distinct values of an integer array: each value marks its place in a
    [min, max] table, whose marked places are the result (no sort on the device)."""
    ar = as_device(ar)
    if return_index or return_inverse or return_counts or axis is not None or ar.dtype.kind not in "biu":
        raise TypeError("numpy.unique on cuda tensors is supported by jitgrad for integer arrays without options "
                        "only")
    x = ar.astype(np.int64)
    n = x.size
    if n == 0:
        return DeviceArray.empty((0,), ar.dtype)
    lo, hi = int(np.min(x)), int(np.max(x))
    if hi - lo + 1 > UNIQUE_SPAN:
        raise TypeError(f"numpy.unique of integers spanning more than {UNIQUE_SPAN} values is not supported on cuda "
                        "tensors by jitgrad yet")
    marks = full_device((hi - lo + 1,), False, np.bool_)
    blocks, threads = driver.grid(n)
    _mark[blocks, threads](x.buf, n, lo, marks.buf)
    pos = flatnonzero_of(marks)
    out = DeviceArray.empty(pos.shape, ar.dtype)
    blocks, threads = driver.grid(pos.size)
    _shift[blocks, threads](pos.buf, pos.size, lo, out.buf)
    return out


FUNCTIONS.update({
    "getitem_advanced": getitem_advanced, "setitem_advanced": setitem_advanced,
    np.take: _take, np.take_along_axis: _take_along_axis, np.put_along_axis: _put_along_axis,
    np.nonzero: _nonzero, np.flatnonzero: _flatnonzero, np.bincount: _bincount, np.unique: _unique,
})
UFUNC_METHODS[(np.add, "at")] = add_at

_PLAN = (INT, index(), index(), index(), array("int64"), INT, INT, index(), index(), INT)  # Plan.launch_args()
_MASK = (INT, index(), index(), INT, INT, INT)
PTX_SIGNATURES = {
    _check: [(array("int64"), INT, index(), index(), INT, array("int64"))],
    _gather: [(array(d),) + _PLAN + (array(d),) for d in TENSOR_DTYPES],
    _scatter: [(array(d),) + _PLAN + (array(d), INT, index()) for d in TENSOR_DTYPES],
    _scatter_add: [(array(d),) + _PLAN + (array(d), INT, index()) for d in sorted(map(str, _ATOMIC_ADD))],
    _count_chunks: [(array(d),) + _MASK + (array("int64"),) for d in TENSOR_DTYPES],
    _scan: [(array("int64"), INT, array("int64"))],
    _write_chunks: [(array(d),) + _MASK + (array("int64"), array("int64")) for d in TENSOR_DTYPES],
    _unravel: [(array("int64"), INT, index(), array("int64"))],
    _bincount_kernel: [(array("int64"), INT, array("float64"), array("float64"))],
    _bincount_ones: [(array("int64"), INT, array("int64"))],
    _mark: [(array("int64"), INT, INT, array("bool"))],
    _shift: [(array("int64"), INT, INT, array(d)) for d in ("int64", "int32", "bool")],
}
