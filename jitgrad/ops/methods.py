"""Tensor methods and operators, bound to the functional ops."""
import numpy as np

from jitgrad._core import device as _device
from jitgrad._core import dtype as _dtype
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import functional as F
from jitgrad.ops import inplace
from jitgrad.ops.device import to_device


def _operator(fn):
    """A binary operator: an operand that is not a Tensor or a number gives NotImplemented,
    so that Python raises "unsupported operand type(s)" as for torch (x + None is a TypeError)."""
    def op(self, other):
        try:
            return fn(self, other)
        except F.OperandTypeError:
            return NotImplemented
    return op


def _r(fn):
    return _operator(lambda self, other: fn(other, self))


def _direct(spec, npfn):
    """a (op) b without the functional wrapper: operators are the hottest call sites (a try
    costs nothing until it raises)."""
    binary = F._binary

    def op(self, other):
        try:
            return binary(spec, npfn, self, other)
        except F.OperandTypeError:
            return NotImplemented
    return op


# operators; the methods that are plain ops are bound by the table (ops/__init__.py)
_METHODS = {
    "__add__": _direct(F.ADD, np.add), "__radd__": _direct(F.ADD, np.add), "__sub__": _operator(F.sub),
    "__rsub__": _operator(F.rsub), "__mul__": _direct(F.MUL, np.multiply), "__rmul__": _direct(F.MUL, np.multiply),
    "__truediv__": _operator(F.div), "__rtruediv__": _r(F.div),
    "__pow__": _operator(F.pow), "__rpow__": _r(F.pow), "__neg__": F.neg, "__matmul__": _operator(F.matmul),
    "__rmatmul__": _r(F.matmul), "__abs__": F.abs, "__getitem__": F.getitem,
    "__eq__": F.eq, "__ne__": F.ne, "__lt__": F.lt, "__le__": F.le, "__gt__": F.gt, "__ge__": F.ge,
    "__and__": F.bitwise_and, "__or__": F.bitwise_or, "__xor__": F.bitwise_xor, "__invert__": F.bitwise_not,
}

for _name, _fn in _METHODS.items():
    setattr(Tensor, _name, _fn)

Tensor.T = property(F._T)
Tensor.mT = property(lambda self: F.transpose(self, -2, -1))
def _view_as(self, other):
    if not isinstance(other, Tensor):
        raise TypeError(f"view_as(): argument 'other' (position 1) must be Tensor, not {type(other).__name__}")
    return F.reshape(self, other._data.shape)


Tensor.view_as = Tensor.reshape_as = _view_as



def to(self, *args, **kwargs):
    """to(dtype) / to(device[, dtype]) / to(other); an unavailable device raises PyTorch's error."""
    dt = kwargs.get("dtype")
    dev = kwargs.get("device")
    for a in args:
        if isinstance(a, _dtype.dtype):
            dt = a
        elif isinstance(a, Tensor):
            dt, dev = a.dtype, a.device
        else:
            dev = a
    dev = self.device if dev is None else _device.check(dev, "to")
    if dt is not None and not isinstance(dt, _dtype.dtype):
        raise TypeError(f"to(): argument 'dtype' must be torch.dtype, not {type(dt).__name__}")
    out = self if dt is None or dt.np == self._data.dtype else F.to_dtype(self, dt)
    return to_device(out, dev)


def cuda(self, device=None, non_blocking=False):
    return to_device(self, _device.check("cuda" if device is None else
                                         f"cuda:{device}" if isinstance(device, int) else device, "cuda"))


Tensor.to = to
Tensor.cuda = cuda
Tensor.cpu = lambda self: to_device(self, _device.CPU)
Tensor.long = lambda self: F.to_dtype(self, _dtype.int64)
Tensor.clone = lambda self: F.clone(self)
inplace.install()
inplace.install_unary()
