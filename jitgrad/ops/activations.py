"""Activation functions and similarity measures composed from existing primitives.

Each is written so that its gradient equals PyTorch's at the kinks too (x == 0, the clamp
bounds) and stays finite where a naive formula overflows (softplus of a large input).
"""
import inspect

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core.messages import scalar_name
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import elementwise as ew
from jitgrad.ops import reduce, shape
from jitgrad.ops._common import _operand_error
from jitgrad.ops.inplace import _apply
from jitgrad.ops.mathops import vector_norm


def _inplace(fn):
    """fn(input, ..., inplace=True) writes its result into input, as PyTorch's, through the in-place
    mechanism every in-place op uses (leaf and view rules, version counter, rebasing)."""
    own = inspect.unwrap(fn).__code__.co_argcount - 1  # inplace is the positional after fn's own arguments

    def op(input, *args, **kwargs):
        inplace = args[own] if len(args) > own else kwargs.pop("inplace", False)
        args = args[:own]
        if not inplace:
            return fn(input, *args, **kwargs)
        return _apply(input, lambda old: fn(old, *args, **kwargs))
    op.__name__ = op.__qualname__ = fn.__name__
    op.__doc__ = fn.__doc__
    return op


def _floating(input, kernel):
    """torch's NotImplementedError for an activation whose kernel has no integer or bool
    version (computing it in float would hand back a float where torch refuses)."""
    if not isinstance(input, Tensor):
        if isinstance(input, (int, float, complex, list, tuple, np.ndarray, type(None))):
            raise _operand_error(kernel.split("_cpu")[0], input, 1)
        return  # a vmap BatchedTensor: its batching rule runs this again on each Tensor
    if input._data.dtype.kind not in "fc":
        raise NotImplementedError(f'"{kernel}" not implemented for \'{scalar_name(input._data.dtype)}\'')


def _no_bool(input, name, what="Bool"):
    if isinstance(input, Tensor) and input._data.dtype == np.bool_:
        raise RuntimeError(f"{what} inputs not supported for {name}")


def _smooth_softplus(x):
    # max(x, 0) + log1p(exp(-|x|)): never overflows; maximum splits the gradient at 0 to give 1/2
    return ew.add(ew.maximum(x, ew.zeros_like(x)), ew.log1p(ew.exp(ew.neg(ew.abs(x)))))


def softplus(input, beta=1.0, threshold=20.0):
    _floating(input, "softplus_cpu")
    bx = ew.mul(input, beta) if beta != 1 else input
    smooth = _smooth_softplus(bx)
    if beta != 1:
        smooth = ew.div(smooth, beta)
    return ew.where(ew.gt(bx, threshold), input, smooth)


@_inplace
def elu(input, alpha=1.0):
    _floating(input, "elu_cpu")
    pos = ew.gt(input, 0)
    neg = ew.where(pos, 0.0, input)  # expm1 only sees x <= 0: no overflow in the unused branch
    return ew.where(pos, input, ew.mul(ew.expm1(neg), alpha))


@_inplace
def leaky_relu(input, negative_slope=0.01):
    _floating(input, "leaky_relu_cpu")
    return ew.where(ew.gt(input, 0), input, ew.mul(input, negative_slope))


@_inplace
def silu(input):
    _floating(input, "silu_cpu")
    return ew.mul(input, ew.sigmoid(input))


@_inplace
def mish(input):
    _floating(input, "mish_cpu")
    return ew.mul(input, ew.tanh(softplus(input)))


@_inplace
def hardtanh(input, min_val=-1.0, max_val=1.0):
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    _no_bool(input, "hardtanh")
    # PyTorch's gradient is 0 at the bounds (clamp's is 1): the clamped values are constants
    inside = ew.logical_and(ew.gt(input, min_val), ew.lt(input, max_val))
    if input._data.dtype.kind != "f":  # torch keeps an int tensor's dtype: the bounds are cast to it
        min_val, max_val = int(min_val), int(max_val)
    return ew.where(inside, input, ew.clamp(input.detach(), min_val, max_val))


@_inplace
def relu6(input):
    return hardtanh(input, 0.0, 6.0)


@_inplace
def hardsigmoid(input):
    _floating(input, "hardsigmoid_cpu")
    return ew.div(hardtanh(ew.add(input, 3.0), 0.0, 6.0), 6.0)


@_inplace
def hardswish(input):
    _floating(input, "hardswish_cpu")
    # PyTorch's pieces: 0 below -3, x (x + 3) / 6 up to 3 (both ends included), x above
    mid = ew.div(ew.mul(input, ew.add(input, 3.0)), 6.0)
    return ew.where(ew.lt(input, -3.0), 0.0, ew.where(ew.le(input, 3.0), mid, input))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@_inplace
def selu(input):
    _floating(input, "elu_cpu")
    return ew.mul(elu(input, _SELU_ALPHA), _SELU_SCALE)


@_inplace
def celu(input, alpha=1.0):
    _floating(input, "elu_cpu")
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")
    pos = ew.gt(input, 0)
    neg = ew.where(pos, 0.0, input)
    return ew.where(pos, input, ew.mul(ew.expm1(ew.div(neg, alpha)), alpha))


def softsign(input):
    return ew.div(input, ew.add(ew.abs(input), 1.0))


def logsigmoid(input):
    _floating(input, "log_sigmoid_cpu")
    # -softplus(-x) without softplus's threshold: PyTorch's log_sigmoid is smooth everywhere
    return ew.neg(_smooth_softplus(ew.neg(input)))


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    n = vector_norm(input, p, dim, keepdim=True)
    return ew.div(input, shape.expand_as(ew.clamp(n, min=eps), input))


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    if _dtype.result_type(x1, x2).kind != "f":
        raise RuntimeError("expected common dtype to be floating point, yet common dtype is "
                           f"{scalar_name(_dtype.result_type(x1, x2))}")
    x1, x2 = ew.promote_float("cosine_similarity", x1, x2)
    n1 = ew.clamp(vector_norm(x1, 2, dim, keepdim=True), min=eps)
    n2 = ew.clamp(vector_norm(x2, 2, dim, keepdim=True), min=eps)
    return reduce.sum(ew.mul(ew.div(x1, n1), ew.div(x2, n2)), dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    return vector_norm(ew.add(ew.sub(x1, x2), eps), p, -1, keepdim=keepdim)
