"""Differentiable ops: numpy forward, then `record` lowers the node onto the tape.

Every public op here is a primitive from derivatives.py or a composition of them; a
composition needs no gradient rule of its own.
"""
import builtins
import collections
import math
import operator

import numpy as np

from jitgrad._core import dtype as _dtype, modes as _grad_mode
from jitgrad.graph.tensor import Tensor, _Rare, _wrap_dim
from jitgrad.ops import derivatives as D
from jitgrad._core.messages import scalar_name, size_str as _size_str, torch_size as _torch_size  # noqa: F401
from jitgrad._core.modes import _packing, _saved_hooks
from jitgrad.graph.record import record, record_ew
from jitgrad.graph.tensor import _ARRAYLIKE, linked as _linked, wrap as _wrap  # noqa: F401  (rules use F._wrap)

_gm_state = _grad_mode._state
_new = object.__new__

_f64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)


def _needs(*ts):
    if not _gm_state.enabled:
        return False
    for t in ts:
        if t._requires_grad:
            return True
    return False


def _broadcast_error(sa, sb):
    n = builtins.max(len(sa), len(sb))  # this module defines its own max
    for i in range(1, n + 1):
        x = sa[-i] if i <= len(sa) else 1
        y = sb[-i] if i <= len(sb) else 1
        if x != y and x != 1 and y != 1:
            return RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b ({y}) "
                                f"at non-singleton dimension {n - i}")
    return RuntimeError(f"shapes {tuple(sa)} and {tuple(sb)} cannot be broadcast")


def _scalar_dtype(t, s):
    """The result dtype of tensor t with Python number s, as torch: a number only decides the
    category (float beside an int tensor gives the default dtype, int beside bool int64)."""
    d = t._data.dtype
    if isinstance(s, float) and d.kind != "f":
        return _dtype.get_default_dtype().np
    if d.kind == "b" and type(s) is int:
        return _I64
    return d


def _operand(x, like):
    """Tensor -> (tensor, array); Python number -> (None, 0-d array of the promoted dtype)."""
    if isinstance(x, Tensor):
        return x, x._data
    if isinstance(x, np.ndarray):
        return None, x
    return None, np.asarray(x, dtype=_scalar_dtype(like, x))


# --- elementwise ------------------------------------------------------------------
_NUMBER = (float, int, bool)
# A 0-d result stays the numpy scalar numpy returns (np.float64 ...): it has the array API the
# code reads (shape, dtype, size, item, reshape) and scalar arithmetic is ~7x cheaper than on
# 0-d arrays, which is most of the forward cost of scalar graphs. In-place writes convert it.


def _ew(spec, out, a, b=None, p0=0.0, p1=0.0, aux=None):
    """Wrap `out` and, if needed, record elementwise `spec` on Tensor a and b (a Tensor, a
    Python float standing for a constant, or None for a unary op)."""
    if not isinstance(out, _ARRAYLIKE):
        out = np.asarray(out)
    res = _new(Tensor)
    res._data = out
    res._requires_grad = False
    res._tape = None
    res._x = None
    if not _gm_state.enabled:
        return res
    if not a._requires_grad and (b is None or type(b) is float or not b._requires_grad):
        return res
    saved = []
    for name in spec.saves:
        if name == "self":
            saved.append(a._data)
        elif name == "other":
            saved.append(b if type(b) is float else b._data)
        elif name == "result":
            saved.append(out)
        else:
            saved.append(aux._data.astype(out.dtype))
    if _packing[0] and _saved_hooks.stack:  # saved_tensors_hooks: pack the tensors, save nothing
        packed = [a if n == "self" else b if n == "other" else res if n == "result" else aux
                  for n in spec.saves if not (n == "other" and type(b) is float)]
        if len(packed) == len(spec.saves):
            return record_ew(spec, res, a, b, (), (p0, p1)[:spec.nparams] if spec.nparams else (), packed)
    unneeded = ()
    if b is not None and out.size != 1:  # one-element values are copied, never version-checked
        wants = (a._requires_grad, type(b) is not float and b._requires_grad)
        if not (wants[0] and wants[1]):
            # one input needs no gradient: values only its formula reads are saved but unneeded
            unneeded = tuple(i for i, users in enumerate(spec.save_users) if not any(wants[j] for j in users))
    return record_ew(spec, res, a, b, saved, (p0, p1)[:spec.nparams] if spec.nparams else (), unneeded=unneeded)


class OperandTypeError(TypeError):
    """An operand that is neither a Tensor nor a number. Tensor's operators turn it into
    NotImplemented, so Python raises its own "unsupported operand type(s)" TypeError, as torch does."""


def _operand_error(fn, x, pos=2):
    name = "other" if pos == 2 else "input"
    return OperandTypeError(f"{fn}(): argument '{name}' (position {pos}) must be Tensor, not {type(x).__name__}")


def _binary(spec, npfn, a, b):
    """a (op) b where at least one is a Tensor. Callers with a Python number first are
    commutative (others have their own reflected ops: rsub, rpow, 2 / x)."""
    if not isinstance(a, Tensor):
        a, b = b, a
        if not isinstance(a, Tensor):
            raise _operand_error(spec.name, b, 1)
    ad = a._data
    if type(b) in _NUMBER:
        if ad.dtype.kind == "f":
            out = npfn(ad, b)  # NEP 50: a Python scalar takes the array's dtype, as in PyTorch
        else:
            out = np.asarray(npfn(ad, b)).astype(_scalar_dtype(a, b), copy=False)
        b = float(b)
    else:
        if not isinstance(b, Tensor):
            if not isinstance(b, _ARRAYLIKE):  # None, str...: numpy would make nan or raise its own error
                raise _operand_error(spec.name, b)
            b = _wrap(np.asarray(b, dtype=ad.dtype))
        bd = b._data
        if bd.dtype != ad.dtype:
            # compute at torch's result dtype, not numpy's (recording casts the saved copies)
            dt = _dtype.result_type(ad, bd)
            ad = ad if ad.dtype == dt else ad.astype(dt)
            bd = bd if bd.dtype == dt else bd.astype(dt)
        try:
            out = npfn(ad, bd)
        except ValueError:
            raise _broadcast_error(ad.shape, bd.shape) from None
    return _ew(spec, out, a, b)


def add(a, b, alpha=1):
    if alpha != 1:
        b = mul(b, alpha)
    return _binary(D.ADD, np.add, a, b)


_BOOL_SUB = ("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a "
             "mask, use the `~` or `logical_not()` operator instead.")


def _no_bool_sub(*operands):
    for x in operands:
        if isinstance(x, Tensor) and x._data.dtype.kind == "b":
            raise RuntimeError(_BOOL_SUB)


def sub(a, b, alpha=1):
    _no_bool_sub(a, b)
    if alpha != 1:
        b = mul(b, alpha)
    if not isinstance(a, Tensor):
        return rsub(b, a)
    return _binary(D.SUB, np.subtract, a, b)


def rsub(t, s):
    """s - t for a Python number s (PyTorch's RsubBackward1)."""
    if not isinstance(s, _NUMBER + _ARRAYLIKE):
        raise _operand_error("sub", s, 1)
    _no_bool_sub(t)
    out = np.asarray(np.subtract(s, t._data))
    out = out.astype(_scalar_dtype(t, s), copy=False)
    return _ew(D.RSUB, out, t, p0=float(s))


def mul(a, b):
    return _binary(D.MUL, np.multiply, a, b)


def div(a, b, rounding_mode=None):
    if rounding_mode is not None:
        with _grad_mode.no_grad():
            fn = np.floor_divide if rounding_mode == "floor" else lambda x, y: np.trunc(x / y)
            return _binary(D.DIV, fn, a, b)
    if not isinstance(a, Tensor):
        return mul(reciprocal(b), a)  # PyTorch: 2 / x is reciprocal then MulBackward0
    if a._data.dtype.kind != "f" and not (isinstance(b, Tensor) and b._data.dtype.kind == "f"):
        # true division of integers gives the default dtype; with a float operand, promotion does
        a, b = _as_float(a), _as_float(b)
    return _binary(D.DIV, np.true_divide, a, b)


def _as_float(t):
    if isinstance(t, Tensor) and t._data.dtype.kind != "f":
        return to_dtype(t, _dtype.get_default_dtype())
    return t


def reciprocal(x):
    x = _as_float(x)
    return _ew(D.RECIPROCAL, np.reciprocal(x._data), x)


def pow(a, b):  # noqa: A001
    for pos, x in ((1, a), (2, b)):
        if not isinstance(x, (Tensor,) + _NUMBER + _ARRAYLIKE):
            raise _operand_error("pow", x, pos)
    if not isinstance(a, Tensor):
        out = np.power(np.asarray(a, dtype=_scalar_dtype(b, a) if isinstance(a, float) else b._data.dtype), b._data)
        return _ew(D.RPOW, np.asarray(out, dtype=b._data.dtype), b, p0=float(a))
    if isinstance(b, Tensor):
        return _binary(D.POW_TT, np.power, a, b)
    ad = a._data
    if ad.dtype.kind != "f" and isinstance(b, float):
        a = _as_float(a)
        ad = a._data
    out = _pow_scalar(ad, b)
    if out.dtype != ad.dtype:
        out = out.astype(ad.dtype)
    return _ew(D.POW, out, a, p0=float(b))


def _pow_scalar(ad, e):
    """torch's pow(Tensor, Scalar) computes x ** 0.5 and x ** -0.5 as sqrt and rsqrt, which differ
    from C pow at -0 and -inf (rsqrt(-0) = -inf, sqrt(-inf) = NaN); PowBackward0 reads it too."""
    if e == 0.5:
        return np.sqrt(ad)
    if e == -0.5:
        with np.errstate(divide="ignore"):
            return np.reciprocal(np.sqrt(ad))
    return np.power(ad, e)


def _unary(spec, npfn):
    def op(x):
        if not isinstance(x, Tensor):
            if not isinstance(x, _NUMBER + _ARRAYLIKE):
                raise _operand_error(spec.name, x, 1)
            return npfn(x)  # a number, e.g. inside a gradient formula such as log(p0)
        if x._data.dtype.kind != "f" and spec is not D.NEG and spec is not D.ABS:
            x = _as_float(x)
        out = npfn(x._data)
        return _ew(spec, out, x)

    op.__name__ = spec.name
    return op


def _erf_array(x):
    from scipy.special import erf as _erf  # imported on first use: scipy.special is slow to import
    return np.asarray(_erf(x)).astype(x.dtype if x.dtype.kind == "f" else np.float32, copy=False)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


neg = _unary(D.NEG, np.negative)
exp = _unary(D.EXP, np.exp)
log = _unary(D.LOG, np.log)
sqrt = _unary(D.SQRT, np.sqrt)
sin = _unary(D.SIN, np.sin)
cos = _unary(D.COS, np.cos)
tanh = _unary(D.TANH, np.tanh)
sigmoid = _unary(D.SIGMOID, lambda x: _sigmoid(x).astype(x.dtype, copy=False))
relu = _unary(D.RELU, lambda x: np.maximum(x, 0).astype(x.dtype, copy=False))
abs = _unary(D.ABS, np.abs)  # noqa: A001
clone = _unary(D.CLONE, np.copy)
erf = _unary(D.ERF, _erf_array)


def sign(x):
    """torch's sign: 0 at NaN, where np.sign gives NaN (AbsBackward0 is grad * sign(self))."""
    d = x._data if isinstance(x, Tensor) else np.asarray(x)
    out = np.sign(d)
    if d.dtype.kind == "f":
        out = np.where(np.isnan(d), out.dtype.type(0), out)
    return _ew(D.SIGN, out, x) if isinstance(x, Tensor) else out


def zeros_like(x):
    """Zeros at x's shape and dtype, with no graph (torch's zeros_like in a gradient formula)."""
    return _wrap(np.zeros_like(x._data))


def clamp(x, min=None, max=None):  # noqa: A002
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    lo = -math.inf if min is None else float(min)
    hi = math.inf if max is None else float(max)
    out = np.clip(x._data, lo, hi).astype(x._data.dtype, copy=False)
    return _ew(D.CLAMP, np.asarray(out), x, p0=lo, p1=hi)


clip = clamp


def maximum(a, b):
    return _binary(D.MAXIMUM, np.maximum, a, b)


def minimum(a, b):
    return _binary(D.MINIMUM, np.minimum, a, b)


def where(cond, a, b):
    c = cond._data if isinstance(cond, Tensor) else np.asarray(cond)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return _wrap(np.where(c, a, b))
    like = a if isinstance(a, Tensor) else b
    ta, ad = _operand(a, like)
    tb, bd = _operand(b, like)
    try:
        out = np.asarray(np.where(c, ad, bd))
    except ValueError:
        raise _broadcast_error(ad.shape, bd.shape) from None
    dt = _dtype.result_type(ad, bd)  # a Python number was made a 0-d array of its torch dtype
    if out.dtype != dt:
        out = out.astype(dt)
    ta = ta if ta is not None else _wrap(np.asarray(ad, dtype=out.dtype))
    tb = tb if tb is not None else _wrap(np.asarray(bd, dtype=out.dtype))
    aux = _wrap(np.broadcast_to(c, out.shape))
    return _ew(D.WHERE, out, ta, tb, aux=aux)


# --- comparisons and logic (never differentiable) -------------------------------------
def _cmp(npfn):
    def op(a, b):
        ad = a._data if isinstance(a, Tensor) else a
        bd = b._data if isinstance(b, Tensor) else b
        try:
            return _wrap(np.asarray(npfn(ad, bd)))
        except ValueError:
            raise _broadcast_error(np.shape(ad), np.shape(bd)) from None
    return op


eq = _cmp(np.equal)
ne = _cmp(np.not_equal)
lt = _cmp(np.less)
le = _cmp(np.less_equal)
gt = _cmp(np.greater)
ge = _cmp(np.greater_equal)
logical_and = _cmp(np.logical_and)
logical_or = _cmp(np.logical_or)
bitwise_and = _cmp(np.bitwise_and)
bitwise_or = _cmp(np.bitwise_or)
bitwise_xor = _cmp(np.bitwise_xor)


def logical_not(x):
    return _wrap(np.logical_not(x._data))


def bitwise_not(x):
    return _wrap(np.invert(x._data))


def isnan(x):
    return _wrap(np.isnan(x._data))


def isfinite(x):
    return _wrap(np.isfinite(x._data))


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(np.allclose(a._data, b._data, rtol=rtol, atol=atol, equal_nan=equal_nan))


def equal(a, b):
    return a._data.shape == b._data.shape and bool((a._data == b._data).all())


def to_dtype(x, dtype):
    if x._data.dtype == dtype.np:
        return x
    res = _wrap(x._data.astype(dtype.np))
    if dtype.is_floating_point and _needs(x):
        return record(D.TO_COPY, res, (x,), (), (), [x._data.dtype.num])
    return res


# --- reductions -------------------------------------------------------------------------
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


def _reduce(spec_all, spec_dim, x, dim, keepdim, out, scale):
    dims = _dims(x, dim)
    res = _wrap(out)
    if not _needs(x):
        return res
    kd = _kd_shape(x._data.shape, dims)
    spec = spec_all if dim is None else spec_dim
    return record(spec, res, (x,), (), (scale,), kd)


def sum(x, dim=None, keepdim=False, dtype=None):  # noqa: A001
    if dtype is not None:
        x = to_dtype(x, dtype)
    dims = _dims(x, dim)
    d = x._data
    out = d.sum(axis=dims, keepdims=keepdim)
    if d.dtype.kind in "bi":
        out = out.astype(np.int64)
    return _reduce(D.SUM_ALL, D.SUM, x, dim, keepdim, out, 1.0)


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
    out = np.asarray(d.mean(axis=dims, keepdims=keepdim), dtype=d.dtype)
    return _reduce(D.MEAN_ALL, D.MEAN, x, dim, keepdim, out, 1.0 / count if count else math.nan)


def _extremum(spec, npfn, x, dim, keepdim):
    dims = _dims(x, dim)
    if x._data.size == 0:
        raise RuntimeError(f"{spec.name}(): Expected reduction dim to be specified for input.numel() == 0.")
    out = np.asarray(npfn(x._data, axis=dims, keepdims=keepdim))
    res = _wrap(out)
    if not _needs(x):
        return res
    kd = _kd_shape(x._data.shape, dims)
    return record(spec, res, (x,), (x._data, out), (), kd)


def amax(x, dim=(), keepdim=False):
    return _extremum(D.AMAX, np.max, x, None if dim == () else dim, keepdim)


def amin(x, dim=(), keepdim=False):
    return _extremum(D.AMIN, np.min, x, None if dim == () else dim, keepdim)


return_types_max = collections.namedtuple("max", ["values", "indices"])
return_types_min = collections.namedtuple("min", ["values", "indices"])


def _extremum_dim(spec, argfn, x, dim, keepdim, rtype):
    d = x._data
    dim = _wrap_dim(dim, d.ndim)
    if d.ndim == 0:
        return rtype(index_flat(x, np.zeros(1, np.int64), (), spec), _wrap(np.asarray(0)))
    shape = d.shape
    pre = int(np.prod(shape[:dim], dtype=np.int64))
    n = shape[dim]
    post = int(np.prod(shape[dim + 1:], dtype=np.int64))
    arg = argfn(d.reshape(pre, n, post), axis=1)
    flat = (np.arange(pre)[:, None] * n + arg) * post + np.arange(post)[None, :]
    out_shape = shape[:dim] + ((1,) if keepdim else ()) + shape[dim + 1:]
    values = index_flat(x, flat.reshape(-1).astype(np.int64), out_shape, spec)
    return rtype(values, _wrap(arg.reshape(out_shape).astype(np.int64)))


def max(x, dim=None, keepdim=False):  # noqa: A001
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        return _extremum(D.MAX_ALL, np.max, x, None, False)
    return _extremum_dim(D.MAX_DIM, np.argmax, x, dim, keepdim, return_types_max)


def min(x, dim=None, keepdim=False):  # noqa: A001
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        return _extremum(D.MIN_ALL, np.min, x, None, False)
    return _extremum_dim(D.MIN_DIM, np.argmin, x, dim, keepdim, return_types_min)


def argmax(x, dim=None, keepdim=False):
    if dim is None:
        return _wrap(np.asarray(np.argmax(x._data), dtype=np.int64))
    return max(x, dim, keepdim).indices


def argmin(x, dim=None, keepdim=False):
    if dim is None:
        return _wrap(np.asarray(np.argmin(x._data), dtype=np.int64))
    return min(x, dim, keepdim).indices


def prod(x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = to_dtype(x, dtype)
    dims = _dims(x, dim)
    out = np.asarray(x._data.prod(axis=dims, keepdims=keepdim))
    res = _wrap(out)
    if not _needs(x):
        return res
    kd = _kd_shape(x._data.shape, dims)
    spec = D.PROD_ALL if dim is None else D.PROD
    return record(spec, res, (x,), (x._data, out), (), kd)


def sum_to(t, shape):
    """Sum `t` down to `shape` (the reverse of broadcasting)."""
    shape = tuple(shape)
    if t._data.shape == shape:
        return t
    lead = t._data.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and t._data.shape[lead + i] != 1)
    return reshape(sum(t, dims, keepdim=True), shape) if dims else reshape(t, shape)


# --- linear algebra ----------------------------------------------------------------------
def matmul(a, b):
    for pos, x in ((1, a), (2, b)):
        if not isinstance(x, Tensor):
            raise _operand_error("matmul", x, pos)
    ad, bd = a._data, b._data
    if ad.ndim == 0 or bd.ndim == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {ad.ndim}D and {bd.ndim}D")
    if ad.ndim == 1 and bd.ndim == 1:
        if ad.shape[0] != bd.shape[0]:
            raise RuntimeError(f"inconsistent tensor size, expected tensor [{ad.shape[0]}] and src [{bd.shape[0]}] to "
                               f"have the same number of elements, but got {ad.shape[0]} and {bd.shape[0]} elements respectively")
        spec = D.DOT
    elif ad.ndim == 2 and bd.ndim == 2:
        if ad.shape[1] != bd.shape[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({ad.shape[0]}x{ad.shape[1]} and "
                               f"{bd.shape[0]}x{bd.shape[1]})")
        spec = D.MATMUL
    elif ad.ndim <= 2 and bd.ndim <= 2:
        k_a = ad.shape[-1]
        k_b = bd.shape[0]
        if k_a != k_b:
            raise RuntimeError(f"size mismatch, got input ({ad.shape[0]}), mat ({ad.shape[0]}x{k_a}), vec ({k_b})"
                               if bd.ndim == 1 else
                               f"size mismatch, got input ({bd.shape[1]}), mat ({bd.shape[0]}x{bd.shape[1]}), vec ({k_a})")
        spec = D.MV if bd.ndim == 1 else D.MATMUL
    else:
        spec = D.BMM
        ka = ad.shape[-1]
        kb = bd.shape[-2] if bd.ndim > 1 else bd.shape[0]
        if ka != kb:
            raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                               f"[{int(np.prod(ad.shape[:-2]))}, {ka}] but got: [{int(np.prod(bd.shape[:-2]))}, {kb}].")
    if ad.dtype != bd.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {a.dtype.name} != {b.dtype.name}"
                           .replace("float64", "double").replace("float32", "float"))
    try:
        out = np.asarray(np.matmul(ad, bd))
    except ValueError as e:
        raise RuntimeError(str(e)) from None
    res = _wrap(out)
    if not _needs(a, b):
        return res
    return record(spec, res, (a, b), (ad, bd))


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2), input broadcast to the product's shape."""
    for name, t in (("mat1", mat1), ("mat2", mat2)):
        if t._data.ndim != 2:
            raise RuntimeError(f"{name} must be a matrix, got {t._data.ndim}-D tensor")
    n, m = mat1._data.shape[0], mat2._data.shape[1]
    try:
        np.broadcast_shapes(input._data.shape, (n, m))
    except ValueError:
        raise RuntimeError(f"The expanded size of the tensor ({m}) must match the existing size "
                           f"({input._data.shape[-1]}) at non-singleton dimension 1.  Target sizes: [{n}, {m}].  "
                           f"Tensor sizes: [{', '.join(str(d) for d in input._data.shape)}]") from None
    return _mm_into(D.ADDMM, input, mat1, mat2, float(beta), float(alpha))


def _mm_into(spec, input, a, b, beta=1.0, alpha=1.0):
    """The addmm primitive (and linear's bias-free mm when input is None). A transposed
    operand, such as linear's W.t(), is saved as its contiguous base, flagged, instead of
    being copied into a contiguous transpose."""
    ad, bd = a._data, b._data
    if ad.shape[1] != bd.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({ad.shape[0]}x{ad.shape[1]} and "
                           f"{bd.shape[0]}x{bd.shape[1]})")
    if input is None and ad.dtype != bd.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {ad.dtype.name} != {bd.dtype.name}"
                           .replace("float64", "double").replace("float32", "float"))
    if input is not None:  # torch checks the input against mat2 first, then mat1
        for name, x in (("self", input._data), ("mat1", ad)):
            if x.dtype != bd.dtype:
                got = " and ".join(scalar_name(d) for d in (x.dtype, bd.dtype))
                raise RuntimeError(f"{name} and mat2 must have the same dtype, but got {got}")
    prod = ad @ bd
    if alpha != 1.0:
        prod *= alpha
    if input is not None and beta != 0.0:
        prod += input._data * beta if beta != 1.0 else input._data
    res = _wrap(prod)
    inputs = (a, b) if input is None else (input, a, b)
    if not _needs(*inputs):
        return res
    packing = _packing[0] and _saved_hooks.stack  # packed values keep the operands as they are
    ta = int(not packing and not ad.flags.c_contiguous and ad.T.flags.c_contiguous)
    tb = int(not packing and not bd.flags.c_contiguous and bd.T.flags.c_contiguous)
    return record(spec, res, inputs, (ad.T if ta else ad, bd.T if tb else bd), (beta, alpha),
                  [ad.shape[0], ad.shape[1], bd.shape[1], ta, tb])


def linear(input, weight, bias=None):
    """input @ weight.t() + bias as torch records it: AddmmBackward0 (MmBackward0 without a
    bias) over TBackward0 of the weight; other than 2-D input with a bias is viewed as 2-D
    around the addmm; without a bias it is a matmul."""
    wt = t(weight)
    x = input._data
    spec = D.LINEAR_MM if bias is None else D.ADDMM
    if x.ndim == 2:
        return _mm_into(spec, bias, input, wt)
    if x.ndim == 0 or x.shape[-1] != wt._data.shape[0] or (bias is None and x.ndim == 1):
        out = matmul(input, wt)  # and matmul raises torch's error for bad shapes
        return out if bias is None else out + bias
    out = _mm_into(spec, bias, reshape(input, (-1, x.shape[-1])), wt)
    shape = x.shape[:-1] + (wt._data.shape[1],)
    return reshape(out, shape) if bias is not None else _view_like(D.RESHAPE_ALIAS, out, out._data.reshape(shape))


def mm(a, b):
    if a._data.ndim != 2:
        raise RuntimeError("self must be a matrix")
    if b._data.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    return matmul(a, b)


def dot(a, b):
    if a._data.ndim != 1 or b._data.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {a._data.ndim}D and {b._data.ndim}D tensors")
    return matmul(a, b)


def mv(a, b):
    return matmul(a, b)


def bmm(a, b):
    return matmul(a, b)


def trace(x):
    d = x._data
    if d.ndim != 2:
        raise RuntimeError("trace: expected a matrix, but got tensor with dim " + str(d.ndim))
    res = _wrap(np.asarray(np.trace(d), dtype=d.dtype if d.dtype.kind == "f" else np.int64))
    if not _needs(x):
        return res
    return record(D.TRACE, res, (x,))


# --- shape ----------------------------------------------------------------------------------
def _shape_arg(shape, fn="view", arg="shape"):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        if any(isinstance(s, (bool, np.bool_)) for s in shape):
            raise TypeError
        return tuple(operator.index(s) for s in shape)  # ints, numpy ints, one-element int tensors
    except TypeError:
        bad = next(s for s in shape if isinstance(s, (bool, np.bool_)) or not hasattr(s, "__index__"))
        raise TypeError(f"{fn}(): argument '{arg}' (position 1) must be tuple of ints, not {type(bad).__name__}") \
            from None


def _infer_shape(shape, numel):
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


def _mark_view(res, x, fn):
    """res shares x's storage (fn(x's array) gives res's): an in-place op on res must then
    update x's history too (ops/inplace.py)."""
    if isinstance(res._data, np.ndarray) and res._data.base is not None:
        if res._x is None:
            res._x = _Rare()
        res._x.view_of = (x, fn)
    return res


def _view_like(spec, x, out, fn=None):
    res = _wrap(out)
    if not _needs(x):
        return res
    res = record(spec, res, (x,))
    if fn is None:
        shape = out.shape
        fn = lambda a: a.reshape(shape)  # noqa: E731
    return _mark_view(res, x, fn)


def reshape(x, *shape):
    shape = _infer_shape(_shape_arg(shape, "reshape"), x._data.size)
    return _view_like(D.VIEW, x, x._data.reshape(shape))


view = reshape


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
        return _view_like(D.SQUEEZE, x, d.reshape(tuple(s for s in d.shape if s != 1)))
    dims = _dims(x, dim) if d.ndim else ()
    shape = tuple(s for i, s in enumerate(d.shape) if not (i in dims and s == 1))
    return _view_like(D.SQUEEZE_DIM, x, d.reshape(shape))


def unsqueeze(x, dim):
    d = x._data
    dim = _wrap_dim(dim, d.ndim + 1)
    return _view_like(D.UNSQUEEZE, x, np.expand_dims(d, dim))


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
    res = _wrap(np.broadcast_to(d, shape))
    if not _needs(x):
        return res
    return record(D.EXPAND, res, (x,))


def expand_as(x, other):
    return expand(x, other._data.shape)


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
    if not _needs(x):
        return res
    return _mark_view(record(spec or D.PERMUTE, res, (x,), (), (), perm), x, lambda a: a.transpose(perm))


def transpose(x, dim0, dim1):
    nd = x._data.ndim
    if nd == 0:
        return x
    perm = list(range(nd))
    a, b = _wrap_dim(dim0, nd), _wrap_dim(dim1, nd)
    perm[a], perm[b] = perm[b], perm[a]
    return permute(x, perm, spec=D.TRANSPOSE)


def t(x):
    nd = x._data.ndim
    if nd > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {nd}D")
    return permute(x, tuple(range(nd))[::-1], spec=D.T)


def _T(x):
    return permute(x, tuple(range(x._data.ndim))[::-1])


# --- indexing ----------------------------------------------------------------------------------
def index_flat(x, idx, out_shape, spec, data=None):
    """out = x.flatten()[idx].reshape(out_shape): the primitive behind indexing and max(dim).
    `data`: the same values as a numpy view of x, when indexing is basic."""
    src = x._data
    out = src.reshape(-1)[idx].reshape(out_shape) if data is None else data
    res = _wrap(out)
    if not _needs(x):
        return res
    return record(spec, res, (x,), (idx,))


def index_put_flat(g, idx, in_shape):
    """zeros(in_shape) with g accumulated at flat indices idx: the adjoint of index_flat."""
    out = np.zeros(int(np.prod(in_shape, dtype=np.int64)), dtype=g._data.dtype)
    np.add.at(out, idx, g._data.reshape(-1))
    res = _wrap(out.reshape(in_shape))
    if not _needs(g):
        return res
    return record(D.INDEX_PUT, res, (g,), (idx,))


def _norm_index(index):
    if not isinstance(index, tuple):
        index = (index,)
    out = []
    for i in index:
        if isinstance(i, Tensor):
            i = i._data
        elif isinstance(i, list):
            i = np.asarray(i)
        out.append(i)
    return tuple(out)


def getitem(x, index):
    idx = _norm_index(index)
    d = x._data
    if type(d) is not np.ndarray:
        d = np.asarray(d)
    try:
        # a trailing Ellipsis makes integer indexing return a 0-d view, not a scalar copy
        out = d[idx] if any(i is Ellipsis for i in idx) else d[idx + (Ellipsis,)]
    except IndexError as e:
        raise IndexError(str(e)) from None
    out = np.asarray(out)
    advanced = any(isinstance(i, np.ndarray) and i.ndim >= 0 and i.dtype.kind in "iub" for i in idx)
    if not _needs(x):
        res = _wrap(out)
        if not advanced:
                return res
    if all(i is None for i in idx):
        return _view_like(D.UNSQUEEZE, x, out)
    if advanced:
        spec = D.INDEX
    elif any(isinstance(i, (int, np.integer)) for i in idx):
        spec = D.SELECT
    else:
        spec = D.SLICE
    flat = np.asarray(np.arange(d.size, dtype=np.int64).reshape(d.shape)[idx]).reshape(-1)
    if advanced:
        return index_flat(x, flat, out.shape, spec)
    # basic indexing gives a view of x's storage, as in PyTorch
    res = index_flat(x, flat, out.shape, spec, data=out)
    return _mark_view(res, x, lambda a: a[idx] if any(i is Ellipsis for i in idx) else a[idx + (Ellipsis,)])


# --- joining ---------------------------------------------------------------------------------
def cat(tensors, dim=0):
    tensors = list(tensors)
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
    return _join(D.CAT, tensors, dim, np.concatenate([t._data for t in tensors], axis=dim), False)


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    ref = tensors[0]._data.shape
    for k, t in enumerate(tensors):
        if t._data.shape != ref:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(ref)} at entry 0 and "
                               f"{list(t._data.shape)} at entry {k}")
    dim = _wrap_dim(dim, len(ref) + 1)
    return _join(D.STACK, tensors, dim, np.stack([t._data for t in tensors], axis=dim), True)


def _join(spec, tensors, dim, out, stacked):
    dt = np.result_type(*[t._data.dtype for t in tensors])
    res = _wrap(out.astype(dt, copy=False))
    if not _needs(*tensors):
        return res
    shape = out.shape
    outer = int(np.prod(shape[:dim], dtype=np.int64))
    inner = int(np.prod(shape[dim + 1:], dtype=np.int64))
    sizes = [1 if stacked else t._data.shape[dim] for t in tensors]
    return record(spec, res, tuple(tensors), (), (), [outer, shape[dim], inner, dim] + sizes)


# --- normalisation ----------------------------------------------------------------------------
def _softmax_np(d, dim):
    e = np.exp(d - d.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _groups(shape, dim):
    return [int(np.prod(shape[:dim], dtype=np.int64)), shape[dim], int(np.prod(shape[dim + 1:], dtype=np.int64))]


def _normalise(spec, x, dim, dtype, forward):
    """softmax / log_softmax along `dim`: forward(d, dim) computes the values."""
    if dtype is not None:
        x = to_dtype(x, dtype)
    x = _as_float(x)
    d = x._data
    dim = _wrap_dim(dim, d.ndim)
    out = forward(d, dim) if d.ndim else forward(d.reshape(1), 0).reshape(())
    res = _wrap(out)
    if not _needs(x):
        return res
    return record(spec, res, (x,), (out,), (), _groups(d.shape or (1,), dim) + [dim])


def _log_softmax_np(d, dim):
    s = d - d.max(axis=dim, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=dim, keepdims=True))


def softmax(x, dim, dtype=None):
    return _normalise(D.SOFTMAX, x, dim, dtype, _softmax_np)


def log_softmax(x, dim, dtype=None):
    return _normalise(D.LOG_SOFTMAX, x, dim, dtype, _log_softmax_np)
