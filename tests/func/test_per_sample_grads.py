"""Per-sample gradients, torch's recipe vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
over functional_call of the digits MLP and CNN (float64): equal to the loop over single
samples (1e-10) and to torch.func's."""
import importlib

import numpy as np
import pytest
import torch

import jitgrad
from jitgrad.examples.digits import build_cnn, build_mlp, cnn_weights, initial_weights


def fn_(T):
    return importlib.import_module(T.__name__ + ".func")


def setup(T, kind, batch, seed=0):
    r = np.random.default_rng(seed)
    if kind == "mlp":
        model = build_mlp(T, initial_weights([64, 32, 32, 10])).double()
        x = T.tensor(r.standard_normal((batch, 64)))
    else:
        model = build_cnn(T, cnn_weights()).double()
        x = T.tensor(r.standard_normal((batch, 1, 8, 8)))
    y = T.tensor(r.integers(0, 10, batch))
    params = {k: v.detach() for k, v in model.named_parameters()}
    fn = fn_(T)

    def loss_fn(p, x, y):
        out = fn.functional_call(model, p, (x.unsqueeze(0),))
        return T.nn.functional.cross_entropy(out, y.unsqueeze(0))
    return fn, loss_fn, params, x, y


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_per_sample_grads_equal_the_loop_and_torch(kind):
    batch = 6
    fn, loss_fn, params, x, y = setup(jitgrad, kind, batch)
    per_sample = fn.vmap(fn.grad(loss_fn), in_dims=(None, 0, 0))(params, x, y)
    loop = [fn.grad(loss_fn)(params, x[i], y[i]) for i in range(batch)]
    tfn, tloss, tparams, tx, ty = setup(torch, kind, batch)
    expected = tfn.vmap(tfn.grad(tloss), in_dims=(None, 0, 0))(tparams, tx, ty)
    assert set(per_sample) == set(expected)
    for k, g in per_sample.items():
        assert not g.requires_grad and tuple(g.shape) == (batch,) + tuple(params[k].shape)
        np.testing.assert_allclose(g.numpy(), np.stack([s[k].numpy() for s in loop]), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g.numpy(), expected[k].numpy(), rtol=1e-10, atol=1e-12)
    assert all(not p.requires_grad for p in params.values())


def test_per_sample_grad_and_value_with_aux():
    def run(T):
        fn, loss_fn, params, x, y = setup(T, "mlp", 4)

        def f(p, x, y):
            loss = loss_fn(p, x, y)
            return loss, loss * 2
        return fn.vmap(fn.grad_and_value(f, has_aux=True), in_dims=(None, 0, 0))(params, x, y)
    (gj, (vj, aj)), (gt, (vt, at)) = run(jitgrad), run(torch)
    for a, b in [(vj, vt), (aj, at)] + [(gj[k], gt[k]) for k in gt]:
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


def test_grad_of_batched_argument_under_vmap():
    def run(T):
        fn = fn_(T)
        x = T.tensor(np.linspace(-1, 1, 12).reshape(3, 4))
        w = T.tensor(np.linspace(0.5, 2, 4))
        g1 = fn.vmap(fn.grad(lambda x, w: (x.sin() * w).sum()))(x, w.expand(3, 4))
        g2 = fn.vmap(fn.grad(lambda x, w: (x.sin() * w).sum(), argnums=(0, 1)), in_dims=(0, None))(x, w)
        return g1, g2
    (a, (b, c)), (ta, (tb, tc)) = run(jitgrad), run(torch)
    for p, q in [(a, ta), (b, tb), (c, tc)]:
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-12, atol=1e-12)
