"""Shape primitives: views (reshape, squeeze, unsqueeze, permute, transpose, t), expand,
indexing (a gather at flat indices, and its adjoint scatter), cat / stack. Each entry
(graph/spec.py) sits below its forward, with its rule above it; the compiled kernels are
in kernels/shape.py, passed as function objects.

Rules call Tensor methods (bound by the table, ops/__init__.py) or functions of this module
and lower ones, never of a module above: the ops package has no import cycle.
"""
import math
import operator

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core.modes import _state as _mode
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph import views as _views
from jitgrad.graph.record import record
from jitgrad.graph.spec import alias, structural
from jitgrad.graph.tensor import Size, Tensor, _Rare, _wrap_dim
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.kernels.shape import (
    f_cat,
    f_expand,
    f_gather,
    f_index_put,
    f_permute,
    f_view,
    k_cat,
    k_expand,
    k_index_put,
    k_permute,
    k_scatter,
    k_view,
)
from jitgrad.ops._common import _broadcast_error, _cap, _needs, asarray, like, traced


def _dims(x, dim):
    nd = x._data.ndim
    if dim is None:
        return tuple(range(nd))
    if nd == 0:
        # PyTorch accepts dim 0 / -1 on a 0-d tensor; there is nothing to reduce
        for d in (dim if isinstance(dim, (tuple, list)) else (dim,)):
            _wrap_dim(d, 0)
        return ()
    if isinstance(dim, (tuple, list)):
        ds = tuple(sorted(_wrap_dim(d, nd) for d in dim))
        if len(set(ds)) != len(ds):
            raise RuntimeError(f"dim {ds[0]} appears multiple times in the list of dims")
        return ds
    return (_wrap_dim(dim, nd),)


def _kd_shape(shape, dims):
    return tuple(1 if i in dims else s for i, s in enumerate(shape))


def _shape_arg(shape, fn="view", arg="shape"):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    for s in shape:  # the usual call: Python ints (a bool's type is not int), already a tuple
        if type(s) is not int:
            break
    else:
        return shape
    try:
        if any(isinstance(s, (bool, np.bool_)) for s in shape):
            raise TypeError
        return tuple(operator.index(s) for s in shape)  # ints, numpy ints, one-element int tensors
    except TypeError:
        bad = next(s for s in shape if isinstance(s, (bool, np.bool_)) or not hasattr(s, "__index__"))
        raise TypeError(f"{fn}(): argument '{arg}' (position 1) must be tuple of ints, not {type(bad).__name__}") \
            from None


def _infer_shape(shape, numel):
    if -1 not in shape and (not shape or min(shape) >= 0) and math.prod(shape) == numel:
        return tuple(shape)  # the usual case: nothing to infer, nothing wrong
    shape = list(shape)
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    for i, s in enumerate(shape):
        if s < -1:
            raise RuntimeError(f"invalid shape dimension {s} at index {i} of shape {shape}")
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        if known == 0 and numel == 0:
            raise RuntimeError(f"cannot reshape tensor of 0 elements into shape {shape} because the unspecified "
                               "dimension size -1 can be any value and is ambiguous")
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    n = 1
    for s in shape:
        n *= s
    if n != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return tuple(shape)


def _report(spec, res, inputs, redo, saved=(), iparams=None):
    """The op ran without grad while jitgrad.compile records: report it as record() would
    have been told. Only float values run in the plan's kernels; the op on ints or bools
    (labels, masks) is replayed in Python by redo(*input arrays) -> the result's array."""
    dt = res._data.dtype
    if dt.kind == "f" and all(t._data.dtype == dt for t in inputs):
        traced(spec, res, inputs, saved, (), iparams)
    else:
        _cap.rec.python(lambda *arrays: (redo(*arrays),), inputs, (res,), spec.name)


def _mark_view(res, x, fn, meta=_views.DEFAULT, origin=None):
    """res shares x's storage (fn(x's array) gives res's): record it as a view of x's
    root (graph/views.py), so that an in-place op on res updates the root's history too
    and one on the root or another of its views updates res's (ops/inplace.py).
    A view of an inference tensor is an inference tensor and no view; one of a normal
    tensor is normal, even in inference mode. A view made without recording (no_grad or
    inference mode) may not be written in place with grad mode on; of a tensor that
    requires grad, it requires grad, with no grad_fn, as in PyTorch. shapeops' multi-output
    views (unbind, split...) pass meta=MULTI_OUTPUT and origin=(output index, node name)."""
    xx = x._x
    rx = res._x
    if xx is not None and xx.inference:
        _views.mark_inference(res, _Rare)
        return res
    d = res._data
    if not (d.base is not None if type(d) is np.ndarray else type(d) is DeviceArray and d.buf is x._data.buf):
        return res  # numpy made a copy
    if rx is None:
        rx = res._x = _Rare()
    elif rx.inference:  # made in inference mode, of a normal tensor
        rx.inference = False
    parent = None if xx is None else xx.view_of
    root = x
    if parent is not None:
        root = parent.base
        fn = _views.Chain(parent.fn, fn)
    grad_mode = _mode.enabled
    if not grad_mode:  # made in no_grad or inference mode, which PyTorch's view record keeps
        meta = _views.INFERENCE if _mode.inference else _views.NO_GRAD
        origin = None
        if x._requires_grad:
            res._requires_grad = True
    elif parent is not None and parent.meta != _views.DEFAULT and meta == _views.DEFAULT:
        meta = parent.meta  # PyTorch names the new view in its message ("Output 0 of Slice is a view...")
        origin = (res.output_nr, _node_name(res))
    rx.view_of = _views.View(root, fn, meta, origin)
    if grad_mode or res._requires_grad:  # (with grad mode on, its root may get a history later)
        _views.register(root, res, _Rare)
    return res


def _node_name(t):
    """A view's node as PyTorch's messages name it ("Slice" for SliceBackward0)."""
    fn = t.grad_fn
    return "" if fn is None else fn.name().replace("Backward0", "")


def _reshaper(shape):
    return lambda a: a.reshape(shape)


def _no_record(x):
    """A view of x is not recorded: no grad needed, or x is an inference tensor (whose
    views are inference tensors that do not require grad)."""
    xx = x._x
    return not _needs(x) or (xx is not None and xx.inference)


def _view_like(spec, x, out, fn=None, meta=_views.DEFAULT, origin=None):
    """The view `out` of x's array as the result of view op `spec` (fn: x's array -> out,
    a reshape when None); meta and origin as for _mark_view."""
    res = _wrap(out)
    if fn is None:
        fn = _reshaper(out.shape)
    if _no_record(x):
        if _cap.on and _cap.mine():
            _report(spec, res, (x,), fn)
        return _mark_view(res, x, fn, meta, origin)
    return _mark_view(record(spec, res, (x,)), x, fn, meta, origin)


def reshape(x, *shape):
    shape = _infer_shape(_shape_arg(shape, "reshape"), x._data.size)
    return _view_like(VIEW, x, x._data.reshape(shape))


view = reshape


def view_rule(grad, ri):
    return (reshape(grad, ri.in_shape(0)),)


def view_jvp(ci, tangents):
    return reshape(tangents[0], ci.out_shape())  # the view of the tangent


VIEW = structural("view", "ViewBackward0", rule=view_rule, kernel=k_view, forward=reshape, jvp=view_jvp,
                  fwd_kernel=f_view)
RESHAPE_ALIAS = alias("unsafe_view", VIEW, "UnsafeViewBackward0")


def flatten(x, start_dim=0, end_dim=-1):
    d = x._data
    if d.ndim == 0:
        return reshape(x, (1,))
    s = _wrap_dim(start_dim, d.ndim)
    e = _wrap_dim(end_dim, d.ndim)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    if s == e:
        return x
    shape = d.shape[:s] + (int(np.prod(d.shape[s:e + 1])),) + d.shape[e + 1:]
    return reshape(x, shape)


def squeeze(x, dim=None):
    d = x._data
    if dim is None:
        return _view_like(SQUEEZE, x, d.reshape(tuple(s for s in d.shape if s != 1)))
    dims = _dims(x, dim) if d.ndim else ()
    shape = tuple(s for i, s in enumerate(d.shape) if not (i in dims and s == 1))
    return _view_like(SQUEEZE_DIM, x, d.reshape(shape))


def unsqueeze(x, dim):
    d = x._data
    dim = _wrap_dim(dim, d.ndim + 1)
    return _view_like(UNSQUEEZE, x, np.expand_dims(d, dim))




SQUEEZE = alias("squeeze", VIEW, "SqueezeBackward0", forward=squeeze)
SQUEEZE_DIM = alias("squeeze_dim", VIEW, "SqueezeBackward1", forward=squeeze)
UNSQUEEZE = alias("unsqueeze", VIEW, "UnsqueezeBackward0", forward=unsqueeze)


def expand(x, *sizes):
    sizes = _shape_arg(sizes, "expand", "size")
    d = x._data
    if len(sizes) < d.ndim:
        raise RuntimeError(f"expand(torch.FloatTensor{{{list(d.shape)}}}, size={list(sizes)}): the number of sizes "
                           f"provided ({len(sizes)}) must be greater or equal to the number of dimensions in the "
                           f"tensor ({d.ndim})")
    lead = len(sizes) - d.ndim
    for i, s in enumerate(sizes):
        if s == -1 and i < lead:  # -1 keeps an existing size; a new leading dim has none
            raise RuntimeError(f"The expanded size of the tensor (-1) isn't allowed in a leading, non-existing "
                               f"dimension {i}")
        if s < -1 and (i < lead or d.shape[i - lead] == 1):  # else the size mismatch below reports it
            raise RuntimeError("numel: integer multiplication overflow")  # sic: what torch says
    shape = tuple(d.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    for i in range(d.ndim):
        if d.shape[i] != 1 and d.shape[i] != shape[lead + i]:
            raise RuntimeError(f"The expanded size of the tensor ({shape[lead + i]}) must match the existing size "
                               f"({d.shape[i]}) at non-singleton dimension {lead + i}.  Target sizes: {list(sizes)}."
                               f"  Tensor sizes: {list(d.shape)}")
    if shape == d.shape:
        return x
    # a view that repeats no element is writable, as in PyTorch (only new leading dims of size 1)
    overlaps = any(s != 1 for s in shape[:lead]) or any(a != b for a, b in zip(d.shape, shape[lead:]))
    fn = (lambda a: np.broadcast_to(a, shape)) if overlaps else _reshaper(shape)
    res = _wrap(fn(d))
    if _no_record(x):
        if _cap.on and _cap.mine():
            _report(EXPAND, res, (x,), fn)
        return _mark_view(res, x, fn)
    return _mark_view(record(EXPAND, res, (x,)), x, fn)


def expand_as(x, other):
    if not isinstance(other, Tensor):
        raise TypeError(f"expand_as(): argument 'other' (position 1) must be Tensor, not {type(other).__name__}")
    return expand(x, other._data.shape)




def expand_rule(grad, ri):
    return (grad.sum_to_size(ri.in_shape(0)),)


def expand_jvp(ci, tangents):
    return expand(tangents[0], ci.out_shape())


EXPAND = structural("expand", "ExpandBackward0", rule=expand_rule, kernel=k_expand, forward=expand,
                    jvp=expand_jvp, fwd_kernel=f_expand)


def permute(x, *dims, spec=None):
    dims = _shape_arg(dims, "permute", "dims")
    d = x._data
    if len(dims) != d.ndim:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does not match the length "
                           f"of the desired ordering of dimensions i.e. input.dim() = {d.ndim} is not equal to "
                           f"len(dims) = {len(dims)}")
    perm = tuple(_wrap_dim(i, d.ndim) for i in dims)
    if sorted(perm) != list(range(d.ndim)):
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    res = _wrap(d.transpose(perm))
    spec = spec or PERMUTE
    if _no_record(x):
        if _cap.on and _cap.mine():
            _report(spec, res, (x,), lambda a: a.transpose(perm), iparams=PERMUTE.pack_ints(rest=perm))
        return _mark_view(res, x, lambda a: a.transpose(perm))
    return _mark_view(record(spec, res, (x,), (), (), PERMUTE.pack_ints(rest=perm)), x, lambda a: a.transpose(perm))


def transpose(x, dim0, dim1):
    nd = x._data.ndim
    if nd == 0:
        return x
    perm = list(range(nd))
    a, b = _wrap_dim(dim0, nd), _wrap_dim(dim1, nd)
    perm[a], perm[b] = perm[b], perm[a]
    return permute(x, perm, spec=TRANSPOSE)


def t(x):
    d = x._data
    if d.ndim != 2 or _cap.on:
        if d.ndim > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {d.ndim}D")
        return permute(x, tuple(range(d.ndim))[::-1], spec=T)
    # eager: permute(x, (1, 0), spec=T) without checking the dims (linear's weight.t(), per call)
    res = _wrap(d.T)
    if _no_record(x):
        return _mark_view(res, x, _transpose2)
    return _mark_view(record(T, res, (x,), (), (), [1, 0]), x, _transpose2)


def _transpose2(a):
    return a.T


def _T(x):
    return permute(x, tuple(range(x._data.ndim))[::-1])




def permute_rule(grad, ri):
    # the same op backwards (t's gradient is a t, transpose's a transpose), as torch's graphs
    return (permute(grad, tuple(int(i) for i in np.argsort(ri.iparams().dims)), spec=ri.spec()),)


def permute_jvp(ci, tangents):
    return permute(tangents[0], ci.iparams().dims, spec=ci.spec())


PERMUTE = structural("permute", "PermuteBackward0", rule=permute_rule, kernel=k_permute, iparams=("*dims",),
                     forward=permute, jvp=permute_jvp, fwd_kernel=f_permute)
TRANSPOSE = alias("transpose", PERMUTE, "TransposeBackward0", forward=transpose)
T = alias("t", PERMUTE, "TBackward0", forward=t)


# --- indexing ----------------------------------------------------------------------------------
def index_flat(x, idx, out_shape, spec, data=None):
    """out = x.flatten()[idx].reshape(out_shape): the primitive behind indexing and max(dim).
    `data`: the same values as a numpy view of x, when indexing is basic."""
    src = x._data
    out = src.reshape(-1)[idx].reshape(out_shape) if data is None else data
    res = _wrap(out)
    if not _needs(x):
        if _cap.on and "_flat_index" in spec.consts and _cap.mine():  # else the caller reports (max(dim): an argmax)
            _report(spec, res, (x,), lambda a: a.reshape(-1)[idx].reshape(out_shape), (idx,))
        return res
    return record(spec, res, (x,), (idx,))


def index_put_flat(g, idx, in_shape, spec=None):
    """zeros(in_shape) with g accumulated at flat indices idx: the adjoint of index_flat
    (recorded as `spec`, an alias of INDEX_PUT such as diag_embed, or INDEX_PUT itself)."""
    spec = INDEX_PUT if spec is None else spec
    out = np.zeros(int(np.prod(in_shape, dtype=np.int64)), dtype=g._data.dtype, like=like(g._data))
    np.add.at(out, idx, g._data.reshape(-1))
    res = _wrap(out.reshape(in_shape))
    if not _needs(g):
        if _cap.on and _cap.mine():
            _report(spec, res, (g,), lambda a: _scatter_add(a, idx, in_shape), (idx,))
        return res
    return record(spec, res, (g,), (idx,))


def _scatter_add(a, idx, shape):
    out = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=a.dtype, like=like(a))
    np.add.at(out, idx, a.reshape(-1))
    return out.reshape(shape)


def _norm_index(index, d):
    """The index as numpy reads it, for data d: index tensors and lists become arrays on
    d's device (PyTorch takes CPU indices for a CUDA tensor, not CUDA ones for a CPU one)."""
    if not isinstance(index, tuple):
        index = (index,)
    on_device = type(d) is DeviceArray
    out = []
    for i in index:
        if isinstance(i, Tensor):
            i = i._data
        elif isinstance(i, list):
            i = np.asarray(i)
        if on_device and isinstance(i, np.ndarray) and i.dtype.kind in "iub":
            i = DeviceArray.from_host(i)
        elif not on_device and type(i) is DeviceArray:
            raise RuntimeError("indices should be either on cpu or on the same device as the indexed tensor (cpu)")
        out.append(i)
    return tuple(out)


def _positions(shape, idx, dev=None):
    """The C-order flat index, in an array of `shape`, of each element that indexing it by
    `idx` selects, on the device of `dev` (ops/_common.like). Beyond a small size, per dim
    the same indexing of a broadcast view of that dim's coordinate, so nothing of the
    array's size is allocated (a batch drawn from a dataset tensor by an index tensor)."""
    size = math.prod(shape)
    if size <= _SMALL:
        return asarray(np.arange(size, dtype=np.int64, like=dev).reshape(shape)[idx]).reshape(-1)
    flat = 0
    stride = 1
    for k in range(len(shape) - 1, -1, -1):
        coord = np.arange(shape[k], dtype=np.int64, like=dev).reshape((-1,) + (1,) * (len(shape) - 1 - k))
        flat = flat + np.broadcast_to(coord, shape)[idx] * stride
        stride *= shape[k]
    return asarray(flat).reshape(-1)


_SMALL = 1 << 15  # below this, arange(size) costs less than a gather per dim


def getitem(x, index):
    d = x._data
    if isinstance(d, np.generic):  # a 0-d result held as a numpy scalar
        d = np.asarray(d)
    idx = _norm_index(index, d)
    try:
        # a trailing Ellipsis makes integer indexing return a 0-d view, not a scalar copy
        out = d[idx] if any(i is Ellipsis for i in idx) else d[idx + (Ellipsis,)]
    except IndexError as e:
        raise IndexError(str(e)) from None
    out = asarray(out)
    if all(i is None for i in idx):
        return _view_like(UNSQUEEZE, x, out)
    needs = not _no_record(x)
    tracing = _cap.on and _cap.mine()
    advanced = any(isinstance(i, (np.ndarray, DeviceArray)) and i.dtype.kind in "iub" for i in idx)
    if not needs and not tracing:
        return _wrap(out) if advanced else _mark_view(_wrap(out), x, _basic_index(idx))
    if advanced:
        spec = INDEX
    elif any(isinstance(i, (int, np.integer)) for i in idx):
        spec = SELECT
    else:
        spec = SLICE
    flat = None
    if tracing:
        flat = _traced_index(x, index, idx, out, needs)
        if isinstance(flat, Tensor):  # the result, the whole indexing reported as one Python instruction
            return flat
    if flat is None:
        flat = _positions(d.shape, idx, like(d))
    if advanced:
        return index_flat(x, flat, out.shape, spec)
    # basic indexing gives a view of x's storage, as in PyTorch
    res = index_flat(x, flat, out.shape, spec, data=out)
    return _mark_view(res, x, _basic_index(idx))


def _basic_index(idx):
    idx = idx if Ellipsis in idx else idx + (Ellipsis,)  # (basic indexing: ints, slices, None)
    return lambda a: a[idx]


def _traced_index(x, index, idx, out, needs):
    """Indexing while jitgrad.compile records, when a Tensor is among the indices: the
    positions depend on its data, so a Python instruction computes them from it at each
    replay (returned: the gather saves this very array), or, on a tensor without float
    data, the whole indexing is one Python instruction (returns the result). A boolean
    mask gives a result whose size is data: a graph break. None: no tensor index."""
    items = index if isinstance(index, tuple) else (index,)
    where = [k for k, i in enumerate(items) if isinstance(i, Tensor)]
    if not where:
        return None
    tensors = tuple(items[k] for k in where)
    if any(t._data.dtype.kind == "b" for t in tensors):
        _cap.rec.stop("indexing by a boolean mask tensor (the result's size depends on its data)")
        return None
    shape = x._data.shape
    ellipsis = any(i is Ellipsis for i in idx)

    def with_data(arrays):
        full = list(idx)
        for k, a in zip(where, arrays):
            full[k] = a
        return tuple(full) if ellipsis else tuple(full) + (Ellipsis,)

    if x._data.dtype.kind != "f" and not needs:
        res = _wrap(out)
        _cap.rec.python(lambda a, *arrays: (a[with_data(arrays)],), (x,) + tensors, (res,), "index")
        return res

    def positions(*arrays):
        return (_positions(shape, with_data(arrays)),)

    (flat,) = positions(*(t._data for t in tensors))
    _cap.rec.python(positions, tensors, (_wrap(flat),), "index positions")
    return flat


def scatter_rule(grad, ri):
    idx = ri.saved(0, None)
    return (index_put_flat(grad, idx, ri.in_shape(0)),)


def gather_rule(grad, ri):
    idx = ri.saved(0, None)
    return (index_flat(grad, idx, ri.in_shape(0), INDEX),)


def gather_jvp(ci, tangents):
    """The same gather of the tangent; when the primal is a view (basic indexing), the
    tangent is the same view of the input's tangent, as in PyTorch."""
    tg = tangents[0]
    idx = ci.saved_named("_flat_index")._data
    out_shape = ci.out_shape()
    data = None
    if ci.spec().op in _VIEW_GATHERS and idx.size:
        data = _affine_view(tg._data, idx.reshape(out_shape))
    return index_flat(tg, idx, out_shape, ci.spec(), data=data)


def _affine_view(a, flat):
    """The view of array `a` whose element at each position is a's element at C-order flat
    index `flat` there: basic indexing's indices are affine in the position, so the view
    starts at flat's first index and steps, along each dim, by the difference it makes
    in a's multi-index (a's own strides: a tangent need not be laid out as its primal)."""
    start = np.unravel_index(int(flat.reshape(-1)[0]), a.shape)
    strides = []
    for d, n in enumerate(flat.shape):
        if n < 2:
            strides.append(0)
            continue
        step = np.unravel_index(int(flat[(0,) * d + (1,) + (0,) * (flat.ndim - d - 1)]), a.shape)
        strides.append(sum((q - p) * s for p, q, s in zip(start, step, a.strides)))
    if type(a) is DeviceArray:  # the same view over the device allocation (strides in elements there)
        offset = a.offset + sum(p * s for p, s in zip(start, a.estrides))
        return DeviceArray(a.buf, offset, flat.shape, tuple(s // a.itemsize for s in strides), a.dtype)
    head = a[tuple(slice(p, None) for p in start)]
    return np.lib.stride_tricks.as_strided(head, flat.shape, strides, writeable=a.flags.writeable)


# The gather primitive behind indexing, max(dim), max_pool2d and padding: its saved value is
# the flat input index of each output element (torch keeps other values: indices per dim,
# a dim and an index... so it is internal, no _saved_ attribute)
INDEX = structural("index", "IndexBackward0", rule=scatter_rule, kernel=k_scatter, saves=("_flat_index",),
                   index_saves=("_flat_index",), forward=index_flat, jvp=gather_jvp, fwd_kernel=f_gather,
                   consts=("_flat_index",))
SELECT = alias("select", INDEX, "SelectBackward0", forward=getitem, consts=("_flat_index",))
SLICE = alias("slice", INDEX, "SliceBackward0", forward=getitem, consts=("_flat_index",))
AS_STRIDED = alias("as_strided", INDEX, "AsStridedBackward0", consts=("_flat_index",))


def as_strided(input, size, stride, storage_offset=None):
    """torch.as_strided: element i of the result is the storage element at storage_offset + sum(i_k * stride_k).
    jitgrad resolves each such storage element to the element of `input` that sits there (input's own strides
    and offset into its base) and gathers them (AsStridedBackward0 scatters the gradient back, adding where
    positions repeat, as torch). Not a view: the result is a copy, so a later in-place write to it does not
    reach `input`. A position outside `input`'s own elements raises (torch reads any element of the storage)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"as_strided(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    size, stride = tuple(int(n) for n in size), tuple(int(n) for n in stride)
    if len(size) != len(stride):
        raise RuntimeError("mismatch in length of strides and shape")
    if any(n < 0 for n in size):
        raise RuntimeError(f"as_strided: Negative sizes are not allowed, got {list(size)}")
    if any(st < 0 for st in stride):
        raise RuntimeError(f"as_strided: Negative strides are not supported at the moment, got strides: {list(stride)}")
    base_offset = input.storage_offset()
    offset = base_offset if storage_offset is None else int(storage_offset)
    want = np.full(size, offset, dtype=np.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        want += (np.arange(n, dtype=np.int64) * st).reshape((n,) + (1,) * (len(size) - d - 1))
    if input.is_contiguous():  # (the usual case, torchdiffeq's as_strided(x, (), ())): element = position - offset
        idx = want.reshape(-1) - base_offset
        if not idx.size or (idx.min() >= 0 and idx.max() < input.numel()):
            return index_flat(input, idx, size, AS_STRIDED)
        return _as_strided_out_of_bounds(input, size, stride, offset, base_offset, want)
    # the storage position of each element of input, in C order of input
    have = np.full(input.shape, base_offset, dtype=np.int64)
    for d, (n, st) in enumerate(zip(input.shape, input.stride())):
        have += (np.arange(n, dtype=np.int64) * st).reshape((n,) + (1,) * (input.dim() - d - 1))
    have = have.reshape(-1)
    order = np.argsort(have, kind="stable")
    pos = np.searchsorted(have[order], want.reshape(-1)) if have.size else np.zeros(want.size, np.int64)
    found = (pos < have.size) & (have[order][np.minimum(pos, max(have.size - 1, 0))] == want.reshape(-1)) \
        if have.size else np.zeros(want.size, bool)
    if not found.all():
        _as_strided_out_of_bounds(input, size, stride, offset, base_offset, want)
    idx = order[pos].astype(np.int64) if want.size else np.zeros(0, np.int64)
    return index_flat(input, idx, size, AS_STRIDED)


def _as_strided_out_of_bounds(input, size, stride, offset, base_offset, want):
    need = int(want.max()) + 1 if want.size else offset
    raise RuntimeError(f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and "
                       f"itemsize {input.element_size()} requiring a storage size of {need * input.element_size()} "
                       f"are out of bounds for storage of size {(base_offset + input.numel()) * input.element_size()}"
                       " (jitgrad's as_strided reads only the input's own elements)")
def scatter_jvp(ci, tangents):
    return index_put_flat(tangents[0], ci.saved_named("_flat_index")._data, ci.out_shape())


INDEX_PUT = structural("index_put", "IndexPutBackward0", rule=gather_rule, kernel=k_index_put,
                       saves=("_flat_index",), index_saves=("_flat_index",), forward=index_put_flat,
                       jvp=scatter_jvp, fwd_kernel=f_index_put, consts=("_flat_index",))


# --- joining ---------------------------------------------------------------------------------
def _tensor_list(tensors):
    tensors = list(tensors)
    for k, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"expected Tensor as element {k} in argument 0, but got {type(t).__name__}")
    return tensors


def cat(tensors, dim=0):
    tensors = _tensor_list(tensors)
    if not tensors:
        raise RuntimeError("torch.cat(): expected a non-empty list of Tensors")
    nd = tensors[0]._data.ndim
    if nd == 0:
        raise RuntimeError("zero-dimensional tensor (at position 0) cannot be concatenated")
    dim = _wrap_dim(dim, nd)
    ref = tensors[0]._data.shape
    for k, t in enumerate(tensors):
        s = t._data.shape
        if len(s) != nd:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {nd} and {len(s)}")
        for i in range(nd):
            if i != dim and s[i] != ref[i]:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {dim}. Expected size {ref[i]} "
                                   f"but got size {s[i]} for tensor number {k} in the list.")
    return _join(CAT, tensors, dim, np.concatenate([t._data for t in tensors], axis=dim), False)


def stack(tensors, dim=0):
    tensors = _tensor_list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    ref = tensors[0]._data.shape
    for k, t in enumerate(tensors):
        if t._data.shape != ref:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(ref)} at entry 0 and "
                               f"{list(t._data.shape)} at entry {k}")
    dim = _wrap_dim(dim, len(ref) + 1)
    return _join(STACK, tensors, dim, np.stack([t._data for t in tensors], axis=dim), True)


def _join(spec, tensors, dim, out, stacked):
    dt = _dtype.result_type(*[t._data for t in tensors])  # torch's: int64 with float32 gives float32
    res = _wrap(out.astype(dt, copy=False))
    needs = _needs(*tensors)
    tracing = _cap.on and _cap.mine()
    if not needs and not tracing:
        return res
    shape = out.shape
    outer = int(np.prod(shape[:dim], dtype=np.int64))
    inner = int(np.prod(shape[dim + 1:], dtype=np.int64))
    sizes = [1 if stacked else t._data.shape[dim] for t in tensors]
    ints = spec.pack_ints(outer, shape[dim], inner, dim, rest=sizes)
    if not needs:
        join = np.stack if stacked else np.concatenate
        _report(spec, res, tuple(tensors), lambda *arrays: join(arrays, axis=dim), iparams=ints)
        return res
    if tracing and any(t._data.dtype != dt for t in tensors):
        _cap.rec.stop(f"{spec.name} of tensors of several dtypes")  # the kernel reads one
    return record(spec, res, tuple(tensors), (), (), ints)




def cat_rule(grad, ri):
    p = ri.iparams()
    stacked = ri.op() == STACK.op
    out = []
    off = 0
    for n in p.sizes:
        idx = [slice(None)] * grad.ndim
        idx[p.dim] = off if stacked else slice(off, off + n)
        out.append(grad[tuple(idx)])
        off += n
    return tuple(out)


def cat_jvp(ci, tangents):
    """The join of the tangents, zeros standing in for an input without one."""
    dt = ci.result._data.dtype
    dev = like(ci.result._data)
    tgs = [tg if tg is not None else _wrap(np.zeros(ci.in_shape(j), dt, like=dev)) for j, tg in enumerate(tangents)]
    join = stack if ci.spec().op == STACK.op else cat
    return join(tgs, ci.iparams().dim)


CAT = structural("cat", "CatBackward0", rule=cat_rule, kernel=k_cat, args=("tensors",),
                 iparams=("outer", "total", "inner", "dim", "*sizes"), forward=cat, jvp=cat_jvp, fwd_kernel=f_cat)
STACK = alias("stack", CAT, "StackBackward0", forward=stack)


# --- views that select part of a tensor: narrow, select, split, chunk, unbind, diagonal -----
# Each is the gather primitive at the positions the view covers (affine in the output
# position), under PyTorch's node name, and its result shares x's storage: a real view.
# split / chunk / unbind make one node per piece (PyTorch's single node has several outputs).
def _gathered_view(x, spec, out, positions, fn, piece=None):
    """out (a view of x's array, fn(x's array) gives it) as gather `spec` of x at the flat
    `positions` (a host array: computed only when the op is recorded or traced). piece: the
    index of this view among the several one call returns (split, unbind): PyTorch forbids
    writing those in place, and its message names the output and the function."""
    meta, origin = (_views.MULTI_OUTPUT, (piece, spec.node_name.replace("Backward0", ""))) if piece is not None \
        else (_views.DEFAULT, None)
    if _no_record(x) and not (_cap.on and _cap.mine()):
        return _mark_view(_wrap(out), x, fn, meta, origin)
    flat = positions().reshape(-1)
    if type(x._data) is DeviceArray:
        flat = DeviceArray.from_host(flat)
    return _mark_view(index_flat(x, flat, out.shape, spec, data=out), x, fn, meta, origin)


def _basic_view(x, spec, idx, piece=None):
    """x[idx] for a tuple of ints and slices, recorded as `spec`."""
    d = x._data
    full = idx + (Ellipsis,)  # an int then gives a 0-d view, not a scalar copy

    def fn(a):
        return a[full]
    return _gathered_view(x, spec, asarray(fn(d)), lambda: _positions(d.shape, full), fn, piece)


def _dim_of(x, dim, fn):
    nd = x._data.ndim
    if nd == 0:
        raise RuntimeError(f"{fn}() cannot be applied to a 0-dim tensor.")
    return _wrap_dim(operator.index(dim), nd)


def narrow(x, dim, start, length):
    dim = _dim_of(x, dim, "narrow")
    size = x._data.shape[dim]
    start, length = operator.index(start), operator.index(length)  # a 0-d int tensor is an index too
    if not -size <= start <= size:
        raise IndexError(f"start out of range (expected to be in range of [{-size}, {size}], but got {start})")
    if start < 0:
        start += size
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if start + length > size:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return _basic_view(x, SLICE, (slice(None),) * dim + (slice(start, start + length),))


def select(x, dim, index):
    if x._data.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    dim = _wrap_dim(operator.index(dim), x._data.ndim)
    size = x._data.shape[dim]
    index = operator.index(index)
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(x._data.shape)} at "
                         f"dimension {dim}")
    return _basic_view(x, SELECT, (slice(None),) * dim + (index % size,))


def _pieces(x, spec, sizes, dim):
    out = []
    off = 0
    for k, n in enumerate(sizes):
        out.append(_basic_view(x, spec, (slice(None),) * dim + (slice(off, off + n),), k))
        off += n
    return tuple(out)


def split_with_sizes(x, split_sizes, dim=0):
    sizes = tuple(split_sizes)
    for k, n in enumerate(sizes):
        if isinstance(n, (bool, np.bool_)) or not hasattr(n, "__index__"):
            raise TypeError(f"split_with_sizes(): argument 'split_sizes' (position 2) must be tuple of ints, but "
                            f"found element of type {type(n).__name__} at pos {k}")
    sizes = tuple(operator.index(n) for n in sizes)
    dim = _wrap_dim(operator.index(dim), x._data.ndim)
    if x._data.ndim == 0:
        raise RuntimeError("split_with_sizes expects at least a 1-dimensional tensor")
    total = x._data.shape[dim]
    if any(n < 0 for n in sizes):
        raise RuntimeError(f"split_with_sizes expects split_sizes have only non-negative entries, but got "
                           f"split_sizes={list(sizes)}")
    if sum(sizes) != total:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {total} (input tensor's size at "
                           f"dimension {dim}), but got split_sizes={list(sizes)}")
    return _pieces(x, SPLIT_WITH_SIZES, sizes, dim)


def split(x, split_size_or_sections, dim=0):
    """torch.split / Tensor.split: pieces of split_size (the last one smaller), or of the
    given sizes (split_with_sizes)."""
    if isinstance(split_size_or_sections, (list, tuple)):
        return split_with_sizes(x, split_size_or_sections, dim)
    step = operator.index(split_size_or_sections)
    if x._data.ndim == 0:
        raise RuntimeError("split expects at least a 1-dimensional tensor")
    dim = _wrap_dim(operator.index(dim), x._data.ndim)
    total = x._data.shape[dim]
    if step < 0:
        raise RuntimeError(f"split expects split_size be non-negative, but got split_size={step}")
    if step == 0 and total != 0:
        raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {total}")
    count = max(-(-total // step), 1) if step else 1
    sizes = [min(step, total - k * step) for k in range(count)]
    return _pieces(x, SPLIT, sizes, dim)


def chunk(x, chunks, dim=0):
    chunks = operator.index(chunks)
    if x._data.ndim == 0:
        raise RuntimeError("chunk expects at least a 1-dimensional tensor")
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    dim = _wrap_dim(operator.index(dim), x._data.ndim)
    total = x._data.shape[dim]
    if total == 0:  # every piece empty: as many as asked
        return _pieces(x, SPLIT_WITH_SIZES, [0] * chunks, dim)
    return split(x, -(-total // chunks), dim)


def unbind(x, dim=0):
    if x._data.ndim == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    dim = _wrap_dim(operator.index(dim), x._data.ndim)
    return tuple(_basic_view(x, UNBIND, (slice(None),) * dim + (i,), i) for i in range(x._data.shape[dim]))


def diagonal(x, offset=0, dim1=0, dim2=1):
    d = x._data
    nd = d.ndim
    a, b = _wrap_dim(operator.index(dim1), nd), _wrap_dim(operator.index(dim2), nd)
    if a == b:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    offset = operator.index(offset)
    # the flat positions, in x, of the diagonal's elements: numpy's diagonal has torch's layout
    pos = np.diagonal(np.arange(d.size, dtype=np.int64).reshape(d.shape), offset, a, b)
    if pos.size:
        def fn(arr):
            return _affine_view(arr, pos)
    else:
        def fn(arr):
            return arr.reshape(-1)[:0].reshape(pos.shape)
    return _gathered_view(x, DIAGONAL, asarray(fn(d)), lambda: pos, fn)


def repeat(x, *repeats):
    """x tiled `repeats` times per dim (a copy, not a view): the gather at the tiled positions."""
    reps = _shape_arg(repeats, "repeat", "repeats")
    d = x._data
    if len(reps) < d.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of "
                           "tensor")
    padded = (1,) * (len(reps) - d.ndim) + tuple(d.shape)
    shape = tuple(p * r for p, r in zip(padded, reps))
    if any(s < 0 for s in shape):
        bad = next(s for s in shape if s < 0)
        raise RuntimeError(f"Trying to create tensor with negative dimension {bad}: {list(shape)}")
    pos = np.tile(np.arange(d.size, dtype=np.int64).reshape(padded), reps).reshape(-1)
    if type(d) is DeviceArray:
        pos = DeviceArray.from_host(pos)
    return index_flat(x, pos, shape, REPEAT)


def tile(x, dims):
    """torch.tile: repeat, with dims padded by leading 1s to x's rank (Tensor.tile also takes
    the dims unpacked: tile_method)."""
    if not isinstance(dims, (tuple, list)):
        raise TypeError(f"tile(): argument 'dims' (position 2) must be tuple of ints, not {type(dims).__name__}")
    for k, n in enumerate(dims):
        if isinstance(n, (bool, np.bool_)) or not hasattr(n, "__index__"):
            raise TypeError(f"tile(): argument 'dims' (position 2) must be tuple of ints, but found element of type "
                            f"{type(n).__name__} at pos {k}")
    reps = tuple(operator.index(n) for n in dims)
    return repeat(x, (1,) * (x._data.ndim - len(reps)) + reps)


def tile_method(x, *dims):
    return tile(x, dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims)


def broadcast_shapes(*shapes):
    """torch.broadcast_shapes: the shape every argument broadcasts to (an int is a 1-d shape),
    combined left to right as torch does, with its message for the first that does not fit."""
    out = ()
    for i, s in enumerate(shapes):
        s = (operator.index(s),) if hasattr(s, "__index__") else tuple(s)
        n = max(len(out), len(s))
        a, b = (1,) * (n - len(out)) + out, (1,) * (n - len(s)) + s
        for k in range(n - 1, -1, -1):  # (torch reports the rightmost mismatch)
            if a[k] != b[k] and a[k] != 1 and b[k] != 1:
                raise RuntimeError(f"Attempting to broadcast a dimension of length {b[k]} at {k - n}! Mismatching "
                                   f"argument at index {i} had {s}; but expected shape should be broadcastable to "
                                   f"{list(out)}")
        out = tuple(y if x == 1 else x for x, y in zip(a, b))
    return Size(out)


def broadcast_to(x, size):
    """torch.broadcast_to / Tensor.broadcast_to: expand (a view, ExpandBackward0)."""
    return expand(x, size)


def broadcast_tensors(*tensors):
    shape = ()
    for t in tensors:  # torch's infer_size, pairwise, with its message
        try:
            shape = np.broadcast_shapes(shape, tuple(t.shape))
        except ValueError:
            raise _broadcast_error(shape, tuple(t.shape)) from None
    return tuple(expand(t, shape) for t in tensors)


def unflatten(x, dim, sizes):
    """torch.unflatten / Tensor.unflatten: dim split into `sizes` (one of them may be -1): a view."""
    nd = x._data.ndim
    dim = _wrap_dim(operator.index(dim), nd)
    sizes = _shape_arg((sizes,), "unflatten", "sizes")
    if not sizes:
        raise RuntimeError("unflatten: sizes must be non-empty")
    n = x._data.shape[dim]
    if sizes.count(-1) > 1:  # (torch wraps infer_size's message so)
        raise RuntimeError("unflatten got an unexpected error:\nonly one dimension can be inferred")
    known = math.prod(s for s in sizes if s != -1)
    if (-1 in sizes and (known == 0 or n % known)) or (-1 not in sizes and known != n):
        raise RuntimeError(f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {dim} "
                           f"({n}) in the input tensor")
    if -1 in sizes:
        sizes = tuple(n // known if s == -1 else s for s in sizes)
    return view(x, x._data.shape[:dim] + sizes + x._data.shape[dim + 1:])


def _diagonal_int(offset, fn="diag"):
    if isinstance(offset, (bool, np.bool_)) or not hasattr(offset, "__index__"):
        raise TypeError(f"{fn}(): argument '{'diagonal' if fn == 'diag' else 'offset'}' (position 2) must be int, "
                        f"not {type(offset).__name__}")
    return operator.index(offset)


def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    """torch.diag_embed: x's last dim placed on the `offset` diagonal of new dims dim1, dim2
    (of the result), zeros elsewhere. The scatter primitive (adjoint of a gather) at the flat
    positions of that diagonal, in x's element order: its gradient is the diagonal's gather."""
    offset = _diagonal_int(offset, "diag_embed")
    d = x._data
    nd = d.ndim + 1
    a, b = _wrap_dim(operator.index(dim1), nd), _wrap_dim(operator.index(dim2), nd)
    if a == b:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    n = d.shape[-1] + abs(offset)
    batch = list(d.shape[:-1])
    shape = []
    for k in range(nd):
        shape.append(n if k in (a, b) else batch.pop(0))
    # np.diagonal of the result's positions lists them with the diagonal last, batch dims in
    # order: exactly x's layout
    pos = np.diagonal(np.arange(math.prod(shape), dtype=np.int64).reshape(shape), offset, a, b).reshape(-1)
    if type(d) is DeviceArray:
        pos = DeviceArray.from_host(pos)
    return index_put_flat(x, pos, tuple(shape), DIAG_EMBED)


def diag(x, diagonal=0):
    """torch.diag: a 1-D x as the `diagonal` diagonal of a square matrix (diag_embed), or the
    diagonal of a 2-D x as a new tensor (a copy, unlike Tensor.diagonal's view)."""
    diagonal = _diagonal_int(diagonal)
    d = x._data
    if d.ndim == 1:
        return diag_embed(x, diagonal, 0, 1)
    if d.ndim != 2:
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {d.ndim}D")
    pos = np.diagonal(np.arange(d.size, dtype=np.int64).reshape(d.shape), diagonal).reshape(-1)
    if type(d) is DeviceArray:
        pos = DeviceArray.from_host(pos)
    return index_flat(x, pos, (pos.size,), DIAG)


SPLIT = alias("split", INDEX, "SplitBackward0", forward=split, consts=("_flat_index",))
SPLIT_WITH_SIZES = alias("split_with_sizes", INDEX, "SplitWithSizesBackward0", forward=split_with_sizes,
                         consts=("_flat_index",))
UNBIND = alias("unbind", INDEX, "UnbindBackward0", forward=unbind, consts=("_flat_index",))
DIAGONAL = alias("diagonal", INDEX, "DiagonalBackward0", forward=diagonal, consts=("_flat_index",))
REPEAT = alias("repeat", INDEX, "RepeatBackward0", forward=repeat, consts=("_flat_index",))
DIAG = alias("diag", INDEX, "DiagonalBackward0_copy", forward=diag, consts=("_flat_index",))  # (torch's name)
DIAG_EMBED = alias("diag_embed", INDEX_PUT, "DiagEmbedBackward0", forward=diag_embed, consts=("_flat_index",))
# the gathers whose result is a view of the input: their tangent is the same view of its tangent
_VIEW_GATHERS = {s.op for s in (SELECT, SLICE, SPLIT, SPLIT_WITH_SIZES, UNBIND, DIAGONAL)}
