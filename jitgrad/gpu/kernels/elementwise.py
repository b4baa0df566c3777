"""numpy's elementwise ufuncs on the device: the `__array_ufunc__` entries (gpu/array.py's
UFUNCS) of every ufunc in gpu/formulas.py's table (numpy's clip ufunc, which np.clip calls,
included), and KERNELS["ew"]: a formula run over device arrays, for code that computes a
spec's formula directly.

A call is numpy's: operands broadcast, numpy chooses the loop (`ufunc.resolve_dtypes`,
NEP 50 for Python scalars, its own errors for loops it has not), each operand is cast to
the loop's input dtype in the kernel and the result has the loop's output dtype, or is
cast into `out=` under numpy's same_kind rule. Scalars (Python numbers, numpy scalars,
0-d host arrays) are kernel arguments; a host array of one or more dimensions is on
another device: PyTorch's error. Ufunc methods other than a call (reduce, at, ...)
are gpu/array.py's UFUNC_METHODS, filled by the modules that implement them.
"""
import functools

import numpy as np
from scipy.special import erf as _scipy_erf

from jitgrad.gpu import formulas
from jitgrad.gpu.array import KERNELS, UFUNC_METHODS, UFUNCS, DeviceArray, _unsupported
from jitgrad.gpu.kernels import generate

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"

formulas.TABLE.setdefault(_scipy_erf, {})["*"] = (("self",), "erf(self)")   # gelu's forward calls scipy's


def _operand(x):
    """(x as the kernel reads it: a DeviceArray or a scalar, the dtype numpy resolves it
    with: a dtype, or Python's int / float for a weak scalar (NEP 50)); None: not ours."""
    if isinstance(x, DeviceArray):
        return x, x.dtype
    if isinstance(x, np.generic):   # before float: np.float64 is one
        return x, x.dtype
    if isinstance(x, bool):
        return x, np.dtype(bool)
    if isinstance(x, (int, float)):
        return x, type(x)
    if isinstance(x, (np.ndarray, list, tuple)):
        a = np.asarray(x)
        if a.ndim:
            raise RuntimeError(MIXED)
        return a[()], a.dtype
    return None


@functools.lru_cache(maxsize=4096)
def _loop(ufunc, dtypes):
    return ufunc.resolve_dtypes(dtypes + (None,) * ufunc.nout)


def _broadcast(shapes):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError("operands could not be broadcast together with shapes "
                         + " ".join(str(s).replace(" ", "") for s in shapes) + " ") from None


def _out(kwargs, name):
    out = kwargs.pop("out", None)
    if isinstance(out, tuple):
        if len(out) != 1:
            _unsupported(f"numpy.{name} with several outputs")
        out = out[0]
    if kwargs.pop("where", True) is not True or kwargs:
        _unsupported(f"numpy.{name} with {', '.join(sorted(kwargs) or ['where'])}=")
    if out is not None and not isinstance(out, DeviceArray):
        raise RuntimeError(MIXED) if isinstance(out, np.ndarray) else TypeError(
            f"return arrays must be of ArrayType, not {type(out).__name__}")
    return out


def _apply(name, names_formula, operands, in_dtypes, out_dtype, out):
    """out (or a new array) = the formula over operands, each cast to in_dtypes[j]:
    (out, the Plan run, per operand the type a scalar was converted to or None)."""
    arrays = [x for x in operands if isinstance(x, DeviceArray)]
    shapes = [a.shape for a in arrays] + ([out.shape] if out is not None else [])
    shape = _broadcast(shapes)
    if out is None:
        out = DeviceArray.empty(shape, out_dtype)
    elif shape != out.shape:
        raise ValueError(f"non-broadcastable output operand with shape {out.shape} doesn't match the broadcast "
                         f"shape {shape}")
    elif not np.can_cast(out_dtype, out.dtype, "same_kind"):
        raise TypeError(f"Cannot cast ufunc '{name}' output from {out_dtype!r} to {out.dtype!r} with casting rule "
                        "'same_kind'")
    ops, casts, scalars = [], [], []
    for x, dt in zip(operands, in_dtypes):
        if isinstance(x, DeviceArray):
            if x.buf is out.buf and (x.offset, x.broadcast_to(shape).estrides) != (out.offset, out.estrides):
                x = x.copy()   # overlaps the output another way: numpy reads a copy too
            ops.append(x.broadcast_to(shape) if x.shape != shape else x)
            casts.append(None if x.dtype == dt else dt.type)
            scalars.append(None)
        else:
            ops.append(dt.type(x))   # Python int out of the loop dtype's range: numpy's OverflowError
            casts.append(None)
            scalars.append(dt.type)
    names, formula = names_formula
    p = generate.plan(formula, names, out, ops, casts)
    generate.run(p, out, ops)
    return out, p, scalars


# A call's work before its launch (numpy's loop, broadcasting, the kernel and its geometry)
# depends on its operands' dtypes and layouts only: done once per ufunc and layouts
_PLANS = {}   # (ufunc, operand layouts) -> (result shape, result dtype, scalar types, generate.Plan)
_MAX_PLANS = 4096


def _layout(x):
    """What a call's plan depends on in operand x; None: not cached (host arrays of one or
    more dimensions, which raise, and other objects)."""
    t = type(x)
    if t is DeviceArray:
        return x.dtype, x.shape, x.estrides
    if t is float or t is int or t is bool:
        return t
    if isinstance(x, np.generic) or (t is np.ndarray and not x.ndim):   # relu's 0-d zero, a numpy scalar
        return x.dtype
    return None


def call(ufunc, inputs, kwargs):
    """ufunc(*inputs, **kwargs) on the device (method "__call__")."""
    key = None
    if not kwargs:
        key = (ufunc, *map(_layout, inputs))
        hit = _PLANS.get(key)
        if hit is not None:
            shape, dtype, scalars, p = hit
            out = DeviceArray.empty(shape, dtype)
            generate.run(p, out, [x if t is None else t(x) for x, t in zip(inputs, scalars)])
            return out
    name = ufunc.__name__
    out = _out(dict(kwargs), name)
    ops = [_operand(x) for x in inputs]
    if any(o is None for o in ops):
        return NotImplemented
    if ufunc.nout != 1:
        _unsupported(f"numpy.{name}")
    loop = _loop(ufunc, tuple(dt for _, dt in ops))
    entry = formulas.lookup(ufunc, loop[0].kind)
    if entry is None:
        _unsupported(f"numpy.{name} on {loop[0]}")
    res, p, scalars = _apply(name, entry, [x for x, _ in ops], loop[:ufunc.nin], loop[-1], out)
    if key is not None and None not in key:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = (res.shape, res.dtype, scalars, p)
    return res


def _entry(ufunc):
    def entry(method, inputs, kwargs):
        if method == "__call__":
            return call(ufunc, inputs, kwargs)
        fn = UFUNC_METHODS.get((ufunc, method))
        if fn is None:
            _unsupported(f"numpy.{ufunc.__name__}.{method}")
        return fn(inputs, kwargs)
    return entry


_CLIP = np._core.umath.clip   # what np.clip computes (gpu/kernels/functions.py calls it)


def _clip_entry(method, inputs, kwargs):
    """The clip ufunc, with numpy's clip function's None for a missing bound (numpy's own
    clip then calls minimum or maximum, as here)."""
    if method == "__call__" and len(inputs) == 3 and (inputs[1] is None or inputs[2] is None):
        a, lo, hi = inputs
        if lo is None and hi is None:
            raise ValueError("One of max or min must be given")
        return np.minimum(a, hi, **kwargs) if lo is None else np.maximum(a, lo, **kwargs)
    return _clip_bounded(method, inputs, kwargs)


_clip_bounded = _entry(_CLIP)


def ew(formula, names, operands, dtype=None, params=(), out=None):
    """out (or a new array of `dtype`) = a spec-language formula over operands (DeviceArrays
    broadcast together, or scalars) read as `names`, with float params p0, p1: numba's
    arithmetic on the operands' own dtypes, the result stored at the output's."""
    shape = out.shape if out is not None else _broadcast([x.shape for x in operands if isinstance(x, DeviceArray)])
    if out is None:
        out = DeviceArray.empty(shape, dtype)
    ops = [x.broadcast_to(shape) if isinstance(x, DeviceArray) and x.shape != shape else x for x in operands]
    generate.launch(formula, names, out, ops, [None] * len(ops), params)
    return out


for _ufunc in formulas.TABLE:
    UFUNCS[_ufunc] = _entry(_ufunc)
UFUNCS[_CLIP] = _clip_entry
KERNELS["ew"] = ew
