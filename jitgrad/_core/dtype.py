"""dtype objects: thin named wrappers over numpy dtypes, printed as PyTorch prints them."""
import builtins

import numpy as np

from jitgrad._core.messages import scalar_name


class dtype:
    __slots__ = ("name", "np", "is_floating_point", "is_complex", "is_signed", "itemsize")

    def __init__(self, name, np_dtype, is_floating_point, is_complex=False):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.is_floating_point = is_floating_point
        self.is_complex = is_complex
        self.is_signed = self.np.kind != "b"
        self.itemsize = self.np.itemsize

    def to_real(self):
        return _REAL_OF.get(self, self)

    def to_complex(self):
        if self in _COMPLEX_OF:
            return _COMPLEX_OF[self]
        if self.is_complex:
            return self
        raise RuntimeError(f"to_complex is only supported for floating point dtypes, got {self!r}")

    def __repr__(self):
        return "torch." + self.name  # PyTorch code compares repr strings; keep its spelling

    def __reduce__(self):
        return (_by_name, (self.name,))


float32 = dtype("float32", np.float32, True)
float64 = dtype("float64", np.float64, True)
int64 = dtype("int64", np.int64, False)
int32 = dtype("int32", np.int32, False)
bool_ = dtype("bool", np.bool_, False)
float = float32  # noqa: A001  (torch.float is float32)
double = float64
long = int64
int = int32  # noqa: A001

# complex dtypes exist as names (dtype checks such as `dtype.is_complex` and `torch.is_complex` work, and a
# library can build its tables of them), but no tensor holds one yet: to_numpy_dtype refuses them, so every
# factory, conversion and tensor() given one raises complex_unsupported's error
complex64 = dtype("complex64", np.complex64, False, is_complex=True)
complex128 = dtype("complex128", np.complex128, False, is_complex=True)
cfloat = complex64
cdouble = complex128
_REAL_OF = {complex64: float32, complex128: float64}
_COMPLEX_OF = {float32: complex64, float64: complex128}

_ALL = (float32, float64, int64, int32, bool_)
_FROM_NP = {d.np: d for d in _ALL}
_default_dtype = [float32]


def _by_name(name):
    return {d.name: d for d in _ALL + (complex64, complex128)}[name]


def complex_unsupported(d):
    return NotImplementedError(f"jitgrad has no complex tensors yet: {d!r} is known as a dtype (for dtype checks) "
                               "but no tensor can hold it")


def from_numpy_dtype(npd):
    try:
        return _FROM_NP[np.dtype(npd)]
    except KeyError:
        raise TypeError(f"can't convert np.ndarray of type {np.dtype(npd)}. The only supported types are: "
                        "float64, float32, int64, int32, and bool.") from None


def to_numpy_dtype(d):
    if d is None:
        return None
    if isinstance(d, dtype):
        if d.is_complex:
            raise complex_unsupported(d)
        return d.np
    return np.dtype(d)


def get_default_dtype():
    return _default_dtype[0]


def set_default_dtype(d):
    if not (isinstance(d, dtype) and d.is_floating_point):
        raise TypeError("only floating-point types are supported as the default type")
    _default_dtype[0] = d


# -- type promotion, as torch.result_type ---------------------------------------------
# The one implementation of torch's rule; every op that combines operands of different
# dtypes asks it. numpy's rules differ from torch's in ways that matter to users: an int
# array with a float32 one gives float64 (torch: float32), and a 0-d float64 array beside a
# float32 one gives float64 (torch: float32). Torch ranks operands in three tiers, each
# promoted within itself: tensors with dimensions, 0-d tensors, Python numbers. A lower tier
# only decides the result's category (bool < int < float) when it is higher than the upper
# tier's, never its width: int32 tensor + 0-d int64 -> int32, int tensor + 0.5 -> the default
# float dtype, float32 tensor + 0-d float64 -> float32.
_CATEGORY = {"b": 0, "i": 1, "u": 1, "f": 2}
_BOOL = np.dtype(np.bool_)
_INT64 = np.dtype(np.int64)


def promote_dtypes(a, b):
    """torch.promote_types(a, b) on jitgrad dtypes (complex ones included: a complex beside a float of
    greater width widens, as torch's table)."""
    if not (isinstance(a, dtype) and isinstance(b, dtype)):
        bad, pos = (a, 1) if not isinstance(a, dtype) else (b, 2)
        raise TypeError(f"promote_types(): argument '{('type1', 'type2')[pos - 1]}' (position {pos}) must be "
                        f"torch.dtype, not {type(bad).__name__}")
    if a.is_complex or b.is_complex:
        real = promote_types(a.to_real().np, b.to_real().np)
        return _COMPLEX_OF[_FROM_NP[real]] if real.kind == "f" else (a if a.is_complex else b)
    return _FROM_NP[promote_types(a.np, b.np)]


def promote_types(a, b):
    """torch.promote_types on numpy dtypes: the higher category wins; within one, the wider."""
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca == cb:
        return a if a == b else np.promote_types(a, b)
    return a if ca > cb else b


def _combine(higher, lower):
    """c10's combine_categories: a higher tier's dtype, lifted to the lower tier's category
    when that is higher (at the lower tier's dtype, or the default float for a number)."""
    if higher is None:
        return lower
    if lower is None or higher.kind == "f":
        return higher
    if higher.kind == "b" or lower.kind == "f":
        return promote_types(higher, lower)
    return higher


def number_dtype(x):
    """The dtype of a Python number as an operand: bool, int64, or the default float."""
    if type(x) is bool:
        return _BOOL
    return _INT64 if isinstance(x, builtins.int) else _default_dtype[0].np


def result_type(*operands):
    """torch.result_type over operands that are arrays (0-d arrays and numpy scalars count
    as 0-d tensors), Tensors, or Python numbers (bool, int, float)."""
    dim = zero = number = None
    for x in operands:
        d = getattr(x, "_data", x)  # a Tensor: its array
        dt = getattr(d, "dtype", None)
        if isinstance(dt, dtype):  # a tensor-like without an array (vmap's BatchedTensor): its own ndim
            dt = dt.np
        if dt is None:
            dt = number_dtype(d)
            number = dt if number is None else promote_types(number, dt)
        elif d.ndim:
            dim = dt if dim is None else promote_types(dim, dt)
        else:
            zero = dt if zero is None else promote_types(zero, dt)
    return _combine(dim, _combine(zero, number))


def can_cast(src, dst):
    """torch.can_cast: no cast to a lower category (float -> int, int -> bool); any width."""
    return _CATEGORY[src.kind] <= _CATEGORY[dst.kind]


def cast_error(src, dst):
    """An in-place op or out= whose result dtype the destination cannot hold."""
    return RuntimeError(f"result type {scalar_name(src)} can't be cast to the desired output type "
                        f"{scalar_name(dst)}")


def not_implemented(kernel, d):
    """torch's refusal of a dtype an op has no kernel for: '"softmax" not implemented for 'Long''."""
    return NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_name(d)}'")
