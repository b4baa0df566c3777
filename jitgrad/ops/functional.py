"""Every op under one name space: the families' functions (ops/<family>.py), as the
engine, autograd and nn call them (F.<name>). Nothing is defined here."""
from jitgrad._core import dtype as _dtype  # noqa: F401
from jitgrad.graph.tensor import wrap as _wrap  # noqa: F401
from jitgrad.ops._common import OperandTypeError, _broadcast_error, _needs, _operand_error, _scalar_dtype  # noqa: F401
from jitgrad.ops.device import to_device  # noqa: F401
from jitgrad.ops.elementwise import *  # noqa: F401,F403
from jitgrad.ops.elementwise import _as_float, _binary, _erf_array, _ew, _unary  # noqa: F401
from jitgrad.ops.linalg import *  # noqa: F401,F403
from jitgrad.ops.nn import *  # noqa: F401,F403
from jitgrad.ops.nn import _legacy_reduction, _padding_index  # noqa: F401
from jitgrad.ops.reduce import *  # noqa: F401,F403
from jitgrad.ops.shape import *  # noqa: F401,F403
from jitgrad.ops.shape import _T, _mark_view, _norm_index, _view_like  # noqa: F401
