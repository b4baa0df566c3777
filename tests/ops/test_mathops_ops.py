"""Math, statistics, einsum and activation ops against PyTorch in float64: values, first and
second-order gradients, dtype rules and errors."""
import math

import numpy as np
import pytest
import torch
from conftest import assert_close

import jitgrad
import jitgrad.nn as jnn
import jitgrad.nn.functional as JF

LIBS = {"j": (jitgrad, JF, jnn), "t": (torch, torch.nn.functional, torch.nn)}


def _np(t):
    """numpy copy; torch's ZeroTensor gradients (second order of a piecewise-linear op) included."""
    return None if t is None else np.array(t.detach().numpy(**({"force": True} if isinstance(t, torch.Tensor) else {})))


def _inputs(T, arrays):
    return [T.tensor(a, dtype=T.float64, requires_grad=True) for a in arrays]


def _run(fn, arrays, second=True, grad_rtol=1e-8):
    """fn(T, F, nn, *tensors) in both libraries: output, gradients and gradients of the gradients."""
    res = {}
    for key, (T, F, nn) in LIBS.items():
        xs = _inputs(T, arrays)
        out = fn(T, F, nn, *xs)
        outs = out if isinstance(out, tuple) else (out,)
        w = [T.tensor(np.cos(np.arange(o.numel()) + 1.0).reshape(tuple(o.shape)), dtype=T.float64) for o in outs]
        loss = sum((o * wi).sum() for o, wi in zip(outs, w))
        gs = T.autograd.grad(loss, xs, create_graph=second, allow_unused=True)
        gg = None
        if second:
            used = [g for g in gs if g is not None and g.requires_grad]
            if used:
                gg = T.autograd.grad(sum((g * g).sum() for g in used), xs, allow_unused=True)
        res[key] = (outs, gs, gg)
    (jo, jg, jgg), (to, tg, tgg) = res["j"], res["t"]
    for a, b in zip(jo, to):
        assert_close(a, b, msg="value")
    for a, b in zip(jg, tg):
        assert (a is None) == (b is None)
        if a is not None:
            assert_close(a, _np(b), rtol=grad_rtol, atol=1e-10, msg="grad")
    if second:
        # an op linear in pieces has no second-order graph in one library or zeros in the other
        zeros = [np.zeros(a.shape) for a in arrays]
        jgg = [zeros[i] if g is None else _np(g) for i, g in enumerate(jgg or [None] * len(arrays))]
        tgg = [zeros[i] if g is None else _np(g) for i, g in enumerate(tgg or [None] * len(arrays))]
        for a, b in zip(jgg, tgg):
            assert_close(a, b, rtol=1e-7, atol=1e-9, msg="second order")


R = np.random.default_rng(0)
A34 = R.standard_normal((3, 4))
B34 = R.standard_normal((3, 4))
POS34 = R.uniform(0.5, 2.0, (3, 4))
A234 = R.standard_normal((2, 3, 4))
A3 = R.standard_normal(3)
B3 = R.standard_normal(3)

CASES = {
    "var_default": (lambda T, F, nn, x: x.var(), [A34]),
    "var_dim": (lambda T, F, nn, x: T.var(x, 1), [A34]),
    "var_dims_keepdim": (lambda T, F, nn, x: x.var((0, 2), keepdim=True), [A234]),
    "var_unbiased_false": (lambda T, F, nn, x: x.var(1, unbiased=False), [A34]),
    "var_correction": (lambda T, F, nn, x: T.var(x, dim=0, correction=0), [A34]),
    "var_correction2": (lambda T, F, nn, x: x.var(dim=-1, correction=2, keepdim=True), [A34]),
    "std": (lambda T, F, nn, x: x.std(0), [A34]),
    "std_all": (lambda T, F, nn, x: T.std(x, unbiased=False), [A34]),
    "var_mean": (lambda T, F, nn, x: T.var_mean(x, 1, keepdim=True), [A34]),
    "std_mean": (lambda T, F, nn, x: T.std_mean(x, dim=(0, 1), correction=0), [A234]),
    "norm": (lambda T, F, nn, x: x.norm(), [A34]),
    "norm_dim": (lambda T, F, nn, x: T.norm(x, dim=1, keepdim=True), [A34]),
    "norm_p1": (lambda T, F, nn, x: x.norm(p=1, dim=0), [A34]),
    "norm_p3": (lambda T, F, nn, x: x.norm(3, dim=1), [A34]),
    "norm_inf": (lambda T, F, nn, x: x.norm(float("inf"), dim=1), [A34]),
    "norm_fro": (lambda T, F, nn, x: T.norm(x, p="fro"), [A34]),
    "vector_norm": (lambda T, F, nn, x: T.linalg.vector_norm(x, dim=(1, 2)), [A234]),
    "vector_norm_ord": (lambda T, F, nn, x: T.linalg.vector_norm(x, ord=0.5), [A34]),
    "matrix_norm": (lambda T, F, nn, x: T.linalg.matrix_norm(x), [A234]),
    "matrix_norm_1": (lambda T, F, nn, x: T.linalg.matrix_norm(x, ord=1), [A234]),
    "matrix_norm_inf": (lambda T, F, nn, x: T.linalg.matrix_norm(x, ord=-math.inf, keepdim=True), [A234]),
    "linalg_norm_vec": (lambda T, F, nn, x: T.linalg.norm(x, dim=1), [A34]),
    "linalg_norm_mat": (lambda T, F, nn, x: T.linalg.norm(x), [A34]),
    "linalg_norm_ord_mat": (lambda T, F, nn, x: T.linalg.norm(x, ord=math.inf), [A34]),
    "logsumexp": (lambda T, F, nn, x: T.logsumexp(x, 1), [A34]),
    "logsumexp_big": (lambda T, F, nn, x: (x * 1000).logsumexp(dim=(0, 1), keepdim=True), [A34]),
    "cumsum": (lambda T, F, nn, x: T.cumsum(x, 1), [A34]),
    "cumsum_dim0": (lambda T, F, nn, x: x.cumsum(dim=0), [A234]),
    "cumprod": (lambda T, F, nn, x: x.cumprod(1), [A34]),
    "cumprod_zero": (lambda T, F, nn, x: T.cumprod(x * T.tensor([1.0, 0.0, 1.0, 1.0], dtype=T.float64), -1),
                     [A34]),
    "diff": (lambda T, F, nn, x: T.diff(x), [A34]),
    "diff_n2": (lambda T, F, nn, x: x.diff(n=2, dim=0, prepend=x[:1] * 2), [A34]),
    "square": (lambda T, F, nn, x: x.square(), [A34]),
    "rsqrt": (lambda T, F, nn, x: T.rsqrt(x), [POS34]),
    "log2": (lambda T, F, nn, x: x.log2(), [POS34]),
    "log10": (lambda T, F, nn, x: T.log10(x), [POS34]),
    "exp2": (lambda T, F, nn, x: T.exp2(x), [A34]),
    "hypot": (lambda T, F, nn, x, y: T.hypot(x, y), [A34, B34]),
    "addcmul": (lambda T, F, nn, a, b, c: T.addcmul(a, b, c, value=0.5), [A34, B34, POS34]),
    "addcdiv": (lambda T, F, nn, a, b, c: a.addcdiv(b, c, value=-2), [A34, B34, POS34]),
    "lerp": (lambda T, F, nn, a, b: T.lerp(a, b, 0.3), [A34, B34]),
    "lerp_tensor_weight": (lambda T, F, nn, a, b, w: a.lerp(b, w), [A34, B34, POS34]),
    "tril": (lambda T, F, nn, x: T.tril(x), [A34]),
    "triu_diag": (lambda T, F, nn, x: x.triu(diagonal=1), [A234]),
    "tril_neg": (lambda T, F, nn, x: x.tril(-1), [A34]),
    "outer": (lambda T, F, nn, a, b: T.outer(a, b), [A3, B3]),
    "ger": (lambda T, F, nn, a, b: a.ger(b), [A3, B3]),
    "addmv": (lambda T, F, nn, c, m, v: T.addmv(c, m, v, beta=0.5, alpha=2), [A3, A34, R.standard_normal(4)]),
    "baddbmm": (lambda T, F, nn, c, a, b: T.baddbmm(c, a, b, alpha=0.5),
                [R.standard_normal((2, 3, 5)), A234, R.standard_normal((2, 4, 5))]),
    "baddbmm_beta0": (lambda T, F, nn, c, a, b: c.baddbmm(a, b, beta=0),
                      [R.standard_normal((3, 5)), A234, R.standard_normal((2, 4, 5))]),
    "addbmm": (lambda T, F, nn, c, a, b: T.addbmm(c, a, b, beta=2),
               [R.standard_normal((3, 5)), A234, R.standard_normal((2, 4, 5))]),
    "cross": (lambda T, F, nn, a, b: T.cross(a, b, dim=1), [R.standard_normal((4, 3)), R.standard_normal((4, 3))]),
    "linalg_cross": (lambda T, F, nn, a, b: T.linalg.cross(a, b), [R.standard_normal((2, 3)), B3[None]]),
    "roll": (lambda T, F, nn, x: T.roll(x, 1, 1), [A34]),
    "roll_flat": (lambda T, F, nn, x: x.roll(5), [A34]),
    "roll_multi": (lambda T, F, nn, x: x.roll((1, -2), (0, 2)), [A234]),
    "movedim": (lambda T, F, nn, x: T.movedim(x, 0, -1), [A234]),
    "moveaxis": (lambda T, F, nn, x: x.moveaxis((0, 1), (2, 0)), [A234]),
    "meshgrid_ij": (lambda T, F, nn, a, b: T.meshgrid(a, b, indexing="ij"), [A3, R.standard_normal(4)]),
    "meshgrid_xy": (lambda T, F, nn, a, b, c: T.meshgrid([a, b, c], indexing="xy"),
                    [A3, R.standard_normal(4), R.standard_normal(2)]),
    "cdist": (lambda T, F, nn, a, b: T.cdist(a, b), [R.standard_normal((4, 3)), R.standard_normal((5, 3))]),
    "cdist_p1_batched": (lambda T, F, nn, a, b: T.cdist(a, b, p=1),
                         [R.standard_normal((2, 4, 3)), R.standard_normal((2, 5, 3))]),
    "nan_to_num": (lambda T, F, nn, x: (x / T.tensor([0.0, 1.0, 1.0, 1.0], dtype=T.float64)).nan_to_num(), [A34]),
    "softplus": (lambda T, F, nn, x: F.softplus(x * 10), [A34]),
    "softplus_beta": (lambda T, F, nn, x: F.softplus(x, beta=2, threshold=1), [A34]),
    "elu": (lambda T, F, nn, x: F.elu(x, 0.7), [A34]),
    "leaky_relu": (lambda T, F, nn, x: F.leaky_relu(x, 0.2), [A34]),
    "silu": (lambda T, F, nn, x: F.silu(x), [A34]),
    "mish": (lambda T, F, nn, x: F.mish(x), [A34]),
    "hardtanh": (lambda T, F, nn, x: F.hardtanh(x * 2, -1.5, 0.5), [A34]),
    "relu6": (lambda T, F, nn, x: F.relu6(x * 5), [A34]),
    "atan2": (lambda T, F, nn, y, x: T.atan2(y, x), [A34, B34]),
    "atan2_broadcast": (lambda T, F, nn, y, x: y.atan2(x), [A34, R.standard_normal((3, 1))]),
    "atan": (lambda T, F, nn, x: T.atan(x), [A34]),
    "asin_acos": (lambda T, F, nn, x: (x.asin(), T.acos(x), T.arctan2(x, x + 2)), [R.uniform(-0.9, 0.9, (3, 4))]),
    "rounding": (lambda T, F, nn, x: (x.floor(), T.ceil(x), x.trunc(), T.round(x), x.round(decimals=1), x.frac()),
                 [A34 * 3]),
    "clamp_min_max": (lambda T, F, nn, x: (x.clamp_min(0.1), T.clamp_max(x, -0.2)), [A34]),
    "hyperbolic_tan": (lambda T, F, nn, x: (x.sinh(), T.cosh(x), T.tan(x)), [A34]),
    "logaddexp": (lambda T, F, nn, a, b: T.logaddexp(a, b * 50), [A34, B34]),
    "logaddexp_equal": (lambda T, F, nn, a: a.logaddexp(a), [A34]),
    "deg_rad": (lambda T, F, nn, x: (x.deg2rad(), T.rad2deg(x)), [A34]),
    "flip": (lambda T, F, nn, x: (T.flip(x, [0, 2]), x.flip(-1)), [A234]),
    "hardsigmoid": (lambda T, F, nn, x: F.hardsigmoid(x * 4), [A34]),
    "hardswish": (lambda T, F, nn, x: F.hardswish(x * 4), [A34]),
    "selu": (lambda T, F, nn, x: F.selu(x), [A34]),
    "celu": (lambda T, F, nn, x: F.celu(x, 0.5), [A34]),
    "softsign": (lambda T, F, nn, x: F.softsign(x), [A34]),
    "modules_more": (lambda T, F, nn, x: (nn.Hardsigmoid()(x * 4), nn.Hardswish()(x * 4), nn.SELU()(x),
                                          nn.CELU(2.0)(x), nn.Softsign()(x)), [A34]),
    "logsigmoid": (lambda T, F, nn, x: F.logsigmoid(x * 30), [A34]),
    "normalize": (lambda T, F, nn, x: F.normalize(x), [A34]),
    "normalize_p1_dim0": (lambda T, F, nn, x: F.normalize(x, p=1, dim=0), [A34]),
    "cosine_similarity": (lambda T, F, nn, a, b: F.cosine_similarity(a, b), [A34, B34]),
    "cosine_similarity_dim": (lambda T, F, nn, a, b: F.cosine_similarity(a, b[:1], dim=-1), [A34, B34]),
    "pairwise_distance": (lambda T, F, nn, a, b: F.pairwise_distance(a, b), [A34, B34]),
    "pairwise_distance_p1": (lambda T, F, nn, a, b: F.pairwise_distance(a, b, p=1, keepdim=True), [A34, B34]),
    "modules": (lambda T, F, nn, x: (nn.Softplus(2)(x), nn.ELU()(x), nn.LeakyReLU(0.1)(x), nn.SiLU()(x),
                                     nn.Mish()(x), nn.Hardtanh(-0.5, 0.5)(x), nn.LogSigmoid()(x), nn.ReLU6()(x)),
                [A34]),
    "modules_similarity": (lambda T, F, nn, a, b: (nn.CosineSimilarity(0)(a, b), nn.PairwiseDistance(3)(a, b)),
                           [A34, B34]),
}


# PyTorch has no second derivative of cdist or hardsigmoid ("... is not implemented")
FIRST_ORDER_ONLY = {"cdist", "cdist_p1_batched", "hardsigmoid", "modules_more"}
# PyTorch's hardsigmoid backward multiplies by a float32 1/6, even in float64
LOOSE_GRAD = {"hardsigmoid", "modules_more"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    fn, arrays = CASES[name]
    _run(fn, arrays, second=name not in FIRST_ORDER_ONLY, grad_rtol=1e-6 if name in LOOSE_GRAD else 1e-8)


EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,kj", [(3, 4), (5, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("i,i->", [(4,), (4,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("iji->j", [(3, 4, 3)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("...ij,...jk", [(2, 1, 3, 4), (3, 4, 2)]),
    ("b...,b...->b", [(2, 3, 4), (2, 3, 4)]),
    ("i...->...", [(2, 3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,cd,bd->a", [(2, 3, 4), (4, 5), (3, 5)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ij,ik->jk", [(1, 4), (3, 5)]),
    ("ijk,ik->j", [(2, 3, 4), (2, 4)]),
    ("i j , j k -> i k", [(2, 3), (3, 2)]),
    ("aab,bc->ac", [(3, 3, 4), (4, 2)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUM, ids=[e for e, _ in EINSUM])
def test_einsum(eq, shapes):
    rng = np.random.default_rng(len(eq))
    arrays = [rng.standard_normal(s) for s in shapes]
    _run(lambda T, F, nn, *xs: T.einsum(eq, *xs), arrays)
    _run(lambda T, F, nn, *xs: T.einsum(eq, list(xs)), arrays, second=False)


def _both(fn):
    return fn(jitgrad), fn(torch)


def _same(fn):
    a, b = _both(fn)
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(a, b):
        assert str(x.dtype).replace("jitgrad", "torch") == str(y.dtype), (x.dtype, y.dtype)
        assert tuple(x.shape) == tuple(y.shape)
        np.testing.assert_allclose(np.asarray(x.numpy(), dtype=float), np.asarray(y.numpy(), dtype=float),
                                   rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("fn", [
    lambda T: T.cumsum(T.tensor([[1, 2], [3, 4]]), 1),
    lambda T: T.cumsum(T.tensor([True, False, True]), 0),
    lambda T: T.tensor([1, 2, 3], dtype=T.int32).cumprod(0),
    lambda T: T.cumsum(T.tensor([1, 2, 3]), 0, dtype=T.float64),
    lambda T: T.tensor([1.0, 2.0], dtype=T.float32).cumsum(0),
    lambda T: T.square(T.tensor([1, -2, 3])),
    lambda T: T.rsqrt(T.tensor([1, 4])),
    lambda T: T.log2(T.tensor([1, 8])),
    lambda T: T.exp2(T.tensor([3])),
    lambda T: T.log10(T.tensor([100.0], dtype=T.float32)),
    lambda T: T.diff(T.tensor([1, 4, 9, 16])),
    lambda T: T.diff(T.tensor([True, False, False, True])),
    lambda T: T.tril(T.ones(3, 3, dtype=T.int64)),
    lambda T: T.triu(T.tensor([[1.0, math.inf], [math.inf, 2.0]]), 1),
    lambda T: T.tril(T.tensor([[1.0, math.inf], [math.inf, 2.0]])),
    lambda T: T.roll(T.arange(6).reshape(2, 3), 1, 0),
    lambda T: T.outer(T.arange(3), T.arange(2)),
    lambda T: T.isinf(T.tensor([1.0, math.inf, -math.inf, math.nan])),
    lambda T: T.isposinf(T.tensor([1.0, math.inf, -math.inf])),
    lambda T: T.isneginf(T.tensor([1.0, math.inf, -math.inf])),
    lambda T: T.isinf(T.tensor([1, 2])),
    lambda T: T.tensor([1.0, math.inf]).isfinite(),
    lambda T: T.isclose(T.tensor([1.0, 2.0, math.nan]), T.tensor([1.0 + 1e-9, 2.1, math.nan])),
    lambda T: T.isclose(T.tensor([1.0, math.nan]), T.tensor([1.0, math.nan]), equal_nan=True),
    lambda T: T.tensor([1.0, 2.0]).isclose(T.tensor([1.5, 2.0]), rtol=0, atol=0.6),
    lambda T: T.nan_to_num(T.tensor([math.nan, math.inf, -math.inf, 1.0], dtype=T.float32)),
    lambda T: T.nan_to_num(T.tensor([math.nan, math.inf, -math.inf]), nan=1.0, posinf=2.0, neginf=-2.0),
    lambda T: T.nan_to_num(T.tensor([1, 2])),
    lambda T: T.logsumexp(T.tensor([-math.inf, -math.inf]), 0),
    lambda T: T.logsumexp(T.tensor([math.inf, 1.0]), 0),
    lambda T: T.logsumexp(T.tensor([1, 2, 3]), 0),
    lambda T: T.var(T.tensor([1.0, 2.0, 4.0], dtype=T.float32)),
    lambda T: T.tensor([[1.0, 2.0]]).var(0),
    lambda T: T.tensor([[1.0, 2.0]]).std(1, correction=0),
    lambda T: T.norm(T.tensor([3.0, 4.0], dtype=T.float32)),
    lambda T: T.norm(T.tensor([[1.0, -2.0], [0.0, 5.0]]), p=1),
    lambda T: T.linalg.vector_norm(T.tensor([3.0, 0.0, -4.0]), ord=0),
    lambda T: T.linalg.vector_norm(T.tensor([3.0, -4.0]), ord=-math.inf),
    lambda T: T.linalg.vector_norm(T.tensor([1.0, 2.0], dtype=T.float32), dtype=T.float64),
    lambda T: T.meshgrid(T.arange(3), T.arange(2)),
    lambda T: T.meshgrid(T.arange(3), indexing="xy"),
    lambda T: T.einsum("ij,j->i", T.arange(6).reshape(2, 3), T.arange(3)),
    lambda T: T.lerp(T.tensor([0.0, 1.0], dtype=T.float32), T.tensor([1.0, 3.0], dtype=T.float32), 0.5),
    lambda T: T.addcmul(T.tensor([1, 2]), T.tensor([3, 4]), T.tensor([5, 6]), value=2),
    lambda T: T.hypot(T.tensor([3.0]), T.tensor([4.0])),
    lambda T: T.atan2(T.tensor([1, -2]), T.tensor([3, 0])),
    lambda T: T.floor(T.tensor([1, -2])),
    lambda T: T.tensor([0.5, 1.5, 2.5, -0.5]).round(),
    lambda T: T.tensor([1.26, -1.35], dtype=T.float64).round(decimals=1),
    lambda T: T.sinh(T.tensor([1, 2])),
    lambda T: T.flip(T.arange(6).reshape(2, 3), [1]),
    lambda T: T.count_nonzero(T.tensor([[0, 1, 2], [0, 0, 3]]), dim=1),
    lambda T: T.count_nonzero(T.tensor([[0.0, 1.0], [0.0, 2.0]])),
    lambda T: T.tensor([-2.0, 0.0, 3.0]).sgn(),
    lambda T: T.logaddexp(T.tensor([-math.inf, 1000.0]), T.tensor([-math.inf, 1000.0])),
    lambda T: T.atan2(T.tensor([1.0, 0.0]), T.tensor([-1.0, 0.0], dtype=T.float64)),
    lambda T: T.asin(T.tensor([2.0, 1.0])),
    lambda T: T.cross(T.tensor([[1.0, 0.0, 0.0]]), T.tensor([[0.0, 1.0, 0.0]])),
    lambda T: T.cross(T.tensor([1, 0, 0]), T.tensor([0, 1, 0]), dim=0),
    lambda T: T.movedim(T.zeros(2, 3, 4), 1, 0),
    lambda T: T.cdist(T.tensor([[0.0, 0.0]]), T.tensor([[3.0, 4.0], [0.0, 0.0]])),
    lambda T: T.nn.functional.leaky_relu(T.tensor([-1, 2], dtype=T.float32)),
    lambda T: T.nn.functional.softplus(T.tensor([100.0, -100.0, 0.0])),
    lambda T: T.nn.functional.logsigmoid(T.tensor([-100.0, 100.0])),
    lambda T: T.nn.functional.normalize(T.zeros(2, 3)),
    lambda T: T.nn.functional.elu(T.tensor([-1000.0, 1000.0])),
    lambda T: T.nn.functional.mish(T.tensor([-100.0, 100.0])),
], ids=lambda f: "")
def test_values_and_dtypes(fn):
    _same(fn)


@pytest.mark.parametrize("name,fn", [
    ("norm_at_zero", lambda T, x: (x * 0).norm()),
    ("normalize_zero_row", lambda T, x: T.nn.functional.normalize(x * T.tensor([[0.0], [1.0], [1.0]],
                                                                                   dtype=T.float64))),
    ("cosine_zero", lambda T, x: T.nn.functional.cosine_similarity(x * 0, x)),
    ("cdist_same_point", lambda T, x: T.cdist(x, x)),
    ("pairwise_same", lambda T, x: T.nn.functional.pairwise_distance(x, x)),
    ("softplus_at_zero", lambda T, x: T.nn.functional.softplus(x * 0)),
    ("leaky_at_zero", lambda T, x: T.nn.functional.leaky_relu(x * 0)),
    ("elu_at_zero", lambda T, x: T.nn.functional.elu(x * 0)),
    ("hardtanh_at_bound", lambda T, x: T.nn.functional.hardtanh(x * 0 + 1)),
    ("hardswish_at_kinks", lambda T, x: T.nn.functional.hardswish(x * 0 + T.tensor([-3.0, 3.0, 0.0, -4.0],
                                                                                   dtype=T.float64))),
    ("hardsigmoid_at_kinks", lambda T, x: T.nn.functional.hardsigmoid(x * 0 + T.tensor([-3.0, 3.0, 0.0, -4.0],
                                                                                       dtype=T.float64))),
    ("selu_celu_at_zero", lambda T, x: T.nn.functional.selu(x * 0) + T.nn.functional.celu(x * 0, 2.0)),
    ("logsumexp_neg_inf_row", lambda T, x: T.logsumexp(x * 0 - math.inf, 1)),
    ("var_single", lambda T, x: x[:1].var(0, correction=0)),
    ("std_constant", lambda T, x: (x * 0 + 1).std(0) + T.std_mean(x * 0, 1)[0].sum()),
    ("norm_p3_at_zero", lambda T, x: (x * 0).norm(3, dim=1)),
    ("cdist_p3_same_point", lambda T, x: T.cdist(x, x, p=3)),
    ("norm_inf_ties", lambda T, x: (x * 0 + 1).norm(float("inf"))),
], ids=lambda v: v if isinstance(v, str) else "")
def test_gradient_edge_cases(name, fn):
    out = {}
    for T in (jitgrad, torch):
        x = T.tensor(A34, dtype=T.float64, requires_grad=True)
        y = fn(T, x)
        g, = T.autograd.grad(y.sum(), x)
        out[T] = (y.detach().numpy(), g.numpy())
    np.testing.assert_allclose(out[jitgrad][0], out[torch][0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out[jitgrad][1], out[torch][1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,fn", [
    ("leaky_relu", lambda T, y: T.nn.functional.leaky_relu(y, 0.1, True)),
    ("elu", lambda T, y: T.nn.functional.elu(y, inplace=True)),
    ("silu", lambda T, y: T.nn.functional.silu(y, inplace=True)),
    ("hardtanh_module", lambda T, y: T.nn.Hardtanh(-0.5, 0.5, inplace=True)(y)),
    ("leaky_module", lambda T, y: T.nn.LeakyReLU(0.2, inplace=True)(y)),
    ("hardswish", lambda T, y: T.nn.functional.hardswish(y, inplace=True)),
    ("selu_module", lambda T, y: T.nn.SELU(inplace=True)(y)),
])
def test_inplace_activations(name, fn):
    res = {}
    for T in (jitgrad, torch):
        x = T.tensor(A34, dtype=T.float64, requires_grad=True)
        y = x * 2
        out = fn(T, y)
        assert out is y
        g, = T.autograd.grad((y * y).sum(), x)
        res[T] = (y.detach().numpy(), g.numpy())
    np.testing.assert_allclose(res[jitgrad][0], res[torch][0])
    np.testing.assert_allclose(res[jitgrad][1], res[torch][1])


def test_inplace_activation_on_leaf_is_rejected():
    for T in (jitgrad, torch):
        x = T.ones(2, requires_grad=True)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
            T.nn.functional.leaky_relu(x, inplace=True)


def _error(fn):
    caught = []
    for T in (jitgrad, torch):
        with pytest.raises(Exception) as info:
            fn(T)
        caught.append(info)
    j, t = caught
    assert j.type is t.type, (j.value, t.value)
    return str(j.value), str(t.value)


@pytest.mark.parametrize("fn,prefix", [
    (lambda T: T.var(T.tensor([1, 2])), "std and var only support floating point and complex dtypes"),
    (lambda T: T.std(T.tensor([1, 2])), "std and var only support floating point and complex dtypes"),
    (lambda T: T.zeros(2, 3).var(2), "Dimension out of range"),
    (lambda T: T.cumsum(T.zeros(2), 1), "Dimension out of range"),
    (lambda T: T.norm(T.tensor([1, 2])), "linalg.vector_norm: Expected a floating point or complex tensor"),
    (lambda T: T.atan2(T.zeros(2), T.zeros(3)), "The size of tensor a (2) must match the size of tensor b (3)"),
    (lambda T: T.flip(T.zeros(2, 3), (0, 0)), "dim 0 appears multiple times in the list of dims"),
    (lambda T: T.tril(T.zeros(3)), "tril: input tensor must have at least 2 dimensions"),
    (lambda T: T.triu(T.zeros(3)), "triu: input tensor must have at least 2 dimensions"),
    (lambda T: T.outer(T.zeros(2, 2), T.zeros(2)), "outer: Expected 1-D argument self, but got 2-D"),
    (lambda T: T.cross(T.zeros(2, 4), T.zeros(2, 4), dim=1), "linalg.cross: inputs dimension 1 must have length 3"),
    (lambda T: T.cross(T.zeros(2, 4), T.zeros(2, 4)), "no dimension of size 3 in input"),
    (lambda T: T.roll(T.zeros(2, 3), (1, 2), 0), "shifts and dimensions must align"),
    (lambda T: T.movedim(T.zeros(2, 3), (0, 1), 0), "movedim() received an invalid combination"),
    (lambda T: T.movedim(T.zeros(2, 3), (0, 1), (0,)), "movedim: Invalid source or destination dims"),
    (lambda T: T.meshgrid(T.zeros(2), indexing="ab"), 'torch.meshgrid: indexing must be one of "xy" or "ij"'),
    (lambda T: T.cdist(T.zeros(2, 3), T.zeros(2, 4)), "X1 and X2 must have the same number of columns"),
    (lambda T: T.cdist(T.zeros(3), T.zeros(2, 3)), "cdist only supports at least 2D tensors, X1 got: 1D"),
    (lambda T: T.diff(T.tensor(1.0)), "diff expects input to be at least one-dimensional"),
    (lambda T: T.einsum("ij,jk->ik", T.zeros(2, 3)), "einsum(): fewer operands were provided than specified"),
    (lambda T: T.einsum("ij->ij", T.zeros(2, 3, 4)), "einsum(): the number of subscripts in the equation (2) does"),
    (lambda T: T.einsum("ij->k", T.zeros(2, 3)), "einsum(): output subscript k does not appear"),
    (lambda T: T.einsum("ii->i", T.zeros(2, 3)), "einsum(): subscript i is repeated for operand 0 but the sizes"),
    (lambda T: T.addcdiv(T.zeros(2), T.tensor([1, 2]), T.tensor([1, 2])), "Integer division with addcdiv"),
    (lambda T: T.isclose(T.zeros(2), T.zeros(2, dtype=T.int64)), "Float did not match Long"),
    (lambda T: T.nn.functional.hardtanh(T.zeros(2), 1.0, 0.0), "min_val cannot be greater than max_val"),
    (lambda T: T.linalg.matrix_norm(T.zeros(3)), "linalg.matrix_norm: The input tensor A must have at least 2"),
])
def test_errors_match_torch(fn, prefix):
    j, t = _error(fn)
    assert t.startswith(prefix), t
    assert j.startswith(prefix), j


def test_unsupported_nuclear_norm_raises():
    with pytest.raises(NotImplementedError, match="nuclear"):
        jitgrad.norm(jitgrad.zeros(2, 2), p="nuc")
    with pytest.raises(NotImplementedError, match="ord=2"):
        jitgrad.linalg.matrix_norm(jitgrad.zeros(2, 2), ord=2)


def test_module_reprs():
    for name, args in [("Softplus", (2.0, 10.0)), ("ELU", (0.5, True)), ("LeakyReLU", (0.2,)), ("SiLU", ()),
                       ("Mish", ()), ("Hardtanh", (-2.0, 2.0)), ("LogSigmoid", ()), ("ReLU6", ()),
                       ("CosineSimilarity", ()), ("PairwiseDistance", ()), ("Hardswish", (True,)),
                       ("Hardsigmoid", ()), ("SELU", ()), ("CELU", (0.5,)), ("Softsign", ())]:
        assert repr(getattr(jnn, name)(*args)) == repr(getattr(torch.nn, name)(*args)), name


def test_var_with_no_degrees_of_freedom_warns_like_torch():
    import warnings
    for T in (jitgrad, torch):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            v = T.tensor([[1.0, 2.0]]).var(0)
        assert np.isnan(v.numpy()).all()
        assert [type(w.message) for w in caught] == [UserWarning]
        assert str(caught[0].message).startswith("var(): degrees of freedom is <= 0")


@pytest.mark.parametrize("name,fn", [
    ("addcmul_", lambda T, y, a, b: y.addcmul_(a, b, value=3)),
    ("addcdiv_", lambda T, y, a, b: y.addcdiv_(a, b * b + 1, value=-0.5)),
    ("lerp_", lambda T, y, a, b: y.lerp_(a, 0.25)),
    ("tril_", lambda T, y, a, b: y.tril_(1)),
    ("triu_", lambda T, y, a, b: y.triu_()),
    ("square_", lambda T, y, a, b: y.square_()),
    ("exp2_", lambda T, y, a, b: y.exp2_()),
    ("cumsum_", lambda T, y, a, b: y.cumsum_(1)),
    ("nan_to_num_", lambda T, y, a, b: y.nan_to_num_()),
    ("view_addcmul_", lambda T, y, a, b: y[1].addcmul_(a[0], b[0])),
])
def test_inplace_forms(name, fn):
    res = {}
    for T in (jitgrad, torch):
        x, a, b = (T.tensor(v, dtype=T.float64, requires_grad=True) for v in (A34, B34, POS34))
        y = x * 1.5
        fn(T, y, a, b)
        gs = T.autograd.grad((y * y).sum(), (x, a, b), allow_unused=True)
        res[T] = [y.detach().numpy()] + [None if g is None else g.numpy() for g in gs]
    for u, v in zip(res[jitgrad], res[torch]):
        assert (u is None) == (v is None)
        if u is not None:
            np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)


def test_inplace_form_on_leaf_and_under_no_grad():
    for T in (jitgrad, torch):
        p = T.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
            p.addcdiv_(T.ones(3), T.ones(3))
        with T.no_grad():
            p.addcdiv_(T.ones(3), T.full((3,), 2.0), value=-1)
        assert p._version == 1 and np.allclose(p.detach().numpy(), 0.5)


def test_composed_ops_replay_under_compile():
    """jitgrad.compile replays the compositions (their constants included) on new inputs."""
    def f(x, y):
        return (x.var(1).sum() + jitgrad.logsumexp(x, 1).sum() + jitgrad.cumsum(x, 1).sum() * 0.1
                + jitgrad.einsum("ij,kj->ik", x, y).sum() + JF.normalize(x).sum() + jitgrad.tril(x).sum()
                + x.cumprod(1).sum() + jitgrad.roll(x, 1, 1)[0, 0] + JF.softplus(x).sum() + x.norm())
    compiled = jitgrad.compile(f)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = jitgrad.tensor(rng.standard_normal((3, 4)), requires_grad=True)
        y = jitgrad.tensor(rng.standard_normal((5, 4)))
        eager = f(x, y)
        ge, = jitgrad.autograd.grad(eager, x)
        replay = compiled(x, y)
        gr, = jitgrad.autograd.grad(replay, x)
        assert_close(replay, eager)
        assert_close(gr, ge)
