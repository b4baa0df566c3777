"""The functional forms PyTorch keeps in torch.nn.functional: activations (gelu), linear,
dropout, layer_norm, embedding and losses, written with jitgrad's differentiable ops."""

import numpy as np

from jitgrad._core.messages import scalar_name, size_str, tensor_type, torch_size

from jitgrad.graph.tensor import Tensor, _rng
from jitgrad.ops import derivatives as D
from jitgrad.ops import functional as _F
from jitgrad.graph.record import record
from jitgrad.kernels.norm import layer_norm_forward
from jitgrad.ops.functional import log_softmax, relu, sigmoid, softmax, tanh  # noqa: F401


linear = _F.linear


def dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return input
    if p == 1:
        return input * 0.0
    keep = (_rng[0].random(input._data.shape) >= p).astype(input._data.dtype) / (1 - p)
    return input * _F._wrap(keep)


def _reduce(loss, reduction, count=None):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean() if count is None else loss.sum() / count
    raise ValueError(f"{reduction} is not a valid value for reduction")


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    return _reduce((input - target) ** 2, _legacy_reduction(size_average, reduce, reduction))


def _legacy_reduction(size_average, reduce, reduction):
    # torch's deprecated size_average/reduce flags still decide the reduction when given
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "none" if not reduce else ("mean" if size_average else "sum")


def _targets(target):
    t = target._data if isinstance(target, Tensor) else np.asarray(target)
    return np.asarray(t, dtype=np.int64)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """-weight[t] * input[n, t] with t = target[n]; ignored targets contribute nothing and,
    for the mean, the sum is divided by the total weight of the targets that count."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    t = _targets(target)
    if input.ndim == 1:                               # one sample: (C,) input, () target
        out = nll_loss(input.unsqueeze(0), t.reshape(1), weight, None, ignore_index, None, reduction)
        return out.reshape(()) if reduction == "none" else out
    if input.ndim != 2:
        raise ValueError(f"Expected 2 dimensions (got {input.ndim})")
    if t.shape != (input.shape[0],):
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size "
                         f"({t.shape[0] if t.ndim else 0}).")
    valid = t != ignore_index
    safe = np.where(valid, t, 0)
    if valid.any() and (safe.min() < 0 or safe.max() >= input.shape[1]):
        raise IndexError(f"Target {int(safe.max() if safe.max() >= input.shape[1] else safe.min())} "
                         "is out of bounds.")
    x = input._data
    w = valid.astype(x.dtype)
    if weight is not None:
        w = w * (weight._data if isinstance(weight, Tensor) else np.asarray(weight))[safe]
        w = w.astype(x.dtype, copy=False)
    losses = -(x[np.arange(t.shape[0]), safe] * w)
    total = w.sum()
    with np.errstate(divide="ignore", invalid="ignore"):   # all targets ignored: nan, as torch
        if reduction == "mean":
            out, coef = np.asarray(losses.sum() / total, dtype=x.dtype), w / total
        elif reduction == "sum":
            out, coef = np.asarray(losses.sum(), dtype=x.dtype), w
        elif reduction == "none":
            out, coef = losses, w
        else:
            raise ValueError(f"{reduction} is not a valid value for reduction")
    res = _F._wrap(out)
    if not _F._needs(input):
        return res
    # one node, as torch's NllLossBackward0: its kernel scatters -grad * coef to the targets
    return record(D.NLL_LOSS, res, (input,), (np.ascontiguousarray(safe), coef.astype(x.dtype, copy=False)), (),
                  [x.shape[1], int(reduction == "none")])


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    logp = log_softmax(input, 0 if input.ndim == 1 else 1)
    if not label_smoothing:
        return nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if input.ndim == 1:
        out = cross_entropy(input.unsqueeze(0), _targets(target).reshape(1), weight, None, ignore_index, None,
                            reduction, label_smoothing)
        return out.reshape(()) if reduction == "none" else out
    t = _targets(target)
    valid = (t != ignore_index).astype(input._data.dtype)
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction="none")
    # torch: the smoothing term weighs every class by its weight, and the mean divides by
    # the weight of the true targets only
    wlogp = logp if weight is None else logp * weight
    smooth = -wlogp.sum(1) * _F._wrap(valid)
    loss = nll * (1 - label_smoothing) + smooth * (label_smoothing / input.shape[1])
    if reduction == "mean":
        w = valid if weight is None else valid * np.asarray(weight._data if isinstance(weight, Tensor) else weight)[
            np.where(valid > 0, t, 0)]
        return loss.sum() / float(w.sum())
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """(1 - t) x + (1 + (pw - 1) t) softplus(-x). softplus(-x) is written with where() on
    the sign of x rather than relu/abs, so that at x == 0 the gradient is the exact
    sigmoid(0) - t (relu's and abs's subgradient 0 there would be off by 0.5); both
    branches stay finite for any x, so the unselected one cannot leak nan."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
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


# --- GELU ------------------------------------------------------------------------------------
_SQRT1_2 = 0.7071067811865476          # 1 / sqrt(2)
_SQRT_2_OVER_PI = 0.7978845608028654   # sqrt(2 / pi)


def gelu(input, approximate="none"):
    """x * Phi(x) ('none', exact, via erf) or its tanh approximation ('tanh'), as torch;
    one GeluBackward0 node whose gradient formula is compiled like any elementwise op."""
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")
    x = input._data
    if x.dtype.kind != "f":
        raise NotImplementedError(f"\"GeluKernelImpl\" not implemented for '{scalar_name(x.dtype)}'")
    if approximate == "none":
        out = 0.5 * x * (1.0 + _F._erf_array(x * _SQRT1_2))
    else:
        out = 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return _F._ew(D.GELU, np.asarray(out).astype(x.dtype, copy=False), input, p0=float(approximate == "tanh"))


# --- LayerNorm -------------------------------------------------------------------------------
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last len(normalized_shape) dims,
    var with correction 0: one NativeLayerNormBackward0 node with torch's three inputs
    (input, weight, bias; None where absent), compiled forward and backward."""
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(d) for d in normalized_shape)
    n = len(normalized_shape)
    shape = tuple(input.shape)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != normalized_shape:
            raise RuntimeError(f"Expected {name} to be of same shape as normalized_shape, but got {name} of shape "
                               f"{size_str(p.shape)} and normalized_shape = {size_str(normalized_shape)}")
    if n == 0 or len(shape) < n or shape[len(shape) - n:] != normalized_shape:
        raise RuntimeError(f"Given normalized_shape={size_str(normalized_shape)}, expected input with shape "
                           f"[*, {', '.join(str(d) for d in normalized_shape)}], but got input of size"
                           f"{size_str(shape)}")
    x = input._data
    if x.dtype.kind != "f":
        raise NotImplementedError(f"\"LayerNormKernelImpl\" not implemented for '{scalar_name(x.dtype)}'")
    if any(p is not None and p._data.dtype != x.dtype for p in (weight, bias)):
        raise RuntimeError("mixed dtype (CPU): all inputs must share same datatype.")
    k = int(np.prod(normalized_shape, dtype=np.int64))
    none = np.zeros(0, x.dtype)
    w = none if weight is None else np.ascontiguousarray(weight._data).reshape(-1)
    b = none if bias is None else np.ascontiguousarray(bias._data).reshape(-1)
    out, mean, rstd = layer_norm_forward(np.ascontiguousarray(x).reshape(-1, k), w, b, weight is not None,
                                         bias is not None, float(eps))
    res = _F._wrap(out.reshape(x.shape))
    inputs = (input, _ABSENT if weight is None else weight, _ABSENT if bias is None else bias)
    if not _F._needs(*inputs):
        return res
    # x itself is saved (not a reshaped copy), so saved_tensors_hooks and _saved_self see the input
    saved = (x, mean, rstd) if weight is None else (x, mean, rstd, weight._data)
    return record(D.LAYER_NORM, res, inputs, saved, (float(eps),), [k, int(weight is not None), int(bias is not None)])


_ABSENT = _F._wrap(np.zeros(0))  # an input slot without a tensor: the node's next_functions entry is None


# --- Embedding -------------------------------------------------------------------------------
def _padding_index(padding_idx, num):
    if padding_idx is None:
        return None
    if padding_idx > 0:
        if padding_idx >= num:
            raise AssertionError("Padding_idx must be within num_embeddings")
    elif padding_idx < 0:
        if padding_idx < -num:
            raise AssertionError("Padding_idx must be within num_embeddings")
        padding_idx = num + padding_idx
    return padding_idx


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """weight[input]: rows of weight picked by an integer tensor of any shape; one
    EmbeddingBackward0 node whose compiled kernel scatter-adds the gradient rows (repeated
    indices accumulate; the padding_idx row gets none; scale_grad_by_freq divides by how
    often each index occurs). max_norm first renormalises the rows used, in place."""
    if sparse:
        raise NotImplementedError("jitgrad: sparse embedding gradients are not supported (no sparse tensors)")
    idx = input._data if isinstance(input, Tensor) else np.asarray(input)
    idx = np.asarray(idx)
    if idx.dtype not in (np.int64, np.int32):
        name = tensor_type(idx.dtype)
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                           f"Long, Int; but got {name} instead (while checking arguments for embedding)")
    if weight.ndim != 2:
        raise RuntimeError("'weight' must be 2-D")
    num, dim = weight.shape
    if idx.size and (idx.min() < 0 or idx.max() >= num):
        raise IndexError("index out of range in self")
    padding_idx = _padding_index(padding_idx, num)
    flat = idx.reshape(-1).astype(np.int64, copy=False)
    if max_norm is not None:
        _embedding_renorm_(weight, flat, float(max_norm), float(norm_type))
    w = weight._data
    res = _F._wrap(w[flat].reshape(idx.shape + (dim,)))
    if not _F._needs(weight):
        return res
    coef = np.ones(flat.size, w.dtype)
    if scale_grad_by_freq:
        coef /= np.bincount(flat, minlength=num)[flat]
    if padding_idx is not None:
        coef[flat == padding_idx] = 0
    return record(D.EMBEDDING, res, (weight,), (np.ascontiguousarray(flat), coef), (), [dim])


def _embedding_renorm_(weight, flat, max_norm, norm_type):
    """torch.embedding_renorm_: rows used whose norm exceeds max_norm are scaled to
    max_norm / (norm + 1e-7), in place and outside autograd (the weight's version moves)."""
    rows = np.unique(flat)
    if rows.size == 0:
        return
    w = weight._array()
    norms = np.linalg.norm(w[rows].astype(np.float64), ord=norm_type, axis=1)
    big = norms > max_norm
    if big.any():
        r = rows[big]
        w[r] *= (max_norm / (norms[big] + 1e-7)).astype(w.dtype)[:, None]
        weight._bump()


from jitgrad.nn.conv import conv2d, max_pool2d  # noqa: F401,E402
