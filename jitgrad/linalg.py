"""torch.linalg's norms, cross product and vecdot (composed ops, see ops/mathops.py), and its error type."""
from jitgrad._core import messages as _messages
from jitgrad.graph.tensor import Tensor as _Tensor
from jitgrad.ops import FUNCTIONS as _F
from jitgrad.ops.mathops import linalg_cross as cross  # noqa: F401
from jitgrad.ops.mathops import linalg_norm as norm  # noqa: F401
from jitgrad.ops.mathops import matrix_norm, vector_norm  # noqa: F401


class LinAlgError(RuntimeError):
    """torch.linalg.LinAlgError (torch._C._LinAlgError): a decomposition or solve met a singular or
    non-positive-definite input. Library code catches it by name."""


LinAlgError.__name__ = LinAlgError.__qualname__ = "_LinAlgError"


def vecdot(x, y, *, dim=-1):
    """sum(x * y, dim) over broadcast x and y (their conjugate is themselves: jitgrad has no complex
    tensors), as torch composes it: MulBackward0 then SumBackward1."""
    for pos, t in ((1, x), (2, y)):
        if not isinstance(t, _Tensor):
            raise TypeError(f"linalg_vecdot(): argument '{'xy'[pos - 1]}' (position {pos}) must be Tensor, "
                            f"not {type(t).__name__}")
    if x.dtype is not y.dtype:
        raise RuntimeError(f"linalg.vecdot: Expected x and y to have the same dtype, but found x of type "
                           f"{_messages.scalar_name(x._data.dtype)} and y of type {_messages.scalar_name(y._data.dtype)} instead")
    if not x.is_floating_point():
        raise RuntimeError(f"linalg.vecdot: Expected a floating point or complex tensor as input. Got "
                           f"{_messages.scalar_name(x._data.dtype)}")
    return _F["sum"](_F["mul"](x, y), dim)
