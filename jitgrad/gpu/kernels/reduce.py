"""Reductions on the device: sum, prod, mean, max/min, argmax/argmin, all/any,
count_nonzero, trace, and the ufuncs' `.reduce` (np.add.reduce, np.maximum.reduce...).

Every reduction is one kernel over a (rows, cols) view of the input: rows are the kept
dims, cols the reduced ones, both read straight from the input's strides (no copy to
move the reduced axes last; the price is a div/mod per dim per element read). Three
layouts of the work, picked by (rows, cols):
- a thread per row, when rows are many or short: no synchronisation, and adjacent
  threads read adjacent rows (coalesced when the kept dims are innermost), but a thread
  walks its row alone;
- a block per row, when rows are long and not too many: the block's threads stride over
  the row and combine their partials in shared memory (a tree, which also keeps float
  sums accurate; the order of additions differs from numpy's pairwise sum, so float
  results agree to rounding);
- a block per row segment, when few rows are very long (a full reduction of a large
  array): the segments' partials are reduced by a second launch, so the whole GPU works.
Accumulators are the widest of the result's kind (float32 for float16, int64 for ints),
one kernel pair per op and accumulator, all made at import; result dtypes are numpy's.
"""
import math
import operator

import numba
import numpy as np
from numba import cuda

from jitgrad.gpu import driver
from jitgrad.gpu.array import FUNCTIONS, UFUNC_METHODS, DeviceArray
from jitgrad.gpu.kernels import functions as sig
from jitgrad.gpu.kernels.functions import MIXED, diagonal, normalize_axes

SUM, MEAN, PROD, MAX, MIN, ALL, ANY, COUNT, ARGMAX, ARGMIN = range(10)
_NAMES = {SUM: "add", PROD: "multiply", MAX: "maximum", MIN: "minimum"}

# Rows at least this long go to a block each (when there are few enough rows for the
# blocks to fill the device).
BLOCK_COLS = 32
BLOCK_ROWS = 8192


@cuda.jit(device=True)
def _offset(flat, off, shape, strides):
    for k in range(len(shape) - 1, -1, -1):
        off += (flat % shape[k]) * strides[k]
        flat //= shape[k]
    return off


def _combiners(op, acc_t):
    """(step(acc, x), merge(acc, acc)) of op: step folds an input element (of any dtype)
    into an accumulator of type acc_t, merge joins two partials. max/min keep a NaN, as
    numpy's do."""
    dev = cuda.jit(device=True)
    if op in (SUM, MEAN):
        merge = dev(lambda a, b: a + b)
    elif op == PROD:
        merge = dev(lambda a, b: a * b)
    elif op == MAX:
        merge = dev(lambda a, b: a if (a != a or a >= b) else b)
    elif op == MIN:
        merge = dev(lambda a, b: a if (a != a or a <= b) else b)
    elif op == ALL:
        return dev(lambda a, x: a and x != 0), dev(lambda a, b: a and b)
    elif op == ANY:
        return dev(lambda a, x: a or x != 0), dev(lambda a, b: a or b)
    else:  # COUNT
        return dev(lambda a, x: a + 1 if x != 0 else a), dev(lambda a, b: a + b)
    return dev(lambda a, x: merge(a, acc_t(x))), merge


def _family(dtype):
    """The accumulator dtype a reduction of dtype's values uses: the widest of its kind
    (float16 in float32). One kernel per op and family, all made at import."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.dtype(np.float64 if dtype.itemsize == 8 else np.float32)
    # unsigned ints too: sums and products wrap the same in int64, and jitgrad's tensors
    # have no uint64 (whose values past 2**63 would compare wrongly in max/min)
    return np.dtype(np.bool_ if dtype.kind == "b" else np.int64)


def _value_kernels(op, acc_dtype):
    """(thread-per-row, block-per-row) kernels of op with accumulator acc_dtype. Both
    write out[row] = combined / div (div is 1 except for means)."""
    acc_t = numba.from_dtype(acc_dtype)
    step, merge = _combiners(op, acc_t)
    finish = (lambda a, div: a / div) if op == MEAN else (lambda a, div: a)
    finish = cuda.jit(device=True)(finish)
    nthreads = driver.THREADS

    @cuda.jit
    def by_thread(src, off, kshape, kst, rshape, rst, nrows, ncols, init, div, out):
        row = cuda.grid(1)
        while row < nrows:
            base = _offset(row, off, kshape, kst)
            acc = init
            for j in range(ncols):
                acc = step(acc, src[_offset(j, base, rshape, rst)])
            out[row] = finish(acc, div)
            row += cuda.gridsize(1)

    @cuda.jit
    def by_block(src, off, kshape, kst, rshape, rst, nrows, ncols, nseg, init, div, out):
        # a block per (row, segment): nseg > 1 splits few long rows over many blocks,
        # whose partials (rows, nseg) a second launch reduces
        part = cuda.shared.array(nthreads, acc_t)
        t = cuda.threadIdx.x
        width = cuda.blockDim.x
        seg = (ncols + nseg - 1) // nseg
        v = cuda.blockIdx.x
        while v < nrows * nseg:
            base = _offset(v // nseg, off, kshape, kst)
            acc = init
            j = (v % nseg) * seg + t
            end = min(ncols, (v % nseg + 1) * seg)
            while j < end:
                acc = step(acc, src[_offset(j, base, rshape, rst)])
                j += width
            part[t] = acc
            cuda.syncthreads()
            gap = 1
            while gap < width:  # a tree over any block width, not only powers of two
                if t % (2 * gap) == 0 and t + gap < width:
                    part[t] = merge(part[t], part[t + gap])
                gap *= 2
                cuda.syncthreads()
            if t == 0:
                out[v] = finish(part[0], div)
            cuda.syncthreads()
            v += cuda.gridDim.x

    return by_thread, by_block


@cuda.jit(device=True)
def _better(op, v, i, bv, bi):
    """Whether (v, i) beats the best so far (bv, bi): a NaN beats any number (numpy's
    argmax returns the first NaN), ties go to the lower index."""
    if bi < 0:
        return True
    if bv != bv:
        return v != v and i < bi
    if v != v:
        return True
    if op == ARGMAX:
        return v > bv or (v == bv and i < bi)
    return v < bv or (v == bv and i < bi)


def _arg_kernels(op, family):
    val_t = numba.from_dtype(family)
    nthreads = driver.THREADS

    @cuda.jit
    def by_thread(src, off, kshape, kst, rshape, rst, nrows, ncols, out):
        row = cuda.grid(1)
        while row < nrows:
            base = _offset(row, off, kshape, kst)
            bv = src[base]
            bi = -1
            for j in range(ncols):
                v = src[_offset(j, base, rshape, rst)]
                if _better(op, v, j, bv, bi):
                    bv = v
                    bi = j
            out[row] = bi
            row += cuda.gridsize(1)

    @cuda.jit
    def by_block(src, off, kshape, kst, rshape, rst, nrows, ncols, out):
        vals = cuda.shared.array(nthreads, val_t)
        idxs = cuda.shared.array(nthreads, numba.int64)
        t = cuda.threadIdx.x
        width = cuda.blockDim.x
        row = cuda.blockIdx.x
        while row < nrows:
            base = _offset(row, off, kshape, kst)
            bv = src[base]
            bi = -1
            j = t
            while j < ncols:
                v = src[_offset(j, base, rshape, rst)]
                if _better(op, v, j, bv, bi):
                    bv = v
                    bi = j
                j += width
            vals[t] = bv
            idxs[t] = bi
            cuda.syncthreads()
            gap = 1
            while gap < width:
                if t % (2 * gap) == 0 and t + gap < width and idxs[t + gap] >= 0:
                    if _better(op, vals[t + gap], idxs[t + gap], vals[t], idxs[t]):
                        vals[t] = vals[t + gap]
                        idxs[t] = idxs[t + gap]
                gap *= 2
                cuda.syncthreads()
            if t == 0:
                out[row] = idxs[0]
            cuda.syncthreads()
            row += cuda.gridDim.x

    return by_thread, by_block


F32, F64, I64, BOOL = (np.dtype(t) for t in (np.float32, np.float64, np.int64, np.bool_))
FAMILIES = {SUM: (F32, F64, I64), MEAN: (F32, F64), PROD: (F32, F64, I64), MAX: (F32, F64, I64, BOOL),
            MIN: (F32, F64, I64, BOOL), ALL: (BOOL,), ANY: (BOOL,), COUNT: (I64,),
            ARGMAX: (F32, F64, I64, BOOL), ARGMIN: (F32, F64, I64, BOOL)}
KERNELS = {(op, fam): (_arg_kernels if op in (ARGMAX, ARGMIN) else _value_kernels)(op, fam)
           for op, fams in FAMILIES.items() for fam in fams}


def _signatures(op, fam):
    """The argument types op's kernels of family fam are launched with, for each tensor
    dtype read (gpu/ptx.py compiles them; shape tuples of any rank type the same code)."""
    geometry = (sig.INT,) + (sig.index(),) * 4 + (sig.INT, sig.INT)
    if op in (ARGMAX, ARGMIN):
        return [(sig.array(src),) + geometry + (sig.array(I64),) for src in sig.TENSOR_DTYPES
                if _family(src) == fam]
    if op in (SUM, PROD, MEAN):  # numpy's result dtype, or one asked for with dtype=
        outs = [np.dtype(d) for d in sig.TENSOR_DTYPES if d != "bool" and _family(d) == fam]
        srcs = sig.TENSOR_DTYPES
    elif op in (MAX, MIN):
        srcs = [d for d in sig.TENSOR_DTYPES if _family(d) == fam]
        outs = None
    else:
        srcs, outs = sig.TENSOR_DTYPES, [fam]
    return [(sig.array(src),) + geometry + (sig.scalar(fam), sig.scalar(fam), sig.array(out))
            for src in srcs for out in (outs or [src])]


def _with_nseg(sigs):
    # a value reduction's block kernel takes its segment count after the geometry
    return [s[:8] + (sig.INT,) + s[8:] for s in sigs]


PTX_SIGNATURES = {}
for (_op, _fam), (_by_thread, _by_block) in KERNELS.items():
    PTX_SIGNATURES[_by_thread] = _signatures(_op, _fam)
    PTX_SIGNATURES[_by_block] = PTX_SIGNATURES[_by_thread] if _op in (ARGMAX, ARGMIN) else \
        _with_nseg(PTX_SIGNATURES[_by_thread])


# -- the host side: plan, result dtype, launch -----------------------------------------------------
def _plan(a, axis):
    """(kept dims, reduced dims, rows, cols) of reducing a over axis."""
    red = normalize_axes(axis, a.ndim)
    kept = tuple(d for d in range(a.ndim) if d not in red)
    return kept, red, math.prod(a.shape[d] for d in kept), math.prod(a.shape[d] for d in red)


def _geom(a, dims):
    """(shape, strides) of a's dims, with size-1 dims dropped and neighbours that step as
    one dim merged (fewer div/mods per element in the kernels; the same C-order positions).
    Kernels index with UniTuples: no dims is one position of size 1."""
    shape, st = [], []
    for d in dims:
        n, s = a.shape[d], a.estrides[d]
        if n == 1:
            continue
        if shape and st[-1] == s * n:
            shape[-1] *= n
            st[-1] = s
        else:
            shape.append(n)
            st.append(s)
    return (tuple(shape), tuple(st)) if shape else ((1,), (0,))


def _out_shape(a, red, keepdims):
    if keepdims:
        return tuple(1 if d in red else n for d, n in enumerate(a.shape))
    return tuple(n for d, n in enumerate(a.shape) if d not in red)


def _launch(kernels, a, kept, red, rows, cols, out, *extra, nseg=1, arg=False):
    by_thread, by_block = kernels
    geometry = (a.buf, a.offset, *_geom(a, kept), *_geom(a, red), rows, cols)
    if nseg > 1 or (cols >= BLOCK_COLS and rows < BLOCK_ROWS):
        blocks, threads = driver.grid(rows * nseg * driver.THREADS)
        by_block[blocks, threads](*geometry, *(() if arg else (nseg,)), *extra, out.buf)
    else:
        blocks, threads = driver.grid(rows)
        by_thread[blocks, threads](*geometry, *extra, out.buf)


# Few rows this long are split over blocks (a row's segments are reduced by a block each,
# then their partials by a second launch): one block per row would leave the GPU idle.
SPLIT_COLS = 1 << 14
SPLIT_ROWS = 64
SEGMENT = 1 << 12


def _segments(op, rows, cols):
    if op in (ARGMAX, ARGMIN) or cols < SPLIT_COLS or rows >= SPLIT_ROWS:
        return 1
    return max(1, min(cols // SEGMENT, driver.MAX_BLOCKS // rows))


def _sum_dtype(dtype):
    """np.sum's / np.prod's result dtype: small ints widen to the platform int, as numpy."""
    if dtype.kind == "b" or (dtype.kind == "i" and dtype.itemsize < 8):
        return np.dtype(np.int64)
    if dtype.kind == "u" and dtype.itemsize < 8:
        return np.dtype(np.uint64)
    return dtype


def _init(op, dtype):
    if op in (SUM, MEAN, ANY, COUNT):
        return dtype.type(0)
    if op in (PROD, ALL):
        return dtype.type(1)
    if dtype.kind == "f":
        return dtype.type(-np.inf if op == MAX else np.inf)
    if dtype.kind == "b":
        return dtype.type(op == MIN)
    info = np.iinfo(dtype)
    return dtype.type(info.min if op == MAX else info.max)


def _reject_out(out, where=True, initial=None):
    if out is not None or where is not True or initial is not None:
        raise TypeError("numpy reductions with out=, where= or initial= are not supported on cuda tensors by "
                        "jitgrad yet")


def reduce(op, a, axis, dtype, keepdims=False, div=1):
    """The reduction op of a over axis with result dtype `dtype` (accumulated in its family)."""
    kept, red, rows, cols = _plan(a, axis)
    if cols == 0 and op in (MAX, MIN) and rows:
        raise ValueError(f"zero-size array to reduction operation {_NAMES[op]} which has no identity")
    res = DeviceArray.empty(_out_shape(a, red, keepdims), dtype)
    if rows:
        fam = _family(dtype)
        if (op, fam) not in KERNELS:
            raise TypeError(f"numpy.{_NAMES.get(op, 'mean')} reduction to {np.dtype(dtype)} is not supported on "
                            "cuda tensors by jitgrad yet")
        nseg = _segments(op, rows, cols)
        if nseg == 1:
            _launch(KERNELS[op, fam], a, kept, red, rows, cols, res, _init(op, fam), fam.type(div))
            return res
        # partials per segment (a mean's are sums, a count's are added), then their reduction
        first, second = {MEAN: (SUM, MEAN), COUNT: (COUNT, SUM)}.get(op, (op, op))
        part = DeviceArray.empty((rows, nseg), fam)
        _launch(KERNELS[first, fam], a, kept, red, rows, cols, part, _init(first, fam), fam.type(1), nseg=nseg)
        _launch(KERNELS[second, fam], part, (0,), (1,), rows, nseg, res, _init(second, fam), fam.type(div))
    return res


def _sum_or_prod(op):
    def fn(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
        _reject_out(out, where, initial)
        dt = np.dtype(dtype) if dtype is not None else _sum_dtype(a.dtype)
        if dt.kind == "b":  # numpy's add / multiply of bools are `or` / `and`
            return reduce(ANY if op == SUM else ALL, a, axis, dt, keepdims)
        return reduce(op, a, axis, dt, keepdims)
    return fn


_sum, _prod = _sum_or_prod(SUM), _sum_or_prod(PROD)


def _mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=True):
    _reject_out(out, where)
    _, red, _, cols = _plan(a, axis)
    if dtype is not None:
        res = np.dtype(dtype)
    else:
        res = np.dtype(np.float64) if a.dtype.kind in "biu" else a.dtype
    # float16 adds up in float32, as numpy's; an empty mean is 0/0: NaN, as numpy's
    return reduce(MEAN, a, axis, res, keepdims, div=cols)


def _extremum(op):
    def fn(a, axis=None, out=None, keepdims=False, initial=None, where=True):
        _reject_out(out, where, initial)
        return reduce(op, a, axis, a.dtype, keepdims)
    return fn


def _logical(op):
    def fn(a, axis=None, out=None, keepdims=False, *, where=True):
        _reject_out(out, where)
        return reduce(op, a, axis, np.dtype(bool), keepdims)
    return fn


def _arg(op):
    name = "argmax" if op == ARGMAX else "argmin"

    def fn(a, axis=None, out=None, *, keepdims=False):
        _reject_out(out)
        if axis is None:
            flat = a.reshape(-1)
            res = fn(flat, 0)
            return res.reshape((1,) * a.ndim) if keepdims else res
        axis = operator.index(axis)  # one axis, as numpy's
        kept, red, rows, cols = _plan(a, axis)
        if cols == 0:
            raise ValueError(f"attempt to get {name} of an empty sequence")
        res = DeviceArray.empty(_out_shape(a, red, keepdims), np.int64)
        if rows:
            _launch(KERNELS[op, _family(a.dtype)], a, kept, red, rows, cols, res, arg=True)
        return res
    return fn


def _count_nonzero(a, axis=None, *, keepdims=False):
    return reduce(COUNT, a, axis, np.dtype(np.int64), keepdims)


def _trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    return _sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype, out=out)


FUNCTIONS.update({
    np.sum: _sum, np.prod: _prod, np.mean: _mean,
    np.max: _extremum(MAX), np.amax: _extremum(MAX), np.min: _extremum(MIN), np.amin: _extremum(MIN),
    np.all: _logical(ALL), np.any: _logical(ANY), np.argmax: _arg(ARGMAX), np.argmin: _arg(ARGMIN),
    np.count_nonzero: _count_nonzero, np.trace: _trace,
})


def _ufunc_reduce(fn):
    """ufunc.reduce(a, axis=0, ...): the reduction function, with the ufunc's default axis 0."""
    def method(inputs, kwargs):
        (a,) = inputs
        if not isinstance(a, DeviceArray):
            raise RuntimeError(MIXED)
        kwargs = dict(kwargs)
        kwargs.setdefault("axis", 0)
        return fn(a, **kwargs)
    return method


for _ufunc, _fn in ((np.add, _sum), (np.multiply, _prod), (np.maximum, _extremum(MAX)),
                    (np.minimum, _extremum(MIN)), (np.logical_and, _logical(ALL)), (np.logical_or, _logical(ANY))):
    UFUNC_METHODS[_ufunc, "reduce"] = _ufunc_reduce(_fn)
