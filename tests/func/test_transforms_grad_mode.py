"""The autodiff transforms under an outer no_grad, against torch: torch.func ignores grad
mode outside a transform, and forward mode is not grad mode, so every composition
(jacfwd(jacrev), hessian, jvp of a vjp, vmap of hessian ...) gives the same derivatives
with and without no_grad. (jacfwd over a vjp used to give zeros under no_grad: the backward
ran without the tangents.) Also no_grad / set_grad_enabled inside the function, which the
transforms respect."""
import importlib

import numpy as np
import pytest
import torch
from conftest import same

import jitgrad


def fn_(T):
    return importlib.import_module(T.__name__ + ".func")


def data(T):
    x = T.tensor([0.5, 1.5, -2.0], dtype=T.float64)
    v = T.tensor([0.3, -1.0, 2.0], dtype=T.float64)
    return x, v


def f(x):
    return (x.sin() * x.exp()).sum()


def g(x):
    return x.sin() * x[0]


CASES = {
    "hessian": lambda T, F, x, v: F.hessian(f)(x),
    "jacfwd_jacrev": lambda T, F, x, v: F.jacfwd(F.jacrev(f))(x),
    "jacrev_jacrev": lambda T, F, x, v: F.jacrev(F.jacrev(f))(x),
    "jacfwd_jacfwd": lambda T, F, x, v: F.jacfwd(F.jacfwd(f))(x),
    "jacrev_jacfwd": lambda T, F, x, v: F.jacrev(F.jacfwd(f))(x),
    "grad_grad": lambda T, F, x, v: F.grad(lambda y: F.grad(f)(y).sum())(x),
    "jvp_grad": lambda T, F, x, v: F.jvp(F.grad(f), (x,), (v,))[1],
    "vjp_grad": lambda T, F, x, v: F.vjp(F.grad(f), x)[1](v)[0],
    "jvp_vjp": lambda T, F, x, v: F.jvp(lambda y: F.vjp(g, y)[1](v)[0], (x,), (v,))[1],
    "jvp_of_vjp_fn": lambda T, F, x, v: F.jvp(lambda c: F.vjp(g, x)[1](c)[0], (v,), (v,))[1],
    "jacfwd_jacrev_vector": lambda T, F, x, v: F.jacfwd(F.jacrev(g))(x),
    "vmap_hessian": lambda T, F, x, v: T.vmap(F.hessian(f))(T.stack([x, x * 2])),
    "jacrev_vjp_fn": lambda T, F, x, v: F.jacrev(lambda c: F.vjp(g, x)[1](c)[0])(v),
}


@pytest.mark.parametrize("no_grad", [False, True], ids=["grad_mode", "no_grad"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_outer_grad_mode_is_ignored(case, no_grad):
    def run(T):
        x, v = data(T)
        if no_grad:
            with T.no_grad():
                out = CASES[case](T, fn_(T), x, v)
        else:
            out = CASES[case](T, fn_(T), x, v)
        return out.detach(), out.requires_grad
    j, t = run(jitgrad), run(torch)
    same(j, t, case)
    # and the same numbers as without no_grad
    x, v = data(jitgrad)
    np.testing.assert_allclose(j[0].numpy(), CASES[case](jitgrad, fn_(jitgrad), x, v).detach().numpy(), rtol=1e-12)


def test_no_grad_inside_the_function_is_respected():
    def run(T):
        F = fn_(T)
        x, v = data(T)

        def inner(y):
            with T.no_grad():
                c = y.sin()
            return (c * y).sum()

        def inner_set(y):
            with T.set_grad_enabled(False):
                c = y * 2
            return (c * y).sum()

        def enabled(y):
            with T.enable_grad():
                return y.cos().sum()
        with T.no_grad():
            e = F.grad(enabled)(x)
        return F.grad(inner)(x), F.grad(inner_set)(x), F.jacrev(inner)(x), F.jacfwd(inner)(x), e
    same(run(jitgrad), run(torch), "inside")
