"""atan2, atan, asin, acos: numpy forwards with their gradient formulas written in jitgrad ops,
so second-order gradients follow. No elementwise primitive exists for them (adding one means a
kernel in the engine and on the device); as custom Functions their grad_fn is `Atan2Backward`
where PyTorch's is `Atan2Backward0`."""
import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad.autograd.function import Function
from jitgrad.graph.tensor import Tensor
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.ops import elementwise as ew


def _float(x):
    return x if x.is_floating_point() else ew._as_float(x)


class Atan2(Function):
    @staticmethod
    def forward(ctx, y, x):
        ctx.save_for_backward(y, x)
        return _wrap(np.arctan2(y._data, x._data))

    @staticmethod
    def backward(ctx, grad):
        y, x = ctx.saved_tensors
        r2 = ew.add(ew.mul(x, x), ew.mul(y, y))
        return ew.div(ew.mul(grad, x), r2), ew.div(ew.mul(grad, ew.neg(y)), r2)


class Atan(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _wrap(np.arctan(x._data))

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return ew.div(grad, ew.add(ew.mul(x, x), 1.0))


class Asin(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        with np.errstate(invalid="ignore"):  # nan outside [-1, 1], as PyTorch, without numpy's warning
            return _wrap(np.arcsin(x._data))

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        with np.errstate(invalid="ignore", divide="ignore"):
            return ew.div(grad, ew.sqrt(ew.rsub(ew.mul(x, x), 1.0)))


class Acos(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        with np.errstate(invalid="ignore"):
            return _wrap(np.arccos(x._data))

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        with np.errstate(invalid="ignore", divide="ignore"):
            return ew.neg(ew.div(grad, ew.sqrt(ew.rsub(ew.mul(x, x), 1.0))))


def atan2(input, other):
    for pos, name, v in ((1, "input", input), (2, "other", other)):
        if not isinstance(v, Tensor):
            raise TypeError(f"atan2(): argument '{name}' (position {pos}) must be Tensor, not {type(v).__name__}")
    dt = _dtype.result_type(input, other)  # torch's promotion (a 0-d float64 does not widen float32)
    dt = _dtype.from_numpy_dtype(dt) if dt.kind == "f" else _dtype.get_default_dtype()
    a, b = (t if t._data.dtype == dt.np else ew.to_dtype(t, dt) for t in (input, other))
    try:
        np.broadcast_shapes(a._data.shape, b._data.shape)
    except ValueError:
        raise ew._broadcast_error(a._data.shape, b._data.shape) from None
    return Atan2.apply(a, b)


def atan(input):
    return Atan.apply(_float(input))


def asin(input):
    return Asin.apply(_float(input))


def acos(input):
    return Acos.apply(_float(input))


FUNCTIONS = {"atan2": atan2, "arctan2": atan2, "atan": atan, "arctan": atan, "asin": asin, "arcsin": asin,
             "acos": acos, "arccos": acos}
for _name, _fn in FUNCTIONS.items():
    setattr(Tensor, _name, _fn)
