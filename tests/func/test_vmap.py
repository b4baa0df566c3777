"""jitgrad.func.vmap's API against torch.func.vmap: in_dims / out_dims (ints, negative,
None, pytrees), nesting, chunk_size, randomness, errors with torch's messages, gradients
through vmap, and per-sample gradients through batched leaves (what grad() inside vmap uses)."""
import numpy as np
import pytest
import torch
from conftest import assert_close, both, err_of

import jitgrad
from jitgrad.func import _dispatch, active_levels, batched_leaf_like, grad_per_sample, physical


def data(T, *shape, seed=0, rg=False):
    rng = np.random.default_rng(seed + len(shape))
    return T.tensor(rng.uniform(-1, 1, size=shape), dtype=T.float64, requires_grad=rg)


# --- in_dims / out_dims ---------------------------------------------------------------------------
@pytest.mark.parametrize("in_dims,out_dims", [(0, 0), (1, 0), (-1, 1), ((1, None), -1), ((0, 0), 2),
                                              ((-2, None), (0, 1))])
def test_in_and_out_dims(in_dims, out_dims):
    def run(T):
        x, y = data(T, 3, 4, 2), data(T, 3, 4, 2, seed=1)

        def f(a, b):
            out = a * b.sum() + a.sin()
            return (out, out.sum(0)) if isinstance(out_dims, tuple) else out
        return T.func.vmap(f, in_dims=in_dims, out_dims=out_dims)(x, y)
    both(run)


def test_pytree_inputs_and_outputs():
    def run(T):
        x, y, z = data(T, 3, 4), data(T, 4, 3, seed=1), data(T, 2)

        def f(d, pair, scale):
            a, b = pair
            return {"sum": d["x"] + b * scale[0], "list": [a * 2, d["z"]]}
        return T.func.vmap(f, in_dims=({"x": 0, "z": None}, [None, 1], None),
                           out_dims={"sum": 1, "list": [0, None]})({"x": x, "z": z}, [y, y], z)
    both(run)


def test_unbatched_output_is_expanded():
    both(lambda T: T.func.vmap(lambda a: (a, data(T, 2)), out_dims=(1, 0))(data(T, 3, 2)))


def test_nested_vmap():
    def run(T):
        x, w = data(T, 2, 3, 4), data(T, 4, 5)
        inner = T.func.vmap(lambda a, b: a @ w + b.sum(), in_dims=(0, None))
        return T.func.vmap(inner, in_dims=(0, 0), out_dims=1)(x, data(T, 2, 3))
    both(run)


def test_nested_vmap_independent_levels():
    """An outer input used inside the inner level is batched over the outer level only."""
    def run(T):
        x, y = data(T, 2, 4), data(T, 3, 4)
        return T.func.vmap(lambda a: T.func.vmap(lambda b: a * b + a.sum())(y))(x)
    both(run)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7])
def test_chunk_size(chunk_size):
    def run(T):
        x, y = data(T, 4, 5), data(T, 5, 4)
        return T.func.vmap(lambda a, b: (a * b, a.sum()), in_dims=(0, 1), out_dims=(1, 0),
                           chunk_size=chunk_size)(x, y)
    both(run)


# --- randomness ------------------------------------------------------------------------------------
def test_randomness_error():
    x = jitgrad.ones(3, 4)
    for f in (lambda a: a + jitgrad.randn(4), lambda a: jitgrad.rand_like(a),
              lambda a: jitgrad.nn.functional.dropout(a, 0.5)):
        e = err_of(jitgrad.func.vmap(f), x)
        assert e == err_of(torch.func.vmap(lambda a: a + torch.randn(4)), torch.ones(3, 4))


@pytest.mark.parametrize("fn", ["randn", "rand_like", "dropout"])
def test_randomness_same_and_different(fn):
    x = jitgrad.ones(5, 50)
    f = {"randn": lambda a: a * jitgrad.randn(50), "rand_like": lambda a: jitgrad.rand_like(a),
         "dropout": lambda a: jitgrad.nn.functional.dropout(a, 0.5)}[fn]
    same = jitgrad.func.vmap(f, randomness="same")(x).numpy()
    assert (same == same[0]).all()
    different = jitgrad.func.vmap(f, randomness="different")(x).numpy()
    assert not (different == different[0]).all()
    if fn == "dropout":
        assert set(np.unique(different)) <= {0.0, 2.0}


def test_randomness_same_with_chunks():
    x = jitgrad.ones(4, 6)
    out = jitgrad.func.vmap(lambda a: a * jitgrad.randn(6), randomness="same", chunk_size=3)(x).numpy()
    assert (out == out[0]).all()


# --- errors -----------------------------------------------------------------------------------------
def _errors(T):
    x, y = data(T, 3, 4), data(T, 4)
    ident = lambda a: a  # noqa: E731
    cases = [
        (T.func.vmap(lambda a, b: a + b), (x, data(T, 2, 4))),
        (T.func.vmap(lambda a, b: a + b, in_dims=(0,)), (x, y)),
        (T.func.vmap(lambda a, b: a + b, in_dims=(0, 5)), (x, y)),
        (T.func.vmap(lambda a, b: a + b, in_dims=[0, 0]), (x, y)),
        (T.func.vmap(ident, in_dims=0.5), (x,)),
        (T.func.vmap(ident, in_dims=None), (x,)),
        (T.func.vmap(ident, in_dims=(None,)), (x,)),
        (T.func.vmap(ident, in_dims=(0,)), (3,)),
        (T.func.vmap(ident, in_dims=({"b": 0},)), ({"a": x},)),
        (T.func.vmap(lambda: x), ()),
        (T.func.vmap(lambda a: 3), (x,)),
        (T.func.vmap(ident, out_dims=None), (x,)),
        (T.func.vmap(ident, out_dims=5), (x,)),
        (T.func.vmap(ident, out_dims=(0, 1)), (x,)),
        (T.func.vmap(ident, out_dims="a"), (x,)),
        (T.func.vmap(lambda a: y.mul_(a)), (x,)),
        (T.func.vmap(lambda a: y.copy_(a)), (x,)),
        (T.func.vmap(lambda a: a.item()), (x,)),
        (T.func.vmap(lambda a: a.sum() > 0 and a), (x,)),
    ]
    return [err_of(f, *args) for f, args in cases]


def test_errors_as_torch():
    for j, t in zip(_errors(jitgrad), _errors(torch)):
        assert j is not None
        assert j[0] == t[0]
        assert j[1].split("TreeSpec")[0] == t[1].split("TreeSpec")[0]


def test_setitem_into_unbatched_tensor():
    y = jitgrad.zeros(4)

    def f(a):
        y[0] = a.sum()
        return a
    assert err_of(jitgrad.func.vmap(f), jitgrad.ones(3, 4))[1].startswith("vmap: inplace arithmetic(self, *extra_args)")


def test_argument_errors_at_creation():
    assert err_of(jitgrad.func.vmap, lambda a: a, randomness="x") == \
        err_of(torch.func.vmap, lambda a: a, randomness="x")
    assert err_of(jitgrad.func.vmap, lambda a: a, chunk_size=0) == err_of(torch.func.vmap, lambda a: a, chunk_size=0)


def test_dispatch_only_inside_vmap():
    """Outside vmap the public entry points are the originals, also after an exception inside."""
    before = (jitgrad.sin, jitgrad.Tensor.__add__, jitgrad.nn.functional.linear)
    with pytest.raises(RuntimeError):
        jitgrad.func.vmap(lambda a: a.item())(jitgrad.ones(3))
    assert (jitgrad.sin, jitgrad.Tensor.__add__, jitgrad.nn.functional.linear) == before
    assert not _dispatch._SWAPPED and active_levels() == ()


# --- gradients ---------------------------------------------------------------------------------------
def test_backward_through_vmap():
    def run(T):
        x, w = data(T, 3, 4, rg=True), data(T, 5, 4, rg=True)
        out = T.func.vmap(lambda a: T.nn.functional.linear(a, w).tanh().softmax(-1) @ w, in_dims=0)(x)
        out = T.func.vmap(lambda a: a.sum(), in_dims=1)(out)
        return out, T.autograd.grad(out.pow(2).sum(), [x, w])
    both(run)


def _mlp_loss(params, x, y):
    w1, b1, w2, b2 = params
    h = jitgrad.nn.functional.linear(x, w1, b1).tanh()
    return jitgrad.nn.functional.cross_entropy(jitgrad.nn.functional.linear(h, w2, b2), y)


def test_per_sample_gradients_through_batched_leaves():
    """grad inside vmap: the parameters become batched leaves, one backward of the batched
    loss gives every sample's gradient; equal to the loop over single samples."""
    rng = np.random.default_rng(0)
    params = [jitgrad.tensor(rng.uniform(-1, 1, size=s)) for s in ((8, 6), (8,), (4, 8), (4,))]
    x = jitgrad.tensor(rng.uniform(-1, 1, size=(5, 6)))
    y = jitgrad.tensor(rng.integers(0, 4, size=5))

    def per_sample(ps, xs, ys):
        assert len(active_levels()) == 1
        leaves = [batched_leaf_like(p) for p in ps]
        loss = _mlp_loss(leaves, xs.unsqueeze(0), ys.unsqueeze(0))
        return grad_per_sample([loss], leaves)
    got = jitgrad.func.vmap(per_sample, in_dims=(None, 0, 0))(params, x, y)
    for b in range(5):
        ps = [p.detach().requires_grad_() for p in params]
        want = jitgrad.autograd.grad(_mlp_loss(ps, x[b:b + 1], y[b:b + 1]), ps)
        for g, w in zip(got, want):
            assert_close(g[b], w, rtol=1e-10, atol=1e-12)


def test_batched_leaf_keeps_the_outer_graph():
    """A leaf made from a tensor that requires grad is a differentiable copy of it."""
    x = data(jitgrad, 3, 2, rg=True)

    def f(a):
        leaf = batched_leaf_like(a)
        assert physical(leaf).grad_fn is not None
        return leaf * 2
    out = jitgrad.func.vmap(f)(x)
    (g,) = jitgrad.autograd.grad(out.sum(), [x])
    assert_close(g, np.full((3, 2), 2.0))


def _cnn_loss(params, x, y):
    """The digits CNN (examples/digits.build_cnn) written with nn.functional."""
    c1, cb1, c2, cb2, w, b = params
    F = jitgrad.nn.functional
    h = F.max_pool2d(F.relu(F.conv2d(x, c1, cb1, padding=1)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, c2, cb2, padding=1)), 2)
    return F.cross_entropy(F.linear(h.flatten(1), w, b), y)


def test_per_sample_gradients_of_the_cnn():
    """Batched leaves of conv weights: the per-sample convolution runs as one grouped one."""
    rng = np.random.default_rng(1)
    shapes = ((8, 1, 3, 3), (8,), (16, 8, 3, 3), (16,), (10, 64), (10,))
    params = [jitgrad.tensor(rng.uniform(-0.5, 0.5, size=s)) for s in shapes]
    x = jitgrad.tensor(rng.uniform(0, 1, size=(4, 1, 8, 8)))
    y = jitgrad.tensor(rng.integers(0, 10, size=4))

    def per_sample(ps, xs, ys):
        leaves = [batched_leaf_like(p) for p in ps]
        return grad_per_sample([_cnn_loss(leaves, xs.unsqueeze(0), ys.unsqueeze(0))], leaves)
    got = jitgrad.func.vmap(per_sample, in_dims=(None, 0, 0))(params, x, y)
    for b in range(4):
        ps = [p.detach().requires_grad_() for p in params]
        want = jitgrad.autograd.grad(_cnn_loss(ps, x[b:b + 1], y[b:b + 1]), ps)
        for g, w in zip(got, want):
            assert_close(g[b], w, rtol=1e-10, atol=1e-12)
