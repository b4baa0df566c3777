"""In-place ops: add_, sub_, mul_, div_, clamp_, copy_, fill_/zero_, op=, and item
assignment.

The new value is written into the tensor's storage, so views see it, and the storage's
version is bumped (autograd/versions.py). When the op must be recorded (grad mode on and
a tensor involved requires grad) it is computed as the out-of-place op on a copy of the
old value, whose node then becomes the tensor's history ("rebasing", as in PyTorch:
`y = x * 2; y += 1` gives AddBackward0). An in-place op on a leaf that requires grad is
an error unless grad mode is off.
"""
import weakref

import numpy as np

import jitgrad.graph.views as _views
from jitgrad._core import dtype as _dtype
from jitgrad._core import modes as _grad_mode
from jitgrad._core.capture import stop as _stop
from jitgrad._core.forward import state as _fw
from jitgrad._core.messages import scalar_name
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph import saved as _saved
from jitgrad.graph.spec import SPECS
from jitgrad.graph.tape import rows_saving_const
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import _forward
from jitgrad.ops import functional as F
from jitgrad.ops._common import asarray, copy_array, like, storage

_LEAF = "a leaf Variable that requires grad is being used in an in-place operation."


def _needs_record(t, *others):
    """Whether the in-place op on t is recorded; raises PyTorch's error where it is not
    allowed (graph/views.py for the view rules). A view needs it when its base requires
    grad, as in PyTorch, where such a view requires grad."""
    x = t._x
    if x is not None and x.inference and not _grad_mode.is_inference_mode_enabled():
        if _grad_mode.is_grad_enabled() and t._requires_grad and t._tape is None:
            raise RuntimeError(_LEAF)
        raise RuntimeError("Inplace update to inference tensor outside InferenceMode is not allowed.You can make a "
                           "clone to get a normal tensor before doing inplace update.See "
                           "https://github.com/pytorch/rfcs/pull/17 for more details.")
    if not _grad_mode.is_grad_enabled():
        return False
    view = None if x is None else x.view_of
    needs = (t._requires_grad or (view is not None and view.base._requires_grad)
             or any(getattr(o, "requires_grad", False) for o in others))
    if view is not None:
        if needs and view.meta != _views.DEFAULT:
            raise _views.inplace_error(view)
        if view.base._tape is None and view.base._requires_grad:
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place "
                               "operation.")
    elif t._requires_grad and t._tape is None:
        raise RuntimeError(_LEAF)
    return needs


def _stale_one_element_saves(t):
    """A one-element value is copied into the tape when an op saves it, so the version
    check at backward cannot see an in-place write to it. Mark the rows that saved it now:
    its own row if it saved its result, and the rows reading it whose formulas saved it."""
    # the rows that copied it noted it (tape.note_inline_const): all of them for a constant;
    # for a leaf, also those of a graph its AccumulateGrad no longer points at (jitgrad.compile
    # gives each call of a compiled module a graph of its own)
    for tape, r in rows_saving_const(t._data):
        _mark_stale(tape, r, t._data, t._version)
    if not t._requires_grad:
        return
    if t._tape is not None:
        tape, row = t._tape, t._row
    else:
        ref = t._acc
        acc = ref() if ref is not None else None
        tape, row = (None, -1) if acc is None else acc._where()
        if tape is None:
            return
    version = t._version
    marks = [(row, None)] + tape.readers_of(row)
    for r, j in marks:
        spec = SPECS[tape.op(r)]
        # the value that row saved under its name for input j (or its result)
        name = "result" if j is None else spec.args[j] if j < len(spec.args) else None
        if spec.kind != "sink" and name in spec.saves and \
                _saved.needed_in_row(tape, r)[spec.saves.index(name)]:  # (not saved when no wanted gradient reads it)
            _mark_stale(tape, r, t._data, version)


def _mark_stale(tape, r, data, version):
    if r not in tape.stale:
        tape.stale[r] = (data, version + 1, version)
        tape.grow_freed()
        tape.freed[r] = 1


def _sharing(t):
    """t, and the tensors whose saves a write through t reaches: its view's root, the
    tensor it was detach()ed from."""
    out = [t]
    view = _views.info(t)
    if view is not None:
        out.append(view.base)
    origin = t._origin() if t._x is not None and t._origin is not None else None
    if origin is not None:
        out.append(origin)
    return out


def _dual(t, others):
    """Forward mode: t or an operand has a tangent, so the op updates t's tangent too."""
    if not _fw.live:
        return False
    return any(isinstance(x, Tensor) and _forward.tangent(x) is not None for x in (t, *others))


def _update_tangent(t, new):
    """t's tangent <- new's, written into t's tangent, so that views of the tangent (the
    tangents of t's base and of its other views) see it, as in PyTorch."""
    nt, tt = _forward.tangent(new), _forward.tangent(t)
    with _forward._paused:
        if tt is None:
            if nt is not None:
                _ensure_tangent(t).copy_(nt)
        elif nt is None:
            tt.zero_()
        else:
            tt.copy_(nt)


def _ensure_tangent(t):
    """t's tangent; a tensor without one gets zeros, the tangent of its whole storage: its
    root's tangent is made (zeros) and every live view of the root without a tangent gets
    the same view of it (a write through one then reaches the others, as in PyTorch, where
    a write of a dual into a view gives its base and the base's views tangents). Called
    with forward mode paused (_forward._paused does not nest)."""
    tt = _forward.tangent(t)
    if tt is not None:
        return tt
    view = _views.info(t)
    root = t if view is None else view.base
    rt = _forward.tangent(root)
    if rt is None:
        rt = F.zeros_like(root)
        _forward.set_tangent(root, rt)
    for v in _views.live_views(root):
        if _forward.tangent(v) is None:
            fn = v._x.view_of.fn
            _forward.set_tangent(v, F._mark_view(F._wrap(fn(rt._data)), rt, fn))
    return _forward.tangent(t)


def _apply(t, compute, *others, fills=False, ufunc=None):
    """t <- compute(old t), in place; recorded as compute's node when needed. `fills`: the
    op writes one value everywhere, which PyTorch allows into overlapping memory. `ufunc`:
    compute is ufunc(old t, others[0]), which the unrecorded common case runs in place."""
    _stop("an in-place op in a compiled step")
    if not fills:
        _check_writable(t)
    if t._data.size == 1:
        for s in _sharing(t):
            _stale_one_element_saves(s)
    dual = _dual(t, others)
    view = _views.info(t)
    record = _needs_record(t, *others)
    if view is not None and record:
        _apply_to_view(t, view, compute, others, dual)
        return t
    if ufunc is not None and not record and not dual and view is None and _in_place(t, ufunc, others[0]):
        t._bump()
        _refresh_views(t, t, False)
        return t
    if record:
        new = compute(_before(t, dual))
    else:
        with _grad_mode.no_grad():
            new = compute(t)
    _check_result(new, t)
    _write(storage(t), new._data)
    t._bump()
    if new.requires_grad:  # rebase: the tensor's history is now the op's node
        _rebase(t, new)
    _refresh_views(t if view is None else view.base, t, new.requires_grad)
    if dual:
        _update_tangent(t, new)
    return t


def _in_place(t, ufunc, other):
    """The unrecorded add_ / sub_ / mul_ of a float array and a number, or a tensor of its
    dtype and shape (an optimizer's `p -= lr * p.grad` under no_grad): the ufunc writes
    into t's array, the same bits as compute(t) and a copy (NEP 50 keeps a number at t's
    dtype, as _binary does). Anything else (a cast, a broadcast, a bool, a read-only or
    device array) returns False and takes the general path, with its checks."""
    d = t._data
    if type(d) is not np.ndarray or d.dtype.kind != "f" or not d.flags.writeable:
        return False
    if isinstance(other, Tensor):
        o = other._data
        if type(o) is not np.ndarray or o.dtype != d.dtype or o.shape != d.shape:
            return False
    elif type(other) is float or type(other) is int:
        o = other
    else:
        return False
    ufunc(d, o, out=d)
    return True


def _check_result(new, t):
    """The op's result must fit t: its shape (an operand may not broadcast t itself), and its
    dtype as torch.can_cast says (no float into an int tensor, no int into a bool one; a
    narrower width of the same category is cast, as torch does)."""
    if new._data.shape != t._data.shape and np.broadcast_shapes(new._data.shape, t._data.shape) != t._data.shape:
        raise RuntimeError(f"output with shape {list(t._data.shape)} doesn't match the broadcast shape "
                           f"{list(np.broadcast_shapes(new._data.shape, t._data.shape))}")
    nd, td = new._data.dtype, t._data.dtype
    if nd != td and not _dtype.can_cast(nd, td):
        raise _dtype.cast_error(nd, td)


def _before(t, dual):
    """The value of t before the write, with t's history, for the op's node to save."""
    old = Tensor._make(copy_array(t._data))
    old._requires_grad = t._requires_grad
    if t._tape is not None:
        old._tape, old._row, old._output_nr = t._tape, t._row, t._output_nr
    if dual:
        old._fw = _forward.tangent(t)
    return old


def _rebase(t, new):
    """t's history becomes new's; a retain_grad() follows it, as in PyTorch."""
    retained = t._retain and t._tape is not None and t._tape.retained.pop(t._row, None) is not None
    t._requires_grad = True
    t._tape, t._row, t._output_nr = new._tape, new._row, new._output_nr
    if t._x is not None:
        t._x.node = None
    if retained:
        t._tape.retained[t._row] = weakref.ref(t)


def _refresh_views(root, written, rebased):
    """After an in-place write to root's storage (through `written`): its views that take
    part in autograd read their values from root's new history when it changed, as
    PyTorch's AsStridedBackward0 does; those whose meta forbids that become invalid."""
    for v in _views.live_views(root):
        info = v._x.view_of
        if info.meta != _views.DEFAULT:
            info.invalid = info.invalid or v._requires_grad
        elif rebased and v is not written and root._requires_grad:
            with _grad_mode.enable_grad():
                again = F.index_flat(root, _positions(root, info.fn), v._data.shape, F.SLICE, data=v._data)
            _rebase(v, again)


def _check_writable(t, index=None):
    """PyTorch refuses a write that would reach one memory location through two elements
    (into an expand() result); a write to part of it that repeats none, `g[0] = 0`, is fine."""
    d = t._data
    if type(d) is not np.ndarray or d.flags.writeable:
        return
    if index is not None:
        index = F._norm_index(index, d)
        if any(isinstance(i, (np.ndarray, DeviceArray)) for i in index):
            return  # advanced indexing writes each selected element once (PyTorch only warns)
        d = d[index]
    if any(s == 0 and n > 1 for n, s in zip(d.shape, d.strides)):
        raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                           "single memory location. Please clone() the tensor before performing the operation.")


def _write(d, value):
    """d[...] = value, broadcast and cast to d's dtype, on d's device."""
    if type(d) is DeviceArray:
        d[...] = value  # DeviceArray's assignment broadcasts and casts
    else:
        d[...] = np.broadcast_to(np.asarray(value, dtype=d.dtype), d.shape)


def _positions(base, fn):
    """Flat positions in base's storage that the view fn(base) covers, in the view's order."""
    d = base._data
    return asarray(fn(np.arange(d.size, dtype=np.int64, like=like(d)).reshape(d.shape))).reshape(-1)


def _assign(t, flat, value, may_repeat=False):
    """t.flatten()[flat] = value, recorded: the old value keeps its gradient outside the
    written positions, value gets the gradient of the positions it was written to."""
    _apply(t, _placing(t, flat, value, may_repeat), value)


def _placing(t, flat, value, may_repeat=False):
    """compute(old) = old with value written at flat: where(written, placed, old). A write, never a
    blend: old * keep + placed would carry a NaN or inf of the old values (torch.empty's leftover
    memory) into the written positions. where's rule gives old a zero gradient there, and value the
    gradient of the positions it was written to."""
    shape = t._data.shape
    written = np.zeros(t._data.size, dtype=bool, like=like(t._data))
    written[flat] = True
    written = written.reshape(shape)
    if may_repeat and isinstance(flat, np.ndarray) and flat.size > 1:
        # a position written twice (x[[0, 0]] = v: only advanced indexing repeats one) holds the last
        # write, as numpy's and torch's CPU assignment: placing by index_put_flat would add the writes up
        rev_first = np.unique(flat[::-1], return_index=True)[1]
        if rev_first.size != flat.size:
            last = np.sort(flat.size - 1 - rev_first)
            vflat = F.reshape(value, (-1,))
            value = F.index_flat(vflat, last, (last.size,), F.SELECT)
            flat = flat[last]

    def compute(a):
        placed = F.index_put_flat(F.reshape(value, (-1,)), flat, shape)
        return F.where(F._wrap(written), placed, a)
    return compute


def rebase_dirty_view(view):
    """A custom Function wrote `view` in place (ctx.mark_dirty) and is now its history:
    the root base's history becomes its old one outside the view's positions and the
    view's inside, as _apply_to_view makes it for an op (PyTorch's CopySlices). The
    values are already in the storage."""
    info = _views.info(view)
    root = info.base
    with _grad_mode.enable_grad():
        new = _placing(root, _positions(root, info.fn), view)(_before(root, False))
    _rebase(root, new)
    _refresh_views(root, view, True)


def _apply_to_view(t, view, compute, others, dual):
    """An in-place op on a view of a tensor with history: the base gets the new values at
    the view's positions (rebasing the base), then the view reads them back from the base.
    This is what PyTorch's CopySlices does. The op reads the view's old value from the
    base too, so the view's old node is left out of the graph (its hooks do not fire)."""
    base, fn = view.base, view.fn
    flat = _positions(base, fn)
    if dual:
        old = _before(t, dual)
    else:
        old = F.index_flat(base, flat, t._data.shape, F.SLICE)  # a copy of the old values
    new = compute(old)
    _check_result(new, t)
    _assign(base, flat, new if new._data.shape == t._data.shape else F.expand(new, t._data.shape))
    # the view's new history: its elements, read from the updated base
    again = F.index_flat(base, flat, t._data.shape, F.SLICE, data=t._data)
    _rebase(t, again)
    if dual:
        _update_tangent(t, again)


def add_(t, other, alpha=1):
    return _apply(t, lambda a: F.add(a, other, alpha=alpha), other, ufunc=np.add if alpha == 1 else None)


def sub_(t, other, alpha=1):
    return _apply(t, lambda a: F.sub(a, other, alpha=alpha), other, ufunc=np.subtract if alpha == 1 else None)


def mul_(t, other):
    return _apply(t, lambda a: F.mul(a, other), other, ufunc=np.multiply)


def div_(t, other):
    return _apply(t, lambda a: F.div(a, other), other)


def clamp_(t, min=None, max=None):  # noqa: A002
    return _apply(t, lambda a: F.clamp(a, min, max))


def _overwritten(spec, a, value):
    """value broadcast over a's shape, recorded as where(False, a, value): the old values
    are really dropped (x * 0 + v would keep NaN and inf), and get a zero gradient."""
    vd = value._data if isinstance(value, Tensor) else value
    out = np.empty_like(asarray(a._data))
    try:
        out[...] = vd
    except ValueError:
        raise F._broadcast_error(out.shape, np.shape(vd)) from None
    keep_none = F._wrap(np.zeros(out.shape, dtype=bool, like=like(out)))
    b = value if isinstance(value, Tensor) else float(value)
    return F._ew(spec, out, a, b, aux=keep_none)


def _overwrite(t, spec, value):
    others = (value,) if isinstance(value, Tensor) else ()
    return _apply(t, lambda a: _overwritten(spec, a, value), *others, fills=spec is not F.COPY)


def copy_(t, src):
    if not isinstance(src, Tensor):
        src = F._wrap(np.asarray(src, dtype=t._data.dtype))
    src = _to_device_of(t, src)
    if src._data.dtype != t._data.dtype:
        src = F.to_dtype(src, t.dtype)
    return _overwrite(t, F.COPY, src)


def _to_device_of(t, value):
    """value moved to t's device, as PyTorch's copy_ and item assignment do (a copy
    across devices; differentiable: the gradient goes back to value's device)."""
    if (type(value._data) is DeviceArray) != (type(t._data) is DeviceArray):
        return value.to(t.device)
    return value


def fill_(t, value):
    if isinstance(value, Tensor):
        if value._data.ndim != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                               f"{value._data.ndim} dimensions.")
        if value._data.dtype != t._data.dtype:
            value = F.to_dtype(value, t.dtype)
        return _overwrite(t, F.FILL_TENSOR, value)
    if not isinstance(value, (int, float, np.number, np.bool_)):
        raise TypeError(f"fill_() received an invalid combination of arguments - got ({type(value).__name__}), "
                        "but expected one of:\n * (Tensor value)\n * (Number value)")
    return _overwrite(t, F.FILL, value)


def zero_(t):
    return _overwrite(t, F.ZERO, 0.0)


def setitem(t, index, value):
    """t[index] = value: the old value keeps its gradient outside the indexed elements,
    value gets the gradient of the elements it was written to."""
    _stop("an item assignment in a compiled step")
    if not isinstance(value, Tensor):
        value = F._wrap(np.asarray(value, dtype=t._data.dtype))
    value = _to_device_of(t, value)
    _check_writable(t, index)
    if not _needs_record(t, value):
        dual = _dual(t, (value,))
        d = storage(t)
        try:
            d[F._norm_index(index, d)] = value._data
        except ValueError:  # numpy's broadcast error: torch's is expand()'s
            F.expand(value, d[F._norm_index(index, d)].shape)
            raise
        t._bump()
        view = _views.info(t)
        _refresh_views(t if view is None else view.base, t, False)
        if dual:  # the tangent's elements at index <- value's tangent (zero without one)
            vt = _forward.tangent(value)
            with _forward._paused:
                _ensure_tangent(t)[index] = vt if vt is not None else 0.0
        return
    d = t._data
    picked = asarray(np.arange(d.size, dtype=np.int64, like=like(d)).reshape(d.shape)[F._norm_index(index, d)])
    flat, target_shape = picked.reshape(-1), picked.shape
    parts = index if isinstance(index, tuple) else (index,)
    advanced = any(not isinstance(i, (int, np.integer, slice, type(None), type(Ellipsis))) for i in parts)
    _assign(t, flat, value if value._data.shape == target_shape else F.expand(value, target_shape), advanced)


def _restride(t, view_op, undo, *args):
    """t becomes view_op(t, *args), a new layout of the same storage (transpose_, squeeze_,
    unsqueeze_...): recorded as that view of its old value (PyTorch's TransposeBackward0...).
    The view records that describe arrays through t's layout are rewritten for the new one
    (undo: an array in the new layout -> the same array in the old one), and t's tangent
    takes the new layout too: it becomes the tangent of the view, the same view of the old
    tangent (so the tangents of t's views still share its storage, as in PyTorch)."""
    _stop("an in-place op in a compiled step")
    record = _needs_record(t)
    if record:
        new = view_op(t, *args)
    else:
        with _grad_mode.no_grad():
            new = view_op(t, *args)
    if new is t:  # a 0-d tensor
        return t
    t._data = new._data
    t._bump()
    view, made = _views.info(t), _views.info(new)
    if made is not None:  # (an inference tensor has no views)
        if view is not None:
            view.fn = made.fn  # the new view's function from the root is now t's
        else:
            for v in _views.live_views(t):
                v._x.view_of.fn = _views.Chain(undo, v._x.view_of.fn)
    if record:
        _rebase(t, new)
    _refresh_views(t if view is None else view.base, t, record)
    if _fw.live:
        tg = _forward.tangent(new)
        if tg is not None:
            _forward.set_tangent(t, tg)
    return t


def transpose_(t, dim0, dim1):
    return _restride(t, F.transpose, lambda a: a.swapaxes(dim0, dim1), dim0, dim1)


def t_(t):
    if t._data.ndim > 2:
        raise RuntimeError(f"t_() expects a tensor with <= 2 dimensions, but self is {t._data.ndim}D")
    return transpose_(t, 0, -1) if t._data.ndim == 2 else t


def squeeze_(t, dim=None):
    shape = t._data.shape
    return _restride(t, F.squeeze, lambda a: a.reshape(shape), dim)


def unsqueeze_(t, dim):
    shape = t._data.shape
    return _restride(t, F.unsqueeze, lambda a: a.reshape(shape), dim)


def _iop(fn):
    def op(self, other):
        return fn(self, other)
    return op


def install():
    Tensor.add_ = add_
    Tensor.sub_ = sub_
    Tensor.mul_ = mul_
    Tensor.div_ = div_
    Tensor.clamp_ = clamp_
    Tensor.copy_ = copy_
    Tensor.fill_ = fill_
    Tensor.zero_ = zero_
    Tensor.__setitem__ = setitem
    Tensor.transpose_ = Tensor.swapdims_ = Tensor.swapaxes_ = transpose_
    Tensor.t_ = t_
    Tensor.squeeze_ = squeeze_
    Tensor.unsqueeze_ = unsqueeze_
    Tensor.__iadd__ = _iop(add_)
    Tensor.__isub__ = _iop(sub_)
    Tensor.__imul__ = _iop(mul_)
    Tensor.__itruediv__ = _iop(div_)


# --- in-place forms of the unary ops (exp_, relu_, ...) and masked_fill_ ------------------
# Each is its out-of-place op written back into the tensor (the node is the op's own, as in
# PyTorch: y.exp_() gives ExpBackward0), through _apply: views, versions and rebasing as above.
_KEEP_INT = {"neg", "abs", "sign", "relu"}  # the others give floats, which an int tensor cannot hold


def _unary_inplace(name):
    def op(t):
        kind = t._data.dtype.kind
        if kind in "iub" and name not in _KEEP_INT:
            raise RuntimeError(f"result type Float can't be cast to the desired output type "
                               f"{scalar_name(t._data.dtype)}")
        return _apply(t, getattr(F, name))
    op.__name__ = op.__qualname__ = name + "_"
    return op


UNARY = {name + "_": _unary_inplace(name) for name in (
    "neg", "exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tanh", "erf", "sigmoid", "relu", "abs",
    "reciprocal", "sign", "asin", "acos", "atan")}


def pow_(t, exponent):
    return _apply(t, lambda a: F.pow(a, exponent), exponent)


def atan2_(t, other):
    return _apply(t, lambda a: F.atan2(a, other), other)


def masked_fill_(t, mask, value):
    if isinstance(mask, Tensor) and np.broadcast_shapes(mask._data.shape, t._data.shape) != t._data.shape:
        raise RuntimeError(f"output with shape {list(t._data.shape)} doesn't match the broadcast shape "
                           f"{list(np.broadcast_shapes(mask._data.shape, t._data.shape))}")
    return _apply(t, lambda a: F.masked_fill(a, mask, value), value)


def install_unary():
    for name, fn in UNARY.items():
        setattr(Tensor, name, fn)
    Tensor.pow_ = pow_
    Tensor.atan2_ = atan2_
    Tensor.__ipow__ = _iop(pow_)
    Tensor.masked_fill_ = masked_fill_
