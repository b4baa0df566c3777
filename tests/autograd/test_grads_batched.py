"""autograd.grad(..., is_grads_batched=True) against PyTorch: a batch of vector-Jacobian
products, the graph kept or freed as torch does, and torch's errors."""
import numpy as np
import pytest
import torch

import jitgrad


def _pair(seed=0):
    rng = np.random.default_rng(seed)
    x0, w0 = rng.standard_normal(3), rng.standard_normal((3, 2))
    out = []
    for lib in (jitgrad, torch):
        x = lib.tensor(x0, dtype=lib.float64, requires_grad=True)
        w = lib.tensor(w0, dtype=lib.float64, requires_grad=True)
        y = (x.sin() * 2.0) @ w      # shape (2,)
        out.append((lib, x, w, y))
    return out


def test_batched_vjps_match_torch():
    v = np.random.default_rng(1).standard_normal((4, 2))
    res = []
    for lib, x, w, y in _pair():
        res.append(lib.autograd.grad(y, (x, w), lib.tensor(v, dtype=lib.float64), is_grads_batched=True))
    for a, b in zip(*res):
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12)


def test_create_graph_makes_the_batch_differentiable():
    v = np.eye(2)
    res = []
    for lib, x, w, y in _pair(2):
        (gx,) = lib.autograd.grad(y, x, lib.tensor(v, dtype=lib.float64), is_grads_batched=True, create_graph=True)
        assert gx.requires_grad and gx.grad_fn is not None
        (hx,) = lib.autograd.grad((gx * gx).sum(), x)
        res.append(hx.numpy())
    np.testing.assert_allclose(res[0], res[1], rtol=1e-12, atol=1e-12)


def test_graph_freed_after_the_call_unless_retained():
    for lib, x, w, y in _pair(3):
        v = lib.tensor(np.eye(2), dtype=lib.float64)
        lib.autograd.grad(y, x, v, is_grads_batched=True, retain_graph=True)
        lib.autograd.grad(y, x, v, is_grads_batched=True)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            lib.autograd.grad(y, x, v, is_grads_batched=True)


def test_unused_inputs_as_torch():
    for lib, x, w, y in _pair(4):
        z = lib.tensor([1.0, 2.0], dtype=lib.float64, requires_grad=True)
        v = lib.tensor(np.eye(2), dtype=lib.float64)
        gx, gz = lib.autograd.grad(y, (x, z), v, is_grads_batched=True, allow_unused=True, retain_graph=True)
        assert gz is None and tuple(gx.shape) == (2, 3)
        _, gz = lib.autograd.grad(y, (x, z), v, is_grads_batched=True, materialize_grads=True, retain_graph=True)
        assert tuple(gz.shape) == (2,)  # torch materializes unused inputs unbatched
        with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
            lib.autograd.grad(y, (x, z), v, is_grads_batched=True)


@pytest.mark.parametrize("lib", [jitgrad, torch], ids=["jitgrad", "torch"])
def test_errors_as_torch(lib):
    x = lib.tensor([1.0, 2.0, 3.0], dtype=lib.float64, requires_grad=True)
    y = x * x
    # torch prints the wrong trailing shape (grad_output[0]'s own trailing dims); jitgrad
    # prints the batch's, so only the part both get right is compared
    with pytest.raises(RuntimeError, match=r"^If `is_grads_batched=True`, we interpret the first dimension.*"
                                           r"mismatch was detected: grad_output\[0\] has a shape of torch.Size"):
        lib.autograd.grad(y, x, lib.ones(4, 2, dtype=lib.float64), is_grads_batched=True, retain_graph=True)
    with pytest.raises(ValueError, match="Got in_dim=0 for some input, but that input is a Tensor of dimensionality 0"):
        lib.autograd.grad(y.sum(), x, None, is_grads_batched=True, retain_graph=True)
    with pytest.raises(IndexError, match="^invalid index of a 0-dim tensor"):
        lib.autograd.grad(y.sum(), x, lib.ones((), dtype=lib.float64), is_grads_batched=True, retain_graph=True)
