"""Every public op under vmap against a Python loop over the batch (and torch.func.vmap).

The ops are enumerated, not listed: the public functions of jitgrad, jitgrad.linalg and
jitgrad.nn.functional and Tensor's methods and operators (what vmap dispatches). Each must
have a sample here (SAMPLES), or be named in one of the sets below with the behaviour it is
checked for (random ops, ops whose output shape depends on the values, metadata, ops that
take no tensor). An op added later without a sample fails test_every_public_op_is_covered.

For each sample (and, for an op's first sample, each in_dims variant: every tensor batched
along dim 0; the first one along its last dim and the others not batched; the first one not
batched and the others along 0),
vmap(op) must equal the loop `stack([op(sample b) for b])`: values, shapes and dtypes. An op
with a batching rule is held to the loop as much as one that falls back to the loop, and
in-place ops run on a clone of their batched self. Where torch's own vmap of the op runs and
the op's loop agrees with torch's loop, jitgrad's vmap must agree with torch's vmap too.
"""
import functools
import warnings

import numpy as np
import pytest
import torch

import jitgrad
from jitgrad.func import _dispatch

B = 3   # the batch


class P:
    """A tensor placeholder of a sample: its per-sample shape, value domain and dtype."""

    def __init__(self, *shape, dom="any", dtype="float64", high=None):
        self.shape, self.dom, self.dtype, self.high = shape, dom, dtype, high

    def array(self, rng, shape):
        if self.dtype == "int64":
            return rng.integers(0, self.high, size=shape)
        if self.dtype == "bool":
            return rng.random(size=shape) < 0.5
        lo, hi = {"any": (-1.5, 1.5), "pos": (0.5, 2.0), "unit": (-0.9, 0.9), "prob": (0.1, 0.9)}[self.dom]
        a = rng.uniform(lo, hi, size=shape)
        if self.dom == "any":
            a = np.where(np.abs(a) < 0.2, 0.7, a)       # away from 0: sign, abs, relu's kink
        return a.astype(self.dtype)


def u(*s):
    return P(*s)


def pos(*s):
    return P(*s, dom="pos")


def unit(*s):
    return P(*s, dom="unit")


def prob(*s):
    return P(*s, dom="prob")


def idx(*s, high):
    return P(*s, dtype="int64", high=high)


def mask(*s):
    return P(*s, dtype="bool")


def S(*args, **kwargs):
    return args, kwargs


# --- samples: name -> [(args, kwargs)] --------------------------------------------------------------
UNARY = ("abs absolute neg negative sin cos tan tanh sinh cosh sigmoid exp exp2 expm1 erf relu sign sgn square "
         "floor ceil round trunc frac deg2rad rad2deg atan arctan isfinite isnan isinf isneginf isposinf logical_not "
         "nan_to_num clone detach contiguous float double long int bool logsigmoid softplus softsign silu mish "
         "gelu elu selu celu relu6 hardtanh hardsigmoid hardswish leaky_relu __neg__ __abs__").split()
UNARY_POS = "log log10 log2 log1p sqrt rsqrt reciprocal".split()
UNARY_UNIT = "asin acos arcsin arccos".split()
BINARY = ("add sub mul div true_divide divide multiply subtract maximum minimum atan2 arctan2 nextafter hypot logaddexp eq ne "
          "lt le gt ge logical_and logical_or logical_xor isclose __add__ __sub__ __mul__ __truediv__ __eq__ __ne__ "
          "__lt__ __le__ __gt__ __ge__").split()
REFLECTED = "__radd__ __rsub__ __rmul__ __rtruediv__".split()      # called with a number (x.__rsub__(2.0))
BOOL_BINARY = "__and__ __or__ __xor__".split()

SAMPLES = {}
for _n in UNARY:
    SAMPLES[_n] = [S(u(3, 4)), S(u())]
for _n in UNARY_POS:
    SAMPLES[_n] = [S(pos(3, 4)), S(pos())]
for _n in UNARY_UNIT:
    SAMPLES[_n] = [S(unit(3, 4))]
for _n in BINARY:
    SAMPLES[_n] = [S(u(3, 4), u(3, 4)), S(u(3, 4), u(4)), S(u(), u(3))]
for _n in REFLECTED:
    SAMPLES[_n] = [S(u(3, 4), 2.0)]
for _n in BOOL_BINARY:
    SAMPLES[_n] = [S(mask(3, 4), mask(3, 4)), S(mask(4), mask(2, 4))]
SAMPLES.update({
    "__invert__": [S(mask(3, 4))],
    "real": [S(u(3, 4))],
    "pow": [S(pos(3, 4), u(3, 4)), S(pos(3, 4), 2.5)], "__pow__": [S(pos(3, 4), u(4))], "__rpow__": [S(u(3, 4), 2.0)],
    "__matmul__": [S(u(3, 4), u(4, 2)), S(u(4), u(4))], "__rmatmul__": [S(u(4, 2), u(3, 4))],
    "__getitem__": [S(u(4, 5), 1), S(u(4, 5), (slice(1, 3), -1)), S(u(4, 5), idx(3, high=4)),
                    S(u(4, 5), (idx(2, high=4), idx(2, high=5))), S(u(4, 5), (Ellipsis, None, slice(None, None, 2))),
                    S(u(4, 5), mask(4, 5))],
    # sum / reductions
    "sum": [S(u(3, 4)), S(u(3, 4), 1), S(u(3, 4), (0, 1), keepdim=True)],
    "mean": [S(u(3, 4)), S(u(3, 4), -1, keepdim=True)],
    "prod": [S(u(3, 4)), S(u(3, 4), 0)],
    "amax": [S(u(3, 4), 1)], "amin": [S(u(3, 4), (0, 1))],
    "max": [S(u(3, 4)), S(u(3, 4), 1), S(u(3, 4), u(3, 4))], "min": [S(u(3, 4)), S(u(3, 4), 0, True)],
    "argmax": [S(u(3, 4)), S(u(3, 4), 1)], "argmin": [S(u(3, 4), 0, keepdim=True)],
    "logsumexp": [S(u(3, 4), 1)], "std": [S(u(3, 4)), S(u(3, 4), 1)], "var": [S(u(3, 4), 0, correction=0)],
    "std_mean": [S(u(3, 4), 1)], "var_mean": [S(u(3, 4))],
    "median": [S(u(5)), S(u(3, 5), 1)], "mode": [S(idx(3, 5, high=3), 1)],
    "kthvalue": [S(u(3, 5), 2, 1)],
    "all": [S(mask(3, 4)), S(mask(3, 4), 1)], "any": [S(mask(3, 4)), S(mask(3, 4), 0)],
    "count_nonzero": [S(idx(3, 4, high=2), 1)],
    "cumsum": [S(u(3, 4), 1)], "cumprod": [S(u(3, 4), 0)],
    "softmax": [S(u(3, 4), 1), S(u(3, 4), dim=0)], "log_softmax": [S(u(3, 4), -1)],
    "norm": [S(u(3, 4)), S(u(3, 4), 1, 1)],
    "linalg.norm": [S(u(3, 4)), S(u(4), 3)], "linalg.vector_norm": [S(u(3, 4)), S(u(3, 4), 1, 1)],
    "linalg.matrix_norm": [S(u(3, 4)), S(u(2, 3, 4), 1, (0, 2))], "linalg.cross": [S(u(2, 3), u(2, 3)), S(u(3, 2), u(3, 2), dim=0)],
    "linalg.vecdot": [S(u(3, 4), u(4)), S(u(3, 4), u(3, 4), dim=0)],
    "trace": [S(u(3, 4))],
    "sum_to_size": [S(u(3, 4), (1, 4))],
    # shapes and views
    "reshape": [S(u(3, 4), (4, 3)), S(u(3, 4), -1)], "view": [S(u(3, 4), (2, 6))],
    "flatten": [S(u(2, 3, 2)), S(u(2, 3, 2), 1)], "squeeze": [S(u(3, 1, 4)), S(u(3, 1, 4), 1)],
    "unsqueeze": [S(u(3, 4), 1), S(u(3, 4), -1)], "expand": [S(u(3, 1), (3, 4)), S(u(4), (2, 4))],
    "expand_as": [S(u(3, 1), u(3, 4))], "view_as": [S(u(3, 4), u(4, 3))], "reshape_as": [S(u(3, 4), u(12))],
    "permute": [S(u(2, 3, 4), (2, 0, 1))], "transpose": [S(u(2, 3, 4), 0, 2)], "t": [S(u(3, 4)), S(u(4))],
    "movedim": [S(u(2, 3, 4), 0, -1)], "moveaxis": [S(u(2, 3, 4), (0, 1), (2, 0))],
    "narrow": [S(u(3, 5), 1, 1, 3)], "select": [S(u(3, 5), 1, 2)],
    "split": [S(u(5, 3), 2), S(u(5, 3), [1, 2], 1)], "split_with_sizes": [S(u(5, 3), [2, 3])],
    "chunk": [S(u(5, 3), 2)], "unbind": [S(u(3, 4)), S(u(3, 4), 1)],
    "diagonal": [S(u(3, 4)), S(u(2, 3, 4), 1, 1, 2)], "tril": [S(u(3, 4)), S(u(3, 4), -1)], "triu": [S(u(3, 4), 1)],
    "roll": [S(u(3, 4), 1, 1), S(u(3, 4), (1, 2), (0, 1))], "flip": [S(u(3, 4), (0,)), S(u(3, 4), (0, 1))],
    "repeat": [S(u(3, 2), (2, 1)), S(u(3), (2, 2))],
    "tile": [S(u(3, 2), (2,)), S(u(3), (2, 2))], "diag": [S(u(3)), S(u(3, 4), 1), S(u(4), -2)],
    "diag_embed": [S(u(2, 3)), S(u(3), 1, 0, 1), S(u(2, 3), -1, 2, 0)],
    "broadcast_to": [S(u(3), (2, 3)), S(u(2, 1), (2, 4))], "broadcast_tensors": [S(u(3), u(2, 1))],
    "glu": [S(u(3, 4)), S(u(4, 2), 0)], "softmin": [S(u(3, 4), 1)], "ravel": [S(u(3, 4))],
    "threshold": [S(u(3, 4), 0.2, -1.0)], "tanhshrink": [S(u(3, 4))], "softshrink": [S(u(3, 4), 0.3)],
    "hardshrink": [S(u(3, 4))],
    "repeat_interleave": [S(u(3, 2), 2, dim=1), S(u(3), 2)],
    "rms_norm": [S(u(3, 4), (4,)), S(u(2, 3, 4), (3, 4), u(3, 4), 1e-3)],
    "unflatten": [S(u(3, 4), 1, (2, 2)), S(u(6), 0, (-1, 3))],
    "pad": [S(u(3, 4), (1, 2)), S(u(2, 3, 4), (1, -1, 2, 0), value=1.5), S(u(2, 3, 4), (1, 2), mode="reflect"),
            S(u(3, 4), (2, 1), mode="replicate"), S(u(2, 3, 4), (1, 2, 1, 1), mode="circular")],
    "scaled_dot_product_attention": [S(u(2, 3, 4), u(2, 5, 4), u(2, 5, 3)),
                                     S(u(2, 4, 4), u(2, 4, 4), u(2, 4, 2), is_causal=True),
                                     S(u(3, 4), u(5, 4), u(5, 2), mask(3, 5)), S(u(3, 4), u(5, 4), u(5, 2), u(3, 5))],
    "cat": [S([u(2, 3), u(1, 3)]), S([u(2, 3), u(2, 2)], 1)], "concat": [S([u(2, 3), u(2, 3)])],
    "concatenate": [S([u(2, 3), u(1, 3)], 0)], "stack": [S([u(2, 3), u(2, 3)]), S([u(3), u(3)], 1)],
    "meshgrid": [S(u(3), u(2), indexing="ij")],
    "where": [S(mask(3, 4), u(3, 4), u(3, 4)), S(mask(4), u(3, 4), 0.5)],
    "masked_fill": [S(u(3, 4), mask(3, 4), 0.5), S(u(3, 4), mask(4), -1.0)],
    "clamp": [S(u(3, 4), -0.5, 0.5), S(u(3, 4), max=0.5)], "clip": [S(u(3, 4), -0.5, 0.5)],
    "clamp_min": [S(u(3, 4), 0.1)], "clamp_max": [S(u(3, 4), 0.2)],
    "lerp": [S(u(3, 4), u(3, 4), 0.3), S(u(3, 4), u(4), u(3, 4))],
    "diff": [S(u(3, 5)), S(u(3, 5), 1, 0)],
    "gather": [S(u(3, 4), 1, idx(3, 2, high=4))], "take_along_dim": [S(u(3, 4), idx(3, 2, high=4), 1)],
    "scatter": [S(u(3, 4), 1, idx(3, 2, high=4), u(3, 2)), S(u(3, 4), 0, idx(1, 4, high=3), 2.0)],
    "scatter_add": [S(u(3, 4), 1, idx(3, 2, high=4), u(3, 2))],
    "index_select": [S(u(3, 4), 1, idx(5, high=4))],
    "index_add": [S(u(3, 4), 0, idx(2, high=3), u(2, 4))], "index_copy": [S(u(3, 4), 1, idx(2, high=4), u(3, 2))],
    "index_fill": [S(u(3, 4), 1, idx(2, high=4), -2.0)],
    "sort": [S(u(3, 4)), S(u(3, 4), 0, True)], "argsort": [S(u(3, 4), 1)],
    "topk": [S(u(3, 5), 2), S(u(3, 5), 2, 0, False)],
    "searchsorted": [S(P(6, dom="any"), u(3, 2))],     # sorted per sample in _prepare
    "bincount": [S(idx(6, high=4), minlength=5)],
    # linear algebra
    "matmul": [S(u(3, 4), u(4, 2)), S(u(4), u(2, 4, 3)), S(u(4), u(4))], "mm": [S(u(3, 4), u(4, 2))],
    "bmm": [S(u(2, 3, 4), u(2, 4, 2))], "mv": [S(u(3, 4), u(4))], "dot": [S(u(4), u(4))],
    "outer": [S(u(3), u(4))], "ger": [S(u(3), u(4))],
    "addmm": [S(u(3, 2), u(3, 4), u(4, 2)), S(u(2), u(3, 4), u(4, 2), beta=0.5, alpha=2.0)],
    "addmv": [S(u(3), u(3, 4), u(4))], "addbmm": [S(u(3, 2), u(2, 3, 4), u(2, 4, 2))],
    "baddbmm": [S(u(2, 3, 2), u(2, 3, 4), u(2, 4, 2))],
    "addcmul": [S(u(3, 4), u(3, 4), u(4), value=0.5)], "addcdiv": [S(u(3, 4), u(3, 4), pos(3, 4))],
    "einsum": [S("ij,jk->ik", u(3, 4), u(4, 2)), S("i,i->", u(4), u(4))],
    "cross": [S(u(2, 3), u(2, 3)), S(u(3, 2), u(3, 2), 0)],
    "cdist": [S(u(3, 2), u(4, 2))], "pairwise_distance": [S(u(3, 4), u(3, 4))],
    "cosine_similarity": [S(u(3, 4), u(3, 4)), S(u(3, 4), u(4), 0)],
    # nn.functional
    "linear": [S(u(3, 4), u(2, 4)), S(u(4), u(2, 4), u(2))],
    "conv2d": [S(u(1, 2, 5, 5), u(3, 2, 3, 3)), S(u(2, 5, 5), u(3, 2, 3, 3), u(3), padding=1)],
    "conv_transpose2d": [S(u(1, 2, 3, 3), u(2, 3, 2, 2)),
                         S(u(2, 3, 3), u(2, 2, 3, 3), u(4), stride=2, padding=1, output_padding=1, groups=2)],
    "max_pool2d": [S(u(1, 2, 4, 4), 2)], "avg_pool2d": [S(u(2, 4, 4), 2)],
    "adaptive_avg_pool2d": [S(u(1, 2, 4, 4), (2, 1))],
    "batch_norm": [S(u(4, 3), None, None, training=True), S(u(4, 3), u(3), pos(3), u(3), u(3))],
    "layer_norm": [S(u(3, 4), (4,)), S(u(3, 4), (4,), u(4), u(4))],
    "group_norm": [S(u(2, 4, 3), 2), S(u(2, 4, 3), 2, u(4), u(4))],
    "embedding": [S(idx(2, 3, high=5), u(5, 4)), S(idx(3, high=5), u(5, 4), padding_idx=1)],
    "one_hot": [S(idx(4, high=3), 3)], "normalize": [S(u(3, 4)), S(u(3, 4), 1.0, 0)],
    "cross_entropy": [S(u(4, 3), idx(4, high=3)), S(u(4, 3), idx(4, high=3), pos(3), label_smoothing=0.1), S(u(3), idx(high=3))],
    "nll_loss": [S(u(4, 3), idx(4, high=3)), S(u(4, 3), idx(4, high=3), reduction="none")],
    "mse_loss": [S(u(3, 4), u(3, 4))], "l1_loss": [S(u(3, 4), u(3, 4), reduction="sum")],
    "smooth_l1_loss": [S(u(3, 4), u(3, 4))], "huber_loss": [S(u(3, 4), u(3, 4), delta=0.5)],
    "kl_div": [S(u(3, 4), prob(3, 4), reduction="batchmean")],
    "binary_cross_entropy": [S(prob(3, 4), prob(3, 4))],
    "binary_cross_entropy_with_logits": [S(u(3, 4), prob(3, 4)), S(u(3, 4), prob(3, 4), pos_weight=pos(4))],
    # new tensors from a tensor
    "empty_like": [S(u(3, 4))], "new_empty": [S(u(3, 4), (2,))],      # shapes and dtypes only
    "zeros_like": [S(u(3, 4))], "ones_like": [S(u(3, 4))], "full_like": [S(u(3, 4), 2.5)],
    "new_zeros": [S(u(3, 4), (2,))], "new_ones": [S(u(3, 4), 2, 3)], "new_full": [S(u(3, 4), (2,), 1.5)],
    "new_tensor": [S(u(3, 4), [1.0, 2.0])], "new": [S(u(3, 4), [1.0, 2.0])], "tensor": [S(u(3, 4))], "as_tensor": [S(u(3, 4))],
    "to": [S(u(3, 4), "float32"), S(u(3, 4), "int64")], "type": [S(u(3, 4), "float32")], "type_as": [S(u(3), idx(3, high=2))],
    # in-place (run on a clone of self)
    "fill_": [S(u(3, 4), 2.0), S(u(3, 4), u())], "zero_": [S(u(3, 4))], "copy_": [S(u(3, 4), u(3, 4)), S(u(3, 4), u(4))],
    "fill_diagonal_": [S(u(3, 3), 2.0)],
    "__setitem__": [S(u(4, 5), 1, u(5)), S(u(4, 5), (slice(1, 3), 2), 0.5), S(u(4, 5), idx(2, high=4), u(2, 5)),
                    S(u(4, 5), mask(4, 5), -1.0)],
    "masked_fill_": [S(u(3, 4), mask(3, 4), 0.5)], "index_add_": [S(u(3, 4), 0, idx(2, high=3), u(2, 4))],
    "index_fill_": [S(u(3, 4), 1, idx(2, high=4), -2.0)], "scatter_": [S(u(3, 4), 1, idx(3, 2, high=4), u(3, 2))],
    "scatter_add_": [S(u(3, 4), 1, idx(3, 2, high=4), u(3, 2))],
    "index_copy_": [S(u(3, 4), 1, idx(2, high=4), u(3, 2))],
    "lerp_": [S(u(3, 4), u(3, 4), 0.3)], "addcmul_": [S(u(3, 4), u(3, 4), u(4))], "addcdiv_": [S(u(3, 4), u(4), pos(4))],
    "addmv_": [S(u(3), u(3, 4), u(4))], "addbmm_": [S(u(3, 2), u(2, 3, 4), u(2, 4, 2))],
    "baddbmm_": [S(u(2, 3, 2), u(2, 3, 4), u(2, 4, 2))],
    "clamp_": [S(u(3, 4), -0.5, 0.5)], "clamp_min_": [S(u(3, 4), 0.0)], "clamp_max_": [S(u(3, 4), 0.2)],
    "cumsum_": [S(u(3, 4), 1)], "cumprod_": [S(u(3, 4), 0)], "nan_to_num_": [S(u(3, 4))],
    "pow_": [S(pos(3, 4), u(4))], "hypot_": [S(u(3, 4), u(3, 4))],
    "tril_": [S(u(3, 4))], "triu_": [S(u(3, 4), 1)], "t_": [S(u(3, 4))], "transpose_": [S(u(2, 3, 4), 0, 2)],
    "swapaxes": [S(u(2, 3, 4), 0, 2)], "swapdims": [S(u(2, 3, 4), 2, 1)],
    "swapaxes_": [S(u(2, 3, 4), 0, 2)], "swapdims_": [S(u(2, 3, 4), 2, 1)],
    "squeeze_": [S(u(3, 1, 4), 1)], "unsqueeze_": [S(u(3, 4), 1)],
    "asin_": [S(unit(3, 4))], "acos_": [S(unit(3, 4))], "atan_": [S(u(3, 4))], "atan2_": [S(u(3, 4), u(3, 4))],
    "add_": [S(u(3, 4), u(4)), S(u(3, 4), u(3, 4), alpha=2.0)], "sub_": [S(u(3, 4), u(3, 4))],
    "mul_": [S(u(3, 4), 2.0)], "div_": [S(u(3, 4), pos(3, 4))],
    "__iadd__": [S(u(3, 4), u(4))], "__isub__": [S(u(3, 4), u(3, 4))], "__imul__": [S(u(3, 4), 2.0)],
    "__itruediv__": [S(u(3, 4), pos(4))],
})
_INPLACE_UNARY = ("abs_ neg_ sin_ cos_ tan_ tanh_ sinh_ cosh_ sigmoid_ exp_ exp2_ expm1_ erf_ relu_ sign_ square_ "
                  "floor_ ceil_ round_ trunc_ frac_").split()
for _n in _INPLACE_UNARY:
    SAMPLES[_n] = [S(u(3, 4))]
for _n in UNARY_POS:
    SAMPLES[_n + "_"] = [S(pos(3, 4))]

# random ops: under randomness="error" they raise torch's error; "different" / "same": test_vmap_compose
RANDOM = {"bernoulli": S(prob(3, 4)), "bernoulli_": S(u(3, 4), 0.5), "multinomial": S(prob(3, 4), 2),
          "normal": S(u(3, 4), pos(3, 4)), "normal_": S(u(3, 4)), "uniform_": S(u(3, 4)), "random_": S(u(3, 4), 0, 5),
          "exponential_": S(u(3, 4)), "rand_like": S(u(3, 4)), "randn_like": S(u(3, 4)),
          "randint_like": S(u(3, 4), 5), "dropout": S(u(3, 4), 0.5)}
# the shape of the result depends on the values: torch's error (whatever the values)
DYNAMIC = {"nonzero": S(mask(3, 4)), "argwhere": S(mask(3, 4)), "unique": S(idx(5, high=3)),
           "masked_select": S(u(3, 4), mask(3, 4))}
TORCH_RETURNS_GARBAGE = {"argwhere"}    # torch 2.13's vmap returns one sample's indices for every sample
# a Python value that depends on the samples, or autograd's own API on a batched tensor (grad
# and vjp do it under vmap): an error, as torch's
DATA_DEPENDENT = {"equal": S(u(3), u(3)), "allclose": S(u(3), u(3)), "item": S(u()), "tolist": S(u(3)),
                  "data_ptr": S(u(3)), "backward": S(u()), "requires_grad_": S(u(3))}
# metadata: the logical tensor's (as torch's vmap)
METADATA = {"numel": S(u(3, 4)), "is_tensor": S(u(3)), "element_size": S(u(3)), "get_device": S(u(3)),
            "storage_offset": S(u(3, 4)), "stride": S(u(3, 4)), "is_inference": S(u(3)), "dim": S(u(3, 4)),
            "size": S(u(3, 4)), "nelement": S(u(3, 4)), "is_floating_point": S(u(3)),
            "is_complex": S(u(3)), "ndimension": S(u(3, 4)),
            "is_contiguous": S(u(3))}
# functions that take no tensor, or are not ops: nothing to batch
NOT_BATCHED = set("""arange empty eye full linspace logspace ones zeros rand randn randint randperm manual_seed
    seed initial_seed get_rng_state set_rng_state
    set_default_device set_default_dtype set_num_threads set_printoptions set_verbosity get_default_device
    get_default_dtype get_num_threads get_verbosity is_grad_enabled is_inference_mode_enabled from_numpy from_dlpack
    place torch_size compile load save half broadcast_shapes register_hook register_post_accumulate_grad_hook cpu cuda numpy""".split())
# compile, load, save: jitgrad attributes loaded on first use (public once some test has used them).
# half: jitgrad has no float16. The op's own hooks and grad state: checked by test_vmap.py / test_per_sample_grads.py
NOT_BATCHED |= {"retain_grad", "detach_"}
# imag: raises for every real tensor (as torch); the RNG state and dtype promotion take no tensor to batch
NOT_BATCHED |= {"imag", "get_rng_state", "set_rng_state", "promote_types", "set_default_tensor_type",
                "install_as_torch", "uninstall_as_torch"}
# as_strided addresses the storage: jitgrad's vmap has no rule for it (a sample of a batch at in_dims=-1 is a
# strided view whose storage positions are the batch's), so it is not claimed to batch
NOT_BATCHED |= {"as_strided"}


def public_ops():
    """Every name vmap dispatches: 'linalg.x' for torch.linalg's, Tensor's by their own name."""
    names = set(_dispatch._public_functions(jitgrad)) | set(_dispatch._public_functions(jitgrad.nn.functional))
    names |= {"linalg." + n for n in _dispatch._public_functions(jitgrad.linalg)}
    names |= set(_dispatch.tensor_methods())
    return names


def test_samples_name_public_ops():
    assert not sorted(set(SAMPLES) - public_ops())


def test_every_public_op_is_covered():
    covered = set(SAMPLES) | set(RANDOM) | set(DYNAMIC) | set(DATA_DEPENDENT) | set(METADATA) | NOT_BATCHED
    missing = sorted(public_ops() - covered)
    assert not missing, f"public ops without a vmap sample in {__file__}: {missing}"


# --- running a sample ----------------------------------------------------------------------------
FORMS = ("jitgrad", "nn.functional", "Tensor")


def _forms(name):
    """The ways op `name` is called: jitgrad.<name>, nn.functional.<name>, Tensor.<name>."""
    if name.startswith("linalg.") or name.startswith("__"):
        return ["jitgrad"]
    out = [form for form, ns in zip(FORMS[:2], (jitgrad, jitgrad.nn.functional)) if callable(getattr(ns, name, None))]
    return out + ["Tensor"] if name in _dispatch.tensor_methods() or not out else out


def _resolve(T, name, form=None):
    """The op `name` of library T as a function of (self, *args), called as `form` (the first
    of _forms by default)."""
    form = form or _forms(name)[0]
    if name.startswith("linalg."):
        return getattr(T.linalg, name[7:])
    if form != "Tensor" and not name.startswith("__"):
        return getattr(T if form == "jitgrad" else T.nn.functional, name)
    if name == "__setitem__":
        def setitem(x, index, value):
            x = x.clone()
            x[index] = value
            return x
        return setitem
    if name.endswith("_") and not name.endswith("__") or name in ("__iadd__", "__isub__", "__imul__", "__itruediv__"):
        return lambda x, *a, **k: getattr(x.clone(), name)(*a, **k)
    return lambda x, *a, **k: getattr(x, name)(*a, **k)


def _placeholders(args, kwargs):
    flat = []

    def walk(v):
        if isinstance(v, P):
            flat.append(v)
        elif isinstance(v, (list, tuple)):
            for w in v:
                walk(w)
    walk(list(args) + list(kwargs.values()))
    return flat


def _fill(T, args, kwargs, values):
    it = iter(values)

    def fill(v):
        if isinstance(v, P):
            return next(it)
        if isinstance(v, list):
            return [fill(w) for w in v]
        if isinstance(v, tuple):
            return tuple(fill(w) for w in v)
        if isinstance(v, str) and v in ("float32", "int64"):
            return getattr(T, v)
        return v
    a = [fill(v) for v in args]
    k = {key: fill(v) for key, v in kwargs.items()}
    return a, k


def _variants(n):
    """in_dims per placeholder: all along 0; the first along its last dim, the rest unbatched;
    the first unbatched, the rest along 0."""
    out = [(0,) * n, (-1,) + (None,) * (n - 1)]
    if n > 1:
        out.append((None,) + (0,) * (n - 1))
    return out


def _arrays(name, holders, dims, seed):
    rng = np.random.default_rng(seed)
    arrays = []
    for h, d in zip(holders, dims):
        shape = list(h.shape)
        if d is not None:
            shape.insert(d % (len(shape) + 1), B)
        a = h.array(rng, tuple(shape))
        if name == "searchsorted" and h is holders[0]:
            a = np.sort(a, axis=-1 if d is None or d == 0 else 0)    # sorted along its searched dim
        arrays.append(a)
    return arrays


def _run(T, name, args, kwargs, dims, arrays, form=None):
    """(vmap result, loop result) of op `name` in library T: loop = stack of per-sample calls.
    The op is looked up inside the function, as `torch.sin(x)` in user code is (vmap(torch.sin)
    of an op looked up before: test_vmap_compose.py)."""
    tensors = [T.tensor(a) for a in arrays]

    def per_sample(*ts):
        a, k = _fill(T, args, kwargs, ts)
        return _resolve(T, name, form)(*a, **k)
    in_dims = tuple(None if d is None else d for d in dims)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batched = T.func.vmap(per_sample, in_dims=in_dims)(*tensors)
    outs = []
    for b in range(B):
        sample = [t if d is None else t.select(d % t.dim(), b) for t, d in zip(tensors, dims)]
        outs.append(per_sample(*sample))
    return batched, _stack(T, outs)


def _stack(T, outs):
    if isinstance(outs[0], (tuple, list)):
        parts = [_stack(T, [o[k] for o in outs]) for k in range(len(outs[0]))]
        return type(outs[0])(*parts) if hasattr(outs[0], "_fields") else type(outs[0])(parts)
    return T.stack(outs)


def _flat(x):
    if isinstance(x, (tuple, list)):
        return [y for v in x for y in _flat(v)]
    return [x]


def _compare(got, want, what, dtype_too=True, values=True):
    g, w = _flat(got), _flat(want)
    assert len(g) == len(w), f"{what}: {len(g)} results, expected {len(w)}"
    for k, (a, b) in enumerate(zip(g, w)):
        assert tuple(a.shape) == tuple(b.shape), f"{what}[{k}]: shape {tuple(a.shape)} != {tuple(b.shape)}"
        if dtype_too:
            assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1], f"{what}[{k}]: {a.dtype} != {b.dtype}"
        if values:
            np.testing.assert_allclose(np.asarray(a.detach().numpy(), dtype=np.float64),
                                       np.asarray(b.detach().numpy(), dtype=np.float64), rtol=1e-9,
                                       atol=1e-12, err_msg=what)


EMPTY_LIKE = {"empty_like", "new_empty"}


def _cases(name):
    """(sample index, in_dims): every variant for the op's first sample, all along dim 0 for
    the others (CI time)."""
    for k, (a, kw) in enumerate(SAMPLES[name]):
        for dims in _variants(len(_placeholders(a, kw)))[:None if k == 0 else 1]:
            yield k, dims


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_op_under_vmap_is_the_loop(name):
    """Each sample and variant as the op's first form; the first sample as its other forms too
    (Tensor.sum besides jitgrad.sum, nn.functional.softmax besides jitgrad.softmax)."""
    forms = _forms(name)
    for k, dims in _cases(name):
        _check_case(name, k, dims, forms[0])
    for form in forms[1:]:
        _check_case(name, 0, _variants(len(_placeholders(*SAMPLES[name][0])))[0], form)


def _check_case(name, k, dims, form):
    args, kwargs = SAMPLES[name][k]
    holders = _placeholders(args, kwargs)
    arrays = _arrays(name, holders, dims, seed=k)
    what = f"{form}.{name} sample {k} in_dims {dims}"
    run = functools.partial(_run, name=name, args=args, kwargs=kwargs, dims=dims, arrays=arrays, form=form)
    try:
        got, loop = run(jitgrad)
    except RuntimeError as e:
        # a case vmap cannot run (an in-place op on an unbatched self, a boolean mask's
        # dynamic shape): torch's vmap must refuse it too, and ours say why, as torch's
        assert str(e).startswith("vmap: "), f"{what}: {e}"
        with pytest.raises(RuntimeError):
            run(torch)
        return
    values = name not in EMPTY_LIKE
    _compare(got, loop, f"{what}: vmap vs loop", values=values)
    if any(d not in (0, None) for d in dims):
        return          # torch's vmap once per sample (CI time): with every tensor along dim 0
    # torch's vmap, where it runs and the op itself agrees with torch
    try:
        t_got, t_loop = run(torch)
    except Exception:       # noqa: BLE001  (torch has no such op / signature, or no batching for it)
        return
    try:
        _compare(loop, t_loop, "loop vs torch's loop", values=values)
        _compare(t_got, t_loop, "torch's vmap vs its loop", values=values)
    except AssertionError:
        return
    _compare(got, t_got, f"{what}: vmap vs torch.func.vmap", values=values)


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_random_op_raises_in_error_mode(name):
    args, kwargs = RANDOM[name]
    arrays = _arrays(name, _placeholders(args, kwargs), (0,) * len(_placeholders(args, kwargs)), 0)

    def run(T):
        tensors = [T.tensor(a) for a in arrays]
        try:
            T.func.vmap(lambda *ts: _resolve(T, name)(*_fill(T, args, kwargs, ts)[0], **kwargs))(*tensors)
        except RuntimeError as e:
            return str(e)
        return None
    j = run(jitgrad)
    assert j is not None and j.startswith("vmap: called random operation while in randomness error mode")


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_random_op_draws_per_sample(name):
    """randomness='different': each sample draws (rows differ), with the loop's shapes."""
    args, kwargs = RANDOM[name]
    holders = _placeholders(args, kwargs)
    arrays = _arrays(name, holders, (0,) * len(holders), 0)
    tensors = [jitgrad.tensor(a) for a in arrays]
    out = jitgrad.func.vmap(lambda *ts: _resolve(jitgrad, name)(*_fill(jitgrad, args, kwargs, ts)[0], **kwargs),
                            randomness="different")(*tensors)
    one = _resolve(jitgrad, name)(*_fill(jitgrad, args, kwargs, [t[0] for t in tensors])[0], **kwargs)
    assert tuple(out.shape) == (B,) + tuple(one.shape)
    rows = out.double().reshape(B, -1).numpy()
    assert not (rows == rows[0]).all()


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_dynamic_shape_op_raises_as_torch(name):
    args, kwargs = DYNAMIC[name]
    holders = _placeholders(args, kwargs)
    arrays = _arrays(name, holders, (0,) * len(holders), 0)
    for T in (jitgrad,) if name in TORCH_RETURNS_GARBAGE else (jitgrad, torch):
        with pytest.raises(RuntimeError, match="vmap: "):
            T.func.vmap(lambda *ts: _resolve(T, name)(*_fill(T, args, kwargs, ts)[0]))(*[T.tensor(a) for a in arrays])


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT))
def test_data_dependent_op_raises_as_torch(name):
    args, kwargs = DATA_DEPENDENT[name]
    holders = _placeholders(args, kwargs)
    arrays = _arrays(name, holders, (0,) * len(holders), 0)
    for T in (jitgrad, torch):
        with pytest.raises(RuntimeError):
            T.func.vmap(lambda *ts: T.tensor(_resolve(T, name)(*_fill(T, args, kwargs, ts)[0])))(
                *[T.tensor(a) for a in arrays])


@pytest.mark.parametrize("name", sorted(METADATA))
def test_metadata_is_the_logical_tensors(name):
    args, kwargs = METADATA[name]
    holders = _placeholders(args, kwargs)
    arrays = _arrays(name, holders, (0,) * len(holders), 0)
    res = []
    for T in (jitgrad, torch):
        res.append(T.func.vmap(lambda *ts: T.tensor(_resolve(T, name)(*_fill(T, args, kwargs, ts)[0])))(
            *[T.tensor(a) for a in arrays]).tolist())
    assert res[0] == res[1]


def test_in_place_op_writes_each_samples_rows():
    """An in-place op without a rule (the loop) writes into the batched tensor itself."""
    x = jitgrad.tensor(np.random.default_rng(0).uniform(0.5, 1.5, (B, 4)))
    y = x.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jitgrad.func.vmap(lambda t: t.hypot_(t * 0 + 1.0))(y)
    np.testing.assert_allclose(y.numpy(), np.hypot(x.numpy(), 1.0))


def test_fallback_per_sample_gradients():
    """grad inside vmap through ops that loop (linalg.cross, atan2, hypot): per-sample
    gradients, as torch's."""
    def run(T):
        def loss(a, b):
            return (T.linalg.cross(a, b).sum() + T.atan2(a, b).sum() + T.hypot(a, b).sum()) ** 2
        rng = np.random.default_rng(3)
        a, b = T.tensor(rng.uniform(0.5, 1.5, (B, 3))), T.tensor(rng.uniform(0.5, 1.5, (B, 3)))
        return T.func.vmap(T.func.grad(loss, argnums=(0, 1)))(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _compare(run(jitgrad), run(torch), "per-sample grads through the loop")
