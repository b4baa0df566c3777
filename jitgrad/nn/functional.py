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
from jitgrad.graph.tensor import zeros as _zeros
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
from jitgrad.nn.padding import pad  # noqa: F401,E402
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

# --- attention -------------------------------------------------------------------------------
# c10's names of scalar types in sdpa's messages ("double", "long int"), and in its legacy one
_C10 = {"float64": "double", "float32": "float", "int64": "long int", "int32": "int", "bool": "bool"}
_C10_TYPE = {"int64": "Long", "int32": "Int", "bool": "Bool"}


def _check_sdpa(query, key, value, attn_mask):
    """torch's validate_sdpa_input, in its order."""
    for pos, (name, t) in enumerate((("query", query), ("key", key), ("value", value)), 1):
        if not isinstance(t, Tensor):
            raise TypeError(f"scaled_dot_product_attention(): argument '{name}' (position {pos}) must be Tensor, "
                            f"not {type(t).__name__}")
    if attn_mask is not None and not isinstance(attn_mask, Tensor):
        raise TypeError(f"scaled_dot_product_attention(): argument 'attn_mask' must be Tensor, not "
                        f"{type(attn_mask).__name__}")
    q, k, v = (_C10.get(t.dtype.name, t.dtype.name) for t in (query, key, value))
    if not q == k == v:
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got query.dtype: {q} "
                           f"key.dtype: {k} and value.dtype: {v} instead.")
    if not query.device == key.device == value.device:
        raise RuntimeError(f"Expected query, key, and value to have the same device type, but got query.device: "
                           f"{query.device} key.device: {key.device} and value.device: {value.device} instead.")
    if min(query.ndim, key.ndim, value.ndim) < 2:
        raise RuntimeError(f"Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: "
                           f"{query.ndim} key.dim: {key.ndim} and value.dim: {value.ndim} instead.")
    if attn_mask is not None and attn_mask.dtype not in (_dtype.bool_, _dtype.float32, query.dtype):
        raise RuntimeError(f"Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                           f"attn_mask.dtype: {_C10.get(attn_mask.dtype.name, attn_mask.dtype.name)} and  "
                           f"query.dtype: {q} instead.")
    if not query.is_floating_point():
        raise RuntimeError(f"expected scalar type Float but found {_C10_TYPE.get(query.dtype.name, q)}")


def _grouped(query, key, value):
    """enable_gqa: key's and value's heads (dim -3) each repeated, interleaved, to query's count."""
    hq, hk, hv = query.size(-3), key.size(-3), value.size(-3)
    if hq == hk == hv:
        return key, value
    if hq % hk or hq % hv:
        raise RuntimeError("Number of heads in key and value must divide the number of heads in ")

    def interleave(t, h):
        shape = tuple(t.shape)
        return t.unsqueeze(-3).expand(shape[:-2] + (hq // h,) + shape[-2:]).reshape(shape[:-3] + (hq,) + shape[-2:])
    return interleave(key, hk), interleave(value, hv)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(query @ key^T * scale + mask) @ value, as torch's math backend composes it from
    differentiable ops: query and key^T each scaled by sqrt(scale) before their product (for
    range), a boolean mask (True: attend) as 0 / -inf added, a float mask added, a causal
    mask (is_causal: the lower triangle of the (L, S) scores, from the top left), and a
    softmax that gives 0 on a row whose every score is -inf (torch's _safe_softmax: its
    gradient there is 0, not NaN). Dropout as at::dropout, when dropout_p > 0."""
    _check_sdpa(query, key, value, attn_mask)
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    factor = (1.0 / np.sqrt(query.size(-1)) if scale is None else abs(scale)) ** 0.5
    q = query * (-factor if scale is not None and scale < 0 else factor)
    if enable_gqa:
        key, value = _grouped(query, key, value)
    attn = _F.matmul(q, key.transpose(-2, -1) * factor)
    if attn_mask is None:
        if is_causal:
            L, S = query.size(-2), key.size(-2)
            dev = query.device
            (above,) = _computed(lambda: (place(~np.tril(np.ones((L, S), dtype=bool)), dev),), (), "causal mask")
            attn = attn.masked_fill(above, float("-inf"))
        attn = _nn.softmax(attn, -1)   # (no row is all -inf: a causal row attends to its first key at least)
    else:
        shape = tuple(attn.shape)
        if attn_mask.dtype == _dtype.bool_:
            attn_mask = _zeros(tuple(attn_mask.shape), dtype=query.dtype, device=query.device).masked_fill(
                attn_mask.logical_not(), float("-inf"))
        attn = attn + attn_mask.to(attn.dtype)   # torch adds in place: its message for a wider mask
        if tuple(attn.shape) != shape:
            raise RuntimeError(f"output with shape {list(shape)} doesn't match the broadcast shape "
                               f"{list(attn.shape)}")
        masked = (attn == float("-inf")).all(-1, keepdim=True)   # rows with nothing to attend to
        attn = _F.where(masked, 0.0, _nn.softmax(_F.where(masked, 0.0, attn), -1))
    if dropout_p > 0.0:
        if dropout_p > 1.0:
            raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
        attn = dropout(attn, dropout_p, True)
    return _F.matmul(attn, value)


# --- small compositions of everyday model code -------------------------------------------------
def glu(input, dim=-1):
    """a * sigmoid(b), a and b the two halves of input along dim."""
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    if input._data.dtype.kind not in "f":
        raise _dtype.not_implemented("glu_cpu", input._data.dtype)
    d = dim % input.ndim if -input.ndim <= dim < input.ndim else dim
    n = input.size(dim)
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {n}")
    a, b = input.split(n // 2, dim)
    return a * sigmoid(b)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    return _nn.softmax(-input, _implicit_dim("softmin", input.dim(), _stacklevel) if dim is None else dim, dtype)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x^2 over the normalized trailing dims) + eps) * weight; eps defaults to the
    dtype's machine epsilon, as torch's."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if not k:
        raise RuntimeError("Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one "
                           "element, but got normalized_shape = []")
    if tuple(input.shape[input.ndim - k:]) != shape or input.ndim < k:
        raise RuntimeError(f"Given normalized_shape={list(shape)}, expected input with shape [*"
                           f"{', '.join(map(str, shape))}], but got input of size{list(input.shape)}")
    if weight is not None and tuple(weight.shape) != shape:
        raise RuntimeError(f"Expected weight to be of same shape as normalized_shape, but got weight of shape "
                           f"{list(weight.shape)} and normalized_shape = {list(shape)}")
    if input._data.dtype.kind != "f":
        raise _dtype.not_implemented("rms_norm", input._data.dtype)
    if eps is None:
        eps = float(np.finfo(input._data.dtype).eps)
    dims = tuple(range(input.ndim - k, input.ndim))
    out = input * ((input * input).mean(dims, keepdim=True) + eps).rsqrt()
    if weight is None:
        return out
    return out * (weight if weight.dtype == out.dtype else weight.to(out.dtype))   # (torch: the input's dtype)


def threshold(input, threshold, value, inplace=False):
    """input where input > threshold, else value (in input's dtype)."""
    if input._data.dtype.kind == "b":
        raise _dtype.not_implemented("threshold_cpu", input._data.dtype)
    out = input.masked_fill(~(input > threshold), value)
    return input.copy_(out) if inplace else out


def tanhshrink(input):
    return input - tanh(input)


def softshrink(input, lambd=0.5):
    """input - lambd above lambd, input + lambd below -lambd, 0 between (x * 0: torch's signed zero)."""
    if input._data.dtype.kind != "f":
        raise _dtype.not_implemented("softshrink_check", input._data.dtype)
    if lambd < 0:
        raise RuntimeError(f"lambda must be in range [0, {np.finfo(input._data.dtype).max:.6g}] for input dtype "
                           f"{_scalar_name(input._data.dtype)}, but found {lambd:g}")
    return _F.where(input > lambd, input - lambd, _F.where(input < -lambd, input + lambd, input * 0))


def hardshrink(input, lambd=0.5):
    """input where |input| > lambd, else 0."""
    if input._data.dtype.kind != "f":
        raise _dtype.not_implemented("hardshrink_cpu", input._data.dtype)
    return input.masked_fill((input >= -lambd) & (input <= lambd), 0.0)
