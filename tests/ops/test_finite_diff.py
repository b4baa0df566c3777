"""Gradients of composite functions vs. central finite differences (no torch involved)."""
import numpy as np
import pytest
from conftest import stable_seed

import jitgrad

EPS = 1e-6


def T(a, requires_grad=False):
    return jitgrad.tensor(np.asarray(a, dtype=np.float64), dtype=jitgrad.float64, requires_grad=requires_grad)


IDX = [0, 2, 1, 1]

FUNCS = {
    "poly_exp_sin": (lambda x, y: (x.sin() * y.exp() + x ** 3 - y / (x * x + 1.0)).sum(), [(3, 4), (3, 4)]),
    "matmul_tanh": (lambda x, w: (x @ w).tanh().sum(), [(2, 3), (3, 4)]),
    "mlp_softmax_ce": (
        lambda x, w: -(x @ w).log_softmax(1)[jitgrad.tensor([0, 1, 2, 3]), jitgrad.tensor([0, 2, 1, 1])].mean(),
        [(4, 3), (3, 3)]),
    "norm": (lambda x: (x * x).sum().sqrt(), [(5,)]),
    "broadcast_div_log": (lambda x, y: ((x.abs() + 1.0).log() / (y * y + 0.5)).mean(), [(2, 3, 4), (3, 1)]),
    "reductions": (lambda x: x.amax(1).sum() + x.min(0).values.prod() + x.mean((0, 1)) * x.max(), [(3, 4)]),
    "shape_ops": (
        lambda x: (x.permute(2, 0, 1).reshape(4, 6).t()[1:4, ::2] * x.transpose(0, 1).flatten()[:9].view(3, 3)[None, :, 0:1]).sum(),
        [(2, 3, 4)]),
    "cat_stack_where": (
        lambda x, y: (jitgrad.cat([x, y], 0).sigmoid() * jitgrad.stack([x, y], 0).sum(0).repeat_like_cat()
                      if False else
                      jitgrad.where(x > 0, x * y, y.exp()).sum() + jitgrad.cat([x, y]).relu().pow(2).sum()
                      + jitgrad.stack([x, y], 1).softmax(1)[:, 0].sum()),
        [(6,), (6,)]),
    "maximum_clamp": (
        lambda x, y: (jitgrad.maximum(x, y) * jitgrad.minimum(x, y).clamp(-0.4, 0.6) - x.clamp(min=0.0)).sum(),
        [(7,), (7,)]),
    "batched_matmul": (lambda a, b: ((a @ b) ** 2).mean(), [(2, 3, 4), (4, 2)]),
    "dot_trace_mm": (
        lambda a, v: jitgrad.dot(v, v.cos()) * jitgrad.mm(a, a.t()).trace() + (a.unsqueeze(0).expand(2, 3, 3) * v[:3]).sum(),
        [(3, 3), (4,)]),
    "scalar_reflected": (lambda x: (2.0 ** x + 3.0 / (x * x + 1.0) - (1.0 - x) * 2.0).sum(), [(4,)]),
}


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_gradient_matches_central_differences(name):
    fn, shapes = FUNCS[name]
    rng = np.random.default_rng(stable_seed("fd", name))
    arrays = [rng.uniform(-1.3, 1.3, size=s) for s in shapes]
    # keep away from kinks (|x| small, ties)
    arrays = [np.where(np.abs(a) < 0.1, a + 0.3, a) for a in arrays]

    leaves = [T(a, requires_grad=True) for a in arrays]
    out = fn(*leaves)
    assert out.shape == ()
    grads = jitgrad.autograd.grad(out, leaves)

    def f(arrs):
        with jitgrad.no_grad():
            return float(fn(*[T(a) for a in arrs]).item())

    assert abs(f(arrays) - out.item()) <= 1e-12 * max(1.0, abs(out.item()))
    for trial in range(3):
        dirs = [rng.standard_normal(a.shape) for a in arrays]
        plus = f([a + EPS * d for a, d in zip(arrays, dirs)])
        minus = f([a - EPS * d for a, d in zip(arrays, dirs)])
        numeric = (plus - minus) / (2 * EPS)
        analytic = sum(float(np.sum(g.numpy() * d)) for g, d in zip(grads, dirs))
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (trial, numeric, analytic)


def test_hessian_vector_product_matches_finite_differences():
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, size=(4,))
    M = rng.uniform(-1, 1, size=(4, 4))
    v = rng.standard_normal(4)

    def grad_at(arr):
        x = T(arr, requires_grad=True)
        y = ((T(M) @ x).tanh() * x.exp()).sum() + (x ** 3).sum()
        (g,) = jitgrad.autograd.grad(y, x, create_graph=True)
        return x, g

    x, g = grad_at(a)
    (hv,) = jitgrad.autograd.grad((g * T(v)).sum(), x)
    gp = grad_at(a + EPS * v)[1].detach().numpy()
    gm = grad_at(a - EPS * v)[1].detach().numpy()
    numeric = (gp - gm) / (2 * EPS)
    np.testing.assert_allclose(hv.numpy(), numeric, rtol=1e-6, atol=1e-6)
