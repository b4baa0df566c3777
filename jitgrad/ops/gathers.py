"""Indexing by tensor and ordering: gather / scatter / index_* / masked_select /
take_along_dim, sort / argsort / topk / kthvalue / median / mode, and the
non-differentiable nonzero / argwhere / unique / bincount / searchsorted / one_hot.

Every differentiable op here is a composition of indexing's two primitives (ops/shape.py):
a gather at flat positions (index_flat, IndexBackward0) and its adjoint, a scatter-add
(index_put_flat). The positions are computed in numpy by applying the op's own indexing
to an arange of the input's size, so one gather serves every selecting op and the
gradient is always the scatter-add PyTorch uses. The grad_fn names are therefore those
of the composition (IndexBackward0, WhereBackward0, AddBackward0), not PyTorch's.

The positions depend on index data, so jitgrad.compile cannot replay these ops as
constants: each one reports a graph break (the step then runs eagerly).
"""
import collections

import numpy as np

from jitgrad._core import capture as _capture
from jitgrad._core import dtype as _dtype
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.tensor import Tensor, _wrap_dim
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.ops import inplace as _inplace
from jitgrad.ops._common import _needs, need_tensor, refuse
from jitgrad.ops.elementwise import add, mul, where
from jitgrad.ops.elementwise import where as _where3
from jitgrad.ops.shape import INDEX, expand, index_flat, index_put_flat, reshape

_I64 = np.dtype(np.int64)

return_types_sort = collections.namedtuple("sort", ["values", "indices"])
return_types_topk = collections.namedtuple("topk", ["values", "indices"])
return_types_kthvalue = collections.namedtuple("kthvalue", ["values", "indices"])
return_types_median = collections.namedtuple("median", ["values", "indices"])
return_types_mode = collections.namedtuple("mode", ["values", "indices"])


# --- helpers -----------------------------------------------------------------------------------
def _host(t, fn):
    """t's data as a numpy array; device tensors are not supported by these ops yet."""
    d = t._data
    if type(d) is DeviceArray:
        raise NotImplementedError(f"{fn}: CUDA tensors are not supported by jitgrad's {fn} yet")
    return np.asarray(d)


def _arange_of(shape):
    """Each element's C-order flat position in an array of `shape`."""
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)


def _take(x, pos, fn):
    """x's elements at flat positions `pos` (any shape), differentiable: a gather whose
    gradient scatter-adds back, as PyTorch's selecting ops do."""
    _capture.stop(f"{fn} reads its positions from tensor data")
    pos = np.asarray(pos, dtype=np.int64)
    return index_flat(x, pos.reshape(-1), pos.shape, INDEX)


def _put(g, pos, shape, fn):
    """zeros(shape) with g's elements added at flat positions `pos` (g's shape)."""
    _capture.stop(f"{fn} reads its positions from tensor data")
    return index_put_flat(g, np.asarray(pos, dtype=np.int64).reshape(-1), tuple(shape))


def _int_index(index, fn, what="int32/int64"):
    if not isinstance(index, Tensor):
        raise TypeError(f"{fn}(): argument 'index' must be Tensor, not {type(index).__name__}")
    a = _host(index, fn)
    if a.dtype.kind not in "iu":
        raise RuntimeError(f"{fn}(): Expected dtype {what} for index")
    return a.astype(np.int64)


def _check_bounds(idx, size, dim, exc=RuntimeError, prefix=""):
    bad = (idx < 0) | (idx >= size)
    if bad.any():
        raise exc(f"{prefix}index {int(idx[bad][0])} is out of bounds for dimension {dim} with size {size}")


def _coords_positions(idx, dim, shape):
    """The flat positions in an array of `shape` of the elements (i_0, .., idx[i], .., i_n)
    for each multi-index i of idx (gather / scatter addressing)."""
    coords = list(np.ogrid[tuple(slice(n) for n in idx.shape)]) if idx.ndim else []
    if not idx.ndim:
        return idx.reshape(())
    coords[dim] = idx
    return np.ravel_multi_index(tuple(np.broadcast_arrays(*coords)), shape)


def _check_gather_shapes(fn, x_shape, idx, dim, src_shape=None):
    if len(idx.shape) != len(x_shape) and not (idx.ndim <= 1 and len(x_shape) <= 1):
        raise RuntimeError("Index tensor must have the same number of dimensions as "
                           + ("input tensor" if src_shape is None else "self tensor"))
    for k, n in enumerate(idx.shape):
        if k != dim and k < len(x_shape) and n > x_shape[k]:
            raise RuntimeError(f"Size does not match at dimension {k} expected index {list(idx.shape)} to be "
                               f"no larger than self {list(x_shape)} apart from dimension {dim}")
        if src_shape is not None and k < len(src_shape) and n > src_shape[k]:
            raise RuntimeError(f"Size does not match at dimension {k} expected index {list(idx.shape)} to be "
                               f"no larger than src {list(src_shape)}")


def _shape1(shape):
    return tuple(shape) if len(shape) else (1,)


# --- gather family -------------------------------------------------------------------------------
def gather(input, dim, index, *, sparse_grad=False):  # noqa: A002  (PyTorch's names)
    shape = input._data.shape
    dim = _wrap_dim(dim, len(shape))
    idx = _int_index(index, "gather")
    _check_gather_shapes("gather", shape, idx, dim)
    _check_bounds(idx, _shape1(shape)[dim], dim)
    pos = _coords_positions(idx.reshape(idx.shape if idx.ndim else ()), dim, _shape1(shape))
    return _take(input, pos.reshape(idx.shape), "gather")


def take_along_dim(input, indices, dim=None):  # noqa: A002
    if not isinstance(indices, Tensor) or indices._data.dtype != _I64:
        raise RuntimeError(f"torch.take_along_dim(): dtype of indices should be Long but got "
                           f"{_SCALAR_NAMES.get(np.dtype(indices._data.dtype).name, '?')}")
    idx = _host(indices, "take_along_dim")
    if dim is None:
        return gather(reshape(input, -1), 0, _wrap(idx.reshape(-1)))  # here torch takes no negative index
    shape = input._data.shape
    dim = _wrap_dim(dim, len(shape))
    if idx.ndim != len(shape):
        raise RuntimeError(f"torch.take_along_dim(): input and indices should have the same number of "
                           f"dimensions, but got {len(shape)} dimensions for input, and {idx.ndim} dimensions "
                           f"for indices")
    # broadcast every dim but `dim`
    other = [np.broadcast_shapes((a,), (b,))[0] if k != dim else None
             for k, (a, b) in enumerate(zip(shape, idx.shape))]
    xs = tuple(shape[dim] if k == dim else n for k, n in enumerate(other))
    ids = tuple(idx.shape[dim] if k == dim else n for k, n in enumerate(other))
    xb = input if xs == shape else expand(input, xs)
    idx = np.where(idx < 0, idx + shape[dim], idx)  # along a dim, torch counts negative indices from the end
    return gather(xb, dim, _wrap(np.broadcast_to(idx, ids).copy()))


def index_select(input, dim, index):  # noqa: A002
    shape = input._data.shape
    dim = _wrap_dim(dim, len(shape))
    if not isinstance(index, Tensor):
        raise TypeError(f"index_select(): argument 'index' (position 2) must be Tensor, not {type(index).__name__}")
    a = _host(index, "index_select")
    if a.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if a.dtype.kind not in "iu":
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")
    idx = a.reshape(-1).astype(np.int64)
    if not shape and idx.size != 1:
        raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got {idx.size} value(s)")
    n = _shape1(shape)[dim]
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        raise RuntimeError(f"INDICES element is out of DATA bounds, id={int(idx[bad][0])} axis_dim={n}")
    pos = np.take(_arange_of(_shape1(shape)), idx, axis=dim)
    if not shape:
        pos = pos.reshape(a.shape)
    return _take(input, pos, "index_select")


def masked_select(input, mask):  # noqa: A002
    if not isinstance(mask, Tensor) or mask._data.dtype.kind != "b":
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    m = _host(mask, "masked_select")
    shape = np.broadcast_shapes(input._data.shape, m.shape)
    x = input if input._data.shape == shape else expand(input, shape)
    pos = _arange_of(shape)[np.broadcast_to(m, shape)]
    return _take(x, pos, "masked_select")


# --- scatter family ------------------------------------------------------------------------------
def _scatter_positions(fn, input, dim, index, src_shape):
    shape = input._data.shape
    dim = _wrap_dim(dim, len(shape))
    idx = _int_index(index, fn)
    _check_gather_shapes(fn, shape, idx, dim, src_shape)
    _check_bounds(idx, _shape1(shape)[dim], dim)
    out_pos = _coords_positions(idx, dim, _shape1(shape)).reshape(-1)
    src_pos = (np.ravel_multi_index(np.indices(idx.shape).reshape(idx.ndim, -1), _shape1(src_shape))
               if src_shape is not None and idx.size else np.zeros(idx.size, np.int64))
    return out_pos, src_pos


def _last_writer(out_pos):
    """Per written position, the last of the writes to it (PyTorch's CPU scatter writes in
    order): the indices into out_pos that survive."""
    rev = out_pos[::-1]
    _, first = np.unique(rev, return_index=True)
    return np.sort(len(out_pos) - 1 - first)


def _placed(input, out_pos, values, fn):
    """input with `values` (a Tensor of out_pos's length) written at out_pos: a where over
    the written mask, whose gradient is the gather of grad at out_pos for every value
    (PyTorch's scatter backward, also for values whose write was overwritten)."""
    shape = input._data.shape
    mask = np.zeros(int(np.prod(shape, dtype=np.int64)), bool)
    mask[out_pos] = True
    keep = _last_writer(out_pos)
    if not (_needs(input) or _needs(values)):
        out = np.array(_host(input, fn), copy=True)
        out.reshape(-1)[out_pos[keep]] = np.asarray(values._data).reshape(-1)[keep]
        return _wrap(out)
    placed = _put(values, out_pos, shape, fn)
    if len(keep) != len(out_pos):  # duplicates: the value the last write leaves, the gradient of all
        last = np.zeros(mask.size, dtype=placed._data.dtype)
        last[out_pos[keep]] = np.asarray(values._data).reshape(-1)[keep]
        placed = add(placed, _wrap(last.reshape(shape) - np.asarray(placed._data)))
    return where(_wrap(mask.reshape(shape)), placed, input)


def _as_value(value, input):
    if isinstance(value, Tensor):
        if value._data.ndim:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                               f"{value._data.ndim} dimensions.")
        return value if _needs(value) else value._data.item()  # (a tangent counts too)
    return value


def _filled(input, out_pos, value, fn):
    shape = input._data.shape
    mask = np.zeros(int(np.prod(shape, dtype=np.int64)), bool)
    mask[out_pos] = True
    mask = mask.reshape(shape)
    if isinstance(value, Tensor):
        return where(_wrap(mask), value.to(input.dtype), input)
    if not _needs(input):
        out = np.array(_host(input, fn), copy=True)
        out[mask] = value
        return _wrap(out)
    return where(_wrap(mask), _wrap(np.asarray(value, dtype=input._data.dtype)), input)


def _check_same_dtype(fn, input, src):
    if src._data.dtype != input._data.dtype:
        raise RuntimeError(f"{fn}(): Expected self.dtype to be equal to src.dtype")


def scatter(input, dim, index, src=None, value=None, *, reduce=None):  # noqa: A002
    if reduce is not None:
        raise NotImplementedError("scatter(): reduce= is not supported by jitgrad (use scatter_add)")
    if src is None and value is None:
        raise TypeError("scatter() missing 1 required positional argument: 'src' or 'value'")
    if src is None:
        src = value
    if isinstance(src, Tensor):
        _check_same_dtype("scatter", input, src)
        out_pos, src_pos = _scatter_positions("scatter", input, dim, index, src._data.shape)
        return _placed(input, out_pos, _take(src, src_pos, "scatter"), "scatter")
    out_pos, _ = _scatter_positions("scatter", input, dim, index, None)
    return _filled(input, out_pos, src, "scatter")


def scatter_add(input, dim, index, src):  # noqa: A002
    _check_same_dtype("scatter_add", input, src)
    out_pos, src_pos = _scatter_positions("scatter_add", input, dim, index, src._data.shape)
    if not (_needs(input) or _needs(src)):
        out = np.array(_host(input, "scatter_add"), copy=True)
        np.add.at(out.reshape(-1), out_pos, np.asarray(src._data).reshape(-1)[src_pos])
        return _wrap(out)
    return add(input, _put(_take(src, src_pos, "scatter_add"), out_pos, input._data.shape, "scatter_add"))


_SCALAR_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "int64": "Long", "int32": "Int",
                 "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def _index_vector(fn, index, int32_ok, exc, message):
    """The 1-d index of the index_* ops; a wrong dtype raises torch's error for `fn`."""
    a = _host(index, fn) if isinstance(index, Tensor) else np.asarray(index)
    if a.ndim > 1:
        raise IndexError(f"{fn}(): Index is supposed to be a vector")
    if not (a.dtype == _I64 or (int32_ok and a.dtype == np.int32)):
        raise exc(message.format(_SCALAR_NAMES.get(a.dtype.name, a.dtype.name)))
    return a.reshape(-1).astype(np.int64)


def _index_positions(input, dim, idx, exc=IndexError, prefix=""):
    """Positions of the slices input.select(dim, i) for i in idx, in idx's order."""
    shape = _shape1(input._data.shape)
    dim = _wrap_dim(dim, len(input._data.shape))
    _check_bounds(idx, shape[dim], dim, exc, prefix)
    return np.take(_arange_of(shape), idx, axis=dim), dim


def _check_source(fn, pos, dim, source, exc, sep):
    n = pos.shape[dim] if pos.ndim else pos.size
    src_shape = _shape1(source._data.shape)
    if src_shape[dim if dim < len(src_shape) else -1] != n:
        raise exc(f"{fn}(): Number of indices ({n}) should be equal to source.size(dim){sep} "
                  f"({src_shape[dim if dim < len(src_shape) else -1]})" + (f", for dim: {dim}" if sep == ":" else ""))
    if source._data.size != pos.size:
        raise RuntimeError(f"{fn}(): Source/destination tensor must have same slice shapes. "
                           f"Destination slice shape: {list(pos.shape)} and source slice shape: "
                           f"{list(source._data.shape)}")


def index_add(input, dim, index, source, *, alpha=1):  # noqa: A002
    idx = _index_vector("index_add", index, True, RuntimeError,
                        "index_add_(): Expected dtype int32/int64 for index but got: {}")
    pos, dim = _index_positions(input, dim, idx, RuntimeError)
    _check_source("index_add_", pos, dim, source, RuntimeError, ":")
    _check_same_dtype("index_add", input, source)
    if alpha != 1:
        source = mul(source, alpha)
    if not (_needs(input) or _needs(source)):
        out = np.array(_host(input, "index_add"), copy=True)
        np.add.at(out.reshape(-1), pos.reshape(-1), np.asarray(source._data).reshape(-1))
        return _wrap(out)
    return add(input, _put(reshape(source, -1), pos, input._data.shape, "index_add"))


def index_fill(input, dim, index, value):  # noqa: A002
    need_tensor("index_fill", input, 1)
    if isinstance(value, Tensor) and value._data.ndim:
        raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value._data.ndim} dimension(s).")
    idx = _index_vector("index_fill", index, False, IndexError, "index_fill_(): Expected dtype int64 for index.")
    pos, _ = _index_positions(input, dim, idx)
    return _filled(input, pos.reshape(-1), _as_value(value, input), "index_fill")


def index_copy(input, dim, index, source):  # noqa: A002
    idx = _index_vector("index_copy", index, False, RuntimeError,
                        "index_copy_(): Expected a long tensor for index, but got {}")
    pos, dim = _index_positions(input, dim, idx, IndexError, "index_copy_(): ")
    _check_source("index_copy_", pos, dim, source, IndexError, "")
    _check_same_dtype("index_copy", input, source)
    return _placed(input, pos.reshape(-1), reshape(source, -1), "index_copy")


def _in_place(fn):
    def op(self, *args, **kwargs):
        others = tuple(a for a in list(args) + list(kwargs.values()) if isinstance(a, Tensor))
        if self._data.size == 1:  # _apply marks saved one-element values stale before computing:
            fn(self.detach(), *args, **kwargs)  # check (bounds, shapes) before it does
        return _inplace._apply(self, lambda a: fn(a, *args, **kwargs), *others)
    op.__name__ = fn.__name__ + "_"
    return op


scatter_ = _in_place(scatter)
scatter_add_ = _in_place(scatter_add)
index_add_ = _in_place(index_add)
index_fill_ = _in_place(index_fill)
index_copy_ = _in_place(index_copy)


# --- ordering ------------------------------------------------------------------------------------
def _order(a, dim, descending):
    """Stable argsort along dim; descending keeps equal elements in their order, and NaN
    sorts above everything, as in PyTorch."""
    if not descending:
        return np.argsort(a, axis=dim, kind="stable")
    n = a.shape[dim]
    flipped = np.flip(a, axis=dim)
    return np.flip(n - 1 - np.argsort(flipped, axis=dim, kind="stable"), axis=dim)


def _select_along(input, order, dim, fn):
    """(values, indices): input's elements at `order` (indices along dim) differentiably."""
    shape = _shape1(input._data.shape)
    pos = np.take_along_axis(_arange_of(shape), order, axis=dim)
    out_shape = order.shape if input._data.ndim else ()
    values = _take(input, pos.reshape(out_shape), fn)
    return values, _wrap(order.reshape(out_shape).astype(np.int64))


def _data1(input, fn):
    a = _host(input, fn)
    return a.reshape(1) if a.ndim == 0 else a


def _reduced_nonempty(fn, a, dim):
    if a.shape[dim] == 0:
        raise IndexError(f"{fn}(): Expected reduction dim {dim} to have non-zero size.")


def sort(input, dim=-1, descending=False, stable=False):  # noqa: A002
    dim = _wrap_dim(dim, input._data.ndim)
    order = _order(_data1(input, "sort"), dim, descending)
    return return_types_sort(*_select_along(input, order, dim, "sort"))


def argsort(input, dim=-1, descending=False, stable=False):  # noqa: A002
    dim = _wrap_dim(dim, input._data.ndim)
    order = _order(_data1(input, "argsort"), dim, descending)
    return _wrap(order.reshape(input._data.shape).astype(np.int64))


def topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    dim = _wrap_dim(dim, input._data.ndim)
    a = _data1(input, "topk")
    if a.dtype.kind == "b":
        raise RuntimeError("topk does not support bool dtypes on CPU")
    if not 0 <= k <= a.shape[dim]:
        raise RuntimeError("selected index k out of range")
    order = np.take(_order(a, dim, largest), np.arange(k), axis=dim)
    return return_types_topk(*_select_along(input, order, dim, "topk"))


def _keep(values, indices, dim, keepdim, ndim):
    if keepdim or not ndim:
        return values, indices
    shape = values._data.shape[:dim] + values._data.shape[dim + 1:]
    return reshape(values, shape), _wrap(indices._data.reshape(shape))


def kthvalue(input, k, dim=-1, keepdim=False):  # noqa: A002
    ndim = input._data.ndim
    dim = _wrap_dim(dim, ndim)
    a = _data1(input, "kthvalue")
    refuse("kthvalue_cpu", input)
    _reduced_nonempty("kthvalue", a, dim)
    if not 1 <= k <= a.shape[dim]:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {dim}")
    order = np.take(_order(a, dim, False), [k - 1], axis=dim)
    return return_types_kthvalue(*_keep(*_select_along(input, order, dim, "kthvalue"), dim, keepdim, ndim))


def _median_order(a, dim):
    """Per slice along dim, the index of the lower median; of the first NaN where there is one."""
    n = a.shape[dim]
    order = np.take(_order(a, dim, False), [(n - 1) // 2], axis=dim)
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        has = nan.any(axis=dim, keepdims=True)
        order = np.where(has, np.argmax(nan, axis=dim, keepdims=True), order)
    return order


def median(input, dim=None, keepdim=False):  # noqa: A002
    a = _host(input, "median")
    refuse("median_out" if dim is None else "median_cpu", input)
    if dim is None:
        if a.size == 0:
            return _wrap(np.asarray(np.nan, a.dtype)) if a.dtype.kind == "f" else _wrap(np.zeros((), a.dtype))
        flat = a.reshape(-1)
        i = int(_median_order(flat, 0)[0])
        v = flat[i]
        res = _wrap(np.asarray(v, dtype=a.dtype))
        if not _needs(input):
            return res
        # PyTorch's evenly_distribute_backward: grad / count to each element equal to the median
        mask = np.isnan(a) if v != v else a == v
        w = _wrap((mask / mask.sum()).astype(a.dtype))
        return add(res, mul(add(input, mul(input.detach(), -1.0)), w).sum())
    ndim = a.ndim
    dim = _wrap_dim(dim, ndim)
    a = _data1(input, "median")
    _reduced_nonempty("median", a, dim)
    order = _median_order(a, dim)
    return return_types_median(*_keep(*_select_along(input, order, dim, "median"), dim, keepdim, ndim))


def mode(input, dim=-1, keepdim=False):  # noqa: A002
    a = _data1(input, "mode")
    ndim = input._data.ndim
    dim = _wrap_dim(dim, ndim)
    _reduced_nonempty("mode", a, dim)
    rows = np.moveaxis(a, dim, -1).reshape(-1, a.shape[dim])
    # per row, the most frequent value (the smallest on a tie: the first longest run of the
    # sorted row), then its last index in the row, as PyTorch's CPU mode
    m, n = rows.shape
    srt = np.sort(rows, axis=1)
    starts = np.ones((m, n), bool)
    starts[:, 1:] = srt[:, 1:] != srt[:, :-1]
    run = np.cumsum(starts, axis=1) - 1 + (np.arange(m) * n)[:, None]
    count = np.bincount(run.reshape(-1), minlength=m * n)[run]
    value = srt[np.arange(m), np.argmax(count, axis=1)]
    picked = n - 1 - np.argmax((rows == value[:, None])[:, ::-1], axis=1)
    moved_shape = np.moveaxis(a, dim, -1).shape[:-1] + (1,)
    order = np.moveaxis(picked.reshape(moved_shape), -1, dim)
    return return_types_mode(*_keep(*_select_along(input, order, dim, "mode"), dim, keepdim, ndim))


# --- not differentiable ------------------------------------------------------------------------
def nonzero(input, *, as_tuple=False):  # noqa: A002
    a = _host(input, "nonzero")
    if as_tuple:
        if a.ndim == 0:
            return (_wrap(np.zeros(int(a != 0), np.int64)),)
        return tuple(_wrap(i.astype(np.int64)) for i in np.nonzero(a))
    if a.ndim == 0:
        return _wrap(np.zeros((int(a != 0), 0), np.int64))
    return _wrap(np.argwhere(a).astype(np.int64))


def where_(condition, input=None, other=None):  # noqa: A002
    """torch.where: elementwise where(condition, input, other), or with the condition alone
    nonzero(condition, as_tuple=True)."""
    if input is None and other is None:
        return nonzero(condition, as_tuple=True)
    if input is None or other is None:
        raise TypeError("where() received an invalid combination of arguments - got (Tensor, Tensor), but "
                        "expected one of: (Tensor condition)")
    return _where3(condition, input, other)


def argwhere(input):  # noqa: A002
    return nonzero(input)


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):  # noqa: A002
    a = _host(input, "unique")
    if dim is not None:
        dim = _wrap_dim(dim, a.ndim)
    vals, inverse, counts = np.unique(a if dim is not None else a.reshape(-1), return_inverse=True,
                                      return_counts=True, axis=dim)
    out = [_wrap(vals)]
    if return_inverse:
        shape = a.shape if dim is None else (a.shape[dim],)
        out.append(_wrap(inverse.reshape(shape).astype(np.int64)))
    if return_counts:
        out.append(_wrap(counts.astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


def bincount(input, weights=None, minlength=0):  # noqa: A002
    a = _host(input, "bincount")
    if a.dtype.kind not in "iu":  # nor bool
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{_dtype.from_numpy_dtype(a.dtype).name.capitalize()}'")
    if a.ndim != 1 or (a.size and a.min() < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is None:
        return _wrap(np.bincount(a, minlength=minlength).astype(np.int64))
    w = _host(weights, "bincount")
    if w.shape != a.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    dt = np.float32 if w.dtype == np.float32 else np.float64
    return _wrap(np.bincount(a, weights=w.astype(np.float64), minlength=minlength).astype(dt))


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None):  # noqa: A002
    if isinstance(input, Tensor) and _dtype.result_type(sorted_sequence, input).kind == "b":
        raise _dtype.not_implemented("searchsorted_out_cpu", np.bool_)
    b = _host(sorted_sequence, "searchsorted")
    scalar = not isinstance(input, Tensor)
    v = np.asarray(input) if scalar else _host(input, "searchsorted")
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of "
                               "left while right was True")
        right = side == "right"
    s = np.asarray(sorter._data) if sorter is not None else None
    how = "right" if right else "left"
    if b.ndim <= 1:
        seq = b.reshape(-1) if s is None else b.reshape(-1)[s.reshape(-1)]
        out = np.searchsorted(seq, v, side=how)
    else:
        if scalar or b.shape[:-1] != v.shape[:-1]:
            raise RuntimeError(f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                               f"dimensions of boundaries tensor and input value tensor must match, but we got "
                               f"boundaries tensor {list(b.shape)} and input value tensor "
                               f"{list(v.shape) if not scalar else []}")
        bs = b.reshape(-1, b.shape[-1])
        if s is not None:
            bs = np.take_along_axis(bs, s.reshape(bs.shape), axis=-1)
        vs = v.reshape(bs.shape[0], -1)
        out = np.stack([np.searchsorted(r, q, side=how) for r, q in zip(bs, vs)]).reshape(v.shape)
    return _wrap(np.asarray(out, dtype=np.int32 if out_int32 else np.int64))


def one_hot(tensor, num_classes=-1):
    a = _host(tensor, "one_hot")
    if a.dtype != _I64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if a.size and a.min() < 0:
        raise RuntimeError("Class values must be non-negative.")
    if num_classes == -1:
        if a.size == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(a.max()) + 1
    elif a.size and a.max() >= num_classes:
        raise RuntimeError("Class values must be smaller than num_classes.")
    return _wrap((a[..., None] == np.arange(num_classes)).astype(np.int64))


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):  # noqa: A002
    """torch.repeat_interleave: each element (each slice along dim; of the flattened input when
    dim is None) repeated `repeats` times. An int repeats composes expand and reshape; a tensor
    of counts is an index_select at the repeated positions (torch's two graphs). With the
    counts alone (repeat_interleave(counts)): the indices, each repeated its count."""
    if repeats is None:   # repeat_interleave(repeats): arange(len).repeat(repeats)
        counts = _count_array(input)
        return _wrap(np.repeat(np.arange(counts.size, dtype=np.int64), counts))
    if dim is None:
        input, dim = reshape(input, (-1,)), 0
    shape = tuple(input._data.shape)
    dim = _wrap_dim(dim, len(shape))
    if isinstance(repeats, Tensor) and repeats._data.ndim == 1 and repeats._data.size != 1:
        counts = _count_array(repeats)
        if counts.size != shape[dim]:
            raise RuntimeError(f"repeats must have the same size as input along dim, but got repeats.size(0) = "
                               f"{counts.size} and input.size({dim}) = {shape[dim]}")
        return index_select(input, dim, _wrap(np.repeat(np.arange(shape[dim], dtype=np.int64), counts)))
    if isinstance(repeats, Tensor):
        count = int(_count_array(repeats).reshape(-1)[0])
    elif isinstance(repeats, (bool, np.bool_)) or not hasattr(repeats, "__index__"):
        raise TypeError(f"repeat_interleave() received an invalid combination of arguments - got "
                        f"({type(repeats).__name__}, dim=int), but expected one of:\n"
                        " * (Tensor repeats, int dim = None, *, int output_size = None)\n"
                        " * (int repeats, int dim = None, *, int output_size = None)\n")
    else:
        count = int(repeats)
    if count < 0:
        raise RuntimeError("Repeats must be non-negative")
    out = expand(input.unsqueeze(dim + 1), shape[:dim + 1] + (count,) + shape[dim + 1:])
    return reshape(out, shape[:dim] + (shape[dim] * count,) + shape[dim + 1:])


def _count_array(t):
    a = t._data
    a = a.get() if type(a) is DeviceArray else np.asarray(a)
    if a.dtype.kind not in "iu":
        raise _dtype.not_implemented("repeat_interleave_cpu", a.dtype)
    if a.ndim > 1:
        raise RuntimeError("repeats must be 0-dim or 1-dim tensor")
    if (a < 0).any():
        raise RuntimeError("repeats can not be negative")
    return a.reshape(-1)


def where_method(self, condition, y):
    """Tensor.where(condition, y): torch.where(condition, self, y)."""
    return _where3(condition, self, y)


FUNCTIONS = {
    "repeat_interleave": repeat_interleave,
    "gather": gather, "take_along_dim": take_along_dim, "index_select": index_select,
    "masked_select": masked_select, "scatter": scatter, "scatter_add": scatter_add, "index_add": index_add,
    "index_fill": index_fill, "index_copy": index_copy, "sort": sort, "argsort": argsort, "topk": topk,
    "kthvalue": kthvalue, "median": median, "mode": mode, "nonzero": nonzero, "argwhere": argwhere,
    "unique": unique, "bincount": bincount, "searchsorted": searchsorted,
}
# jitgrad.where (not Tensor.where, whose first argument is the input): also the one-argument form
PUBLIC_ONLY = {"where": where_}
METHODS = dict(FUNCTIONS, where=where_method, scatter_=scatter_, scatter_add_=scatter_add_, index_add_=index_add_,
               index_fill_=index_fill_, index_copy_=index_copy_)
del METHODS["searchsorted"]
