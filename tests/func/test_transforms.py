"""jitgrad.func's transforms against torch.func on the same functions (float64): values,
structures (pytrees, argnums, has_aux), nesting, which results stay differentiable, and
torch's errors."""
import importlib

import numpy as np
import pytest
import torch
from conftest import err_of, same

import jitgrad


def fn_(T):
    return importlib.import_module(T.__name__ + ".func")


def data(T, seed=0):
    r = np.random.default_rng(seed)
    x = T.tensor(r.uniform(-1.2, 1.2, 4), dtype=T.float64)
    y = T.tensor(r.uniform(-1.2, 1.2, 4), dtype=T.float64)
    w = T.tensor(r.uniform(-1.2, 1.2, (4, 3)), dtype=T.float64)
    return x, y, w


# functions written once for both libraries (tensor methods only)
def mlp_loss(x, w):
    return ((x.sin() @ w).tanh() * x.sum()).sum()


def two_outputs(x, w):
    return (x.sin() @ w).tanh(), (x * x).sum()


def ew(x, y):          # elementwise: what forward mode covers on every op
    return (x.sin() * y).exp() * x


def ew_two(x, y):
    return ew(x, y), x.tanh() + y * y


def scalar(x, y):
    return ((x.sin() * y).exp() * x).sum()


def check(run):
    """run(T, func) with both libraries; results (and their requires_grad) must agree."""
    t = run(torch, torch.func)
    j = run(jitgrad, fn_(jitgrad))
    same(j, t, "jitgrad vs torch")
    flags = [[a.requires_grad for a in _leaves(r)] for r in (j, t)]
    assert flags[0] == flags[1], f"requires_grad {flags[0]} != torch's {flags[1]}"
    return j


def _leaves(tree):
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in _leaves(v)]
    return [tree] if hasattr(tree, "requires_grad") else []


# --- grad / grad_and_value -----------------------------------------------------------------

@pytest.mark.parametrize("argnums", [0, 1, -1, (0, 1), (1, 0)])
def test_grad_argnums(argnums):
    check(lambda T, fn: fn.grad(mlp_loss, argnums=argnums)(*data(T)[::2]))


def test_grad_and_value_and_aux():
    def f(x, w):
        loss = mlp_loss(x, w)
        return loss, {"out": x.cos() * 2, "pair": (loss * 3, w)}
    check(lambda T, fn: fn.grad_and_value(f, has_aux=True)(*data(T)[::2]))
    check(lambda T, fn: fn.grad(f, argnums=(0, 1), has_aux=True)(*data(T)[::2]))
    check(lambda T, fn: fn.grad_and_value(mlp_loss, argnums=1)(*data(T)[::2]))


def test_grad_of_pytree_arguments_and_kwargs():
    def f(p, x, scale=1.0):
        return ((p["w"] * x).sin().sum() + (p["b"][0] * p["b"][1]).sum()) * scale
    def run(T, fn):
        x, y, _ = data(T)
        return fn.grad(f)({"w": x, "b": [y, x * 2]}, y, scale=3.0)
    check(run)


def test_output_independent_of_input_gives_zeros():
    check(lambda T, fn: fn.grad(lambda x, y: (y * y).sum(), argnums=0)(*data(T)[:2]))
    check(lambda T, fn: fn.vjp(lambda x, y: (y * 2, x * 0 + 1), *data(T)[:2])[1](tuple(data(T)[:2])))


def test_grad_of_grad_and_jacrev_of_grad():
    def f(x):
        return (x.sin() * x).sum().cos()
    check(lambda T, fn: fn.grad(lambda x: fn.grad(f)(x).sum())(data(T)[0]))
    check(lambda T, fn: fn.jacrev(fn.grad(f))(data(T)[0]))
    check(lambda T, fn: fn.jacrev(fn.jacrev(mlp_loss))(*data(T)[::2]))
    check(lambda T, fn: fn.grad(fn.grad(fn.grad(lambda x: x.sin().sum() * 1.0)))(data(T)[0][0]))


def test_inner_transform_does_not_see_outer_variable():
    # perturbation confusion: d/dx [x * d/dy (x * y)] = d/dx [x * x] = 2x
    check(lambda T, fn: fn.grad(lambda x: (x * fn.grad(lambda y: (x * y).sum())(x)).sum())(data(T)[0]))


def test_grad_ignores_outer_no_grad_but_obeys_inner():
    def run(T, fn):
        x = data(T)[0]
        with T.no_grad():
            g = fn.grad(lambda x: (x.sin() * x).sum())(x)

        def f(x):
            with T.no_grad():
                c = x * x
            return (x * c).sum()
        return g, fn.grad(f)(x)
    check(run)


# --- what stays differentiable, what is untouched --------------------------------------------

def test_results_are_plain_tensors_and_user_tensors_untouched():
    for T in (torch, jitgrad):
        fn = torch.func if T is torch else fn_(T)
        x, _, w = data(T)
        g = fn.grad(mlp_loss, argnums=(0, 1))(x, w)
        assert not x.requires_grad and not w.requires_grad and x.grad is None
        assert all(not t.requires_grad and t.grad_fn is None for t in g)


def test_captured_parameter_keeps_result_differentiable():
    def run(T, fn):
        x, y, _ = data(T)
        p = y.clone().requires_grad_()
        g = fn.grad(lambda x: (x.sin() * p).sum() * (x * p).sum())(x)
        (g * g).sum().backward()
        return g.detach(), p.grad
    check(run)


def test_argument_requiring_grad_is_differentiated_through():
    def run(T, fn):
        x, _, w = data(T)
        x.requires_grad_()
        g = fn.grad(mlp_loss)(x, w)
        (gx,) = T.autograd.grad(g.sum(), x)
        return gx
    check(run)


# --- vjp / jacrev ----------------------------------------------------------------------------

def test_vjp_pytree_outputs_and_aux():
    def f(x, w):
        a, b = two_outputs(x, w)
        return {"a": a, "b": [b, x.cos()]}, x.sum()
    def run(T, fn):
        x, y, w = data(T)
        out, vjp_fn, aux = fn.vjp(f, x, w, has_aux=True)
        ct = {"a": T.ones(3, dtype=T.float64), "b": [T.tensor(2.0, dtype=T.float64), y]}
        return out, vjp_fn(ct), vjp_fn(ct), aux
    check(run)


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 5, 100])
def test_jacrev_multiple_outputs_and_inputs(chunk_size):
    check(lambda T, fn: fn.jacrev(two_outputs, argnums=(0, 1), chunk_size=chunk_size)(*data(T)[::2]))
    check(lambda T, fn: fn.jacrev(two_outputs, argnums=1, chunk_size=chunk_size)(*data(T)[::2]))


def test_jacrev_pytree_and_aux():
    def f(p):
        return {"s": (p["a"] * p["b"]).sin(), "t": p["a"].sum()}, p["b"] * 3
    check(lambda T, fn: fn.jacrev(f, has_aux=True)({"a": data(T)[0], "b": data(T)[1]}))


# --- jvp / jacfwd / hessian --------------------------------------------------------------------

def test_jvp_elementwise():
    check(lambda T, fn: fn.jvp(ew, data(T)[:2], (data(T, 1)[0], data(T, 1)[1])))
    check(lambda T, fn: fn.jvp(ew_two, data(T)[:2], (data(T, 1)[0], data(T, 1)[1])))
    check(lambda T, fn: fn.jvp(lambda x, y: (ew(x, y), x * 2), data(T)[:2], tuple(data(T, 2)[:2]), has_aux=True))


def test_jvp_of_independent_output_is_zero():
    check(lambda T, fn: fn.jvp(lambda x: data(T, 1)[0] * 2, (data(T)[0],), (data(T)[1],)))


def test_jvp_reduction_and_matmul():
    check(lambda T, fn: fn.jvp(two_outputs, (data(T)[0], data(T)[2]), (data(T, 1)[0], data(T, 1)[2])))


@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_jacfwd(argnums):
    check(lambda T, fn: fn.jacfwd(ew_two, argnums=argnums)(*data(T)[:2]))


def test_jacfwd_has_aux():
    check(lambda T, fn: fn.jacfwd(lambda x, y: (ew(x, y), x * 2), has_aux=True)(*data(T)[:2]))


@pytest.mark.parametrize("argnums", [0, (0, 1)])
def test_hessian(argnums):
    check(lambda T, fn: fn.hessian(scalar, argnums=argnums)(*data(T)[:2]))
    check(lambda T, fn: fn.hessian(mlp_loss, argnums=argnums)(*data(T)[::2]))


def test_other_hessian_compositions():
    check(lambda T, fn: fn.jacfwd(fn.jacfwd(scalar))(*data(T)[:2]))
    check(lambda T, fn: fn.jacrev(fn.jacfwd(scalar))(*data(T)[:2]))
    check(lambda T, fn: fn.jvp(fn.grad(scalar), data(T)[:2], tuple(data(T, 3)[:2])))
    check(lambda T, fn: fn.grad(lambda x: fn.jvp(scalar, (x, data(T)[1]), tuple(data(T, 3)[:2]))[1])(data(T)[0]))


# --- errors, as torch's -------------------------------------------------------------------------

def _errors(T):
    fn = torch.func if T is torch else fn_(T)
    x, y, w = data(T)
    ones = T.ones(4, dtype=T.float64)
    out = []
    cases = [
        lambda: fn.grad(mlp_loss, argnums=2)(x, w),
        lambda: fn.grad(mlp_loss, argnums=-3)(x, w),
        lambda: fn.grad(mlp_loss, argnums=(0, 0))(x, w),
        lambda: fn.grad(mlp_loss, argnums=())(x, w),
        lambda: fn.grad(mlp_loss, argnums=[0])(x, w),
        lambda: fn.grad(mlp_loss, argnums=(0, "a"))(x, w),
        lambda: fn.grad(lambda x: x.sin())(x),
        lambda: fn.grad(lambda x: [x.sum()])(x),
        lambda: fn.grad(lambda x: x.sum(), has_aux=True)(x),
        lambda: fn.grad(lambda x: (x.sum(), 3), has_aux=True)(x),
        lambda: fn.grad(lambda x: x.sum())(3.0),
        lambda: fn.grad(lambda p: p["a"].sum())({"a": x, "b": 3}),
        lambda: fn.vjp(lambda x: x.sin(), x)[1]((ones,)),
        lambda: fn.vjp(ew_two, x, y)[1]([ones, ones]),
        lambda: fn.vjp(lambda x: (x * 2).long(), x),
        lambda: fn.vjp(lambda x: 3, x),
        lambda: fn.vjp(lambda x: None, x),
        lambda: fn.vjp(lambda x: (), x),
        lambda: fn.vjp(lambda x: x, x, has_aux=True),
        lambda: fn.jacrev(lambda x: x, chunk_size=0),
        lambda: fn.jacrev(lambda x: x, argnums=1)(x),
        lambda: fn.jacrev(lambda x: 3)(x),
        lambda: fn.jvp(lambda x: x.sin(), x, x),
        lambda: fn.jvp(lambda x: x.sin(), (x,), [x]),
        lambda: fn.jvp(lambda x: x.sin(), (x,), (x, x)),
        lambda: fn.jvp(lambda x: x.sin(), (), ()),
        lambda: fn.jvp(lambda x: x.sin(), (3.0,), (3.0,)),
        lambda: fn.jvp(lambda x: x.sin(), (x,), (x[:2],)),
        lambda: fn.jvp(lambda x: 3, (x,), (x,)),
        lambda: fn.jvp(lambda x: y * 2, (x,), (x,), strict=True),
        lambda: fn.jvp(lambda x: x, (x,), (x,), has_aux=True),
        lambda: fn.jacfwd(lambda x: x, argnums=3)(x),
        lambda: fn.jacfwd(lambda x: 3)(x),
    ]
    for c in cases:
        out.append(err_of(c))
    return out


def test_errors_as_torch():
    for i, (j, t) in enumerate(zip(_errors(jitgrad), _errors(torch))):
        assert t is not None, f"case {i}: torch raised nothing"
        assert j == t, f"case {i}: {j} != torch's {t}"


# --- under vmap -------------------------------------------------------------------------------

def test_vmap_of_jacrev_and_of_vjp():
    def run(T, fn):
        r = np.random.default_rng(4)
        x = T.tensor(r.standard_normal((5, 4)))
        w = T.tensor(r.standard_normal((4, 3)))
        ct = T.tensor(r.standard_normal((5, 3)))
        return (fn.vmap(fn.jacrev(two_outputs, argnums=(0, 1)), in_dims=(0, None))(x, w),
                fn.vmap(fn.jacrev(two_outputs))(x, w.expand(5, 4, 3)),
                fn.vmap(lambda x, c: fn.vjp(lambda x: (x.sin() @ w).tanh(), x)[1](c))(x, ct))
    check(run)
