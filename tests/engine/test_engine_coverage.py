"""Every backward of a catalogue of real graph shapes runs on the compiled engine.

Each program is written once against a torch-like module T and run with jitgrad and with
torch from the same numbers; jitgrad's gradients must match torch's (at the program's
float32 tolerance) and, counted by jitgrad.autograd.engine_stats(), every backward call
must have run compiled: rows the sweep cannot run (a custom Function, a hook, a row of
another dtype than its tape's, one that mixes dtypes) are handed back one by one, never
the whole call. The shapes are those of the programs the project is for: an ODE solver's
(float32 state, float64 time and step-size arithmetic, casts both ways), a transformer
block's, mixed precision, custom Functions and hooks inside, integer and bool rows.
"""
import importlib.util
import warnings

import numpy as np
import pytest
import torch
from conftest import assert_close

import jitgrad

RTOL, ATOL = 2e-5, 1e-6  # float32 programs: jitgrad and torch round differently
# the solver's step-size control (err ** -0.2 of a float32 norm) amplifies that rounding
LOOSE = {"rk_solver": (2e-4, 1e-5)}


def _arr(seed, *shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _t(T, a, rg=False):
    return T.tensor(a, requires_grad=rg)


# --- the programs: each returns the tensors whose .grad is compared --------------------------------
def rk_solver(T):
    """An adaptive Runge-Kutta loop as torchdiffeq writes it: the state and the model in
    float32, time and step sizes in float64, the step cast to the state's dtype, the error
    norm (float32) driving the float64 step-size update, all of it differentiated."""
    w1, w2 = _t(T, _arr(1, 2, 16) * 0.5, True), _t(T, _arr(2, 16, 2) * 0.5, True)
    y = _t(T, _arr(3, 4, 2))
    t = T.tensor(0.0, dtype=T.float64)
    h = T.tensor(0.05, dtype=T.float64)

    def f(t, y):
        return T.tanh((y ** 3) @ w1 + t.to(y.dtype)) @ w2

    for _ in range(4):
        hy = h.to(y.dtype)
        k1 = f(t, y)
        k2 = f(t + h / 2, y + hy * k1 / 2)
        y_new = y + hy * k2
        err = (hy * (k2 - k1)).abs().pow(2).mean().sqrt()
        ratio = err.double() / 1e-3
        h = h * T.clamp(0.9 * ratio ** -0.2, 0.2, 5.0)  # a float64 row fed by float32 ones
        t = t + h
        y = y_new
    loss = (y ** 2).sum() + t.float() * 1e-2
    loss.backward()
    return [w1, w2]


def transformer_block(T):
    """Embedding, layer norm, causal softmax attention, GELU MLP, cross entropy."""
    B, L, D, V = 2, 5, 8, 11
    emb = _t(T, _arr(4, V, D) * 0.3, True)
    wqkv = _t(T, _arr(5, D, 3 * D) * 0.3, True)
    w1, w2 = _t(T, _arr(6, D, 2 * D) * 0.3, True), _t(T, _arr(7, 2 * D, D) * 0.3, True)
    ln_w = _t(T, np.ones(D, np.float32), True)
    idx = T.tensor(np.random.default_rng(8).integers(0, V, (B, L)))
    x = emb[idx]
    h = T.nn.functional.layer_norm(x, (D,), ln_w)
    q, k, v = (h @ wqkv).split(D, dim=-1)
    att = (q @ k.transpose(-2, -1)) / D ** 0.5
    mask = T.tril(T.ones(L, L, dtype=T.bool))  # a bool row beside the float ones
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    x = x + att @ v
    x = x + T.nn.functional.gelu(x @ w1) @ w2
    logits = x @ emb.t()
    loss = T.nn.functional.cross_entropy(logits.reshape(-1, V), idx.reshape(-1))
    loss.backward()
    return [emb, wqkv, w1, w2, ln_w]


def mixed_precision(T):
    """A float32 model whose loss is taken in float64, a float64 parameter beside float32
    ones, and float32 * float64 promotion inside the graph."""
    w = _t(T, _arr(9, 3, 4), True)
    scale = _t(T, np.array([1.5, -0.5, 2.0, 0.25]), True)  # float64
    x = _t(T, _arr(10, 6, 3))
    h = T.relu(x @ w) * scale          # float32 * float64 -> float64
    out = (h.float() * 2).sum(1)       # and back
    loss = (out.double() - 1.0).pow(2).mean()
    loss.backward()
    return [w, scale]


def custom_function_and_hooks(T):
    """A custom Function, tensor hooks, a Node pre- and post-hook, a post-accumulate hook,
    retain_grad, inside a float32 graph with a float64 branch."""
    class Cube(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x ** 2 * g

    w = _t(T, _arr(11, 5), True)
    b = _t(T, _arr(12, 5).astype(np.float64), True)
    seen = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.sum().item()))
    h = Cube.apply(w * 2)
    h.register_hook(lambda g: g * 2)
    h.grad_fn.register_prehook(lambda gs: (gs[0] + 1,))
    m = T.tanh(h)
    m.retain_grad()
    m.grad_fn.register_hook(lambda gi, go: (gi[0] * 0.5,))
    loss = (m * b.float()).sum() + (b.exp() * 0.1).sum()
    loss.backward()
    return [w, b, m]


def int_and_bool_rows(T):
    """Indexing with integer tensors, gather, masks, where, argmax and sort indices."""
    x = _t(T, _arr(13, 6, 4), True)
    i = T.tensor([0, 2, 2, 5])
    y = x[i] * 2
    keep = y > 0
    z = T.where(keep, y, y * 0.1)
    j = z.argmax(dim=1, keepdim=True)
    picked = z.gather(1, j)
    s, order = z.sort(dim=1)
    loss = picked.sum() + (s * T.arange(4).float()).sum() + z[keep].sum()
    loss.backward()
    return [x]


def two_roots_two_dtypes(T):
    """backward over a float32 and a float64 root at once."""
    a = _t(T, _arr(14, 4), True)
    b = _t(T, _arr(15, 4).astype(np.float64), True)
    l32 = (a.sin() * b.float()).sum()
    l64 = (a.double() * b).cos().sum()
    T.autograd.backward([l32, l64])
    return [a, b]


def across_tapes(T):
    """A graph spread over several tapes (a retained part, then more ops after a first
    backward), float64 rows on one side of the seam and float32 on the other."""
    w = _t(T, _arr(16, 3, 3), True)
    h = (w @ w).double()
    h.sum().backward(retain_graph=True)
    y = (h.exp().float() * w).sum()
    y.backward()
    return [w]


def saved_tensor_hooks(T):
    """Saved values packed by hooks: those rows run in Python, the rest compiled."""
    x = _t(T, _arr(17, 8), True)
    with T.autograd.graph.saved_tensors_hooks(lambda t: t * 1, lambda t: t):
        y = (x.sin() * x).exp()
    (y.sum() + x.pow(3).sum()).backward()
    return [x]


PROGRAMS = [rk_solver, transformer_block, mixed_precision, custom_function_and_hooks, int_and_bool_rows,
            two_roots_two_dtypes, across_tapes, saved_tensor_hooks]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_every_backward_runs_compiled(program):
    want = program(torch)
    jitgrad.autograd.reset_engine_stats()
    got = program(jitgrad)
    stats = jitgrad.autograd.engine_stats()
    assert stats["python_calls"] == 0, stats["python_reasons"]
    assert stats["compiled_calls"] >= 1
    rtol, atol = LOOSE.get(program.__name__, (RTOL, ATOL))
    for i, (g, t) in enumerate(zip(got, want)):
        assert g.grad.dtype == getattr(jitgrad, str(t.grad.dtype).split(".")[-1]), i
        assert_close(g.grad, t.grad, rtol=rtol, atol=atol, msg=f"{program.__name__}: gradient {i}")


def test_rows_handed_back_are_counted_by_reason():
    jitgrad.autograd.reset_engine_stats()
    custom_function_and_hooks(jitgrad)
    rows = jitgrad.autograd.engine_stats()["rows_in_python"]
    assert rows.get("custom Function") == 1
    assert rows.get("node post-hook") == 1
    # b.exp() and the rest of the float64 branch are swept compiled, at float64; the cast
    # between the branches moves its gradient from one dtype's state to the other's, and
    # the float32 + float64 sum (it mixes dtypes) runs its rule in Python
    assert rows.get("a cast between float dtypes") == 1
    assert rows.get("mixes dtypes or devices, or hooks packed its saved values") == 1
    assert len(rows) == 4


def test_a_python_engine_call_is_counted_and_said_once_with_the_users_line():
    jitgrad.autograd.reset_engine_stats(warnings_too=True)
    x = jitgrad.ones(3, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            (gx,) = jitgrad.autograd.grad((x ** 3).sum(), x, create_graph=True)  # the line named
    said = [w for w in caught if "Python engine" in str(w.message)]
    assert len(said) == 1
    assert "create_graph=True" in str(said[0].message)
    assert said[0].filename == __file__
    stats = jitgrad.autograd.engine_stats()
    assert stats["python_calls"] == 2 and stats["compiled_calls"] == 0
    assert list(stats["python_reasons"]) == ["create_graph=True records the backward's ops node by node"]


@pytest.mark.skipif(importlib.util.find_spec("torchdiffeq") is None, reason="torchdiffeq is not installed")
@pytest.mark.parametrize("adjoint", [False, True], ids=["odeint", "odeint_adjoint"])
def test_torchdiffeq_training_step_runs_compiled(adjoint):
    """torchdiffeq's ode_demo step (dopri5) through the import shim: every backward compiled."""
    def step(T):
        import torchdiffeq
        net = T.nn.Sequential(T.nn.Linear(2, 16), T.nn.Tanh(), T.nn.Linear(16, 2))
        with T.no_grad():
            for k, p in enumerate(net.parameters()):
                p.copy_(T.tensor(_arr(20 + k, *p.shape) * 0.3))

        class Func(T.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, t, y):
                return self.net(y ** 3)

        func = Func()
        y0 = T.tensor(_arr(18, 5, 1, 2))
        t = T.linspace(0.0, 0.5, 4)
        solve = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint
        pred = solve(func, y0, t, method="dopri5")
        pred.abs().mean().backward()
        return [p.grad.numpy().copy() for p in net.parameters()]

    want = step(torch)
    jitgrad.autograd.reset_engine_stats()
    with jitgrad.install_as_torch():
        import sys
        saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.startswith("torchdiffeq")}
        try:
            got = step(jitgrad)
        finally:
            for k in [k for k in sys.modules if k.startswith("torchdiffeq")]:
                del sys.modules[k]
            sys.modules.update(saved)
    stats = jitgrad.autograd.engine_stats()
    assert stats["python_calls"] == 0, stats["python_reasons"]
    assert stats["compiled_calls"] >= 1
    for g, t in zip(got, want):
        np.testing.assert_allclose(g, t, rtol=1e-4, atol=1e-6)
