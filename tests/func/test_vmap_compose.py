"""vmap composed with the autodiff transforms, against torch.func (float64): vmap over
vjp_fn (the Jacobian idiom: each cotangent its own backward, never summed), over grad / vjp /
jvp / jacrev / jacfwd / hessian, those transforms over vmap, nested vmaps with transforms
inside, in_dims / out_dims / chunk_size variants, and the randomness flag."""
import numpy as np
import pytest
import torch
from conftest import both, err_of

import jitgrad


def data(T, *shape, seed=0):
    rng = np.random.default_rng(seed + 7 * len(shape))
    return T.tensor(rng.uniform(-1, 1, size=shape), dtype=T.float64)


def f(x):                     # vector -> vector, not elementwise
    return x.sin() * x.sum() + x ** 2


def g(x, y):                  # two inputs -> vector
    return (x * y).cos() + x.sum() * y


def s(x):                     # vector -> scalar
    return (x.sin() * x).sum() + x.prod()


# --- vmap over a vjp_fn made outside the vmap ----------------------------------------------------
def test_issue_example_vjp_fn_of_3x_is_3_identity():
    def run(T):
        x = data(T, 3)
        _, vjp_fn = T.func.vjp(lambda t: 3 * t, x)
        return T.func.vmap(vjp_fn)(T.eye(3, dtype=T.float64))
    j, _ = both(run)
    np.testing.assert_allclose(j[0].numpy(), 3 * np.eye(3))


@pytest.mark.parametrize("case", ["jacobian", "two_inputs", "in_dims_1", "chunked", "pytree_out", "has_aux",
                                  "cotangent_and_captured", "two_levels", "two_levels_one_each"])
def test_vmap_over_vjp_fn(case):
    def run(T):
        fn = T.func
        x, y = data(T, 4), data(T, 4, seed=1)
        eye = T.eye(4, dtype=T.float64)
        if case == "jacobian":
            return fn.vmap(fn.vjp(f, x)[1])(eye)
        if case == "two_inputs":
            return fn.vmap(fn.vjp(g, x, y)[1])(eye)
        if case == "in_dims_1":
            return fn.vmap(fn.vjp(f, x)[1], in_dims=1, out_dims=1)(data(T, 4, 3, seed=2))
        if case == "chunked":
            return fn.vmap(fn.vjp(f, x)[1], chunk_size=3)(eye)
        if case == "pytree_out":
            _, vf = fn.vjp(lambda t: {"a": f(t), "b": t.sum()}, x)
            return fn.vmap(vf)({"a": eye, "b": T.arange(4, dtype=T.float64)})
        if case == "two_levels":        # both levels only on the cotangent: 2 x 3 backward passes
            return fn.vmap(fn.vmap(fn.vjp(f, x)[1]))(data(T, 2, 3, 4, seed=3))
        if case == "two_levels_one_each":   # two cotangents, each batched over one of the levels
            _, vf = fn.vjp(lambda t: (f(t), t * 2), x)
            return fn.vmap(lambda a: fn.vmap(lambda b: vf((a, b)))(data(T, 3, 4, seed=5)))(data(T, 2, 4, seed=4))
        if case == "has_aux":
            _, vf, aux = fn.vjp(lambda t: (f(t), t.cos()), x, has_aux=True)
            return fn.vmap(vf)(eye), aux
        # a cotangent batched, and a second unbatched one
        _, vf = fn.vjp(lambda t: (f(t), t * 2), x)
        return fn.vmap(vf, in_dims=((0, None),))((eye, y))
    both(run)


def test_vmap_over_vjp_fn_made_inside_an_outer_vmap():
    """The graph is batched over the outer level, the cotangents over the inner one."""
    def run(T):
        fn = T.func

        def jac(x):
            return fn.vmap(fn.vjp(f, x)[1])(T.eye(4, dtype=T.float64))[0]
        return fn.vmap(jac)(data(T, 3, 4)), fn.vmap(jac, in_dims=1)(data(T, 4, 2))
    both(run)


def test_vmap_over_vjp_fn_with_create_graph_is_differentiable():
    def run(T):
        fn = T.func
        x = data(T, 3)

        def jac_trace(t):
            _, vf = fn.vjp(f, t)
            return fn.vmap(vf)(T.eye(3, dtype=T.float64))[0].diagonal().sum()
        return fn.grad(jac_trace)(x)
    both(run)


# --- transforms inside vmap ----------------------------------------------------------------------
INSIDE = {
    "grad": lambda T, fn: fn.vmap(fn.grad(s))(data(T, 3, 4)),
    "grad_argnums": lambda T, fn: fn.vmap(fn.grad(lambda a, b: (g(a, b) ** 2).sum(), argnums=(0, 1)),
                                          in_dims=(0, None))(data(T, 3, 4), data(T, 4, seed=1)),
    "grad_and_value": lambda T, fn: fn.vmap(fn.grad_and_value(s))(data(T, 3, 4)),
    "vjp": lambda T, fn: fn.vmap(lambda x, c: fn.vjp(f, x)[1](c))(data(T, 3, 4), data(T, 3, 4, seed=1)),
    "jvp": lambda T, fn: fn.vmap(lambda p, t: fn.jvp(f, (p,), (t,))[1])(data(T, 3, 4), data(T, 3, 4, seed=1)),
    "jvp_unbatched_tangent": lambda T, fn: fn.vmap(lambda p: fn.jvp(g, (p, data(T, 4, seed=2)),
                                                                    (data(T, 4, seed=3), data(T, 4, seed=4))))(
        data(T, 3, 4)),
    "jvp_in_dims": lambda T, fn: fn.vmap(lambda p, t: fn.jvp(f, (p,), (t,)), in_dims=(1, None), out_dims=1)(
        data(T, 4, 2), data(T, 4, seed=1)),
    "jacrev": lambda T, fn: fn.vmap(fn.jacrev(f))(data(T, 3, 4)),
    "jacrev_two": lambda T, fn: fn.vmap(fn.jacrev(g, argnums=(0, 1)))(data(T, 2, 3), data(T, 2, 3, seed=1)),
    "jacfwd": lambda T, fn: fn.vmap(fn.jacfwd(f))(data(T, 3, 4)),
    "jacfwd_sin": lambda T, fn: fn.vmap(fn.jacfwd(T.sin))(data(T, 2, 3)),
    "jacfwd_two": lambda T, fn: fn.vmap(fn.jacfwd(g, argnums=(0, 1)), in_dims=(0, None))(data(T, 2, 3),
                                                                                       data(T, 3, seed=1)),
    "jacfwd_has_aux": lambda T, fn: fn.vmap(fn.jacfwd(lambda x: (f(x), x.sum()), has_aux=True))(data(T, 2, 3)),
    "hessian": lambda T, fn: fn.vmap(fn.hessian(s))(data(T, 3, 4)),
    "hessian_out_dims": lambda T, fn: fn.vmap(fn.hessian(s), in_dims=1, out_dims=2)(data(T, 3, 2)),
    "jacfwd_jacfwd": lambda T, fn: fn.vmap(fn.jacfwd(fn.jacfwd(s)))(data(T, 2, 3)),
    "jacrev_jacrev": lambda T, fn: fn.vmap(fn.jacrev(fn.jacrev(s)))(data(T, 2, 3)),
    "jvp_of_grad": lambda T, fn: fn.vmap(lambda p, t: fn.jvp(fn.grad(s), (p,), (t,))[1])(data(T, 2, 3),
                                                                                       data(T, 2, 3, seed=1)),
    "grad_of_jvp": lambda T, fn: fn.vmap(fn.grad(lambda p, t: fn.jvp(s, (p,), (t,))[1]))(data(T, 2, 3),
                                                                                      data(T, 2, 3, seed=1)),
    "per_sample_grad_model": lambda T, fn: fn.vmap(fn.grad(lambda w, x: ((x @ w).tanh() ** 2).sum()),
                                                   in_dims=(None, 0))(data(T, 3, 2), data(T, 5, 3, seed=1)),
    "vmap_vmap_vjp": lambda T, fn: fn.vmap(fn.vmap(lambda x: fn.vjp(f, x)[1](x.cos())[0]))(data(T, 2, 3, 4)),
    "vmap_vmap_jvp": lambda T, fn: fn.vmap(fn.vmap(lambda p, t: fn.jvp(f, (p,), (t,))[1]))(
        data(T, 2, 3, 4), data(T, 2, 3, 4, seed=1)),
    "vmap_vmap_jvp_mixed_levels": lambda T, fn: fn.vmap(lambda p: fn.vmap(lambda t: fn.jvp(f, (p,), (t,))[1])(
        data(T, 3, 4, seed=1)))(data(T, 2, 4)),
    "vmap_vmap_grad": lambda T, fn: fn.vmap(fn.vmap(fn.grad(s)), in_dims=1)(data(T, 3, 2, 4)),
    "vmap_vmap_jacfwd": lambda T, fn: fn.vmap(fn.vmap(fn.jacfwd(f)))(data(T, 2, 2, 3)),
    "vmap_vmap_hessian": lambda T, fn: fn.vmap(fn.vmap(fn.hessian(s)))(data(T, 2, 2, 3)),
    "vmap_jacrev_vmap": lambda T, fn: fn.vmap(fn.jacrev(lambda x: fn.vmap(f)(x)))(data(T, 2, 3, 4)),
    "chunked_jacfwd": lambda T, fn: fn.vmap(fn.jacfwd(f), chunk_size=2)(data(T, 3, 4)),
}


@pytest.mark.parametrize("name", sorted(INSIDE))
def test_transform_inside_vmap(name):
    both(lambda T: INSIDE[name](T, T.func))


# --- vmap inside transforms ------------------------------------------------------------------------
OVER = {
    "grad": lambda T, fn: fn.grad(lambda x: fn.vmap(s)(x).sum())(data(T, 3, 4)),
    "grad_in_dims": lambda T, fn: fn.grad(lambda w, x: fn.vmap(lambda xi: (xi @ w).sin().sum(), in_dims=1)(x)
                                          .sum())(data(T, 3, 2), data(T, 3, 5, seed=1)),
    "vjp": lambda T, fn: fn.vjp(fn.vmap(f), data(T, 3, 4))[1](data(T, 3, 4, seed=1)),
    "jvp": lambda T, fn: fn.jvp(fn.vmap(f), (data(T, 3, 4),), (data(T, 3, 4, seed=1),)),
    "jacrev": lambda T, fn: fn.jacrev(fn.vmap(f))(data(T, 2, 3)),
    "jacfwd": lambda T, fn: fn.jacfwd(fn.vmap(f))(data(T, 2, 3)),
    "jacfwd_out_dims": lambda T, fn: fn.jacfwd(fn.vmap(f, out_dims=1))(data(T, 2, 3)),
    "hessian": lambda T, fn: fn.hessian(lambda x: fn.vmap(s)(x).sum())(data(T, 2, 3)),
    "jacrev_of_vmap_grad": lambda T, fn: fn.jacrev(fn.vmap(fn.grad(s)))(data(T, 2, 3)),
    "jacfwd_of_vmap_jacrev": lambda T, fn: fn.jacfwd(fn.vmap(fn.jacrev(f)))(data(T, 2, 3)),
}


@pytest.mark.parametrize("name", sorted(OVER))
def test_vmap_inside_transform(name):
    both(lambda T: OVER[name](T, T.func))


# --- captured ops and namespaces -------------------------------------------------------------------
def test_ops_captured_before_vmap_are_batched():
    """vmap(torch.dot): the op was looked up before vmap began, and still batches."""
    def run(T):
        x, y = data(T, 3, 4), data(T, 3, 4, seed=1)
        fn = T.func
        import functools
        return (fn.vmap(T.dot)(x, y), fn.vmap(T.sin)(x), fn.vmap(T.linalg.vector_norm)(x),
                fn.vmap(T.atan2)(x, y), fn.vmap(T.linalg.cross)(data(T, 2, 3), data(T, 2, 3, seed=1)),
                fn.vmap(functools.partial(T.sum, dim=0))(x), fn.vmap(T.Tensor.sum)(x),
                fn.vmap(x[0].mul)(y), fn.vmap(T.nn.functional.softplus)(x),
                fn.vmap(fn.grad(T.linalg.vector_norm))(x))
    both(run)


# --- randomness ----------------------------------------------------------------------------------
def _noisy(T):
    return lambda x: x * T.rand(x.shape, dtype=T.float64) + T.randn_like(x) + T.bernoulli(x.sigmoid())


@pytest.mark.parametrize("where", ["vmap", "vmap_grad", "jacfwd"])
def test_randomness_error_raises_as_torch(where):
    def run(T):
        noisy = _noisy(T)
        x = data(T, 3, 4)
        if where == "vmap":
            return err_of(T.func.vmap(noisy), x)
        if where == "vmap_grad":
            return err_of(T.func.vmap(T.func.grad(lambda t: noisy(t).sum())), x)
        return err_of(T.func.jacfwd(noisy), x[0])
    j = run(jitgrad)
    assert j is not None and j == run(torch)


@pytest.mark.parametrize("flag", ["same", "different"])
@pytest.mark.parametrize("op", ["rand", "randn_like", "bernoulli", "normal", "randint", "randperm", "dropout",
                                "uniform_", "multinomial", "bernoulli_batched"])
def test_randomness_same_and_different(flag, op):
    """'same': every sample sees the same draw; 'different': they differ (and the draws are
    the op's: in range). As torch (whose generator draws other numbers)."""
    def draw(T, x):
        return {"rand": lambda: T.rand(4, dtype=T.float64) + 0 * x,
                "randn_like": lambda: T.randn_like(x),
                "bernoulli": lambda: T.bernoulli(T.full((4,), 0.5, dtype=T.float64)) + 0 * x,
                "normal": lambda: T.normal(0.0, 1.0, (4,), dtype=T.float64) + 0 * x,
                "randint": lambda: T.randint(0, 1000, (4,)) + 0 * x,
                "randperm": lambda: T.randperm(4) + 0 * x,
                "dropout": lambda: T.nn.functional.dropout(x * 0 + 1, 0.5),
                "uniform_": lambda: (x * 0).uniform_(),
                "multinomial": lambda: T.multinomial(T.ones(4, dtype=T.float64), 4).double() + 0 * x,
                "bernoulli_batched": lambda: T.bernoulli(x.sigmoid()) * 0 + T.bernoulli(T.full((4,), 0.5,
                                                                                              dtype=T.float64))}[op]()

    def run(T):
        T.manual_seed(0)
        if op == "bernoulli_batched" and flag == "same":    # torch refuses, and so must we
            return err_of(T.func.vmap(lambda x: draw(T, x), randomness=flag), data(T, 6, 4))
        out = T.func.vmap(lambda x: draw(T, x), randomness=flag)(data(T, 6, 4))
        rows = {tuple(r) for r in out.tolist()}
        return len(rows) == 1
    j, t = run(jitgrad), run(torch)
    assert j == t and (j == (flag == "same") or isinstance(j, tuple))


def test_inplace_different_randomness_on_unbatched_raises_as_torch():
    def run(T):
        z = T.zeros(4, dtype=T.float64)
        return err_of(T.func.vmap(lambda x: z.uniform_() + x, randomness="different"), data(T, 3, 4))
    j = run(jitgrad)
    assert j is not None and j == run(torch)


@pytest.mark.parametrize("flag", ["same", "different"])
def test_randomness_with_a_generator_draws_like_the_loop(flag):
    """generator=: 'same' draws once (the rows are the one draw, and the generator is left where
    one draw leaves it); 'different' draws per sample, as the loop from the same state."""
    p = jitgrad.full((5,), 0.5, dtype=jitgrad.float64)
    g = jitgrad.Generator().manual_seed(7)
    out = jitgrad.func.vmap(lambda x: jitgrad.bernoulli(p, generator=g) + 0 * x, randomness=flag)(jitgrad.zeros(4, 5))
    after = jitgrad.bernoulli(p, generator=g)
    g.manual_seed(7)
    loop = [jitgrad.bernoulli(p, generator=g) for _ in range(1 if flag == "same" else 4)]
    expected = jitgrad.stack(loop * 4 if flag == "same" else loop)
    np.testing.assert_array_equal(out.numpy(), expected.numpy())
    np.testing.assert_array_equal(after.numpy(), jitgrad.bernoulli(p, generator=g).numpy())
