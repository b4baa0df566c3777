"""Forward-mode AD of every public op: `jitgrad.<name>` and `jitgrad.nn.functional.<name>`.

tests/autograd/test_forward_ad_primitives.py holds each primitive's JVP; this file holds the
ops users call, most of them compositions, where a tangent can still be lost (flip copied its
array without one) or shared (clone's tangent was its input's). The list of ops is read from
the op table, so a new public op fails `test_every_public_op_is_checked` until it has a sample
here or is listed as not differentiable, with the reason. Each sample runs
- gradcheck(check_forward_ad=True, check_backward_ad=True) (fast mode: one random direction
  against central differences, for the JVP and for the VJP), and
- jitgrad.func.jvp against torch.func.jvp, value and tangent (float64, rtol 1e-6).
The in-place ops that change a tangent's layout or storage are tested at the end.
"""
import inspect

import numpy as np
import pytest

import jitgrad as J
import jitgrad.nn.functional as JF
import jitgrad.ops as _ops

torch = pytest.importorskip("torch")

S = (2, 3)  # the default input shape: small, so that the whole file runs in seconds


def _array(shape, dom, rng):
    if dom == "pos":
        return rng.uniform(0.5, 1.5, shape)
    if dom == "unit":
        return rng.uniform(-0.8, 0.8, shape)
    if dom == "prob":
        return rng.uniform(0.1, 0.9, shape)
    if dom == "spread":  # distinct values, well apart (sort, max, median: no ties near a kink)
        return rng.permutation(np.prod(shape, dtype=int)).reshape(shape) * 0.5 + rng.uniform(-0.1, 0.1, shape)
    return rng.standard_normal(shape)


def un(name, dom="any", shape=S, **kw):
    """A function of one tensor, called by name: jitgrad.<name>(x, **kw)."""
    return [(shape, dom)], lambda T, x: getattr(T, name)(x, **kw)


def bi(name, doms=("any", "any"), shapes=((2, 3), (3,)), **kw):
    return list(zip(shapes, doms)), lambda T, x, y: getattr(T, name)(x, y, **kw)


def ip(name, dom="any"):
    """An in-place form jitgrad.<name>_ (on a copy, so that the input is not a leaf written in place)."""
    return [(S, dom)], lambda T, x: getattr(T, name)(x * 1.0)


def fn(name, dom="any", shape=S, **kw):
    """A function of one tensor of nn.functional."""
    return [(shape, dom)], lambda T, x: getattr(T.nn.functional, name)(x, **kw)


SAMPLES = {
    # elementwise, one input
    **{n: un(n) for n in ("abs", "neg", "exp", "expm1", "sin", "cos", "tanh", "sigmoid", "erf", "atan", "arctan",
                          "sinh", "cosh", "sign", "sgn", "clone", "square", "exp2", "deg2rad", "rad2deg", "frac",
                          "floor", "ceil", "round", "trunc", "nan_to_num", "relu")},
    **{n: un(n, "pos") for n in ("log", "log1p", "log2", "log10", "sqrt", "rsqrt", "reciprocal")},
    **{n: un(n, "unit") for n in ("asin", "acos", "arcsin", "arccos", "tan")},
    **{n + "_": ip(n) for n in ("abs", "neg", "exp", "expm1", "sin", "cos", "tanh", "sigmoid", "erf", "atan",
                                "sign", "relu")},
    **{n + "_": ip(n, "pos") for n in ("log", "log1p", "sqrt", "reciprocal")},
    **{n + "_": ip(n, "unit") for n in ("asin", "acos")},
    "clamp": un("clamp", min=-0.5, max=0.5),
    "real": un("real"),
    "nextafter": bi("nextafter"),
    "as_strided": ([((2, 3), "any")], lambda T, x: T.as_strided(x, (3, 2), (1, 2), 1)),
    "clip": un("clip", min=-0.5, max=0.5),
    "clamp_min": ([(S, "any")], lambda T, x: T.clamp_min(x, 0.1)),
    "clamp_max": ([(S, "any")], lambda T, x: T.clamp_max(x, 0.1)),
    # elementwise, two or more inputs (broadcast)
    **{n: bi(n) for n in ("add", "sub", "mul", "maximum", "minimum", "atan2", "arctan2", "hypot", "logaddexp")},
    "div": bi("div", ("any", "pos")),
    "pow": bi("pow", ("pos", "any")),
    "where": ([(S, "any"), ((3,), "any")], lambda T, x, y: T.where(x > 0, x, y)),
    "masked_fill": ([(S, "any")], lambda T, x: T.masked_fill(x, x > 0, 0.5)),
    "lerp": ([(S, "any"), (S, "any")], lambda T, x, y: T.lerp(x, y, 0.3)),
    "addcmul": ([(S, "any"), (S, "any"), (S, "any")], lambda T, a, b, c: T.addcmul(a, b, c, value=0.5)),
    "addcdiv": ([(S, "any"), (S, "any"), (S, "pos")], lambda T, a, b, c: T.addcdiv(a, b, c, value=0.5)),
    # shape and views
    "flip": ([((2, 3, 2), "any")], lambda T, x: T.flip(x, (0, 2))),
    "roll": ([(S, "any")], lambda T, x: T.roll(x, 1, 1)),
    "reshape": ([(S, "any")], lambda T, x: T.reshape(x, (3, 2))),
    "flatten": ([((2, 3, 2), "any")], lambda T, x: T.flatten(x, 1)),
    "squeeze": ([((2, 1, 3), "any")], lambda T, x: T.squeeze(x, 1)),
    "unsqueeze": ([(S, "any")], lambda T, x: T.unsqueeze(x, 1)),
    "expand": ([((3, 1), "any")], lambda T, x: x.expand(2, 3, 4)),
    "permute": ([((2, 3, 2), "any")], lambda T, x: T.permute(x, (2, 0, 1))),
    "transpose": ([(S, "any")], lambda T, x: T.transpose(x, 0, 1)),
    "swapdims": ([(S, "any")], lambda T, x: T.swapdims(x, 0, 1)),
    "swapaxes": ([(S, "any")], lambda T, x: T.swapaxes(x, 0, 1)),
    "movedim": ([((2, 3, 2), "any")], lambda T, x: T.movedim(x, 0, 2)),
    "moveaxis": ([((2, 3, 2), "any")], lambda T, x: T.moveaxis(x, 0, 2)),
    "t": un("t"),
    "narrow": ([(S, "any")], lambda T, x: T.narrow(x, 1, 1, 2)),
    "select": ([(S, "any")], lambda T, x: T.select(x, 1, 2)),
    "diagonal": ([((3, 3), "any")], lambda T, x: T.diagonal(x, 1)),
    "diag": ([((3,), "any")], lambda T, x: T.diag(x, -1)),
    "diag_embed": ([((2, 3), "any")], lambda T, x: T.diag_embed(x, 1, 0, 2)),
    "tile": ([(S, "any")], lambda T, x: T.tile(x, (2, 1, 2))),
    "broadcast_to": ([((3, 1), "any")], lambda T, x: T.broadcast_to(x, (2, 3, 4))),
    "broadcast_tensors": ([((3, 1), "any"), ((4,), "any")], lambda T, x, y: T.broadcast_tensors(x, y)[1]),
    "unflatten": ([(S, "any")], lambda T, x: T.unflatten(x, 1, (-1, 1))),
    "ravel": ([(S, "any")], lambda T, x: T.ravel(x.t())),
    "repeat_interleave": ([(S, "any")], lambda T, x: T.repeat_interleave(x, 2, dim=0)),
    "tril": un("tril", shape=(3, 3)),
    "triu": un("triu", shape=(3, 3)),
    "cat": ([(S, "any"), ((1, 3), "any")], lambda T, x, y: T.cat([x, y], 0)),
    "stack": ([(S, "any"), (S, "any")], lambda T, x, y: T.stack([x, y], 1)),
    "unbind": ([(S, "any")], lambda T, x: T.unbind(x, 1)),
    "chunk": ([((4, 3), "any")], lambda T, x: T.chunk(x, 2, 0)),
    "split": ([((4, 3), "any")], lambda T, x: T.split(x, 3, 0)),
    "split_with_sizes": ([((4, 3), "any")], lambda T, x: T.split_with_sizes(x, [1, 3], 0)),
    "meshgrid": ([((2,), "any"), ((3,), "any")], lambda T, x, y: T.meshgrid(x, y, indexing="ij")),
    # indexing by tensor and ordering
    "gather": ([(S, "any")], lambda T, x: T.gather(x, 1, T.tensor([[0, 2], [1, 1]]))),
    "take_along_dim": ([(S, "any")], lambda T, x: T.take_along_dim(x, T.tensor([[0, 2], [1, 1]]), 1)),
    "index_select": ([(S, "any")], lambda T, x: T.index_select(x, 1, T.tensor([2, 0, 2]))),
    "masked_select": ([(S, "any")], lambda T, x: T.masked_select(x, T.tensor([True, False, True]))),
    "scatter": ([(S, "any"), ((2, 2), "any")], lambda T, x, s: T.scatter(x, 1, T.tensor([[0, 2], [1, 0]]), s)),
    "scatter_add": ([(S, "any"), ((2, 2), "any")],
                    lambda T, x, s: T.scatter_add(x, 1, T.tensor([[0, 0], [1, 0]]), s)),
    "index_add": ([(S, "any"), ((2, 2), "any")], lambda T, x, s: T.index_add(x, 1, T.tensor([2, 0]), s)),
    "index_copy": ([(S, "any"), ((2, 2), "any")], lambda T, x, s: T.index_copy(x, 1, T.tensor([2, 0]), s)),
    "index_fill": ([(S, "any"), ((), "any")], lambda T, x, v: T.index_fill(x, 1, T.tensor([2, 0]), v)),
    "sort": ([(S, "spread")], lambda T, x: T.sort(x, 1)[0]),
    "topk": ([(S, "spread")], lambda T, x: T.topk(x, 2, 1)[0]),
    "kthvalue": ([(S, "spread")], lambda T, x: T.kthvalue(x, 2, 1)[0]),
    "median": ([(S, "spread")], lambda T, x: T.median(x, 1)[0]),
    "mode": ([(S, "spread")], lambda T, x: T.mode(x, 1)[0]),
    # reductions
    "sum": ([(S, "any")], lambda T, x: T.sum(x, 1)),
    "mean": ([(S, "any")], lambda T, x: T.mean(x, 0)),
    "prod": ([(S, "pos")], lambda T, x: T.prod(x, 1)),
    "amax": ([(S, "spread")], lambda T, x: T.amax(x, 1)),
    "amin": ([(S, "spread")], lambda T, x: T.amin(x, 0)),
    "max": ([(S, "spread")], lambda T, x: T.max(x, 1)[0]),
    "min": ([(S, "spread")], lambda T, x: T.min(x)),
    "norm": ([(S, "any")], lambda T, x: T.norm(x, dim=1)),
    "logsumexp": ([(S, "any")], lambda T, x: T.logsumexp(x, 1)),
    "var": ([(S, "any")], lambda T, x: T.var(x, 1)),
    "std": ([(S, "any")], lambda T, x: T.std(x, 0)),
    "var_mean": ([(S, "any")], lambda T, x: T.var_mean(x, 1)),
    "std_mean": ([(S, "any")], lambda T, x: T.std_mean(x, 1)),
    "cumsum": ([(S, "any")], lambda T, x: T.cumsum(x, 1)),
    "cumprod": ([(S, "pos")], lambda T, x: T.cumprod(x, 1)),
    "diff": ([(S, "any")], lambda T, x: T.diff(x, dim=1)),
    "trace": un("trace", shape=(3, 3)),
    # linear algebra
    "matmul": ([(S, "any"), ((3, 2), "any")], lambda T, a, b: T.matmul(a, b)),
    "mm": ([(S, "any"), ((3, 2), "any")], lambda T, a, b: T.mm(a, b)),
    "mv": ([(S, "any"), ((3,), "any")], lambda T, a, b: T.mv(a, b)),
    "dot": ([((3,), "any"), ((3,), "any")], lambda T, a, b: T.dot(a, b)),
    "bmm": ([((2, 2, 3), "any"), ((2, 3, 2), "any")], lambda T, a, b: T.bmm(a, b)),
    "outer": ([((2,), "any"), ((3,), "any")], lambda T, a, b: T.outer(a, b)),
    "ger": ([((2,), "any"), ((3,), "any")], lambda T, a, b: T.ger(a, b)),
    "addmm": ([((2, 2), "any"), (S, "any"), ((3, 2), "any")], lambda T, c, a, b: T.addmm(c, a, b, beta=0.5)),
    "addmv": ([((2,), "any"), (S, "any"), ((3,), "any")], lambda T, c, a, b: T.addmv(c, a, b, alpha=2.0)),
    "baddbmm": ([((2, 2, 2), "any"), ((2, 2, 3), "any"), ((2, 3, 2), "any")],
                lambda T, c, a, b: T.baddbmm(c, a, b)),
    "addbmm": ([((2, 2), "any"), ((2, 2, 3), "any"), ((2, 3, 2), "any")], lambda T, c, a, b: T.addbmm(c, a, b)),
    "einsum": ([(S, "any"), ((3, 2), "any")], lambda T, a, b: T.einsum("ij,jk->ik", a, b)),
    "cross": ([(S, "any"), (S, "any")], lambda T, a, b: T.cross(a, b, dim=1)),
    "cdist": ([(S, "any"), ((4, 3), "any")], lambda T, a, b: T.cdist(a, b)),
    "cosine_similarity": ([(S, "any"), (S, "any")], lambda T, a, b: T.cosine_similarity(a, b)),
    "pairwise_distance": ([(S, "any"), (S, "any")], lambda T, a, b: T.pairwise_distance(a, b)),
    # softmax family
    "softmax": ([(S, "any")], lambda T, x: T.softmax(x, 1)),
    "log_softmax": ([(S, "any")], lambda T, x: T.log_softmax(x, 0)),
}

# nn.functional: the activations of one tensor
NN_SAMPLES = {
    **{n: fn(n) for n in ("relu", "relu6", "elu", "selu", "celu", "gelu", "silu", "mish", "softplus", "softsign",
                          "logsigmoid", "hardtanh", "hardswish", "hardsigmoid", "sigmoid", "tanh", "leaky_relu")},
    "relu_": ([(S, "any")], lambda T, x: T.nn.functional.relu_(x * 1.0)),
    "softmax": fn("softmax", dim=1),
    "log_softmax": fn("log_softmax", dim=1),
    "normalize": fn("normalize", dim=1),
    "dropout": fn("dropout", p=0.5, training=False),
    "linear": ([(S, "any"), ((4, 3), "any"), ((4,), "any")], lambda T, x, w, b: T.nn.functional.linear(x, w, b)),
    "glu": ([(S, "any")], lambda T, x: T.nn.functional.glu(x, 0)),
    "softmin": fn("softmin", dim=1),
    "threshold": fn("threshold", threshold=0.2, value=-1.0), "tanhshrink": fn("tanhshrink"),
    "softshrink": fn("softshrink", lambd=0.3), "hardshrink": fn("hardshrink", lambd=0.3),
    "rms_norm": ([(S, "any"), ((3,), "any")], lambda T, x, w: T.nn.functional.rms_norm(x, (3,), w)),
    "pad": ([((2, 3, 4), "any")], lambda T, x: T.nn.functional.pad(x, (1, 2, -1, 1), mode="constant", value=0.5)),
    "scaled_dot_product_attention": ([((2, 3, 4), "any"), ((2, 3, 4), "any"), ((2, 3, 2), "any")],
                                     lambda T, q, k, v: T.nn.functional.scaled_dot_product_attention(
                                         q, k, v, is_causal=True)),
    "conv2d": ([((1, 2, 4, 4), "any"), ((3, 2, 2, 2), "any"), ((3,), "any")],
               lambda T, x, w, b: T.nn.functional.conv2d(x, w, b, padding=1)),
    "conv_transpose2d": ([((1, 2, 3, 3), "any"), ((2, 2, 2, 2), "any"), ((4,), "any")],
                         lambda T, x, w, b: T.nn.functional.conv_transpose2d(x, w, b, stride=2, output_padding=1,
                                                                             groups=2)),
    "max_pool2d": ([((1, 2, 4, 4), "spread")], lambda T, x: T.nn.functional.max_pool2d(x, 2)),
    "avg_pool2d": ([((1, 2, 4, 4), "any")], lambda T, x: T.nn.functional.avg_pool2d(x, 2)),
    "adaptive_avg_pool2d": ([((1, 2, 4, 4), "any")], lambda T, x: T.nn.functional.adaptive_avg_pool2d(x, 3)),
    "layer_norm": ([(S, "any"), ((3,), "any"), ((3,), "any")],
                   lambda T, x, w, b: T.nn.functional.layer_norm(x, (3,), w, b)),
    "group_norm": ([((2, 4, 3), "any"), ((4,), "any"), ((4,), "any")],
                   lambda T, x, w, b: T.nn.functional.group_norm(x, 2, w, b)),
    "batch_norm": ([((3, 2, 2), "any"), ((2,), "any"), ((2,), "any")],
                   lambda T, x, w, b: T.nn.functional.batch_norm(x, None, None, w, b, training=True)),
    "embedding": ([((4, 3), "any")], lambda T, w: T.nn.functional.embedding(T.tensor([[0, 3], [3, 1]]), w)),
    "cosine_similarity": ([(S, "any"), (S, "any")], lambda T, a, b: T.nn.functional.cosine_similarity(a, b)),
    "pairwise_distance": ([(S, "any"), (S, "any")], lambda T, a, b: T.nn.functional.pairwise_distance(a, b)),
    # losses (every input that is a float tensor is differentiable; class indices are not)
    "binary_cross_entropy": ([(S, "prob"), (S, "prob")], lambda T, x, t: T.nn.functional.binary_cross_entropy(
        x, t, T.tensor([0.5, 1.0, 2.0], dtype=T.float64))),  # (torch has no tangent for the weight)
    "binary_cross_entropy_with_logits": ([(S, "any"), (S, "prob")],
                                         lambda T, x, t: T.nn.functional.binary_cross_entropy_with_logits(x, t)),
    "cross_entropy": ([(S, "any")], lambda T, x: T.nn.functional.cross_entropy(x, T.tensor([2, 0]))),
    "nll_loss": ([(S, "any")], lambda T, x: T.nn.functional.nll_loss(x, T.tensor([2, 0]), reduction="sum")),
    "mse_loss": ([(S, "any"), (S, "any")], lambda T, x, y: T.nn.functional.mse_loss(x, y)),
    "l1_loss": ([(S, "any"), (S, "any")], lambda T, x, y: T.nn.functional.l1_loss(x, y)),
    "smooth_l1_loss": ([(S, "any"), (S, "any")], lambda T, x, y: T.nn.functional.smooth_l1_loss(x, y, beta=0.7)),
    "huber_loss": ([(S, "any"), (S, "any")], lambda T, x, y: T.nn.functional.huber_loss(x, y, delta=0.7)),
    "kl_div": ([(S, "any"), (S, "prob")], lambda T, x, t: T.nn.functional.kl_div(x, t, reduction="batchmean")),
}

def m(name, *args, dom="any", shape=S):
    """Tensor.<name>(*args) on a copy of the input (an in-place one must not write a leaf)."""
    return [(shape, dom)], lambda T, x: getattr(x * 1.0, name)(*args)


def m2(name, *args, doms=("any", "any"), shapes=(S, S)):
    """Tensor.<name>(other, *args) on a copy of the first input."""
    return list(zip(shapes, doms)), lambda T, x, y: getattr(x * 1.0, name)(y, *args)


# the Tensor methods that are not a public function of the same name (in-place forms, operators...)
METHOD_SAMPLES = {
    **{n: m(n) for n in ("ceil_", "cosh_", "exp2_", "floor_", "frac_", "nan_to_num_", "round_", "sinh_", "square_",
                         "trunc_", "t_", "squeeze_", "contiguous", "cpu", "double", "zero_", "__neg__", "__abs__")},
    **{n: m(n, dom="pos") for n in ("log10_", "log2_", "rsqrt_")},
    "tan_": m("tan_", dom="unit"),
    "tril_": m("tril_", shape=(3, 3)),
    "triu_": m("triu_", shape=(3, 3)),
    "unsqueeze_": m("unsqueeze_", 1),
    "transpose_": m("transpose_", 0, 1),
    "swapdims_": m("swapdims_", 1, 0),
    "swapaxes_": m("swapaxes_", 0, 1),
    "fill_diagonal_": m("fill_diagonal_", 0.5, shape=(3, 3)),
    "fill_": m("fill_", 0.5),
    "pow_": m("pow_", 3.0),
    "__pow__": m("__pow__", 3.0),
    "__rpow__": m("__rpow__", 1.5),
    "__ipow__": m("__ipow__", 2.0),
    "clamp_": m("clamp_", -0.5, 0.5),
    "clamp_min_": m("clamp_min_", 0.1),
    "clamp_max_": m("clamp_max_", 0.1),
    "cumsum_": m("cumsum_", 1),
    "cumprod_": m("cumprod_", 1, dom="pos"),
    "view": m("view", 3, 2),
    "repeat": m("repeat", 2, 1, 2),
    "diag": m("diag", 1, shape=(3, 4)),
    "sum_to_size": m("sum_to_size", 1, 3),
    "__getitem__": m("__getitem__", (slice(None), [2, 0, 2])),
    "float": ([(S, "any")], lambda T, x: x.float()),
    "to": ([(S, "any")], lambda T, x: x.to(T.float32)),
    **{n: m2(n) for n in ("add_", "sub_", "mul_", "atan2_", "hypot_", "copy_", "expand_as", "reshape_as",
                          "view_as", "type_as", "__add__", "__sub__", "__mul__", "__iadd__", "__isub__",
                          "__imul__")},
    **{n: m2(n, doms=("any", "pos")) for n in ("div_", "true_divide", "__truediv__", "__itruediv__")},
    **{n: m(n, 2.5) for n in ("__radd__", "__rsub__", "__rmul__", "__rtruediv__")},  # (a number on the left)
    "fill_tensor": ([(S, "any"), ((), "any")], lambda T, x, v: (x * 1.0).fill_(v)),
    "lerp_": m2("lerp_", 0.3),
    "__matmul__": m2("__matmul__", shapes=(S, (3, 2))),
    "__rmatmul__": m2("__rmatmul__", shapes=(S, (2, 2))),
    "__setitem__": ([(S, "any"), ((2,), "any")], lambda T, x, v: _setitem(x * 1.0, (slice(None), 1), v)),
    "addcmul_": ([(S, "any"), (S, "any"), (S, "any")], lambda T, a, b, c: (a * 1.0).addcmul_(b, c, value=0.5)),
    "addcdiv_": ([(S, "any"), (S, "any"), (S, "pos")], lambda T, a, b, c: (a * 1.0).addcdiv_(b, c, value=0.5)),
    "addmv_": ([((2,), "any"), (S, "any"), ((3,), "any")], lambda T, c, a, b: (c * 1.0).addmv_(a, b)),
    "addbmm_": ([((2, 2), "any"), ((2, 2, 3), "any"), ((2, 3, 2), "any")],
                lambda T, c, a, b: (c * 1.0).addbmm_(a, b)),
    "baddbmm_": ([((2, 2, 2), "any"), ((2, 2, 3), "any"), ((2, 3, 2), "any")],
                 lambda T, c, a, b: (c * 1.0).baddbmm_(a, b, alpha=0.5)),
    "masked_fill_": ([(S, "any")], lambda T, x: (x * 1.0).masked_fill_(x > 0, 0.5)),
    "index_add_": ([(S, "any"), ((2, 2), "any")], lambda T, x, s: (x * 1.0).index_add_(1, T.tensor([2, 0]), s)),
    "index_copy_": ([(S, "any"), ((2, 2), "any")], lambda T, x, s: (x * 1.0).index_copy_(1, T.tensor([2, 0]), s)),
    "index_fill_": ([(S, "any")], lambda T, x: (x * 1.0).index_fill_(1, T.tensor([2, 0]), 0.5)),
    "scatter_": ([(S, "any"), ((2, 2), "any")],
                 lambda T, x, s: (x * 1.0).scatter_(1, T.tensor([[0, 2], [1, 0]]), s)),
    "scatter_add_": ([(S, "any"), ((2, 2), "any")],
                     lambda T, x, s: (x * 1.0).scatter_add_(1, T.tensor([[0, 0], [1, 0]]), s)),
}


def _setitem(x, index, value):
    x[index] = value
    return x


# public names that have no tangent to check, with the reason
NOT_DIFFERENTIABLE = {
    **dict.fromkeys(("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
                     "logical_xor", "isnan", "isfinite", "isinf", "isposinf", "isneginf", "isclose", "allclose",
                     "equal", "all", "any"), "a bool result"),
    **dict.fromkeys(("argmax", "argmin", "argsort", "argwhere", "nonzero", "count_nonzero", "bincount",
                     "searchsorted", "unique", "numel", "one_hot"), "an integer result"),
    **dict.fromkeys(("arange", "linspace", "logspace", "empty", "eye", "full", "ones", "zeros", "rand", "randn",
                     "randint_like", "rand_like", "randn_like", "normal", "bernoulli", "multinomial"),
                    "a factory or a random draw"),
    **dict.fromkeys(("broadcast_shapes", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "set_printoptions", "default_generator", "torch_size", "place", "backward",
                     "register_hook", "register_post_accumulate_grad_hook", "retain_grad", "requires_grad_", "dim",
                     "size", "stride", "storage_offset", "element_size", "nelement", "data_ptr", "get_device",
                     "is_contiguous", "is_floating_point", "is_complex", "ndimension", "promote_types",
                     "is_inference", "item", "tolist", "numpy", "type",
                     "__array__", "__bool__", "__dlpack__", "__dlpack_device__", "__float__", "__hash__",
                     "__index__", "__init__", "__int__", "__iter__", "__len__", "__repr__", "__str__"),
                    "not a tensor op"),
    **dict.fromkeys(("bool", "int", "long", "__and__", "__or__", "__xor__", "__invert__", "__eq__", "__ne__",
                     "__lt__", "__le__", "__gt__", "__ge__"), "an integer or bool result"),
    **dict.fromkeys(("new", "new_empty", "new_full", "new_ones", "new_tensor", "new_zeros", "bernoulli_", "exponential_",
                     "normal_", "random_", "uniform_"), "a factory or a random draw"),
    "__deepcopy__": "copies a leaf outside autograd (torch's copy has no tangent either)",
    "detach": "no tangent by definition (detach_ too)",
    "imag": "raises for every real tensor, as torch (tests/ops/test_library_names.py)",
    "detach_": "no tangent by definition",
    "half": "float16: a float64 gradcheck cannot hold its rounding (float and to() are checked)",
    "cuda": "needs a GPU (tests/cuda/)",
}


def _public():
    names = {n: "jitgrad" for n in _ops.FUNCTIONS}
    for n in dir(JF):
        f = getattr(JF, n)
        if not n.startswith("_") and callable(f) and not inspect.isclass(f) and \
                getattr(f, "__module__", "").startswith("jitgrad"):
            names.setdefault("F." + n, "nn.functional")
    return names


def _methods():
    """Tensor's methods and operators defined by jitgrad that are not a public function's name."""
    out = []
    for n in dir(J.Tensor):
        f = getattr(J.Tensor, n)
        if (n.startswith("__") or not n.startswith("_")) and n not in _ops.FUNCTIONS and callable(f) and \
                str(getattr(f, "__module__", "")).startswith("jitgrad"):
            out.append("Tensor." + n)
    return out


def test_every_public_op_is_checked():
    missing = []
    for name in [*_public(), *_methods()]:
        prefix, _, short = name.rpartition(".")
        table = {"F": NN_SAMPLES, "Tensor": METHOD_SAMPLES, "": SAMPLES}[prefix]
        if short not in table and short not in NOT_DIFFERENTIABLE:
            missing.append(name)
    assert not missing, f"give these public ops a forward-AD sample (or a reason they have none): {sorted(missing)}"


CASES = {**SAMPLES, **{"F." + n: s for n, s in NN_SAMPLES.items()},
         **{"Tensor." + n: s for n, s in METHOD_SAMPLES.items()}}


def _inputs(lib, specs, seed):
    rng = np.random.default_rng(seed)
    arrays = [_array(shape, dom, rng) for shape, dom in specs]
    return [lib.tensor(a, dtype=lib.float64) for a in arrays]


def _floats(out):
    """The float outputs (sort's values, not its indices) as a tuple, for jitgrad and torch alike."""
    return tuple(o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.is_floating_point())


# float32 results: finite differences in float32 cannot hold a float64 gradcheck's tolerance
# (their tangents are compared with torch's below)
NO_GRADCHECK = {"Tensor.float", "Tensor.to"}


@pytest.mark.parametrize("name", sorted(set(CASES) - NO_GRADCHECK))
def test_gradcheck_forward_and_backward(name):
    specs, call = CASES[name]
    xs = [x.requires_grad_() for x in _inputs(J, specs, 5)]
    J.manual_seed(0)
    assert J.autograd.gradcheck(lambda *a: _floats(call(J, *a)), xs, check_forward_ad=True,
                                check_backward_ad=True, fast_mode=True, check_undefined_grad=False)


# torch.func.jvp cannot run these (gradcheck above still checks ours)
TORCH_HAS_NO_JVP = {"cdist": "torch's _cdist_forward has no forward AD"}


@pytest.mark.parametrize("name", sorted(set(CASES) - set(TORCH_HAS_NO_JVP)))
def test_jvp_matches_torch_func_jvp(name):
    specs, call = CASES[name]
    ours = _inputs(J, specs, 3)
    theirs = _inputs(torch, specs, 3)
    rng = np.random.default_rng(4)
    tangents = [rng.standard_normal(tuple(x.shape)) for x in ours]
    out, tan = J.func.jvp(lambda *a: _floats(call(J, *a)), tuple(ours),
                          tuple(J.tensor(t, dtype=J.float64) for t in tangents))
    tout, ttan = torch.func.jvp(lambda *a: _floats(call(torch, *a)), tuple(theirs),
                                tuple(torch.tensor(t, dtype=torch.float64) for t in tangents))
    assert len(out) == len(tout)
    for a, b in zip(out, tout):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6, atol=1e-12)
    for a, b in zip(tan, ttan):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6, atol=1e-10,
                                   err_msg=f"{name}: tangent")



# --- in-place ops: a tangent keeps its storage (views see a write) and never another's ------------
def _dual_run(lib, body, seed=8):
    """body(lib, dual) -> tensors; their primals and tangents (None: no tangent), in float64."""
    fw = lib.autograd.forward_ad
    rng = np.random.default_rng(seed)
    x = lib.tensor(rng.standard_normal((2, 1, 3)), dtype=lib.float64)
    t = lib.tensor(rng.standard_normal((2, 1, 3)), dtype=lib.float64)
    with fw.dual_level():
        d = fw.make_dual(x, t)
        outs = body(lib, d)
        res = []
        for o in outs:
            p, tg = fw.unpack_dual(o)
            res.append((p.detach().numpy().copy(), None if tg is None else tg.detach().numpy().copy()))
    return res


def _same_as_torch(body):
    ours, theirs = _dual_run(J, body), _dual_run(torch, body)
    assert len(ours) == len(theirs)
    for k, ((p, tg), (tp, ttg)) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(p, tp, rtol=1e-12, atol=1e-12, err_msg=f"primal {k}")
        assert (tg is None) == (ttg is None), f"tangent {k}: {tg} vs torch's {ttg}"
        if tg is not None:
            assert tg.shape == ttg.shape, f"tangent {k}: shape {tg.shape} vs torch's {ttg.shape}"
            np.testing.assert_allclose(tg, ttg, rtol=1e-12, atol=1e-12, err_msg=f"tangent {k}")


# ops whose result is a new tensor: writing it in place must leave the input's tangent alone
# (clone shared its input's tangent; add of a constant and sum over a size-1 dim did too)
COPIES = {
    "clone": lambda T, d: d.clone(),
    "add_constant": lambda T, d: d + 1.0,
    "sub_constant": lambda T, d: d - T.ones(2, 1, 3, dtype=T.float64),
    "add_broadcast_constant": lambda T, d: d + T.zeros(4, 2, 1, 3, dtype=T.float64),
    "sum_size_one_dim": lambda T, d: d.sum(1),
    "mean_size_one_dim": lambda T, d: d.mean(1, keepdim=True),
    "flip": lambda T, d: d.flip(0),
    "where_constant": lambda T, d: T.where(T.ones(2, 1, 3, dtype=T.bool), d, 0.0),
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_writing_a_copy_leaves_the_input_tangent_alone(name):
    def body(T, d):
        y = COPIES[name](T, d)
        y.mul_(3.0)
        return d, y
    _same_as_torch(body)


# the in-place view ops: the tangent takes the new layout, and stays the storage of the views'
# tangents (a write through a view made before the op reaches it, and one made after)
RESTRIDES = {
    "transpose_": lambda y: y.transpose_(0, 2),
    "swapdims_": lambda y: y.swapdims_(0, 1),
    "swapaxes_": lambda y: y.swapaxes_(2, 0),
    "t_": lambda y: y.squeeze(1).t_(),
    "squeeze_": lambda y: y.squeeze_(),
    "squeeze_dim": lambda y: y.squeeze_(1),
    "unsqueeze_": lambda y: y.unsqueeze_(0),
}


@pytest.mark.parametrize("name", sorted(RESTRIDES))
def test_inplace_view_op_moves_the_tangent(name):
    def body(T, d):
        y = d * 1.0
        before = y[0]            # a view made before the op
        z = RESTRIDES[name](y)
        after = z.flatten()[1:4] if z.is_contiguous() else z[..., :1]  # a view made after it
        after.mul_(2.0)          # both see it, and so does the tangent of y
        before.add_(before)
        return y, z, before, after
    _same_as_torch(body)


def _restride_a_view(T, d):
    y = d * 1.0
    v = y[1]            # (1, 3)
    v.transpose_(0, 1)  # (3, 1): still a view of y
    v.mul_(2.0)
    w = v[:2]
    w.add_(1.0)
    return y, v, w


def _restride_then_write_a_dual(T, d):
    y = T.zeros(2, 1, 3, dtype=T.float64)  # no tangent
    v = y[0]
    y.transpose_(0, 2)
    v.copy_(d[1])       # y and v get tangents, v's a view of y's
    return y, v


def test_inplace_view_ops_on_views():
    _same_as_torch(_restride_a_view)
    _same_as_torch(_restride_then_write_a_dual)


# a write of a dual into a tensor without a tangent, or into a view of one: its root gets a
# tangent (zeros elsewhere) and so does every view of it, a view of the root's
WRITES_INTO_PRIMALS = {
    "view_copy_": lambda T, d, y: y[0].copy_(d[1]),
    "view_mul_": lambda T, d, y: y[0].add_(1.0).mul_(d[1]),
    "setitem": lambda T, d, y: y.__setitem__(0, d[1]),
    "view_setitem": lambda T, d, y: y[1].__setitem__((0, 1), d[0, 0, 2]),
    "add_": lambda T, d, y: y.add_(d),
}


@pytest.mark.parametrize("name", sorted(WRITES_INTO_PRIMALS))
def test_writing_a_dual_into_a_plain_tensor(name):
    def body(T, d):
        y = T.ones(2, 1, 3, dtype=T.float64)
        before = y[:, :, 1:]  # a view made before the write
        WRITES_INTO_PRIMALS[name](T, d, y)
        after = y[1]
        after.mul_(3.0)
        return y, before, after
    _same_as_torch(body)


# every view op: the view's tangent is the same view of its base's tangent, both ways, whether
# the base had a tangent (y = d * 1) or gets one through the write (y = ones)
VIEWS = {
    "getitem": lambda y: y[1, :, ::2],
    "select": lambda y: y.select(2, 1),
    "narrow": lambda y: y.narrow(2, 1, 2),
    "view": lambda y: y.view(3, 2),
    "reshape": lambda y: y.reshape(6),
    "flatten": lambda y: y.flatten(),
    "squeeze": lambda y: y.squeeze(1),
    "unsqueeze": lambda y: y.unsqueeze(0),
    "permute": lambda y: y.permute(2, 0, 1),
    "transpose": lambda y: y.transpose(0, 2),
    "t": lambda y: y[:, 0].t(),
    "movedim": lambda y: y.movedim(2, 0),
    "diagonal": lambda y: y[:, 0, :2].diagonal(),
    "unbind": lambda y: y.unbind(2)[1],
    "split": lambda y: y.split(2, 2)[0],
    "chunk": lambda y: y.chunk(3, 2)[2],
    "view_as": lambda y: y.view_as(y.new_zeros(3, 2)),
    "expand_then_select": lambda y: y.expand(2, 2, 2, 1, 3)[0, 1],
}


@pytest.mark.parametrize("has_tangent", [True, False], ids=["dual_base", "plain_base"])
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_tangents_share_the_base_tangent(name, has_tangent):
    def body(T, d):
        y = d * 1.0 if has_tangent else T.ones(2, 1, 3, dtype=T.float64)
        v = VIEWS[name](y)
        other = y[0]                  # a view of the same base
        v.mul_(d.sum())               # through the view: the base and the other view see it
        y.add_(d if has_tangent else 1.0)  # through the base: the views see it
        return y, v, other
    _same_as_torch(body)


# in-place ops on a tensor and on views of it: every tangent as torch's
INPLACE = {
    "add_dual": lambda T, d, y: y.add_(d),
    "mul_dual": lambda T, d, y: y.mul_(d),
    "div_": lambda T, d, y: y.div_(2.0),
    "pow_": lambda T, d, y: y.pow_(2.0),
    "clamp_": lambda T, d, y: y.clamp_(-0.5, 0.5),
    "exp_": lambda T, d, y: y.exp_(),
    "atan_": lambda T, d, y: y.atan_(),
    "atan2_": lambda T, d, y: y.atan2_(d + 2.0),
    "fill_": lambda T, d, y: y.fill_(0.25),
    "zero_": lambda T, d, y: y.zero_(),
    "copy_": lambda T, d, y: y.copy_(d.flip(2)),
    "masked_fill_": lambda T, d, y: y.masked_fill_(d > 0, 1.0),
    "setitem": lambda T, d, y: y.__setitem__((0, 0), d[1, 0] * 2.0),
    "view_mul_": lambda T, d, y: y[1].mul_(d[0]),
    "view_setitem": lambda T, d, y: y[:, 0].__setitem__(1, 3.0),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_tangents(name):
    def body(T, d):
        y = d * 1.0
        sibling = y[:, :, 1:]
        INPLACE[name](T, d, y)
        return d, y, sibling
    _same_as_torch(body)


# --- asin, acos, atan, atan2, binary_cross_entropy: op-table entries (no custom Function) --------
NAMED = {
    "AsinBackward0": lambda T, x, y: T.asin(x * 0.5),
    "AcosBackward0": lambda T, x, y: x.mul(0.5).acos(),
    "AtanBackward0": lambda T, x, y: T.arctan(x),
    "Atan2Backward0": lambda T, x, y: T.atan2(x, y),
    "BinaryCrossEntropyBackward0": lambda T, x, y: T.nn.functional.binary_cross_entropy(
        T.sigmoid(x), T.sigmoid(y).expand(2, 3), reduction="none"),
}


@pytest.mark.parametrize("node", sorted(NAMED))
def test_node_names_and_second_order(node):
    rng = np.random.default_rng(2)
    arrays = rng.uniform(-0.9, 0.9, (2, 3)), rng.uniform(-0.9, 0.9, (3,))
    res = []
    for T in (J, torch):
        x, y = (T.tensor(a, dtype=T.float64, requires_grad=True) for a in arrays)
        out = NAMED[node](T, x, y)
        assert type(out.grad_fn).__name__ == node
        g = T.autograd.grad(out.sum(), (x, y), create_graph=True, allow_unused=True)
        gg = T.autograd.grad(sum(t.square().sum() for t in g if t is not None), (x, y), allow_unused=True)
        res.append([t.detach().numpy() for t in (out, *g, *gg) if t is not None])
    for a, b in zip(*res, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_atan2_promotes_as_a_binary_op():
    for T in (J, torch):
        f32 = T.tensor([1.0, -2.0])
        assert T.atan2(f32, T.tensor(2.0, dtype=T.float64)).dtype == T.float32  # a 0-d tensor does not promote
        assert T.atan2(f32, T.tensor([2.0], dtype=T.float64)).dtype == T.float64
        assert T.atan2(T.tensor([1, 2]), T.tensor([3, 0])).dtype == T.float32   # integers: the default dtype
        for args, arg in (((f32, 2.0), r"'other' \(position 2\)"), ((2.0, f32), r"'input' \(position 1\)")):
            with pytest.raises(TypeError, match=rf"^atan2\(\): argument {arg} must be Tensor, not float"):
                T.atan2(*args)


def test_compiled_step_replays_them_without_a_graph_break():
    def step(w, x, t, opt):
        h = J.sigmoid(J.atan2(x, w) + J.asin(x * 0.5) + J.acos(x * 0.3) + J.atan(w))
        loss = J.nn.functional.binary_cross_entropy(h, t)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def run(compiled):
        w = J.tensor(np.linspace(0.2, 1.0, 3), dtype=J.float64, requires_grad=True)
        opt = J.optim.SGD([w], lr=0.1)
        f = J.compile(step, fullgraph=True) if compiled else step  # fullgraph: a break raises
        t = J.tensor(np.linspace(0.1, 0.9, 6).reshape(2, 3), dtype=J.float64)
        losses = [float(f(w, J.tensor(np.linspace(-0.9, 0.9, 6).reshape(2, 3) * (1 - 0.1 * i)), t, opt))
                  for i in range(3)]
        return losses, w.detach().numpy()

    (lc, wc), (le, we) = run(True), run(False)
    np.testing.assert_allclose(lc, le, rtol=1e-12)
    np.testing.assert_allclose(wc, we, rtol=1e-12)


@pytest.mark.parametrize("call", [
    lambda T, d, o: T.sin(d, out=o),
    lambda T, d, o: T.add(d, 1.0, out=o),
    lambda T, d, o: T.sin(d.detach(), out=T.autograd.forward_ad.make_dual(o, o + 1.0)),  # a dual out
    lambda T, d, o: T.cat([d, d], out=o),
], ids=["sin", "add", "dual_out", "cat"])
def test_out_functions_refuse_forward_ad(call):
    for T in (J, torch):  # as torch: out's tangent would otherwise be left stale
        with T.autograd.forward_ad.dual_level():
            d = T.autograd.forward_ad.make_dual(T.ones(3, dtype=T.float64), T.ones(3, dtype=T.float64))
            with pytest.raises(NotImplementedError, match=r"^Trying to use forward AD with \w+_out that does not "
                                                          r"support it because it is an out= function"):
                call(T, d, T.zeros(3, dtype=T.float64))


def _mixed(T, x):
    """In-place view ops, a written clone, flip and the former custom Functions in one function."""
    y = (x * 1.0).reshape(2, 3)
    y.transpose_(0, 1)
    z = y.clone()
    z.mul_(2.0)
    w = T.atan2(z, y.flip(0) + 2.0) + T.asin(y * 0.3) + T.acos(y * 0.2) * T.atan(y)
    w = w.unsqueeze_(0).squeeze_()
    return T.nn.functional.binary_cross_entropy(T.sigmoid(w), T.sigmoid(y.detach() * 0.5)) + (w * w).sum()


@pytest.mark.parametrize("transform", ["jacfwd", "hessian", "jacrev(jacfwd)"])  # forward, forward-over-reverse, reverse-over-forward
def test_stacked_transforms_match_torch_func(transform):
    x = np.random.default_rng(0).standard_normal(6) * 0.5
    res = []
    for T in (J, torch):
        f = lambda t, T=T: _mixed(T, t)  # noqa: E731
        for name in reversed(transform.replace(")", "").split("(")):
            f = getattr(T.func, name)(f)
        res.append(f(T.tensor(x, dtype=T.float64)).detach().numpy())
    np.testing.assert_allclose(*res, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("args,message", [
    (([0.5], [1.5], "float32"), "all elements of target should be between 0 and 1"),
    (([1.5], [0.5], "float32"), "all elements of input should be between 0 and 1"),
    (([0.5], [1.0], "float64"), "Found dtype Double but expected Float"),
])
def test_binary_cross_entropy_checks_its_arguments(args, message):
    x, t, tdtype = args
    for T in (J, torch):
        with pytest.raises(RuntimeError, match=f"^{message}"):
            T.nn.functional.binary_cross_entropy(T.tensor(x), T.tensor(t, dtype=getattr(T, tdtype)))
