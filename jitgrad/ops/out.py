"""The `out=` keyword of the public functions (torch.add(a, b, out=c)): the op runs as
usual, then its result is written into `out`, which is returned. One wrapper for every
function of the op table (ops/__init__.py), so each op keeps a single signature.

As in PyTorch: no autograd through it (an argument requiring grad, with grad mode on, is
an error), the result must be castable to out's dtype (no float into an int tensor), and an
out of another shape is resized (with PyTorch's deprecation warning when it was not empty).
"""
import warnings

from jitgrad._core import modes as _modes
from jitgrad._core.forward import state as _fw
from jitgrad._core.messages import scalar_name
from jitgrad.graph.tensor import Tensor
from jitgrad.ops._common import asarray

# functions of the table that take no out= in PyTorch: several views, or a Python bool
NO_OUT = {"broadcast_tensors", "split", "split_with_sizes", "chunk", "unbind", "allclose", "equal"}


# factories with out=: they make the values in out's dtype, and resize out without a warning
FACTORIES = ("zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "rand", "randn")


def with_out(name, fn, factory=False):
    def op(*args, out=None, **kwargs):
        if out is None:
            return fn(*args, **kwargs)
        if factory:
            kwargs["dtype"] = _factory_dtype(kwargs.get("dtype"), out)
        return _into(name, fn, out, args, kwargs, warn=not factory)
    op.__name__ = op.__qualname__ = getattr(fn, "__name__", name)
    op.__doc__ = fn.__doc__
    op.__wrapped__ = fn  # inspect.unwrap: the op itself (its Tensor method is fn)
    return op


def _factory_dtype(dtype, out):
    if isinstance(out, Tensor) and dtype is not None and getattr(dtype, "np", None) != out._data.dtype:
        raise RuntimeError(f"dtype {scalar_name(dtype.np)} does not match dtype of out parameter "
                           f"({scalar_name(out._data.dtype)})")
    return out.dtype if isinstance(out, Tensor) else dtype


def _requires_grad(values):
    for v in values:
        if isinstance(v, Tensor) and v.requires_grad:
            return True
        if isinstance(v, (tuple, list)) and _requires_grad(v):
            return True
    return False


def _has_tangent(values):
    for v in values:
        if isinstance(v, Tensor) and v._x is not None and v._x.fw is not None:
            return True
        if isinstance(v, (tuple, list)) and _has_tangent(v):
            return True
    return False


def _into(name, fn, out, args, kwargs, warn=True):
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if not all(isinstance(o, Tensor) for o in outs):
        bad = next(o for o in outs if not isinstance(o, Tensor))
        raise TypeError(f"{name}(): argument 'out' must be Tensor, not {type(bad).__name__}")
    if _modes.is_grad_enabled() and _requires_grad((*args, *kwargs.values(), *outs)):
        raise RuntimeError(f"{name}(): functions with out=... arguments don't support automatic differentiation, "
                           "but one of the arguments requires grad.")
    if _fw.live and _has_tangent((*args, *kwargs.values(), *outs)):  # (out's tangent would be left stale)
        raise NotImplementedError(f"Trying to use forward AD with {name}_out that does not support it because it "
                                  "is an out= function")
    res = fn(*args, **kwargs)
    results = (res,) if isinstance(res, Tensor) else tuple(res)
    if len(results) != len(outs):
        raise TypeError(f"{name}(): argument 'out' must be a tuple of {len(results)} Tensors, not {len(outs)}")
    for o, r in zip(outs, results):
        _write(o, r, warn)
    if isinstance(res, Tensor):
        return out
    return type(res)(*outs) if hasattr(res, "_fields") else tuple(outs)


def _write(o, r, warn):
    rk, ok = r._data.dtype.kind, o._data.dtype.kind
    if (rk == "f" and ok in "iub") or (rk in "iu" and ok == "b"):
        raise RuntimeError(f"result type {scalar_name(r._data.dtype)} can't be cast to the desired output type "
                           f"{scalar_name(o._data.dtype)}")
    if tuple(o._data.shape) != tuple(r._data.shape):
        if warn and o._data.size:
            warnings.warn(f"An output with one or more elements was resized since it had shape "
                          f"{list(o._data.shape)}, which does not match the required output shape "
                          f"{list(r._data.shape)}. This behavior is deprecated, and in a future PyTorch release "
                          "outputs will not be resized unless they have zero elements. You can explicitly reuse an "
                          "out tensor t by resizing it, inplace, to zero elements with t.resize_(0).", UserWarning,
                          stacklevel=4)
        o._data = asarray(r._data).astype(o._data.dtype, copy=True)
        o._bump()
        return
    with _modes.no_grad():
        o.copy_(r)
