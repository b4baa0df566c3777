"""torch's legacy tensor types (torch.FloatTensor, DoubleTensor, LongTensor, IntTensor, BoolTensor), which older
library code still uses to build tensors, test a tensor's type (isinstance(x, torch.DoubleTensor)), set the
default dtype (set_default_tensor_type) and name a tensor's type (x.type() -> 'torch.FloatTensor')."""
import warnings

import numpy as np

from jitgrad._core import device as _device
from jitgrad._core import dtype as _dtype
from jitgrad.graph import tensor as _t
from jitgrad.graph.tensor import Size, Tensor


class tensortype(type):
    """The class of torch.DoubleTensor...: calling one builds a tensor of its dtype; isinstance tests a
    tensor's dtype and device."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype and obj.is_cuda == cls.is_cuda

    def __call__(cls, *args, device=None):
        dev = "cuda" if cls.is_cuda else (device or "cpu")
        if len(args) == 1 and not isinstance(args[0], (int, np.integer, Size)):
            data = args[0]
            if isinstance(data, Tensor):
                return data.to(dtype=cls.dtype, device=dev)
            return _t.tensor(data, dtype=cls.dtype, device=dev)
        size = tuple(args[0]) if len(args) == 1 and isinstance(args[0], Size) else args
        return _t.empty(*size, dtype=cls.dtype, device=dev) if size else _t.empty(0, dtype=cls.dtype, device=dev)

    def __repr__(cls):
        return f"<class '{cls.type_name}'>"


_NAMES = {"FloatTensor": _dtype.float32, "DoubleTensor": _dtype.float64, "LongTensor": _dtype.int64,
          "IntTensor": _dtype.int32, "BoolTensor": _dtype.bool_}


def _make(name, d, cuda):
    return tensortype(name, (), {"dtype": d, "is_cuda": cuda, "type_name": ("torch.cuda." if cuda else "torch.") + name,
                                 "__module__": "jitgrad"})


CPU_TYPES = {n: _make(n, d, False) for n, d in _NAMES.items()}
CUDA_TYPES = {n: _make(n, d, True) for n, d in _NAMES.items()}
_BY_NAME = {c.type_name: c for c in (*CPU_TYPES.values(), *CUDA_TYPES.values())}
_BY_DTYPE = {(c.dtype, c.is_cuda): c for c in _BY_NAME.values()}


def _resolve(t):
    if isinstance(t, tensortype):
        return t
    if isinstance(t, str):
        if t in _BY_NAME:
            return _BY_NAME[t]
        raise ValueError(f"invalid type: '{t}'")
    raise TypeError(f"invalid type: {t!r}")


def type_(self, dtype=None, non_blocking=False, **kwargs):
    """x.type(): the type's name ('torch.FloatTensor'); x.type(t): x as t (a dtype, a type or its name)."""
    if dtype is None:
        return _BY_DTYPE[(self.dtype, self.is_cuda)].type_name
    if isinstance(dtype, _dtype.dtype):
        return self.to(dtype)
    cls = _resolve(dtype)
    return self.to(dtype=cls.dtype, device="cuda" if cls.is_cuda else "cpu")


def set_default_tensor_type(t):
    warnings.warn("torch.set_default_tensor_type() is deprecated as of PyTorch 2.1, please use "
                  "torch.set_default_dtype() and torch.set_default_device() as alternatives.", UserWarning,
                  stacklevel=2)
    cls = _resolve(t)
    if not cls.dtype.is_floating_point:
        raise TypeError("only floating-point types are supported as the default type")
    _dtype.set_default_dtype(cls.dtype)
    _device.set_default_device("cuda" if cls.is_cuda else None)
