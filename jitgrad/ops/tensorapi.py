"""Tensor methods of everyday PyTorch code that are not ops of their own: the new_* factories,
dtype conversions (int, bool, type_as), and the storage queries (stride, storage_offset,
data_ptr, element_size, nbytes, is_contiguous) read from the numpy array under the tensor."""
import warnings

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core.format import set_printoptions
from jitgrad.graph import tensor as _t
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import functional as F
from jitgrad.ops import tensortypes


def _like(self, dtype, device):
    return (self.dtype if dtype is None else dtype), (self.device if device is None else device)


def _new_factory(factory):
    """Tensor.new_<factory>(*size): a tensor of self's dtype and device unless told otherwise."""
    def new(self, *size, dtype=None, device=None, requires_grad=False):
        dt, dev = _like(self, dtype, device)
        return factory(*size, dtype=dt, device=dev, requires_grad=requires_grad)
    new.__name__ = "new_" + factory.__name__
    return new


def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    dt, dev = _like(self, dtype, device)
    return _t.full(size, fill_value, dtype=dt, device=dev, requires_grad=requires_grad)


def new_tensor(self, data, *, dtype=None, device=None, requires_grad=False):
    """A copy of data (detached when a Tensor) of self's dtype and device unless told otherwise."""
    dt, dev = _like(self, dtype, device)
    if isinstance(data, Tensor):
        warnings.warn("To copy construct from a tensor, it is recommended to use sourceTensor.detach().clone() or "
                      "sourceTensor.detach().clone().requires_grad_(True), rather than tensor.new_tensor(sourceTensor).",
                      UserWarning, stacklevel=2)
        data = data.detach()._array().copy()
    return _t.tensor(data, dtype=dt, device=dev, requires_grad=requires_grad)


# c10's names of the scalar types, as torch's TensorOptions messages print them
_C10_NAMES = {"float64": "double", "float32": "float", "int64": "long int", "int32": "int", "bool": "bool"}


def _options(t):
    return (f"TensorOptions(dtype={_C10_NAMES.get(t.dtype.name, t.dtype.name)}, device={t.device}, layout=Strided, "
            "requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))")


_NEW_SIGNATURES = ("new() received an invalid combination of arguments - got ({}), but expected one of:\n"
                   " * (*, torch.device device = None)\n * (torch.Storage storage)\n * (Tensor other)\n"
                   " * (tuple of ints size, *, torch.device device = None)\n"
                   " * (object data, *, torch.device device = None)\n")


def new(self, *args, device=None, **kwargs):
    """torch's legacy constructor: x.new() (empty), x.new(*sizes) / x.new(torch.Size) /
    x.new(size=...) (uninitialised), x.new(sequence) (the data, in x's dtype), x.new(tensor)
    (that tensor's storage, detached: it must have x's dtype and device). Never a graph."""
    size = kwargs.pop("size", None)
    if kwargs:
        def kind(v):
            return "torch.dtype" if isinstance(v, _dtype.dtype) else type(v).__name__
        got = ", ".join([kind(a) for a in args] + [f"{k}={kind(v)}" for k, v in kwargs.items()])
        raise TypeError(_NEW_SIGNATURES.format(got))
    dev = self.device if device is None else device
    if size is not None:
        args = (tuple(size),)
    if not args:
        return _t.empty(0, dtype=self.dtype, device=dev)
    if len(args) == 1:
        a = args[0]
        if isinstance(a, Tensor):
            if a.dtype != self.dtype or a.device != self.device:
                raise TypeError(f"expected {_options(self)} (got {_options(a)})")
            return a.detach()
        if isinstance(a, _t.Size) or size is not None:
            return _t.empty(tuple(a), dtype=self.dtype, device=dev)
        if isinstance(a, (bool, np.bool_, float, np.floating, complex)):
            raise TypeError(f"new(): data must be a sequence (got {type(a).__name__})")
        if not hasattr(a, "__index__") or isinstance(a, np.ndarray) and a.ndim:  # a sequence or an array: its values
            return _t.tensor(a, dtype=self.dtype, device=dev)
    for k, n in enumerate(args):
        if isinstance(n, (bool, np.bool_)) or not hasattr(n, "__index__"):
            raise TypeError(f"new(): argument 'size' failed to unpack the object at pos {k + 1} with error "
                            f'"type must be tuple of ints,but got {type(n).__name__}"')
    return _t.empty(tuple(int(n) for n in args), dtype=self.dtype, device=dev)


def type_as(self, other):
    if not isinstance(other, Tensor):
        raise TypeError(f"type_as(): argument 'other' (position 1) must be Tensor, not {type(other).__name__}")
    return self.to(other.dtype)


def half(self, memory_format=None):
    raise TypeError("jitgrad has no float16 dtype: half() is not supported (use float() or double())")


def element_size(self):
    return self._data.dtype.itemsize


def _strides(self):
    return tuple(s // self._data.dtype.itemsize for s in self._data.strides)


def stride(self, dim=None):
    strides = _strides(self)
    if dim is None:
        return strides
    n = max(len(strides), 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return strides[dim] if strides else 1


def _address(arr):
    if isinstance(arr, np.ndarray):
        return arr.__array_interface__["data"][0]
    return arr.ptr  # a DeviceArray: its first element's device address


def data_ptr(self):
    return _address(self._data)


def storage_offset(self):
    """Elements between the start of the storage and this tensor's first element: nonzero
    only for a view into another tensor's storage (the base owns the storage)."""
    x = self._x
    view = None if x is None else x.view_of
    if view is None:
        return 0
    return (_address(self._data) - _address(view.base._data)) // self._data.dtype.itemsize


def is_contiguous(self, memory_format=None):
    arr = self._data
    if isinstance(arr, np.ndarray):
        return bool(arr.flags.c_contiguous)
    if isinstance(arr, np.generic):  # a 0-d result held as a numpy scalar
        return True
    return bool(arr.is_c_contiguous())


def contiguous(self, memory_format=None):
    """self when already row-major, else a row-major copy (CloneBackward0, as torch)."""
    if is_contiguous(self):
        return self
    out = F.clone(self)
    if isinstance(out._data, np.ndarray) and not out._data.flags.c_contiguous:
        out._data = np.ascontiguousarray(out._data)
    return out


def numel(input):
    if not isinstance(input, Tensor):
        raise TypeError(f"numel(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    return input.numel()


def _tensor_arg(fn, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}(): argument 'input' (position 1) must be Tensor, not {type(x).__name__}")


def is_floating_point(input):
    _tensor_arg("is_floating_point", input)
    return input.is_floating_point()


def is_complex(input):
    """False for every jitgrad tensor: none holds a complex dtype yet (torch.complex64 exists for dtype checks)."""
    _tensor_arg("is_complex", input)
    return False


def real(input):
    """A real tensor's real part is the tensor itself (torch returns self: same object, same graph)."""
    _tensor_arg("real", input)
    return input


def imag(input):
    _tensor_arg("imag", input)
    raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")


METHODS = {
    "is_complex": lambda self: False,
    "ndimension": lambda self: self.dim(),
    "type": tensortypes.type_,  # torch's older spelling of dim()
    "new_zeros": _new_factory(_t.zeros), "new_ones": _new_factory(_t.ones), "new_empty": _new_factory(_t.empty),
    "new_full": new_full, "new_tensor": new_tensor, "new": new, "type_as": type_as,
    "int": lambda self, memory_format=None: F.to_dtype(self, _dtype.int32),
    "bool": lambda self, memory_format=None: F.to_dtype(self, _dtype.bool_),
    "half": half, "element_size": element_size, "stride": stride, "data_ptr": data_ptr,
    "storage_offset": storage_offset, "is_contiguous": is_contiguous, "contiguous": contiguous,
}
PROPERTIES = {
    "real": real, "imag": imag,
    "itemsize": element_size,
    "nbytes": lambda self: self._data.size * self._data.dtype.itemsize,
}
FUNCTIONS = {"numel": numel, "set_printoptions": set_printoptions, "is_floating_point": is_floating_point,
             "is_complex": is_complex, "real": real, "imag": imag, "promote_types": _dtype.promote_dtypes,
             "broadcast_shapes": F.broadcast_shapes}


def install():
    for name, fn in METHODS.items():
        setattr(Tensor, name, fn)
    for name, fn in PROPERTIES.items():
        setattr(Tensor, name, property(fn))
