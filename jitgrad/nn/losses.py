"""The regression and probability losses beyond mse / cross entropy: binary_cross_entropy,
l1_loss, smooth_l1_loss, huber_loss, kl_div (the modules are in loss_modules.py), composed from
jitgrad's differentiable ops (their grad_fn is the last op's, not torch's *LossBackward0;
binary_cross_entropy's elementwise loss is one primitive, BinaryCrossEntropyBackward0, then
weighted and reduced)."""
import warnings

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core.messages import scalar_name, torch_size
from jitgrad.gpu.array import DeviceArray
from jitgrad.ops import functional as _F
from jitgrad.ops.nn import _legacy_reduction, _reduce, binary_cross_entropy_elementwise


def _values(t):
    """t's values on the host, for torch's range checks (a CUDA tensor's are copied: torch's
    check synchronizes with the device too)."""
    d = t._data
    return d.get() if type(d) is DeviceArray else t._array()


def _same_size(input, target):
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size ({torch_size(target.shape)}) that is different to the input size "
                         f"({torch_size(input.shape)}) is deprecated. Please ensure they have the same size.")


def _expandable(shape, to):
    """torch's error where weight.expand(target's shape) fails."""
    shape, to = tuple(shape), tuple(to)
    for i in range(1, len(shape) + 1):
        if shape[-i] != 1 and (i > len(to) or shape[-i] != to[-i]):
            raise RuntimeError(f"Attempting to broadcast a dimension of length {shape[-i]} at {-i}! Mismatching "
                               f"argument at index 1 had {torch_size(shape)}; but expected shape should be "
                               f"broadcastable to {list(to)}")


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if input._data.dtype.kind != "f":
        raise _dtype.not_implemented("binary_cross_entropy", input._data.dtype)
    if target._data.dtype != input._data.dtype:  # torch casts neither
        raise RuntimeError(f"Found dtype {scalar_name(target._data.dtype)} but expected "
                           f"{scalar_name(input._data.dtype)}")
    _same_size(input, target)
    x = _values(input)
    if np.any(~((x >= 0) & (x <= 1))):
        raise RuntimeError("all elements of input should be between 0 and 1")
    t = _values(target)
    if np.any(~((t >= 0) & (t <= 1))):
        raise RuntimeError("all elements of target should be between 0 and 1")
    loss = binary_cross_entropy_elementwise(input, target)
    if weight is not None:
        _expandable(weight.shape, target.shape)
        loss = loss * weight
    return _reduce(loss, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    return _reduce(_F.abs(input - target), _legacy_reduction(size_average, reduce, reduction))


def _piecewise(d, threshold, inner, outer):
    a = _F.abs(d)
    return _F.where(a < threshold, inner(d), outer(a))


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    input, target = _F.promote_float("smooth_l1_cpu", input, target)
    d = input - target
    if beta == 0:
        loss = _F.abs(d)
    else:
        loss = _piecewise(d, beta, lambda d: 0.5 * d * d / beta, lambda a: a - 0.5 * beta)
    return _reduce(loss, _legacy_reduction(size_average, reduce, reduction))


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    dt = _dtype.result_type(input, target)
    if dt.kind == "f" and input._data.dtype.kind != "f":  # torch writes the loss at the input's dtype
        raise _dtype.cast_error(dt, input._data.dtype)
    if dt.kind != "f":
        raise _dtype.not_implemented("huber_cpu", dt)
    if target._data.dtype != input._data.dtype:  # even a wider target: the loss stays at the input's dtype
        target = _F.to_dtype(target, input.dtype)
    loss = _piecewise(input - target, delta, lambda d: 0.5 * d * d, lambda a: delta * (a - 0.5 * delta))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if input._data.dtype.kind != "f" or target._data.dtype.kind != "f":
        raise RuntimeError("kl_div: Integral inputs not supported.")
    input, target = _F.promote_float("kl_div", input, target)
    if log_target:
        loss = _F.exp(target) * (target - input)
    else:
        # target * log(target) is 0 where target is 0 (xlogy), so a zero target adds nothing
        positive = target > 0
        safe = _F.where(positive, target, target * 0.0 + 1.0)
        loss = _F.where(positive, target * _F.log(safe), target * 0.0) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.dim() else loss.sum()
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                      "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                      "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                      stacklevel=2)
    return _reduce(loss, reduction)
