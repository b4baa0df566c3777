"""Neural-network primitives: softmax / log_softmax, gelu, layer_norm, embedding, nll_loss,
convolution, max_pool2d and the padding gathers. Each entry sits below its forward; the
user-facing functions (argument handling, torch's error messages) are jitgrad/nn/functional.py
and jitgrad/nn/conv.py, which call these forwards.

Each forward computes through one `_<op>_data` function: the compiled host loops for
ndarrays, the CUDA kernel (gpu/kernels/nn.py, KERNELS["nn.<op>"]) for DeviceArrays. The
gradient rules are Tensor ops, so they run wherever their inputs are; the index arrays they
make are made where the data is (numpy's like=)."""
import math

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core.capture import stop as _stop
from jitgrad._core.messages import scalar_name, size_str, tensor_type, torch_size
from jitgrad.gpu.array import KERNELS as _KERNELS
from jitgrad.gpu.array import DeviceArray as _DeviceArray
from jitgrad.graph.record import record
from jitgrad.graph.spec import alias, elementwise, structural
from jitgrad.graph.tensor import Tensor, _wrap_dim
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.kernels.conv import conv_forward, k_conv, max_pool_forward
from jitgrad.kernels.forward_nn import (
    f_avg_pool,
    f_batch_norm,
    f_conv,
    f_embedding,
    f_layer_norm,
    f_log_softmax,
    f_max_pool2d,
    f_nll,
    f_softmax,
)
from jitgrad.kernels.loss import k_nll
from jitgrad.kernels.norm import (
    k_batch_norm,
    k_layer_norm,
    k_log_softmax_grad,
    k_softmax_grad,
    layer_norm_forward,
    norm_into,
    softmax_into,
)
from jitgrad.kernels.pool import avg_pool_into, k_avg_pool
from jitgrad.kernels.shape import k_embedding
from jitgrad.ops._common import _cap, _needs, traced
from jitgrad.ops.elementwise import _erf_array, _ew, exp, reciprocal, sqrt, to_dtype
from jitgrad.ops.linalg import _as_array, _like, _on_device, _same_device, matmul, transpose
from jitgrad.ops.reduce import mean, sum
from jitgrad.ops.shape import INDEX, INDEX_PUT, cat, expand, getitem, index_flat, index_put_flat, permute, reshape


def _record_with(spec, res, inputs, saved, fparams=(), iparams=None, reads=(), extra=()):
    """Record `spec` for grad. In a jitgrad.compile recording the forward instruction has
    the row's inputs and `reads` (tensors the forward reads that get no gradient edge:
    indices, targets), and `extra` outputs after the saved values (max_pool2d's indices)."""
    if not (reads or extra) or not (_cap.on and _cap.mine()):
        return record(spec, res, inputs, saved, fparams, iparams)
    _cap.on = False  # record() would report the row's inputs only
    try:
        out = record(spec, res, inputs, saved, fparams, iparams)
    finally:
        _cap.on = True
    return traced(spec, out, inputs + reads, saved, fparams, iparams, extra)


def _operand_tensor(x, arr=None):
    """x as a Tensor; Python data (a list, a numpy array: `arr` if given) becomes one, a
    constant of a jitgrad.compile plan."""
    if isinstance(x, Tensor):
        return x
    t = _wrap(np.asarray(x) if arr is None else arr)
    if _cap.on and _cap.mine():
        _cap.rec.constant_tensor(t)
    return t


def _index_tensor(x, arr=None):
    """_operand_tensor for indices: a Tensor of int64 or int32 (what the forward kernels read)."""
    t = _operand_tensor(x, arr)
    if _cap.on and t._data.dtype not in (np.int64, np.int32):
        _stop(f"indices of dtype {t._data.dtype}")
    return t


# --- softmax / log_softmax ------------------------------------------------------------------
def _groups(shape, dim):
    return [math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])]


def _normalise(spec, x, dim, dtype, log):
    """softmax / log_softmax along `dim`, with the loops jitgrad.compile's replay runs
    (kernels/norm.py: bitwise the same, and one compiled call instead of five numpy ones)."""
    if dtype is not None:
        x = to_dtype(x, dtype)
    d = x._data
    dim = _wrap_dim(dim, d.ndim)
    if d.dtype.kind != "f":  # torch has no int kernel (dtype= casts first)
        kernel = ("log_softmax" if log else "softmax") + ("_lastdim" if dim == max(d.ndim - 1, 0) else "")
        raise _dtype.not_implemented(kernel + "_kernel_impl", d.dtype)
    groups = _groups(d.shape or (1,), dim)
    out = _softmax_data(d, groups, log)
    res = _wrap(out)
    if not _needs(x):
        return traced(spec, res, (x,), (out,), (), spec.pack_ints(*groups, dim)) if _cap.on else res
    return record(spec, res, (x,), (out,), (), spec.pack_ints(*groups, dim))


def _softmax_data(d, groups, log):
    """softmax (log: log_softmax) of array d over groups = (outer, n, inner) around the dim."""
    if _on_device(d):
        return _KERNELS["nn.softmax"](d, groups, log)
    out = np.empty(d.shape, d.dtype)
    if d.size:
        softmax_into(np.ascontiguousarray(d).reshape(-1), *groups, out.reshape(-1), log)
    return out


def softmax(x, dim, dtype=None):
    return _normalise(SOFTMAX, x, dim, dtype, False)


def log_softmax(x, dim, dtype=None):
    return _normalise(LOG_SOFTMAX, x, dim, dtype, True)


def softmax_rule(grad, ri):
    dim = ri.iparams().dim
    y = ri.result(0)
    return (y * (grad - sum(grad * y, dim, keepdim=True)),)


def log_softmax_rule(grad, ri):
    dim = ri.iparams().dim
    y = ri.result(0)
    return (grad - exp(y) * sum(grad, dim, keepdim=True),)


def softmax_jvp(ci, tangents):
    """result * (t - sum(result * t, dim)), derivatives.yaml's result: formula."""
    (t,) = tangents
    dim = ci.iparams().dim
    y = ci.result
    return y * (t - sum(y * t, dim, keepdim=True))


def log_softmax_jvp(ci, tangents):
    """t - sum(softmax * t, dim), the softmax being exp(result)."""
    (t,) = tangents
    dim = ci.iparams().dim
    return t - sum(exp(ci.result) * t, dim, keepdim=True)


# iparams: the input as (outer, n, inner) around `dim`, and dim
SOFTMAX = structural("softmax", "SoftmaxBackward0", saves=("result",), rule=softmax_rule, kernel=k_softmax_grad,
                     iparams=("outer", "n", "inner", "dim"), forward=softmax, jvp=softmax_jvp, fwd_kernel=f_softmax)
LOG_SOFTMAX = structural("log_softmax", "LogSoftmaxBackward0", saves=("result",), rule=log_softmax_rule,
                         kernel=k_log_softmax_grad, iparams=("outer", "n", "inner", "dim"), forward=log_softmax,
                         jvp=log_softmax_jvp, fwd_kernel=f_log_softmax)


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
    return _ew(GELU, _gelu_data(x, approximate == "tanh"), input, p0=float(approximate == "tanh"))


def _gelu_data(x, tanh_form):
    if _on_device(x):  # one kernel generated from the spec's forward formula
        return _KERNELS["ew"](GELU.fwd, ("self",), (x,), x.dtype, (float(tanh_form),))
    if tanh_form:
        out = 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    else:
        out = 0.5 * x * (1.0 + _erf_array(x * _SQRT1_2))
    return np.asarray(out).astype(x.dtype, copy=False)


# p0: 0 for the exact form x * Phi(x), 1 for the tanh approximation; both as torch's GeluBackward0
# (0.7071... = 1/sqrt(2), 0.3989... = 1/sqrt(2 pi), 0.7978... = sqrt(2/pi), 0.044715 torch's kappa)
GELU = elementwise("gelu", "GeluBackward0",
                   "grad * (0.5 * (1.0 + erf(self * 0.7071067811865476)) + self * 0.3989422804014327 * "
                   "exp(-0.5 * self * self)) if p0 == 0.0 else "
                   "grad * (0.5 * (1.0 + tanh(0.7978845608028654 * (self + 0.044715 * self * self * self))) + "
                   "0.5 * self * (1.0 - tanh(0.7978845608028654 * (self + 0.044715 * self * self * self)) ** 2.0) * "
                   "0.7978845608028654 * (1.0 + 3.0 * 0.044715 * self * self))",
                   saves=("self",), fparams=("_approximate",), args=("self",), forward=gelu,
                   fwd="0.5 * self * (1.0 + erf(self * 0.7071067811865476)) if p0 == 0.0 else "
                       "0.5 * self * (1.0 + tanh(0.7978845608028654 * (self + 0.044715 * self * self * self)))")


# --- LayerNorm -------------------------------------------------------------------------------


def check_mixed_dtypes(dtype, *params):
    """torch's check (CPU) that a normalisation's weight, bias and running statistics have
    the input's dtype: its error for a float32 input with float64 parameters, and for any
    other mix."""
    dtypes = [p._data.dtype for p in params if p is not None]
    if any(d != dtype for d in dtypes):
        if any(d != np.float32 for d in dtypes):
            raise RuntimeError("mixed dtype (CPU): expect parameter to have scalar type of Float")
        raise RuntimeError("mixed dtype (CPU): all inputs must share same datatype.")


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
    check_mixed_dtypes(x.dtype, weight, bias)
    if x.dtype.kind != "f":
        raise NotImplementedError(f"\"LayerNormKernelImpl\" not implemented for '{scalar_name(x.dtype)}'")
    _same_device(x, *(None if p is None else p._data for p in (weight, bias)))
    k = int(np.prod(normalized_shape, dtype=np.int64))
    out, mean, rstd = _layer_norm_data(x, k, None if weight is None else weight._data,
                                       None if bias is None else bias._data, float(eps))
    res = _wrap(out.reshape(x.shape))
    inputs = (input, _ABSENT if weight is None else weight, _ABSENT if bias is None else bias)
    needs = _needs(*inputs)
    if not (needs or _cap.on):
        return res
    # x itself is saved (not a reshaped copy), so saved_tensors_hooks and _saved_self see the input
    saved = (x, mean, rstd) if weight is None else (x, mean, rstd, weight._data)
    ints = LAYER_NORM.pack_ints(k=k, has_w=weight is not None, has_b=bias is not None)
    if not needs:
        return traced(LAYER_NORM, res, inputs, saved, (float(eps),), ints)
    return record(LAYER_NORM, res, inputs, saved, (float(eps),), ints)


_ABSENT = _wrap(np.zeros(0))  # an input slot without a tensor: the node's next_functions entry is None


def _layer_norm_data(x, k, w, b, eps):
    """(out, mean, rstd) of array x over trailing groups of k; w, b: arrays or None."""
    if _on_device(x):
        return _KERNELS["nn.layer_norm"](x, k, w, b, eps)
    none = np.zeros(0, x.dtype)
    return layer_norm_forward(np.ascontiguousarray(x).reshape(-1, k),
                              none if w is None else np.ascontiguousarray(w).reshape(-1),
                              none if b is None else np.ascontiguousarray(b).reshape(-1),
                              w is not None, b is not None, eps)




def layer_norm_rule(grad, ri):
    """dx = rstd * (gy - mean(gy) - y * mean(gy * y)) per group of k with gy = grad * weight,
    dw = sum of grad * y, db = sum of grad; y and rstd are rebuilt from the saved input
    with Tensor ops, so that under create_graph the second derivative sees how they depend
    on x (the compiled kernel reads the saved values)."""
    k, has_w, has_b = ri.iparams()
    (eps,) = ri.floats(1)
    shape = ri.in_shape(0)
    rows = int(np.prod(shape, dtype=np.int64)) // k
    x = reshape(ri.saved_input(0, 0), (rows, k))
    c = x - mean(x, 1, keepdim=True)
    rstd = reciprocal(sqrt(mean(c * c, 1, keepdim=True) + eps))
    y = c * rstd
    g = reshape(grad, (rows, k))
    gy = g * reshape(ri.saved_input(3, 1), (k,)) if has_w else g
    dx = (gy - mean(gy, 1, keepdim=True) - y * mean(gy * y, 1, keepdim=True)) * rstd
    dw = reshape(sum(g * y, 0), ri.in_shape(1)) if has_w else None
    db = reshape(sum(g, 0), ri.in_shape(2)) if has_b else None
    return (reshape(dx, shape), dw, db)


def layer_norm_jvp(ci, tangents):
    """With y = (x - mean) * rstd per group of k: dy = rstd * (tc - y * mean(tc * y)) for the
    centred input tangent tc, and the output's tangent is dy * weight + y * t_weight + t_bias.
    When the input requires grad, y and rstd are rebuilt from it with Tensor ops, as in
    layer_norm_rule, so that a backward through the tangent sees how they depend on x;
    otherwise they are constants made from the saved mean and rstd."""
    tx, tw, tb = tangents
    if tx is None and tw is None:
        return tb  # at the normalized shape, which the output's trailing dims broadcast
    k, has_w, _ = ci.iparams()
    (eps,) = ci.floats(1)
    shape = ci.in_shape(0)
    rows = int(np.prod(shape, dtype=np.int64)) // k
    x = ci.input(0)
    if x._requires_grad:
        x = reshape(x, (rows, k))
        c = x - mean(x, 1, keepdim=True)
        rstd = reciprocal(sqrt(mean(c * c, 1, keepdim=True) + eps))
        y = c * rstd
    else:
        mu = ci.saved_named("result1")._data.reshape(rows, 1)
        r = ci.saved_named("result2")._data.reshape(rows, 1)
        rstd, y = _wrap(r), _wrap((x._data.reshape(rows, k) - mu) * r)
    out = None
    if tx is not None:
        tx = reshape(tx, (rows, k))
        tc = tx - mean(tx, 1, keepdim=True)
        out = (tc - y * mean(tc * y, 1, keepdim=True)) * rstd
        if has_w:
            out = out * reshape(ci.input(1), (k,))
    if tw is not None:
        part = y * reshape(tw, (k,))
        out = part if out is None else out + part
    if tb is not None:
        out = out + reshape(tb, (k,))
    return reshape(out, shape)


def _stat(ri, k):
    """Saved mean / rstd (torch's result1 / result2): the input's shape with the normalized
    dims as 1 (taken as the fewest trailing dims that hold k elements)."""
    shape = ri.in_shape(0)
    n = ri.iparams().k
    lead = len(shape)
    while lead > 0 and int(np.prod(shape[lead:], dtype=np.int64)) != n:
        lead -= 1
    rows = int(np.prod(shape[:lead], dtype=np.int64))
    return _wrap(_as_array(ri.saved(k, (rows,))).reshape(tuple(shape[:lead]) + (1,) * (len(shape) - lead)))


def _ln_weight(ri, k):
    return ri.saved_input(k, 1) if ri.iparams().has_w else None


# saved: the input, torch's result1 / result2 (mean, rstd per group) and the weight (when given)
LAYER_NORM = structural("layer_norm", "NativeLayerNormBackward0", args=("input", "weight", "bias"),
                        saves=("input", "result1", "result2", "weight"),
                        saved_as={"result1": _stat, "result2": _stat, "weight": _ln_weight},
                        rule=layer_norm_rule, kernel=k_layer_norm, iparams=("k", "has_w", "has_b"),
                        fparams=("_eps",), forward=layer_norm, jvp=layer_norm_jvp, fwd_kernel=f_layer_norm)


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
    idx = _as_array(input._data if isinstance(input, Tensor) else input)
    if idx.dtype not in (np.int64, np.int32):
        name = tensor_type(idx.dtype)
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                           f"Long, Int; but got {name} instead (while checking arguments for embedding)")
    if weight.ndim != 2:
        raise RuntimeError("'weight' must be 2-D")
    num, dim = weight.shape
    device = _same_device(weight._data, idx)
    if num == 0 and idx.size:
        raise RuntimeError("index_select(): self indexing axis dim should be positive")
    if not device and idx.size and (idx.min() < 0 or idx.max() >= num):  # the device kernel checks its reads
        raise IndexError("index out of range in self")
    padding_idx = _padding_index(padding_idx, num)
    flat = idx.reshape(-1).astype(np.int64, copy=False)
    if max_norm is not None:
        _stop("embedding(max_norm=...) renormalises the weight in place")
        _embedding_renorm_(weight, flat, float(max_norm), float(norm_type))
    needs = _needs(weight)
    rows, flat, coef = _embedding_data(weight._data, flat, padding_idx, scale_grad_by_freq, needs or _cap.on)
    res = _wrap(rows.reshape(idx.shape + (dim,)))
    if not (needs or _cap.on):
        return res
    saved = (flat, coef)
    ints = EMBEDDING.pack_ints(dim=dim, padding_idx=-1 if padding_idx is None else padding_idx,
                               freq=bool(scale_grad_by_freq))
    reads = (_operand_tensor(input, idx),)
    if not needs:
        return traced(EMBEDDING, res, (weight,) + reads, saved, (), ints)
    return _record_with(EMBEDDING, res, (weight,), saved, (), ints, reads)


def _embedding_data(w, flat, padding_idx, freq, want_coef):
    """(w's rows at flat indices, (n, dim); the indices, contiguous; per index its gradient's
    coefficient, None unless want_coef)."""
    if _on_device(w):
        return _KERNELS["nn.embedding"](w, flat, padding_idx, freq, w.dtype if want_coef else None)
    rows = w[flat]
    if not want_coef:
        return rows, flat, None
    coef = np.ones(flat.size, w.dtype)
    if freq:
        coef /= np.bincount(flat, minlength=w.shape[0])[flat]
    if padding_idx is not None:
        coef[flat == padding_idx] = 0
    return rows, np.ascontiguousarray(flat), coef


def _embedding_renorm_(weight, flat, max_norm, norm_type):
    """torch.embedding_renorm_: rows used whose norm exceeds max_norm are scaled to
    max_norm / (norm + 1e-7), in place and outside autograd (the weight's version moves)."""
    if _on_device(weight._data):
        _KERNELS["nn.embedding_renorm_"](weight._data, flat, max_norm, norm_type)
        weight._bump()
        return
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


def embedding_rule(grad, ri):
    """d weight[idx[j]] += coef[j] * grad[j] (coef: 0 on padding_idx, 1/count of the index
    with scale_grad_by_freq, else 1), as a scatter-add Tensor op.
    As in torch, the counts are not part of the derivative of this backward (torch's
    embedding_dense_double_backward masks the padding row only), so they are applied as
    a constant offset rather than as a recorded multiply."""
    dim, _, freq = ri.iparams()
    idx = _as_array(ri.saved(0, None)).reshape(-1)
    n = idx.size
    coef = _as_array(ri.saved(1, (n,))).reshape(n)
    used = coef != 0
    mask = _wrap(used.astype(coef.dtype).reshape(n, 1))
    g = reshape(reshape(grad, (n, dim)) * mask, (-1,))
    flat = (idx[:, None] * dim + np.arange(dim, dtype=np.int64, **_like(idx))).reshape(-1)
    gw = index_put_flat(g, flat, ri.in_shape(0))
    if not freq:
        return (gw,)
    scale = np.ones((ri.in_shape(0)[0], 1), coef.dtype, **_like(coef))
    scale[idx, 0] = np.where(used, coef, 1)  # 1/count of each row used (a row's entries agree)
    return (gw + _wrap(gw._data * scale - gw._data),)


def _indices(ri, k):
    """torch's _saved_indices: the index tensor, at its own shape."""
    return _wrap(_as_array(ri.saved(k, None)).reshape(ri.out_shape()[:-1]))


def embedding_jvp(ci, tangents):
    """The rows of the weight's tangent that the indices pick (torch: embedding(weight_t,
    indices, ...)), recorded as the same node, so that a backward through the tangent
    keeps padding_idx and scale_grad_by_freq."""
    (tw,) = tangents
    flat, coef = ci.saved_named("indices")._data, ci.saved_named("_coef")._data
    res = _wrap(tw._data[flat].reshape(ci.out_shape()))
    if not _needs(tw):
        return res
    return record(EMBEDDING, res, (tw,), (flat, coef), (), ci.ints())


# saved: the indices (flat, int64) and per index its gradient's coefficient (0 at padding_idx,
# 1/count with scale_grad_by_freq), which torch recomputes instead of saving; iparams: the row
# length, and what the coefficients are made from (padding_idx, -1 for none; scale_grad_by_freq)
EMBEDDING = structural("embedding", "EmbeddingBackward0", args=("weight",), saves=("indices", "_coef"),
                       index_saves=("indices",), saved_as={"indices": _indices}, rule=embedding_rule,
                       kernel=k_embedding, iparams=("dim", "padding_idx", "freq"), forward=embedding,
                       jvp=embedding_jvp, fwd_kernel=f_embedding)


# --- binary_cross_entropy: its elementwise loss (reduction and weight are applied after it) ---
def _bce_data(x, t):
    # torch's: (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100); the clamp keeps a probability
    # of 0 or 1 finite, and log(0)'s divide-by-zero is expected there, not a warning for the user
    with np.errstate(divide="ignore"):
        return (t - 1.0) * np.maximum(np.log1p(-x), -100.0) - t * np.maximum(np.log(x), -100.0)


def binary_cross_entropy_elementwise(input, target):
    """binary_cross_entropy with reduction="none", no weight: one BinaryCrossEntropyBackward0
    node. Its input gradient is torch's (x - t) / max(x (1 - x), eps), finite at a probability
    of 0 or 1 where the clamped logs' own derivative is not; the target's is -logit(x)."""
    xd, td = input._data, target._data
    dt = _dtype.result_type(xd, td)
    out = _bce_data(xd if xd.dtype == dt else xd.astype(dt), td if td.dtype == dt else td.astype(dt))
    return _ew(BINARY_CROSS_ENTROPY, out.astype(dt, copy=False), input, target)


# 9.999999960041972e-13: torch's EPSILON, the float 1e-12, also for double
BINARY_CROSS_ENTROPY = elementwise(
    "binary_cross_entropy", "BinaryCrossEntropyBackward0",
    "grad * (self - target) / where(self * (1.0 - self) < 9.999999960041972e-13, 9.999999960041972e-13, "
    "self * (1.0 - self))",
    "grad * (log(1.0 - self) - log(self))",  # -logit(self); its derivative is torch's, -inf at 0 and 1
    saves=("self", "target"), args=("self", "target"), forward=binary_cross_entropy_elementwise,
    fwd="(target - 1.0) * fmax(log1p(-self), -100.0) - target * fmax(log(self), -100.0)")


# --- nll_loss --------------------------------------------------------------------------------
def _reduce(loss, reduction, count=None):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean() if count is None else loss.sum() / count
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _legacy_reduction(size_average, reduce, reduction):
    # torch's deprecated size_average/reduce flags still decide the reduction when given
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "none" if not reduce else ("mean" if size_average else "sum")


def _targets(target):
    t = target._data if isinstance(target, Tensor) else target
    return t.astype(np.int64, copy=False) if _on_device(t) else np.asarray(t, dtype=np.int64)


def check_nll_args(input, target, weight):
    """torch's checks of nll_loss's arguments, in torch's order (nll_loss_nd, then nll_loss or
    nll_loss2d): dims, batch, target shape, target dtype, weight size."""
    shape, tshape = tuple(input.shape), tuple(target.shape)
    if not shape:
        raise ValueError("Expected 1 or more dimensions (got 0)")
    if len(shape) != 1 and (len(tshape) < 1 or shape[0] != tshape[0]):
        raise ValueError(f"Expected input batch_size ({shape[0]}) to match target batch_size "
                         f"({tshape[0] if tshape else 0}).")
    c = shape[0] if len(shape) == 1 else shape[1]
    if len(shape) == 4:
        if len(tshape) != 3:
            raise RuntimeError(f"only batches of spatial targets supported (3D tensors) but got targets of dimension: "
                               f"{len(tshape)}")
        if tshape != shape[:1] + shape[2:]:
            raise RuntimeError(f"size mismatch (got input: {size_str(shape)} , target: {size_str(tshape)}")
    elif len(shape) > 2:
        if tshape[1:] != shape[2:]:
            raise RuntimeError(f"Expected target size {size_str(shape[:1] + shape[2:])}, got {size_str(tshape)}")
    elif len(tshape) > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    elif len(shape) == 1 and tshape not in ((), (1,)):
        raise ValueError(f"For 1D input, 1D target must have size 1, but got target size: {tshape[0]}")
    tdtype = target._data.dtype if isinstance(target, Tensor) else getattr(target, "dtype", None)  # device arrays
    tdtype = np.asarray(target).dtype if tdtype is None else tdtype
    if tdtype not in (np.int64, np.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {scalar_name(tdtype)}")
    if weight is not None and (weight.ndim != 1 or weight.shape[0] != c):
        raise RuntimeError("weight tensor should be defined either for all or no classes" if len(shape) > 2 else
                           f"weight tensor should be defined either for all {c} classes or no classes but got "
                           f"weight tensor of shape: {size_str(weight.shape)}")


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """-weight[t] * input[n, t] with t = target[n]; ignored targets contribute nothing and,
    for the mean, the sum is divided by the total weight of the targets that count."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if input._data.dtype.kind != "f":
        raise _dtype.not_implemented("nll_loss_out_frame", input._data.dtype)
    check_nll_args(input, target, weight)
    if isinstance(weight, Tensor) and weight._data.dtype != input._data.dtype:  # torch casts nothing here
        raise RuntimeError(f"expected scalar type {scalar_name(input._data.dtype)} but found "
                           f"{scalar_name(weight._data.dtype)}")
    if input.ndim > 2:                                # (N, C, d1, ...): each position is a sample
        c = input.shape[1]
        out = nll_loss(input.movedim(1, -1).reshape(-1, c), target.reshape(-1), weight, None, ignore_index, None,
                       reduction)
        return out.reshape(tuple(target.shape)) if reduction == "none" else out
    t = _targets(target)
    if input.ndim == 1:                               # one sample: (C,) input, () or (1,) target
        t1 = _index_tensor(target, t).reshape(1) if _cap.on else t.reshape(1)
        out = nll_loss(input.unsqueeze(0), t1, weight, None, ignore_index, None, reduction)
        return out.reshape(tuple(t.shape)) if reduction == "none" else out
    x = input._data
    cw = None if weight is None else _as_array(weight._data if isinstance(weight, Tensor) else weight)
    _same_device(x, t, cw)
    out, coef, safe = _nll_data(x, t, cw, ignore_index, reduction)
    res = _wrap(out)
    needs = _needs(input)
    if not (needs or _cap.on):
        return res
    saved = (safe, coef)
    ints = NLL_LOSS.pack_ints(ncls=x.shape[1], per_row=reduction == "none", mean=reduction == "mean",
                              ignore_index=ignore_index)
    reads = (_index_tensor(target, t),)
    if weight is not None:
        reads += (_operand_tensor(weight),)
        if reads[-1]._data.dtype != x.dtype:
            _stop(f"nll_loss with a {reads[-1]._data.dtype} weight for {x.dtype} input")
    if not needs:
        return traced(NLL_LOSS, res, (input,) + reads, saved, (), ints)
    # one node, as torch's NllLossBackward0: its kernel scatters -grad * coef to the targets
    return _record_with(NLL_LOSS, res, (input,), saved, (), ints, reads)


def _nll_data(x, t, cw, ignore_index, reduction):
    """(loss, per-sample gradient coefficient: class weight, ignore mask and 1/total, targets
    with the ignored ones as 0) of array x (N, C), targets t and class weights cw (or None)."""
    if _on_device(x):
        return _KERNELS["nn.nll_loss"](x, t, cw, ignore_index, reduction)
    if cw is None and reduction == "mean" and t.ndim == 1 and t.size:
        lo, hi = t.min(), t.max()
        if 0 <= lo and hi < x.shape[1] and not lo <= ignore_index <= hi:
            # every target counts and is in range (a training batch): the general path's
            # values without its masks (w is all ones, x * 1 is x, the total is n)
            n = t.shape[0]
            w = np.ones(n, x.dtype)
            total = w.sum()
            with np.errstate(divide="ignore", invalid="ignore"):
                out = np.asarray((-x[np.arange(n), t]).sum() / total, dtype=x.dtype)
            return out, w / total, t.copy()
    valid = t != ignore_index
    safe = np.where(valid, t, 0)
    if valid.any() and (safe.min() < 0 or safe.max() >= x.shape[1]):
        raise IndexError(f"Target {int(safe.max() if safe.max() >= x.shape[1] else safe.min())} "
                         "is out of bounds.")
    w = valid.astype(x.dtype)
    if cw is not None:
        w = (w * cw[safe]).astype(x.dtype, copy=False)
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
    return out, coef.astype(x.dtype, copy=False), np.ascontiguousarray(safe)


def nll_rule(grad, ri):
    """d input[n, target[n]] = -grad * weight[n] (grad is one value unless reduction='none';
    the saved weight already holds the class weight, the ignore mask and the 1/total)."""
    ncls, per_row = ri.iparams()[:2]
    shape = ri.in_shape(0)
    n = shape[0]
    target = _as_array(ri.saved(0, None)).reshape(n)
    coef = _wrap(_as_array(ri.saved(1, (n,))).reshape(n))
    g = grad if per_row else expand(reshape(grad, (1,)), (n,))
    return (index_put_flat(-(g * coef), np.arange(n, dtype=np.int64, **_like(target)) * ncls + target, shape),)


def _target(ri, k):
    return _wrap(_as_array(ri.saved(k, None)).reshape(ri.in_shape(0)[:1]))


def nll_jvp(ci, tangents):
    """Linear in the input: the same loss of the tangent, -coef[n] * t[n, target[n]] (summed
    unless reduction='none'; coef holds the class weight, the ignore mask and 1/total)."""
    (t,) = tangents
    ncls, per_row = ci.iparams()[:2]
    n = ci.in_shape(0)[0]
    target = ci.saved_named("target")._data.reshape(n)
    picked = index_flat(t, np.arange(n, dtype=np.int64, **_like(target)) * ncls + target, (n,), INDEX)
    losses = -(picked * ci.saved_named("_coef"))
    return losses if per_row else sum(losses)


# saved: the target (ignored ones as 0) and per sample the gradient's coefficient (class
# weight, ignore mask and 1/total), where torch saves self, weight and total_weight; iparams:
# the classes, reduction 'none' (per_row) or 'mean', and ignore_index (the forward kernel's)
NLL_LOSS = structural("nll_loss", "NllLossBackward0", saves=("target", "_coef"), index_saves=("target",),
                      saved_as={"target": _target}, rule=nll_rule, kernel=k_nll,
                      iparams=("ncls", "per_row", "mean", "ignore_index"), forward=nll_loss, jvp=nll_jvp,
                      fwd_kernel=f_nll)


# --- convolution -----------------------------------------------------------------------------


def convolution(input, weight, bias, stride, pads, dilation, groups):
    """The ConvolutionBackward0 primitive on batched input: compiled forward (kernels/conv.py)
    and one row whose kernel (kernels/conv.py, k_conv) computes all three gradients."""
    x, w = input._data, weight._data
    _same_device(x, w, None if bias is None else bias._data)
    n, c, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    pt, pb, pl, pr = pads
    ho = (h + pt + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    geom = np.array([n, c, h, wd, cout, cg, kh, kw, stride[0], stride[1], pt, pl, dilation[0], dilation[1],
                     groups, ho, wo], np.int64)
    out = _conv_data(x, w, None if bias is None else bias._data, geom)
    res = _wrap(out.reshape(n, cout, ho, wo))
    inputs = (input, weight) if bias is None else (input, weight, bias)
    if not _needs(*inputs):
        return traced(CONVOLUTION, res, inputs, (x, w), (), CONVOLUTION.pack_ints(*geom.tolist())) if _cap.on else res
    return record(CONVOLUTION, res, inputs, (x, w), (), CONVOLUTION.pack_ints(*geom.tolist()))


def _conv_data(x, w, b, geom):
    """The convolution of arrays x, w (b: the bias, or None) for the geometry."""
    if _on_device(x):
        return _KERNELS["nn.conv2d"](x, w, b, geom)
    return conv_forward(np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(w).reshape(-1),
                        np.ascontiguousarray(b if b is not None else np.zeros(0, x.dtype)), b is not None, geom)


def conv_rule(grad, ri):
    """ConvolutionBackward0 from Tensor ops, so that create_graph records a differentiable
    backward: im2col is a gather (an IndexBackward0 node) from the flattened input with
    one zero appended, which every padding position reads; the rest is matmuls."""
    geom = ri.iparams()
    n, c, h, w, cout, cg, kh, kw, _, _, _, _, _, _, groups, ho, wo = geom
    x = ri.saved_input(0, 0)
    wt = ri.saved_input(1, 1)
    idx = conv_gather_index(geom, x._data)                         # (G, K, N*L)
    xz = cat([reshape(x, (-1,)), _wrap(np.zeros(1, x._data.dtype, **_like(x._data)))], 0)
    cols = index_flat(xz, idx.reshape(-1), idx.shape, INDEX)
    m = cout // groups
    # grad (N, Cout, Ho, Wo) -> (G, M, N*L), the columns' layout
    gmat = reshape(permute(reshape(grad, (n, groups, m, ho * wo)), (1, 2, 0, 3)), (groups, m, n * ho * wo))
    wmat = reshape(wt, (groups, m, cg * kh * kw))
    gw = reshape(matmul(gmat, transpose(cols, -1, -2)), tuple(wt.shape))
    gcols = matmul(transpose(wmat, -1, -2), gmat)
    gxz = index_put_flat(reshape(gcols, (-1,)), idx.reshape(-1), (n * c * h * w + 1,))
    gx = reshape(getitem(gxz, slice(0, n * c * h * w)), (n, c, h, w))
    gb = sum(grad, (0, 2, 3)) if ri.n_inputs() == 3 else None
    return (gx, gw) if gb is None else (gx, gw, gb)


def conv_gather_index(geom, data=None):
    """For each column entry (group, (c, i, j), (sample, oh, ow)), the flat input index it
    reads, or N*C*H*W (the appended zero) where it falls in the padding; on the device when
    the input's array `data` is there."""
    if _on_device(data):
        return _KERNELS["nn.conv_gather_index"](geom)
    n, c, h, w, _, cg, kh, kw, sh, sw, pt, pl, dh, dw, groups, ho, wo = (int(v) for v in geom)
    grp, ch, i, j, s, oh, ow = np.ix_(*(np.arange(d) for d in (groups, cg, kh, kw, n, ho, wo)))
    ih = oh * sh - pt + i * dh
    iw = ow * sw - pl + j * dw
    flat = ((s * c + grp * cg + ch) * h + ih) * w + iw
    inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)
    return np.where(inside, flat, n * c * h * w).reshape(groups, cg * kh * kw, n * ho * wo)


def conv_jvp(ci, tangents):
    """Linear in each input: conv(t_x, w) + conv(x, t_w) + t_b over the channels. The
    geometry keeps the top / left padding only; the bottom / right one is taken as what
    gives the same output size (any such value computes the same output)."""
    n, c, h, w, cout, cg, kh, kw, sh, sw, pt, pl, dh, dw, groups, ho, wo = ci.iparams()
    pads = (pt, (ho - 1) * sh + dh * (kh - 1) + 1 - h - pt, pl, (wo - 1) * sw + dw * (kw - 1) + 1 - w - pl)
    geometry = ((sh, sw), pads, (dh, dw), groups)
    tx, tw = tangents[:2]
    out = None if tx is None else convolution(tx, ci.input(1), None, *geometry)
    if tw is not None:
        part = convolution(ci.input(0), tw, None, *geometry)
        out = part if out is None else out + part
    tb = tangents[2] if len(tangents) == 3 else None
    if tb is not None:
        part = reshape(tb, (cout, 1, 1))
        out = part if out is None else out + part
    return out


# iparams: the geometry (kernels/conv.py reads the same 17 numbers)
CONVOLUTION = structural("convolution", "ConvolutionBackward0", args=("input", "weight", "bias"),
                         saves=("input", "weight"), rule=conv_rule, kernel=k_conv,
                         iparams=("n", "c", "h", "w", "cout", "cg", "kh", "kw", "sh", "sw", "pt", "pl", "dh", "dw",
                                  "groups", "ho", "wo"), forward=convolution, jvp=conv_jvp, fwd_kernel=f_conv)


# --- max_pool2d and the padding modes: gathers (indexing's primitive) under torch's names ----
def _max_pool2d_with_indices(input, kernel, stride, padding, dilation, out_size):
    """(values, indices), indices flat within each (H, W) plane as PyTorch's. The node is
    a scatter of the gradient to the argmax positions (the kernel max(dim) uses), so it
    saves the argmax as indices into the whole input."""
    x = input._data
    h, w = x.shape[-2:]
    planes = x.size // (h * w)
    (ho, wo) = out_size
    pgeom = np.array([planes, h, w, *kernel, *stride, *padding, *dilation, ho, wo], np.int64)
    out, arg, flat = _max_pool_data(x, pgeom)
    shape = x.shape[:-2] + (ho, wo)
    indices = _wrap(arg.reshape(shape))
    res = _wrap(out.reshape(shape))
    needs = _needs(input)
    if not (needs or _cap.on):
        return res, indices
    if flat is None:
        flat = arg + np.repeat(np.arange(planes, dtype=np.int64) * (h * w), ho * wo)
    if not needs:
        return traced(MAX_POOL2D, res, (input,), (flat,), (), pgeom.tolist(), (indices,)), indices
    return _record_with(MAX_POOL2D, res, (input,), (flat,), (), pgeom.tolist(), extra=(indices,)), indices


def _max_pool_data(x, pgeom):
    """(values, argmax within each plane, argmax within the input: None on the host, where
    it is made only for a recorded node), flat."""
    if _on_device(x):
        return _KERNELS["nn.max_pool2d"](x, pgeom)
    return (*max_pool_forward(np.ascontiguousarray(x).reshape(-1), pgeom), None)


def _gather_jvp(spec):
    """A gather is linear: its tangent is the same gather of the input's tangent, recorded
    as `spec` (torch: a gather for max_pool2d, the padding op itself for the paddings)."""
    def jvp(ci, tangents):
        return index_flat(tangents[0], ci.saved_named("_flat_index")._data, ci.out_shape(), spec)
    return jvp


# iparams (unused by the backward, a scatter to the saved argmax): the pooling geometry the
# forward kernel reads, kernels/conv.py's pgeom
MAX_POOL2D = alias("max_pool2d", INDEX, "MaxPool2DWithIndicesBackward0", forward=_max_pool2d_with_indices,
                   jvp=_gather_jvp(INDEX), fwd_kernel=f_max_pool2d,
                   iparams=("planes", "h", "w", "kh", "kw", "sh", "sw", "ph", "pw", "dh", "dw", "ho", "wo"))


def _pad_source(n, lo, hi, mode):
    """For each position of a dimension of size n padded by (lo, hi), where it reads from."""
    i = np.arange(-lo, n + hi)
    if mode == "reflect":
        i = np.abs(i)
        return np.where(i >= n, 2 * (n - 1) - i, i)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    return i % n  # circular


# Conv2d's padding modes
REFLECTION_PAD2D = alias("reflection_pad2d", INDEX, "ReflectionPad2DBackward0", consts=("_flat_index",))
REPLICATION_PAD2D = alias("replication_pad2d", INDEX, "ReplicationPad2DBackward0", consts=("_flat_index",))
REFLECTION_PAD2D.jvp = _gather_jvp(REFLECTION_PAD2D)
REPLICATION_PAD2D.jvp = _gather_jvp(REPLICATION_PAD2D)
_PAD_SPEC = {"reflect": REFLECTION_PAD2D, "replicate": REPLICATION_PAD2D, "circular": INDEX}
# F.pad's other dims (nn/padding.py): the same gathers under torch's names, and constant
# padding as the scatter of the input into the padded shape
REFLECTION_PAD1D = alias("reflection_pad1d", INDEX, "ReflectionPad1DBackward0", consts=("_flat_index",))
REPLICATION_PAD1D = alias("replication_pad1d", INDEX, "ReplicationPad1DBackward0", consts=("_flat_index",))
REFLECTION_PAD3D = alias("reflection_pad3d", INDEX, "ReflectionPad3DBackward0", consts=("_flat_index",))
REPLICATION_PAD3D = alias("replication_pad3d", INDEX, "ReplicationPad3DBackward0", consts=("_flat_index",))
CONSTANT_PAD_ND = alias("constant_pad_nd", INDEX_PUT, "ConstantPadNdBackward0", consts=("_flat_index",))
PAD_SPECS = {("reflect", 1): REFLECTION_PAD1D, ("reflect", 2): REFLECTION_PAD2D, ("reflect", 3): REFLECTION_PAD3D,
             ("replicate", 1): REPLICATION_PAD1D, ("replicate", 2): REPLICATION_PAD2D,
             ("replicate", 3): REPLICATION_PAD3D}


def _pad2d(x, pads, mode):
    """The last two dims of x padded by pads = (top, bottom, left, right) in a non-zero
    padding mode: a gather from the input (its gradient scatter-adds back), recorded under
    torch's node name (circular, which torch builds from copies, records IndexBackward0)."""
    shape = tuple(x.shape)
    h, w = shape[-2:]
    pt, pb, pl, pr = pads
    if mode == "reflect":
        # torch checks the width first; its messages number the pads as arguments #4 and #6
        for arg, dim, (lo, hi), size in ((4, len(shape) - 1, (pl, pr), w), (6, len(shape) - 2, (pt, pb), h)):
            if lo >= size or hi >= size:
                raise RuntimeError(f"Argument #{arg}: Padding size should be less than the corresponding input "
                                   f"dimension, but got: padding ({lo}, {hi}) at dimension {dim} of input {size_str(shape)}")
    if mode == "circular" and max(pt, pb) > h or mode == "circular" and max(pl, pr) > w:
        raise RuntimeError("Padding value causes wrapping around more than once.")
    rows, cols = _pad_source(h, pt, pb, mode), _pad_source(w, pl, pr, mode)
    planes = int(np.prod(shape[:-2], dtype=np.int64))
    idx = (np.arange(planes)[:, None, None] * (h * w) + rows[None, :, None] * w + cols[None, None, :]).reshape(-1)
    if _on_device(x._data):  # the gather reads where the data is
        idx = _DeviceArray.from_host(idx)
    out_shape = shape[:-2] + (rows.size, cols.size)
    return index_flat(x, idx, out_shape, _PAD_SPEC[mode])


REFLECTION_PAD2D.forward = REPLICATION_PAD2D.forward = _pad2d


# --- batch norm and group norm: one primitive layout, two PyTorch nodes --------------------------
# The input is taken as (n, c, s), s the product of the spatial dims; its channels fall in
# `groups` groups of c // groups. A statistic (mean, rstd) covers one group over all
# samples (batch norm, groups = c) or one group of one sample (group norm, per_sample).
# The statistics come from the input (train) or are given (batch norm's eval: the
# running mean and 1 / sqrt(running var + eps)); weight and bias are per channel.
def _norm_data(x, n, c, groups, per_sample, w, b, running, eps):
    """(out, mean, rstd, biased variance or None) of array x as (n, c, s): the statistics per
    group from x, or (running: (mean, var) arrays) from the running ones (batch norm's eval);
    w, b: arrays or None. The host runs the loops jitgrad.compile's replay runs
    (kernels/norm.py); the device, the same arithmetic in numpy calls on its arrays."""
    s = x.size // (n * c) if n * c else 0
    cg = c // groups
    nstat = groups * (n if per_sample else 1)
    if _on_device(x):
        x4 = x.reshape(n, groups, cg, s)
        var = None
        if running is None:
            axes = (2, 3) if per_sample else (0, 2, 3)
            mu = x4.mean(axis=axes, keepdims=True)
            d = x4 - mu
            var = (d * d).mean(axis=axes, keepdims=True)
            rstd = 1.0 / np.sqrt(var + eps)
        else:
            mu = running[0].reshape(1, groups, 1, 1).astype(x.dtype)
            rstd = (1.0 / np.sqrt(running[1].astype(np.float64) + eps)).reshape(1, groups, 1, 1).astype(x.dtype)
        y = (x4 - mu) * rstd
        if w is not None:
            y = y * w.reshape(1, groups, cg, 1)
        if b is not None:
            y = y + b.reshape(1, groups, cg, 1)
        return (y.astype(x.dtype).reshape(x.shape), mu.reshape(-1).astype(x.dtype),
                rstd.reshape(-1).astype(x.dtype), None if var is None else var.reshape(-1))
    out = np.empty(x.shape, x.dtype)
    mean, rstd, var = np.empty(nstat, x.dtype), np.empty(nstat, x.dtype), np.empty(nstat)
    none = np.zeros(0, x.dtype)
    rm, rv = (none, none) if running is None else (np.ascontiguousarray(a).reshape(-1) for a in running)
    norm_into(np.ascontiguousarray(x).reshape(-1), n, c, s, groups, per_sample, running is None,
              none if w is None else np.ascontiguousarray(w).reshape(-1),
              none if b is None else np.ascontiguousarray(b).reshape(-1), w is not None, b is not None,
              rm, rv, float(eps), out.reshape(-1), mean, rstd, var)
    return out, mean, rstd, None if running is not None else var


def _normalize(spec, input, weight, bias, n, c, groups, per_sample, eps, running=None):
    """Record `spec` (NativeBatchNormBackward0 / NativeGroupNormBackward0) for the normalisation
    of `input` as (n, c, s); running: None (statistics from the input), or the running
    (mean, var) Tensors. Returns (the result, (the mean, the biased variance) per
    statistic, None for given statistics), which batch norm's running statistics take."""
    x = input._data
    if spec is not BATCH_NORM:  # batch_norm checks (its running statistics too) after the dtype
        check_mixed_dtypes(x.dtype, weight, bias)
    if x.dtype.kind != "f":
        name = "batch_norm" if spec is BATCH_NORM else "GroupNormKernelImpl"
        raise NotImplementedError(f"\"{name}\" not implemented for '{scalar_name(x.dtype)}'")
    _same_device(x, *(None if p is None else p._data for p in (weight, bias)))
    out, mean_, rstd_, var = _norm_data(x, n, c, groups, per_sample, None if weight is None else weight._data,
                                        None if bias is None else bias._data,
                                        None if running is None else tuple(t._data for t in running), eps)
    res = _wrap(out)
    inputs = (input, _ABSENT if weight is None else weight, _ABSENT if bias is None else bias)
    needs = _needs(*inputs)
    if needs or _cap.on:
        saved = (x, mean_, rstd_) if weight is None else (x, mean_, rstd_, weight._data)
        s = x.size // (n * c) if n * c else 0
        ints = spec.pack_ints(n=n, c=c, s=s, groups=groups, per_sample=per_sample, train=running is None,
                              has_w=weight is not None, has_b=bias is not None)
        # eval: the forward reads the running statistics (no gradient edge: they are buffers)
        reads = () if running is None else tuple(running)
        if _cap.on and any(t._data.dtype != x.dtype for t in reads):
            _stop(f"batch_norm with {reads[0]._data.dtype} running statistics for {x.dtype} input")
        res = _record_with(spec, res, inputs, saved, (float(eps),), ints, reads) if needs else \
            traced(spec, res, inputs + reads, saved, (float(eps),), ints)
    return res, None if var is None else (mean_, var)


def _norm_view(t, ints):
    """t (the input's shape, or the gradient's) as (n, groups, c // groups, s), and the dims
    a statistic covers."""
    n, c, s, groups, per_sample = ints[:5]
    return reshape(t, (n, groups, c // groups, s)), ((2, 3) if per_sample else (0, 2, 3))


def _norm_y(x4, axes, ints, eps, saved_stats):
    """(y, rstd): the normalised input and rstd as Tensors over the (n, groups, cg, s) view.
    Statistics from the input are rebuilt from it with Tensor ops, so that under
    create_graph the second derivative sees how they depend on it; given ones (eval) are
    constants, read from the saved values."""
    if ints.train:
        c = x4 - mean(x4, axes, keepdim=True)
        rstd = reciprocal(sqrt(mean(c * c, axes, keepdim=True) + eps))
        return c * rstd, rstd
    groups = ints.groups
    mu, rstd = (_wrap(_as_array(a).reshape(1, groups, 1, 1)) for a in saved_stats())
    return (x4 - mu) * rstd, rstd


def _per_channel(t, ints):
    """A per-channel Tensor (c,) broadcast over the (n, groups, cg, s) view."""
    return reshape(t, (1, ints.groups, ints.c // ints.groups, 1))


def norm_rule(grad, ri):
    """dx = rstd * (gy - mean(gy) - y * mean(gy * y)) per statistic with gy = grad * weight
    (rstd * gy for given statistics), dw = sum of grad * y, db = sum of grad per channel."""
    ints = ri.iparams()
    (eps,) = ri.floats(1)
    k = ri.spec().saves
    x4, axes = _norm_view(ri.saved_input(0, 0), ints)
    nstat = ints.groups * (ints.n if ints.per_sample else 1)
    y, rstd = _norm_y(x4, axes, ints, eps, lambda: (ri.saved(1, (nstat,)), ri.saved(2, (nstat,))))
    g, _ = _norm_view(grad, ints)
    gy = g * _per_channel(ri.saved_input(k.index("weight"), 1), ints) if ints.has_w else g
    if ints.train:
        dx = (gy - mean(gy, axes, keepdim=True) - y * mean(gy * y, axes, keepdim=True)) * rstd
    else:
        dx = gy * rstd
    dw = reshape(sum(g * y, (0, 3)), ri.in_shape(1)) if ints.has_w else None
    db = reshape(sum(g, (0, 3)), ri.in_shape(2)) if ints.has_b else None
    return (reshape(dx, ri.in_shape(0)), dw, db)


def norm_jvp(ci, tangents):
    """dy * weight + y * t_weight + t_bias, with dy = rstd * (tc - y * mean(tc * y)) for the
    input's tangent centred per statistic tc (rstd * t_x for given statistics)."""
    tx, tw, tb = tangents
    ints = ci.iparams()
    (eps,) = ci.floats(1)
    shape = ci.in_shape(0)
    x4, axes = _norm_view(ci.input(0), ints)
    y, rstd = _norm_y(x4, axes, ints, eps,
                      lambda: (ci.saved_named("result1")._data, ci.saved_named("result2")._data))
    out = None
    if tx is not None:
        t4, _ = _norm_view(tx, ints)
        if ints.train:
            tc = t4 - mean(t4, axes, keepdim=True)
            out = (tc - y * mean(tc * y, axes, keepdim=True)) * rstd
        else:
            out = t4 * rstd
        if ints.has_w:
            out = out * _per_channel(ci.input(1), ints)
    if tw is not None:
        part = y * _per_channel(tw, ints)
        out = part if out is None else out + part
    if tb is not None:
        part = expand(_per_channel(tb, ints), tuple(x4.shape))
        out = part if out is None else out + part
    return reshape(out, shape)


def _norm_stat(ri, k):
    """Saved mean / rstd (torch's result1 / result2): per channel for batch norm, (N, group)
    for group norm."""
    ints = ri.iparams()
    shape = (ints.n, ints.groups) if ints.per_sample else (ints.groups,)
    return _wrap(_as_array(ri.saved(k, (int(np.prod(shape)),))).reshape(shape))


def _norm_weight(ri, k):
    return ri.saved_input(k, 1) if ri.iparams().has_w else None


_NORM_INTS = ("n", "c", "s", "groups", "per_sample", "train", "has_w", "has_b")
# saved: the input, the statistics (torch's result1 / result2: the batch's mean and invstd, or
# in eval the running mean and 1 / sqrt(running var + eps), which torch keeps as the running
# stats instead) and the weight (when given)
BATCH_NORM = structural("batch_norm", "NativeBatchNormBackward0", args=("input", "weight", "bias"),
                        saves=("input", "result1", "result2", "weight"),
                        saved_as={"result1": _norm_stat, "result2": _norm_stat, "weight": _norm_weight},
                        rule=norm_rule, kernel=k_batch_norm, iparams=_NORM_INTS, fparams=("eps",),
                        jvp=norm_jvp, fwd_kernel=f_batch_norm)
GROUP_NORM = alias("group_norm", BATCH_NORM, "NativeGroupNormBackward0")


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """torch.nn.functional.batch_norm over dim 1 of (N, C, *): in training the batch's
    statistics normalise, and update the running ones in place (the unbiased variance, as
    torch; their version counters do not move, as torch's); otherwise the running ones do."""
    if input._data.dtype.kind != "f":
        raise _dtype.not_implemented("batch_norm", input._data.dtype)
    shape = tuple(input.shape)
    if len(shape) < 2:
        if training and (not shape or shape[0] == 1):
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"{torch_size(shape)}")
        raise IndexError(f"Dimension out of range (expected to be in range of [{-max(len(shape), 1)}, "
                         f"{max(len(shape), 1) - 1}], but got 1)")
    n, c = shape[:2]
    if c == 0:  # torch fails picking channel 0's statistics
        raise IndexError("select(): index 0 out of range for tensor of size [0] at dimension 0")
    size = int(np.prod(shape, dtype=np.int64)) // c if c else 0
    if training and size == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {torch_size(shape)}")
    for name, p in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if p is not None and p.numel() != c:
            raise RuntimeError(f"{name} should contain {c} elements not {p.numel()}")
    if not training and (running_mean is None or running_var is None):
        raise RuntimeError(f"{'running_mean' if running_mean is None else 'running_var'} must be defined in "
                           "evaluation mode")
    if input._data.dtype.kind == "f":  # torch's not-implemented error for an integer input comes first
        check_mixed_dtypes(input._data.dtype, weight, bias, running_mean, running_var)
    running = None if training else (running_mean, running_var)
    out, stats = _normalize(BATCH_NORM, input, weight, bias, n, c, c, 0, eps, running)
    if training and (running_mean is not None or running_var is not None):
        _stop("batch_norm updates its running statistics in place")
        mu, var = stats
        m = float(momentum)
        if running_mean is not None:
            rm = running_mean._data
            rm[...] = ((1 - m) * rm + m * mu).astype(rm.dtype, copy=False).reshape(rm.shape)
        if running_var is not None:
            rv = running_var._data
            unbiased = var * (size / (size - 1))
            rv[...] = ((1 - m) * rv + m * unbiased).astype(rv.dtype, copy=False).reshape(rv.shape)
    return out


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.group_norm: per sample, over each group of channels and the spatial dims."""
    check_mixed_dtypes(input._data.dtype, weight, bias)
    shape = tuple(input.shape)
    if len(shape) < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {len(shape)}")
    n, c = shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError("Expected number of channels in input to be divisible by num_groups, but got input of "
                           f"shape {size_str(shape)} and num_groups={num_groups}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (p.ndim != 1 or p.numel() != c):
            raise RuntimeError(f"Expected {name} to be a vector of size equal to the number of channels in input, "
                               f"but got {name} of shape {size_str(p.shape)} and input of shape {size_str(shape)}")
    return _normalize(GROUP_NORM, input, weight, bias, n, c, int(num_groups), 1, eps)[0]


# --- average pooling: avg_pool2d and adaptive_avg_pool2d, one primitive layout --------------------
# Both average, per output (oh, ow), the window rows [hs, he) x columns [ws, we) over the
# divisor dr[oh] * dc[ow] (or a fixed one): the pooling of a plane X is R @ X @ C^T with
# R[oh, ih] = 1 / dr[oh] on the window's rows, C likewise. The rule and the tangent are
# those two matmuls (differentiable Tensor ops), as is the forward on the device; the host
# forward and the backward kernel loop over the windows (kernels/pool.py).
def _windows(ints):
    """(planes, h, w, ho, wo, fixed divisor or 0, (hs, he, dr), (ws, we, dc)) from a row's int params."""
    planes, h, w, ho, wo, fixed = ints[:6]
    rest = np.asarray(ints[6:], np.int64)
    return planes, h, w, ho, wo, fixed, rest[:3 * ho].reshape(3, ho), rest[3 * ho:].reshape(3, wo)


def _window_matrix(ranges, n, fixed, like):
    """(outputs, n): row o is 1 / divisor on [start, end) of output o (1 with a fixed divisor)."""
    start, end, div = ranges
    i = np.arange(n)
    inside = (i >= start[:, None]) & (i < end[:, None])
    m = np.where(inside, 1.0 if fixed else 1.0 / np.maximum(div, 1)[:, None], 0.0)
    return _wrap(m if not _on_device(like) else _DeviceArray.from_host(m))


def _pool_mats(ints, like, dtype):
    """R (ho, h) and C^T (w, wo) as Tensors of dtype, and the fixed divisor (0: none)."""
    _, h, w, _, _, fixed, rows, cols = _windows(ints)
    r = to_dtype(_window_matrix(rows, h, fixed, like), dtype)
    c = to_dtype(_window_matrix(cols, w, fixed, like), dtype)
    return r, transpose(c, 0, 1), fixed


def _pool_planes(x, ints):
    """R @ x @ C^T per plane of x (a Tensor with planes of (h, w)), over the fixed divisor."""
    planes, h, w, ho, wo = ints[:5]
    r, ct, fixed = _pool_mats(ints, x._data, x.dtype)
    out = matmul(matmul(r, reshape(x, (planes, h, w))), ct)
    return out / fixed if fixed else out


def avg_pool_rule(grad, ri):
    """The adjoint of the pooling: R^T @ grad @ C per plane (over the fixed divisor)."""
    ints = ri.ints()
    planes, h, w, ho, wo = ints[:5]
    r, ct, fixed = _pool_mats(ints, grad._data, grad.dtype)
    dx = matmul(matmul(transpose(r, 0, 1), reshape(grad, (planes, ho, wo))), transpose(ct, 0, 1))
    return (reshape(dx / fixed if fixed else dx, ri.in_shape(0)),)


def avg_pool_jvp(ci, tangents):
    """Linear: the same pooling of the tangent."""
    return reshape(_pool_planes(tangents[0], ci.ints()), ci.out_shape())


def _avg_pool(spec, input, ints, out_hw):
    """Record the average pooling of `input` (its last two dims) with the windows in `ints`."""
    x = input._data
    if x.dtype.kind != "f":
        raise NotImplementedError(f"\"{spec.name}\" not implemented for '{scalar_name(x.dtype)}'")
    out = _avg_pool_data(x, ints)
    res = _wrap(out.astype(x.dtype, copy=False).reshape(tuple(x.shape[:-2]) + out_hw))
    if not _needs(input):
        return traced(spec, res, (input,), (), (), ints) if _cap.on else res
    return record(spec, res, (input,), (), (), ints)


def _avg_pool_data(x, ints):
    """The pooled planes of array x, flat: the loops jitgrad.compile's replay runs on the host
    (kernels/pool.py), R @ X @ C^T on the device."""
    planes, h, w, ho, wo, fixed, rows, cols = _windows(ints)
    if not _on_device(x):
        out = np.empty(planes * ho * wo, x.dtype)
        avg_pool_into(np.ascontiguousarray(x).reshape(-1), np.asarray(ints, np.int64), out)
        return out
    r = _window_matrix(rows, h, fixed, x)._data.astype(x.dtype)
    ct = _window_matrix(cols, w, fixed, x)._data.astype(x.dtype).T
    out = np.matmul(np.matmul(r, x.reshape(planes, h, w)), ct)
    return out / x.dtype.type(fixed) if fixed else out


def _pool_ints(spec, planes, h, w, fixed, rows, cols):
    return spec.pack_ints(planes, h, w, rows.shape[1], cols.shape[1], fixed,
                          rest=np.concatenate([rows.reshape(-1), cols.reshape(-1)]).tolist())


# iparams: the windows, kernels/pool.py's layout; nothing saved (the backward needs none)
AVG_POOL2D = structural("avg_pool2d", "AvgPool2DBackward0", rule=avg_pool_rule, kernel=k_avg_pool,
                        iparams=("planes", "h", "w", "ho", "wo", "divisor", "*windows"), jvp=avg_pool_jvp,
                        fwd_kernel=f_avg_pool)
ADAPTIVE_AVG_POOL2D = alias("adaptive_avg_pool2d", AVG_POOL2D, "AdaptiveAvgPool2DBackward0")


def _avg_windows(n, k, s, p, ceil_mode, count_include_pad):
    """avg_pool2d's windows along one dim of size n: (start, end, divisor) per output, torch's
    output size (a last window that would start in the right padding is dropped)."""
    out = (n + 2 * p - k + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    start = np.arange(out) * s - p
    end = np.minimum(start + k, n + p)
    size = end - start
    start, end = np.maximum(start, 0), np.minimum(end, n)
    return np.stack([start, end, size if count_include_pad else end - start]).astype(np.int64)


def _pool_pair(v, name):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return (int(v[0]),) * 2
        if len(v) != 2:
            raise RuntimeError(f"avg_pool2d: {name} must either be omitted, a single int, or a tuple of two ints"
                               if name != "kernel_size" else
                               "avg_pool2d: kernel_size must either be a single int, or a tuple of two ints")
        return (int(v[0]), int(v[1]))
    return (int(v), int(v))


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """torch.nn.functional.avg_pool2d on (N, C, H, W) or (C, H, W): one AvgPool2DBackward0 node."""
    kernel = _pool_pair(kernel_size, "kernel_size")
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _pool_pair(stride, "stride")
    pad = _pool_pair(padding, "padding")
    if input.ndim < 3:  # torch reads the size of dim -3 first
        n = max(input.ndim, 1)
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got -3)")
    if input.ndim > 4:
        raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")
    if min(stride) == 0:
        raise RuntimeError("stride should not be zero")
    if min(kernel) <= 0:
        raise RuntimeError(f"kernel size should be greater than zero, but got kH: {kernel[0]} kW: {kernel[1]}")
    if pad[0] > kernel[0] // 2 or pad[1] > kernel[1] // 2:
        p, k = (pad[0], kernel[0]) if pad[0] > kernel[0] // 2 else (pad[1], kernel[1])
        raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k} "
                           "and dilation=1")
    if divisor_override is not None and int(divisor_override) == 0:
        raise RuntimeError("divisor must be not zero")
    shape = tuple(input.shape)
    h, w = shape[-2:]
    rows = _avg_windows(h, kernel[0], stride[0], pad[0], ceil_mode, count_include_pad)
    cols = _avg_windows(w, kernel[1], stride[1], pad[1], ceil_mode, count_include_pad)
    ho, wo = rows.shape[1], cols.shape[1]
    if ho < 1 or wo < 1:
        raise RuntimeError(f"Given input size: ({shape[-3]}x{h}x{w}). Calculated output size: ({shape[-3]}x{ho}x{wo}). "
                           "Output size is too small")
    planes = int(np.prod(shape[:-2], dtype=np.int64))
    fixed = 0 if divisor_override is None else int(divisor_override)
    if input._data.dtype == np.int64 and not _on_device(input._data):
        _stop("avg_pool2d of an integer tensor")
        return _wrap(_avg_pool_long(input._data, rows, cols, fixed))
    return _avg_pool(AVG_POOL2D, input, _pool_ints(AVG_POOL2D, planes, h, w, fixed, rows, cols), (ho, wo))


def _avg_pool_long(x, rows, cols, fixed):
    """torch's avg_pool2d of an int64 array (the one integer dtype it pools): each window's
    exact sum, from a summed-area table, divided by its divisor truncating toward zero."""
    table = np.zeros(x.shape[:-2] + (x.shape[-2] + 1, x.shape[-1] + 1), np.int64)
    table[..., 1:, 1:] = x.cumsum(-2).cumsum(-1)
    (r0, r1, dr), (c0, c1, dc) = rows[:, :, None], cols[:, None, :]
    s = table[..., r1, c1] - table[..., r0, c1] - table[..., r1, c0] + table[..., r0, c0]
    q = np.abs(s) // (fixed if fixed else dr * dc)
    return np.where(s < 0, -q, q)


def _adaptive_windows(n, out):
    """adaptive pooling's windows along a dim of size n: [floor(o n / out), ceil((o + 1) n / out))."""
    o = np.arange(out)
    start = (o * n) // out
    end = -((-(o + 1) * n) // out)
    return np.stack([start, end, end - start]).astype(np.int64)


def adaptive_avg_pool2d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool2d: AdaptiveAvgPool2DBackward0, or, for a 1 x 1
    output, the mean over the last two dims (MeanBackward1), as torch."""
    if isinstance(output_size, (tuple, list)):
        if len(output_size) != 2:
            raise RuntimeError("adaptive_avg_pool2d: output_size must be 2")
        size = tuple(output_size)
    else:
        size = (output_size, output_size)
    if any(s is not None and s < 0 for s in size):
        given = ", ".join(str(s) for s in size)
        raise RuntimeError("adaptive_avg_pool2d: elements of output_size must be greater than or equal to 0 but "
                           f"received {{{given}}}")
    shape = tuple(input.shape)
    if len(shape) not in (3, 4):
        raise RuntimeError(f"adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got {size_str(shape)}")
    for i in (len(shape) - 2, len(shape) - 1):
        if shape[i] == 0:
            raise RuntimeError("adaptive_avg_pool2d(): Expected input to have non-zero size for non-batch dimensions, "
                               f"but input has sizes {size_str(shape)} with dimension {i} being empty")
    h, w = shape[-2:]
    ho, wo = (h if size[0] is None else int(size[0])), (w if size[1] is None else int(size[1]))
    if ho == 1 and wo == 1 and input._data.dtype.kind == "f":
        return mean(input, (-1, -2), keepdim=True)
    planes = int(np.prod(shape[:-2], dtype=np.int64))
    ints = _pool_ints(ADAPTIVE_AVG_POOL2D, planes, h, w, 0, _adaptive_windows(h, ho), _adaptive_windows(w, wo))
    return _avg_pool(ADAPTIVE_AVG_POOL2D, input, ints, (ho, wo))
