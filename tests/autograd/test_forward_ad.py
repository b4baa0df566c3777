"""Forward-mode AD's API and behaviour side by side with PyTorch (float64): dual levels,
make_dual / unpack_dual, views and in-place ops, custom Functions' jvp, grad modes,
forward-over-reverse (Hessian-vector products), reverse-over-forward, and the errors."""
import importlib

import numpy as np
import pytest
import torch  # noqa: F401  (conftest's `both` runs the same code with torch)
from conftest import both, err_of, mk

import jitgrad


def fw(T):
    return importlib.import_module(T.__name__ + ".autograd.forward_ad")


X = [0.3, -1.2, 2.0, 0.7]
V = [1.0, 0.5, -0.25, 2.0]


def _jvp(T, f, xs=(X,), vs=(V,), rg=False):
    F = fw(T)
    with F.dual_level():
        duals = [F.make_dual(mk(T, x, rg=rg), mk(T, v)) for x, v in zip(xs, vs)]
        out = f(T, *duals)
        p, t = F.unpack_dual(out)
        return p.detach(), t


@pytest.mark.parametrize("f", [
    lambda T, x: x.sin() * x.exp() / (1.0 + x * x),
    lambda T, x: T.tanh(x) ** 3 - T.sigmoid(x) + x.abs(),
    lambda T, x: T.where(x > 0, x.log1p().clamp(0.1, 0.9), -x),
    lambda T, x: T.nn.functional.gelu(x) + T.relu(x) * 2.0,
    lambda T, x: (x.reshape(2, 2) @ x.reshape(2, 2).t()).sum(1).softmax(0),
    lambda T, x: T.cat([x, x * 2]).reshape(2, 4).mean(0).prod(),
    lambda T, x: x[1:3].expand(3, 2).amax(0),
], ids=["ew", "ew2", "where", "nn", "matmul", "cat", "view"])
def test_jvp_of_programs(f):
    both(lambda T: _jvp(T, f))


def test_two_inputs_and_a_constant():
    both(lambda T: _jvp(T, lambda T, a, b: (a * b + 3.0) / (b * b + 1.0) - a.pow(2.0),
                        xs=(X, X[::-1]), vs=(V, V[::-1])))


def test_tangent_on_one_input_only():
    def run(T):
        F = fw(T)
        with F.dual_level():
            a = F.make_dual(mk(T, X), mk(T, V))
            b = mk(T, X[::-1])
            out = a * b + b.exp()
            return F.unpack_dual(out).tangent, F.unpack_dual(b).tangent, F.unpack_dual(b * 2).tangent
    both(run)


def test_make_dual_and_unpack_dual():
    def run(T):
        F = fw(T)
        x, v = mk(T, X, rg=True), mk(T, V)
        with F.dual_level() as level:
            d = F.make_dual(x, v)
            p, t = F.unpack_dual(d)
            inside = (level, type(d.grad_fn).__name__, d.requires_grad, t is v, p.grad_fn is not None,
                      F.unpack_dual(x).tangent is None)
        after = F.unpack_dual(d).tangent
        return inside, after
    both(run)


def test_tangents_are_dropped_at_level_exit():
    def run(T):
        F = fw(T)
        with F.dual_level():
            d = F.make_dual(mk(T, X), mk(T, V))
            y = d * 2
        with F.dual_level():
            return F.unpack_dual(y).tangent, F.unpack_dual(d).tangent, F.unpack_dual(y * 3).tangent
    both(run)


def test_no_grad_keeps_forward_mode():
    def run(T):
        F = fw(T)
        with F.dual_level():
            d = F.make_dual(mk(T, X), mk(T, V))
            with T.no_grad():
                y = d.sin().sum()
            return F.unpack_dual(y).tangent
    both(run)


def test_views_share_the_tangent_and_inplace_updates_it():
    def run(T):
        F = fw(T)
        with F.dual_level():
            base = mk(T, X) * 1.0
            d = F.make_dual(base, mk(T, V))
            view = d[1:3]
            view.mul_(mk(T, [2.0, -1.0]))
            d.add_(mk(T, X).exp())
            z = mk(T, [0.0, 0.0, 0.0, 0.0])
            z[1:3] = d[0:2]  # setitem of dual values into a plain tensor
            return (F.unpack_dual(d).tangent, F.unpack_dual(view).tangent, F.unpack_dual(z).tangent, d.detach())
    both(run)


def test_inplace_from_a_dual_operand_and_overwrites():
    def run(T):
        F = fw(T)
        with F.dual_level():
            a = mk(T, X)
            d = F.make_dual(mk(T, X[::-1]), mk(T, V))
            a.mul_(d)             # a gets a tangent from its operand
            b = d * 1.0
            b.fill_(2.0)          # overwritten: zero tangent
            c = d * 1.0
            c.copy_(a)
            return F.unpack_dual(a).tangent, F.unpack_dual(b).tangent, F.unpack_dual(c).tangent
    both(run)


def test_inplace_recorded_with_grad():
    def run(T):
        F = fw(T)
        x = mk(T, X, rg=True)
        with F.dual_level():
            d = F.make_dual(x, mk(T, V))
            y = d * 2
            y += d * d
            g, = T.autograd.grad(y.sum(), x, create_graph=True)
            return F.unpack_dual(y).tangent, g.detach(), F.unpack_dual(g).tangent
    both(run)


def test_forward_over_reverse_gives_hessian_vector_products():
    def run(T):
        F = fw(T)
        x = mk(T, X, rg=True)
        w = mk(T, [[0.5, -1.0, 0.2, 1.1], [0.3, 0.8, -0.7, 0.4]])
        with F.dual_level():
            d = F.make_dual(x, mk(T, V))
            loss = ((w @ d.tanh()) ** 2).sum() + (d.sin() * d).sum() + (d * d * d).mean()
            g, = T.autograd.grad(loss, x, create_graph=True)
            return g.detach(), F.unpack_dual(g).tangent
    both(run)


def test_reverse_over_forward():
    def run(T):
        F = fw(T)
        x = mk(T, X, rg=True)
        with F.dual_level():
            d = F.make_dual(x, mk(T, V))
            t = F.unpack_dual((d.exp() * d.cos()).sum()).tangent
            g, = T.autograd.grad(t, x)
            return t.detach(), g
    both(run)


def test_tangent_that_requires_grad():
    def run(T):
        F = fw(T)
        v = mk(T, V, rg=True)
        with F.dual_level():
            d = F.make_dual(mk(T, X), v)
            t = F.unpack_dual((d * d).sum()).tangent
            g, = T.autograd.grad(t, v)
            return t.detach(), g
    both(run)


def _custom(T, with_jvp=True):
    class Cube(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            ctx.save_for_forward(x)
            ctx.save_for_backward(x)
            ctx.k = k
            return x ** 3 * k

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * 3 * x ** 2 * ctx.k, None

        if with_jvp:
            @staticmethod
            def jvp(ctx, tx, tk):
                x, = ctx.saved_tensors
                return tx * 3 * x ** 2 * ctx.k
    return Cube


def test_custom_function_jvp():
    def run(T):
        F = fw(T)
        Cube = _custom(T)
        with F.dual_level():
            d = F.make_dual(mk(T, X, rg=True), mk(T, V))
            y = Cube.apply(d, 2.0)
            return F.unpack_dual(y).tangent, type(y.grad_fn).__name__
    both(run)


def test_custom_function_without_jvp_raises():
    def run(T):
        F = fw(T)
        Cube = _custom(T, with_jvp=False)
        with F.dual_level():
            return err_of(Cube.apply, F.make_dual(mk(T, X), mk(T, V)), 2.0)
    both(run)


@pytest.mark.parametrize("case", ["size", "int_primal", "int_tangent", "no_level", "nested", "exit_wrong"])
def test_errors(case):
    def run(T):
        F = fw(T)
        if case == "no_level":
            return err_of(F.make_dual, mk(T, X), mk(T, V))
        with F.dual_level():
            if case == "size":
                return err_of(F.make_dual, mk(T, X), mk(T, V[:3]))
            if case == "int_primal":
                return err_of(F.make_dual, T.arange(4), mk(T, V))
            if case == "int_tangent":
                return err_of(F.make_dual, mk(T, X), T.arange(4))
            if case == "nested":
                return err_of(F.enter_dual_level)
            return err_of(F.exit_dual_level, level=3)
    both(run)


def test_enter_and_exit_by_hand():
    F = jitgrad.autograd.forward_ad
    level = F.enter_dual_level()
    try:
        d = F.make_dual(jitgrad.tensor(X, dtype=jitgrad.float64), jitgrad.tensor(V, dtype=jitgrad.float64))
        t = F.unpack_dual(d * 3).tangent
    finally:
        F.exit_dual_level(level=level)
    np.testing.assert_allclose(t.numpy(), 3 * np.array(V))
    assert F.unpack_dual(d).tangent is None
