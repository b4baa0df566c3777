"""dtype objects: thin named wrappers over numpy dtypes, printed as PyTorch prints them."""
import numpy as np


class dtype:
    __slots__ = ("name", "np", "is_floating_point", "itemsize")

    def __init__(self, name, np_dtype, is_floating_point):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.is_floating_point = is_floating_point
        self.itemsize = self.np.itemsize

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

_ALL = (float32, float64, int64, int32, bool_)
_FROM_NP = {d.np: d for d in _ALL}
_default_dtype = [float32]


def _by_name(name):
    return {d.name: d for d in _ALL}[name]


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
        return d.np
    return np.dtype(d)


def get_default_dtype():
    return _default_dtype[0]


def set_default_dtype(d):
    if not (isinstance(d, dtype) and d.is_floating_point):
        raise TypeError("only floating-point types are supported as the default type")
    _default_dtype[0] = d


# -- type promotion, as torch.result_type ---------------------------------------------
# numpy's rules differ from torch's in two ways that matter to users: an int array with a
# float32 one gives float64 (torch: float32), and a 0-d float64 array beside a float32 one
# gives float64 (torch: float32, since a 0-d operand only decides the result's category).
_CATEGORY = {"b": 0, "i": 1, "u": 1, "f": 2}


def promote_types(a, b):
    """torch.promote_types on numpy dtypes: the higher category wins; within one, the wider."""
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca == cb:
        return np.promote_types(a, b)
    return a if ca > cb else b


def result_type(a, b):
    """torch's result dtype of an op on arrays a and b (0-d arrays and numpy scalars count as
    zero-dim tensors, which rank below dimensioned ones)."""
    da, db = a.dtype, b.dtype
    if da == db:
        return da
    if (a.ndim == 0) == (b.ndim == 0):
        return promote_types(da, db)
    dim, zero = (db, da) if a.ndim == 0 else (da, db)
    # c10's combine_categories(dim result, zero-dim result)
    if dim.kind == "f":
        return dim
    if dim.kind == "b" or zero.kind == "f":
        return promote_types(dim, zero)
    return dim
