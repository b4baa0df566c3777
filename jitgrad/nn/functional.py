"""The functional forms PyTorch keeps in torch.nn.functional: activations (gelu), linear,
dropout, layer_norm, embedding and losses, written with jitgrad's differentiable ops."""

import warnings

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core.capture import state as _cap
from jitgrad._core.messages import scalar_name as _scalar_name
from jitgrad._core.messages import size_str as _size_str
from jitgrad._core.messages import torch_size
from jitgrad._core.rng import contiguous as _contiguous
from jitgrad._core.rng import laid_out as _laid_out
from jitgrad._core.rng import layout_of as _layout_of
from jitgrad.graph.tensor import Tensor, place
from jitgrad.graph.tensor import stream as _stream
from jitgrad.ops import functional as _F
from jitgrad.ops import nn as _nn
from jitgrad.ops._common import _operand_error
from jitgrad.ops.elementwise import relu as _relu
from jitgrad.ops.elementwise import sigmoid, tanh  # noqa: F401
from jitgrad.ops.gathers import one_hot  # noqa: F401
from jitgrad.ops.inplace import UNARY as _INPLACE

# the primitives' forwards, each beside its entry in ops/nn.py
from jitgrad.ops.nn import (  # noqa: F401
    _index_tensor,
    _legacy_reduction,
    _padding_index,
    _reduce,
    _targets,
    adaptive_avg_pool2d,
    avg_pool2d,
    batch_norm,
    embedding,
    gelu,
    group_norm,
    layer_norm,
    nll_loss,
)

linear = _F.linear
relu_ = _INPLACE["relu_"]


_NOT_TENSORS = (int, float, complex, list, tuple, np.ndarray, type(None))


def relu(input, inplace=False):
    if isinstance(input, Tensor):
        if input._data.dtype.kind == "b":
            raise RuntimeError("Boolean inputs not supported for relu")
    elif isinstance(input, _NOT_TENSORS):  # (a vmap BatchedTensor goes on to its batching rule)
        raise _operand_error("relu", input, 1)
    return relu_(input) if inplace else _relu(input)


def _implicit_dim(name, ndim, stacklevel):
    """torch's legacy choice of dim for softmax-like calls without one, with its warning."""
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  "as an argument.", UserWarning, stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _nn.softmax(input, _implicit_dim("softmax", input.dim(), _stacklevel) if dim is None else dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _nn.log_softmax(input, _implicit_dim("log_softmax", input.dim(), _stacklevel) if dim is None else dim,
                           dtype)


def _computed(fn, inputs, name):
    """Tensors made by fn(*the inputs' arrays) -> a tuple of arrays, without a graph. In a
    jitgrad.compile recording fn becomes a Python instruction of the plan, so a replay
    calls it again on that call's values (and draws fresh random numbers)."""
    outs = tuple(_F._wrap(a) for a in fn(*(t._data for t in inputs)))
    if _cap.on and _cap.mine():
        _cap.rec.python(fn, inputs, outs, name)
    return outs


def dropout(input, p=0.5, training=True, inplace=False):
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return input
    if input._data.dtype.kind not in "fc":  # the mask is float: torch will not write it into an integer tensor
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{_scalar_name(input._data.dtype)}")
    if p == 1:
        return input * 0.0
    dtype, device = input._data.dtype, input.device

    def mask():
        # torch (CPU): noise = empty_like(input).bernoulli_(1 - p); noise.div_(1 - p): a double
        # uniform per element, kept when below 1 - p, in the input's storage order. The stream
        # when drawn: a replay draws what eager would from the generator's state then; on
        # the host for a CUDA input too (the factories' rule: a seed gives the same masks)
        u = _stream(device).uniform(n, np.float64)
        keep = (u.reshape(shape) if layout is None else _laid_out(layout, u)) < 1 - p
        return (place(keep.astype(dtype) / dtype.type(1 - p), device),)
    shape, n = input._data.shape, input._data.size
    layout = None if _contiguous(input._data) else _layout_of(input._data)
    (keep,) = _computed(mask, (), "dropout's mask")
    return input * keep


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    input, target = _F.promote_float("mse_cpu", input, target)
    return _reduce((input - target) ** 2, _legacy_reduction(size_average, reduce, reduction))


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """torch's three forms: class probabilities (a target of the input's shape), class indices
    with label smoothing (label_smoothing > 0; a negative one is ignored, as torch does), and
    plain class indices (log_softmax + nll_loss)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    class_dim = 0 if input.ndim == 1 else 1
    if tuple(input.shape) == tuple(target.shape):
        return _cross_entropy_probabilities(input, target, weight, ignore_index, reduction, label_smoothing)
    if not label_smoothing > 0.0:
        return nll_loss(log_softmax(input, class_dim), target, weight, ignore_index=ignore_index, reduction=reduction)
    _check_smoothing(label_smoothing)
    if input.ndim == 1:
        t1 = _index_tensor(target).reshape(1) if _cap.on else _targets(target).reshape(1)
        out = cross_entropy(input.unsqueeze(0), t1, weight, None, ignore_index, None, reduction, label_smoothing)
        return out.reshape(()) if reduction == "none" else out
    _nn.check_nll_args(input, target, weight)
    logp = log_softmax(input, 1)
    dtype = input._data.dtype
    cw = None if weight is None else weight._data if isinstance(weight, Tensor) else np.asarray(weight)

    def weights(t):
        # the mask of targets that count, and the total weight of the true targets (the mean's divisor)
        t = _targets(t)
        valid = (t != ignore_index).astype(dtype)
        w = valid if cw is None else valid * cw[np.where(valid > 0, t, 0)]
        return valid, w.sum().astype(dtype)
    valid, total = _computed(weights, (_index_tensor(target),), "cross_entropy's target weights")
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction="none")
    # torch: the smoothing term weighs every class by its weight, and the mean divides by
    # the weight of the true targets only
    wlogp = logp if weight is None else logp * _class_weights(weight, input.ndim)
    smooth = -wlogp.sum(1) * valid
    loss = nll * (1 - label_smoothing) + smooth * (label_smoothing / input.shape[1])
    if reduction == "mean":
        return loss.sum() / total
    return _reduce(loss, reduction)


def _bce_logits_dtypes(input, target):
    """torch: float logits only, and a target whose dtype can take the float result."""
    if input._data.dtype.kind != "f":
        raise _dtype.not_implemented("log_sigmoid_cpu", input._data.dtype)
    k = target._data.dtype.kind
    if k == "b":
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or "
                           "`logical_xor()` operator instead.")
    if k != "f":
        raise _dtype.cast_error(input._data.dtype, target._data.dtype)


def _check_smoothing(label_smoothing):
    if label_smoothing > 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")


def _class_weights(weight, ndim):
    """weight (C,) shaped to multiply a (N, C, d1, ...) tensor of ndim dims."""
    return weight.reshape((-1,) + (1,) * (ndim - 2)) if ndim > 2 else weight


def _cross_entropy_probabilities(input, target, weight, ignore_index, reduction, label_smoothing):
    """-sum over classes of target * weight * log_softmax(input), as torch's
    cross_entropy_loss_prob_target (its mean divides by the number of samples)."""
    if target._data.dtype.kind != "f":
        raise RuntimeError("Expected floating point type for target with class probabilities, got "
                           f"{_scalar_name(target._data.dtype)}")
    if ignore_index >= 0:
        raise RuntimeError("ignore_index is not supported for floating point target")
    class_dim = 0 if input.ndim == 1 else 1
    c = input.shape[class_dim]
    if weight is not None and (weight.ndim != 1 or weight.shape[0] != c):
        raise RuntimeError(f"cross_entropy: weight tensor should be defined either for all {c} classes or no "
                           f"classes but got weight tensor of shape: {_size_str(weight.shape)}")
    logp = log_softmax(input, class_dim)
    if label_smoothing > 0.0:
        _check_smoothing(label_smoothing)
        target = target * (1 - label_smoothing) + label_smoothing / c
    prod = logp * target
    if weight is not None:
        prod = prod * _class_weights(weight, input.ndim)
    if reduction == "none":
        return -prod.sum(class_dim)
    if reduction == "sum":
        return -prod.sum()
    n = input.numel() // c if c else 0
    return -prod.sum() / n if n else -prod.sum() * float("nan")


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """(1 - t) x + (1 + (pw - 1) t) softplus(-x). softplus(-x) is written with where() on
    the sign of x rather than relu/abs, so that at x == 0 the gradient is the exact
    sigmoid(0) - t (relu's and abs's subgradient 0 there would be off by 0.5); both
    branches stay finite for any x, so the unselected one cannot leak nan."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _bce_logits_dtypes(input, target)
    if input._data.dtype != target._data.dtype:  # torch computes into a copy of the target: its dtype
        input = _F.to_dtype(input, target.dtype)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({torch_size(target.shape)}) must be the same as input size "
                         f"({torch_size(input.shape)})")
    pos = input >= 0
    neg_abs = _F.where(pos, -input, input)                          # -|x|
    softplus_neg = _F.where(pos, input * 0.0, -input) + _F.log(_F.exp(neg_abs) + 1.0)
    coef = 1.0 if pos_weight is None else (pos_weight - 1.0) * target + 1.0
    loss = (1.0 - target) * input + coef * softplus_neg
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)




from jitgrad.nn.conv import conv2d, conv_transpose2d, max_pool2d  # noqa: F401,E402
from jitgrad.nn.losses import binary_cross_entropy, huber_loss, kl_div, l1_loss, smooth_l1_loss  # noqa: F401,E402
from jitgrad.ops.activations import (  # noqa: F401,E402
    celu,
    cosine_similarity,
    elu,
    hardsigmoid,
    hardswish,
    hardtanh,
    leaky_relu,
    logsigmoid,
    mish,
    normalize,
    pairwise_distance,
    relu6,
    selu,
    silu,
    softplus,
    softsign,
)
