"""Reductions: sum, mean, amax / amin, max / min (all, and along a dim), prod, and
sum_to (the reverse of broadcasting, a composition). Each entry sits below its forward."""
import collections
import math

import numpy as np

from jitgrad._core import modes as _grad_mode
from jitgrad.graph.record import record
from jitgrad.graph.spec import alias, structural
from jitgrad.graph.tensor import Tensor, _wrap_dim
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.kernels.reduce import (
    f_amax,
    f_amin,
    f_max_dim,
    f_min_dim,
    f_prod,
    f_sum,
    k_amax_dims,
    k_max_all,
    k_prod_all,
    k_prod_dims,
    k_sum,
)
from jitgrad.ops._common import _cap, _needs, asarray, like, traced
from jitgrad.ops.elementwise import eq, maximum, minimum, to_dtype, where
from jitgrad.ops.shape import INDEX, _dims, _kd_shape, expand, reshape


def traced_as(spec, res, inputs, saved, fparams, iparams, again):
    """Report an op not recorded for grad to jitgrad.compile (ops/_common.traced): a float
    result replays with spec's forward kernel; an integer or bool one, which the plan's
    compiled kernels (one float dtype) do not compute, replays as again(*input arrays)."""
    if res._data.dtype.kind == "f":
        traced(spec, res, inputs, saved, fparams, iparams)
    else:
        _cap.rec.python(lambda *arrays: (again(*arrays),), inputs, (res,), spec.name)
    return res


def _reduce(spec_all, spec_dim, x, dim, keepdim, out, scale):
    dims = _dims(x, dim)
    res = _wrap(out)
    spec = spec_all if dim is None else spec_dim
    if not _needs(x):
        if _cap.on and _cap.mine():  # jitgrad.compile traces the op without grad too
            traced_as(spec, res, (x,), (), (scale,), spec.pack_ints(rest=_kd_shape(x._data.shape, dims)),
                      lambda d: np.asarray(d.sum(axis=dims, keepdims=keepdim), out.dtype))
        return res
    kd = _kd_shape(x._data.shape, dims)
    return record(spec, res, (x,), (), (scale,), spec.pack_ints(rest=kd))


def sum(x, dim=None, keepdim=False, dtype=None):  # noqa: A001
    if dtype is not None:
        x = to_dtype(x, dtype)
    dims = _dims(x, dim)
    d = x._data
    out = d.sum(axis=dims, keepdims=keepdim)
    if d.dtype.kind in "bi":  # torch sums ints and bools in int64, unless dtype= says otherwise
        out = out.astype(np.int64 if dtype is None else d.dtype)
    return _reduce(SUM_ALL, SUM, x, dim, keepdim, out, 1.0)




def sum_rule(grad, ri):
    (scale,) = ri.floats(1)
    # a full reduction's 0-d gradient expands as it is (one ExpandBackward0, as torch's)
    g = expand(grad if grad.ndim == 0 else reshape(grad, ri.iparams().keepdim_shape), ri.in_shape(0))
    return (g * scale if scale != 1.0 else g,)


# iparams: the input's shape with the reduced dims kept as 1 (the kernel's broadcast plan
# reads it as a shape); fparams: the scale (1 for sum, 1/count for mean)
def sum_jvp(ci, tangents):
    """The same sum of the tangent (mean: the same scale)."""
    (scale,) = ci.floats(1)
    kd = ci.iparams().keepdim_shape
    tg = sum(tangents[0], _dims_of(ci.in_shape(0), kd), keepdim=True)
    return reshape(tg * scale if scale != 1.0 else tg, ci.out_shape())


SUM = structural("sum", "SumBackward1", rule=sum_rule, kernel=k_sum, fwd_kernel=f_sum, iparams=("*keepdim_shape",),
                 fparams=("_scale",), forward=sum, jvp=sum_jvp)
SUM_ALL = alias("sum_all", SUM, "SumBackward0")


def mean(x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = to_dtype(x, dtype)
    if x._data.dtype.kind != "f":
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {x.dtype.name.capitalize()}")
    dims = _dims(x, dim)
    d = x._data
    count = 1
    for i in dims:
        count *= d.shape[i]
    if count:
        # numpy's mean without its Python wrapper (~3x the cost of the sum on small inputs):
        # the same sum, divided at float64 and rounded back, as np.mean does
        total = np.add.reduce(d, axis=dims, keepdims=keepdim)
        out = asarray(total / count if d.dtype.type is np.float64 else total / np.float64(count), dtype=d.dtype)
    else:
        out = asarray(d.mean(axis=dims, keepdims=keepdim), dtype=d.dtype)  # NaN, with numpy's warning
    return _reduce(MEAN_ALL, MEAN, x, dim, keepdim, out, 1.0 / count if count else math.nan)




MEAN = alias("mean", SUM, "MeanBackward1", forward=mean)         # the kernel scales by fp[0]
MEAN_ALL = alias("mean_all", SUM, "MeanBackward0", forward=mean)


def _extremum(spec, npfn, x, dim, keepdim):
    dims = _dims(x, dim)
    if x._data.size == 0:
        _check_nonempty(spec.name.replace("_all", ""), x._data.shape, None if dim is None else dims)
    out = asarray(npfn(x._data, axis=dims, keepdims=keepdim))
    res = _wrap(out)
    if not _needs(x):
        if _cap.on and _cap.mine():
            traced_as(spec, res, (x,), (x._data, out), (), spec.pack_ints(rest=_kd_shape(x._data.shape, dims)),
                      lambda d: np.asarray(npfn(d, axis=dims, keepdims=keepdim)))
        return res
    kd = _kd_shape(x._data.shape, dims)
    return record(spec, res, (x,), (x._data, out), (), spec.pack_ints(rest=kd))


def _check_nonempty(name, shape, dims):
    """torch's errors for a max/min-like reduction of an empty tensor: over every dim, or
    along a dim of size 0 (along another dim the result is just empty)."""
    if dims is None:
        if name.startswith("arg"):
            raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
                           "reduction dim with the 'dim' argument.")
    for d in dims:
        if shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def amax(x, dim=(), keepdim=False):
    return _extremum(AMAX, np.max, x, None if dim == () else dim, keepdim)


def amin(x, dim=(), keepdim=False):
    return _extremum(AMIN, np.min, x, None if dim == () else dim, keepdim)




def _dims_of(in_shape, kd):
    return tuple(i for i, (a, b) in enumerate(zip(in_shape, kd)) if b == 1)


def extremum_rule(grad, ri):
    kd = ri.iparams().keepdim_shape
    self = ri.saved_input(0, 0)
    r = _wrap(ri.saved(1, ri.out_shape())).reshape(kd)
    mask = to_dtype(eq(self, r), self.dtype)
    count = sum(mask, _dims_of(ri.in_shape(0), kd), keepdim=True)
    return (reshape(grad, kd) * mask / count,)


def evenly_rule(grad, ri):
    """max()/min(): torch's evenly_distribute_backward, grad / count where self equals the
    result (where self is NaN when the result is NaN), exactly 0 elsewhere."""
    self = ri.saved_input(0, 0)
    x = asarray(self._data)
    r = asarray(ri.saved(1, ri.out_shape()))
    mask = np.isnan(x) if np.isnan(r).all() else x == r
    g = reshape(grad, ()) / float(mask.sum())
    return (where(_wrap(mask), g, 0.0),)


def extremum_jvp(ci, tangents):
    """torch's amaxamin_jvp / evenly_read_jvp: the mean of the tangent over the elements
    equal to the result (a NaN result matches none: NaN, as in torch)."""
    kd = ci.iparams().keepdim_shape
    dims = _dims_of(ci.in_shape(0), kd)
    mask = eq(ci.input(0).detach(), reshape(ci.result.detach(), kd))
    picked = sum(where(mask, tangents[0], 0.0), dims, keepdim=True)
    return reshape(picked / sum(mask, dims, keepdim=True), ci.out_shape())


AMAX = structural("amax", "AmaxBackward0", saves=("self", "result"), rule=extremum_rule, kernel=k_amax_dims,
                  fwd_kernel=f_amax, iparams=("*keepdim_shape",), forward=amax, jvp=extremum_jvp)
AMIN = alias("amin", AMAX, "AminBackward0", forward=amin, fwd_kernel=f_amin)
MAX_ALL = structural("max_all", "MaxBackward1", saves=("self", "result"), rule=evenly_rule, kernel=k_max_all,
                     fwd_kernel=f_amax, iparams=("*keepdim_shape",), forward=_extremum,
                     jvp=extremum_jvp)  # torch's own rule
MIN_ALL = alias("min_all", MAX_ALL, "MinBackward1", fwd_kernel=f_amin)

return_types_max = collections.namedtuple("max", ["values", "indices"])
return_types_min = collections.namedtuple("min", ["values", "indices"])


def _extremum_dim(spec, argfn, x, dim, keepdim, rtype, name):
    """Values and indices along `dim`: a gather of the input at the flat index of each
    extreme element (indexing's primitive), the indices an extra output of the op."""
    d = x._data
    dim = _wrap_dim(dim, d.ndim)
    shape = d.shape if d.ndim else (1,)
    if shape[dim] == 0:
        _check_nonempty(name, shape, (dim,))
    ints = spec.pack_ints(pre=math.prod(shape[:dim]), n=shape[dim], post=math.prod(shape[dim + 1:]))
    out_shape = d.shape[:dim] + ((1,) if keepdim and d.ndim else ()) + d.shape[dim + 1:]
    values, indices, flat = _extreme_along(argfn, d, ints, out_shape)
    values, indices = _wrap(values), _wrap(indices)
    if not (_cap.on and _cap.mine()):
        return rtype(_record_dim(spec, values, x, flat, ints), indices)
    # jitgrad.compile: report the op with its extra output (record() knows of none)
    _cap.on = False
    try:
        values = _record_dim(spec, values, x, flat, ints)
    finally:
        _cap.on = True
    if d.dtype.kind == "f":
        _cap.rec.struct(spec, values, (x,), (flat,), (), ints, extra=(indices,))
    else:
        _cap.rec.python(lambda a: _extreme_along(argfn, a, ints, out_shape)[:2], (x,), (values, indices), spec.name)
    return rtype(values, indices)


def _extreme_along(argfn, d, ints, out_shape):
    """(values, indices, flat index into d) of the extremes along the middle dim of d
    seen as (pre, n, post)."""
    pre, n, post = ints
    arg = argfn(d.reshape(pre, n, post), axis=1)
    dev = like(d)
    flat = ((np.arange(pre, like=dev)[:, None] * n + arg) * post + np.arange(post, like=dev)[None, :])
    flat = flat.reshape(-1).astype(np.int64)
    return d.reshape(-1)[flat].reshape(out_shape), arg.reshape(out_shape).astype(np.int64), flat


def _record_dim(spec, values, x, flat, ints):
    return record(spec, values, (x,), (flat,), (), ints) if _needs(x) else values


def max(x, dim=None, keepdim=False):  # noqa: A001
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        return _extremum(MAX_ALL, np.max, x, None, False)
    return _extremum_dim(MAX_DIM, np.argmax, x, dim, keepdim, return_types_max, "max")


def min(x, dim=None, keepdim=False):  # noqa: A001
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        return _extremum(MIN_ALL, np.min, x, None, False)
    return _extremum_dim(MIN_DIM, np.argmin, x, dim, keepdim, return_types_min, "min")


def argmax(x, dim=None, keepdim=False):
    if x._data.dtype.kind == "b":
        raise RuntimeError("argmax(): does not support bool input")
    if dim is None:
        return _arg_all(np.argmax, x)
    return _extremum_dim(MAX_DIM, np.argmax, x, dim, keepdim, return_types_max, "argmax").indices


def argmin(x, dim=None, keepdim=False):
    if x._data.dtype.kind == "b":
        raise RuntimeError("argmin(): does not support bool input")
    if dim is None:
        return _arg_all(np.argmin, x)
    return _extremum_dim(MIN_DIM, np.argmin, x, dim, keepdim, return_types_min, "argmin").indices


def _arg_all(argfn, x):
    if x._data.size == 0:
        _check_nonempty(argfn.__name__, x._data.shape, None)
    res = _wrap(asarray(argfn(x._data), dtype=np.int64))
    if _cap.on and _cap.mine():  # not differentiable, and an int64 result: jitgrad.compile replays it in Python
        _cap.rec.python(lambda d: (np.asarray(argfn(d), dtype=np.int64),), (x,), (res,), argfn.__name__)
    return res


def prod(x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = to_dtype(x, dtype)
    dims = _dims(x, dim)
    out = asarray(np.prod(x._data, axis=dims, keepdims=keepdim))
    res = _wrap(out)
    spec = PROD_ALL if dim is None else PROD
    if not _needs(x):
        if _cap.on and _cap.mine():
            traced_as(spec, res, (x,), (x._data, out), (), spec.pack_ints(rest=_kd_shape(x._data.shape, dims)),
                      lambda d: np.asarray(d.prod(axis=dims, keepdims=keepdim)))
        return res
    kd = _kd_shape(x._data.shape, dims)
    return record(spec, res, (x,), (x._data, out), (), spec.pack_ints(rest=kd))



# max / min along a dim: a gather of the extreme elements (indexing's primitive, whose
# backward reads no int params); iparams: the sizes before the dim, of it, after it
MAX_DIM = alias("max_dim", INDEX, "MaxBackward0", forward=max, iparams=("pre", "n", "post"), fwd_kernel=f_max_dim)
MIN_DIM = alias("min_dim", INDEX, "MinBackward0", forward=min, iparams=("pre", "n", "post"), fwd_kernel=f_min_dim)


def prod_all_rule(grad, ri):
    """torch's prod_backward without a dim: with more than one zero and grad mode off, zeros."""
    zeros = int((asarray(ri.saved_input(0, 0)._data) == 0).sum())
    if zeros > 1 and not _grad_mode.is_grad_enabled():
        return (_wrap(np.zeros(ri.in_shape(0), grad._data.dtype, like=like(grad._data))),)
    return prod_rule(grad, ri)


def prod_rule(grad, ri):
    kd = ri.iparams().keepdim_shape
    self = ri.saved_input(0, 0)
    g = reshape(grad, kd)
    x = asarray(self._data)
    if not (x == 0).any():
        return (g * (reshape(ri.result(1), kd) / self),)
    # With zeros, result/self is undefined: use the product of the other elements,
    # computed without a graph (its second derivative is not tracked here).
    return (g * _wrap(_prod_others(x, _dims_of(x.shape, kd))),)


def _prod_others(x, dims):
    moved = np.moveaxis(x, dims, tuple(range(len(dims))))
    lead = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
    flat = moved.reshape(lead, -1)
    res = np.empty_like(flat)
    for i in range(lead):  # the rows before i, then those after: slices, on any device
        res[i] = np.prod(flat[:i], axis=0) * np.prod(flat[i + 1:], axis=0)
    return np.moveaxis(res.reshape(moved.shape), tuple(range(len(dims))), dims)


def prod_jvp(ci, tangents):
    """sum over the reduced dims of tangent * (the product of the other elements)."""
    kd = ci.iparams().keepdim_shape
    self = ci.input(0)
    dims = _dims_of(ci.in_shape(0), kd)
    x = asarray(self._data)
    if not (x == 0).any():
        others = reshape(ci.result, kd) / self
    else:  # as in prod_rule: without a graph (its second derivative is not tracked)
        others = _wrap(_prod_others(x, dims))
    return reshape(sum(tangents[0] * others, dims, keepdim=True), ci.out_shape())


PROD = structural("prod", "ProdBackward1", saves=("self", "result"), rule=prod_rule, kernel=k_prod_dims,
                  fwd_kernel=f_prod, iparams=("*keepdim_shape",), forward=prod, jvp=prod_jvp)
PROD_ALL = structural("prod_all", "ProdBackward0", saves=("self", "result"), rule=prod_all_rule,
                      kernel=k_prod_all, fwd_kernel=f_prod, iparams=("*keepdim_shape",), forward=prod, jvp=prod_jvp)


def sum_to(t, shape):
    """Sum `t` down to `shape` (the reverse of broadcasting)."""
    shape = tuple(shape)
    if t._data.shape == shape:
        return t
    lead = t._data.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and t._data.shape[lead + i] != 1)
    if not dims:
        return reshape(t, shape)
    if not shape:
        return sum(t)  # to a 0-d value: one full sum (SumBackward0), as torch
    s = sum(t, dims, keepdim=True)
    return s if s._data.shape == shape else reshape(s, shape)  # a view only when dims lead (as torch's sum_to)




# --- all / any: logical reductions, never differentiable (a bool result) ---------------------
def _logical(npfn, name):
    def op(x, dim=None, keepdim=False):
        axes = None if dim is None else _dims(x, dim)
        res = _wrap(asarray(npfn(x._data, axis=axes, keepdims=keepdim and dim is not None)))
        if _cap.on and _cap.mine():  # a bool result: jitgrad.compile replays it in Python
            _cap.rec.python(lambda d: (np.asarray(npfn(d, axis=axes, keepdims=keepdim and dim is not None)),),
                            (x,), (res,), name)
        return res
    op.__name__ = op.__qualname__ = name
    return op


all = _logical(np.all, "all")  # noqa: A001
any = _logical(np.any, "any")  # noqa: A001
