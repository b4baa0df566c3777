"""jitgrad.compile replays the reductions, the matrix products, trace, dtype casts and
the comparison / logic ops.

Each case is a training step's forward built on one op. The same step runs compiled (on
one set of parameters) and eagerly (on a twin set), over several calls with new inputs:
the losses, the op's other outputs (indices, masks) and the parameters' gradients must
agree, and the compiled function must hold a plan (not an eager fallback) whose program
contains the op. Every case runs once with the op on tensors that require grad (recorded
for the backward) and once on the inputs alone (no grad: reported by the op itself).
"""
import numpy as np
import pytest

import jitgrad
import jitgrad.nn as nn
import jitgrad.nn.functional as F
from jitgrad.compiler.api import _Eager, _Entry

DTYPES = ["float64", "float32"]


def _tol(dtype):
    return dict(rtol=1e-12, atol=1e-12) if dtype == "float64" else dict(rtol=1e-5, atol=1e-6)


def _tensor(a, dtype, rg=False):
    return jitgrad.tensor(np.asarray(a), dtype=getattr(jitgrad, dtype), requires_grad=rg)


class Case:
    """op(*hs) -> y or (y, *others): hs are x_i * w_i (grad) or the inputs x_i (no grad),
    at `shapes`; y is a float tensor the loss reads, the others (indices, masks, integer
    results) are returned by the step and compared as they are."""

    def __init__(self, name, shapes, op, names):
        self.name, self.shapes, self.op, self.names = name, shapes, op, names


CASES = [
    Case("amax", [(3, 4, 2)], lambda h: h.amax(1) * h.amax((0, 2), keepdim=True).sum(), ["amax"]),
    Case("amin", [(3, 4, 2)], lambda h: h.amin(-1) + h.amin((0, 1)).sum(), ["amin"]),
    Case("max_all", [(3, 4)], lambda h: h.max() * h, ["max_all"]),
    Case("min_all", [(3, 4)], lambda h: h.min() * h, ["min_all"]),
    Case("max_dim", [(3, 4, 2)], lambda h: (h.max(1).values * h.max(-1, keepdim=True)[0].sum(), h.max(1).indices,
                                            h.max(-1, keepdim=True)[1]), ["max_dim"]),
    Case("min_dim", [(3, 4)], lambda h: (jitgrad.min(h, 0)[0], jitgrad.min(h, 0)[1]), ["min_dim"]),
    Case("argmax_argmin", [(3, 4)], lambda h: (h * 2.0, h.argmax(), h.argmax(1), h.argmin(), h.argmin(0, keepdim=True)),
         ["max_dim", "min_dim"]),
    Case("prod", [(3, 4)], lambda h: h.prod(1) * h.prod(0, keepdim=True).sum(), ["prod"]),
    Case("prod_all", [(3, 4)], lambda h: h.prod() * h, ["prod_all"]),
    Case("mm", [(3, 4), (4, 5)], lambda a, b: a @ b, ["matmul"]),
    Case("dot", [(4,), (4,)], lambda a, b: jitgrad.dot(a, b) * a, ["dot"]),
    Case("mv", [(3, 4), (4,)], lambda a, b: jitgrad.mv(a, b), ["mv"]),
    Case("vec_mat", [(4,), (4, 3)], lambda a, b: a @ b, ["matmul"]),
    Case("bmm", [(2, 3, 4), (2, 4, 5)], lambda a, b: jitgrad.bmm(a, b), ["bmm"]),
    Case("matmul_broadcast", [(2, 1, 3, 4), (3, 4, 5)], lambda a, b: a @ b, ["bmm"]),
    Case("matmul_batch_vec", [(2, 3, 4), (4,)], lambda a, b: a @ b, ["bmm"]),
    Case("addmm", [(5,), (3, 4), (4, 5)], lambda i, a, b: jitgrad.addmm(i, a, b), ["addmm"]),
    Case("addmm_beta_alpha", [(3, 1), (3, 4), (4, 5)], lambda i, a, b: jitgrad.addmm(i, a, b, beta=0.5, alpha=-2.0),
         ["addmm"]),
    Case("addmm_transposed", [(3, 5), (4, 3), (5, 4)], lambda i, a, b: jitgrad.addmm(i, a.t(), b.t()), ["addmm"]),
    Case("linear", [(3, 4), (5, 4), (5,)], lambda x, w, b: F.linear(x, w, b), ["addmm"]),
    Case("linear_no_bias", [(3, 4), (5, 4)], lambda x, w: F.linear(x, w), ["linear_mm"]),
    Case("linear_3d", [(2, 3, 4), (5, 4), (5,)], lambda x, w, b: F.linear(x, w, b), ["addmm"]),
    Case("trace", [(3, 4)], lambda h: h.trace() * h, ["trace"]),
    Case("to_copy", [(3, 4)], lambda h: h * (h > 0.2).to(h.dtype) + h.long().to(h.dtype) * h, ["to_copy"]),
    Case("comparisons", [(3, 4), (3, 4)],
         lambda a, b: (a * (a >= b).to(a.dtype), a > 0, a < b, a <= 0.5, a == a, a != b, 0.1 < a),
         ["to_copy", "greater_equal", "greater", "less", "less_equal", "equal", "not_equal"]),
    Case("logic", [(3, 4), (3, 4)],
         lambda a, b: (a * 1.0, (a > 0) & (b > 0), (a > 0) | (b < 0), (a > 0) ^ (b > 0), ~(a > 0),
                       jitgrad.logical_and(a > 0, b > 0), jitgrad.logical_or(a > 0, b > 0),
                       jitgrad.logical_not(a > 0), jitgrad.isnan(a), jitgrad.isfinite(b / a)),
         ["bitwise_and", "bitwise_or", "bitwise_xor", "invert", "logical_and", "logical_or", "logical_not", "isnan",
          "isfinite"]),
    Case("integer_results", [(3, 3)],
         lambda h: (h * 1.0, (h > 0).sum(), (h > 0).sum(0), h.long(), (h * 3.0).long().amax(0),
                    (h * 3.0).long().max(1).values, (h * 3.0).long() @ (h * 2.0).long(), (h * 3.0).long().trace(),
                    (h * 3.0).long().prod()), ["sum_all", "sum", "amax", "max_dim", "matmul", "trace", "prod_all"]),
]


def _step(case, ws, grad):
    """With grad the op runs on x_i * w_i; without, on the x_i alone, and the gradients of
    the w_i then read the op's result through the loss."""
    def step(*xs):
        out = case.op(*[x * w for x, w in zip(xs, ws)] if grad else xs)
        y, others = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
        loss = (y * y).sum()
        if not grad:
            loss = loss * sum((w * w).sum() for w in ws)
        loss.backward()
        return (loss,) + others
    return step


def _run(case, dtype, grad, rng, calls=4):
    w0 = [rng.uniform(0.5, 1.5, s) * np.where(rng.random(s) < 0.5, -1.0, 1.0) for s in case.shapes]
    wc = [_tensor(w, dtype, True) for w in w0]
    we = [_tensor(w, dtype, True) for w in w0]
    compiled = jitgrad.compile(_step(case, wc, grad))
    eager = _step(case, we, grad)
    for _ in range(calls):
        xs = [rng.standard_normal(s) for s in case.shapes]
        for w in wc + we:
            w.grad = None
        got = compiled(*[_tensor(x, dtype) for x in xs])
        want = eager(*[_tensor(x, dtype) for x in xs])
        assert len(got) == len(want)
        for g, e in zip(got, want):
            assert g.dtype == e.dtype and g.shape == e.shape, (g, e)
            np.testing.assert_allclose(g.detach().numpy(), e.detach().numpy(), **_tol(dtype))
        for a, b in zip(wc, we):  # a w that reaches the loss only through a comparison gets none
            assert (a.grad is None) == (b.grad is None)
            if b.grad is not None:
                np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), **_tol(dtype))
    (entry,) = compiled.cache.values()
    assert type(entry) is _Entry, entry.breaks if type(entry) is _Eager else entry
    return entry.plan


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_replay_equals_eager_with_grad(case, dtype, rng):
    plan = _run(case, dtype, True, rng)
    for name in case.names:
        assert name in plan.names, (name, plan.names)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_replay_equals_eager_without_grad(case, dtype, rng):
    plan = _run(case, dtype, False, rng)
    for name in case.names:
        assert name in plan.names, (name, plan.names)


def test_ties_and_nans_pick_what_eager_picks(rng):
    """max / min / argmax along a dim pick the first extreme, a NaN first of all; amax and
    max() give NaN for a slice holding one, as eager (numpy) does."""
    x0 = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, np.nan, 5.0], [2.0, 2.0, -1.0, -1.0]])

    def step(x):
        return (x.max(1), x.min(1), x.argmax(0), x.amax(1), x.amin(0), x.max(), x.min())

    compiled = jitgrad.compile(step)
    for shift in (0.0, 1.0, -2.0):
        x = jitgrad.tensor(x0 + shift)
        got = _flat(compiled(x))
        want = _flat(step(x))
        for g, e in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), e.numpy())
    (entry,) = compiled.cache.values()
    assert type(entry) is _Entry


def _flat(out):
    flat = []
    for o in out:
        flat.extend(o if isinstance(o, tuple) else (o,))
    return flat


def test_prod_with_zeros_replays_its_backward(rng):
    """prod's backward takes another path when the input holds zeros: the replayed forward
    writes the values that path reads."""
    w = _tensor(rng.uniform(0.5, 1.5, (3, 4)), "float64", True)
    we = _tensor(w.detach().numpy(), "float64", True)

    def make(p):
        def step(x):
            loss = (x * p).prod(1).sum() + (x * p).prod()
            loss.backward()
            return loss
        return step

    compiled, eager = jitgrad.compile(make(w)), make(we)
    for zeros in ([], [(0, 1)], [(0, 1), (0, 2)], [(1, 0), (2, 3)]):
        x0 = rng.uniform(0.5, 1.5, (3, 4))
        for ij in zeros:
            x0[ij] = 0.0
        w.grad = we.grad = None
        np.testing.assert_allclose(compiled(jitgrad.tensor(x0)).detach().numpy(),
                                   eager(jitgrad.tensor(x0)).detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), rtol=1e-12)
    assert type(next(iter(compiled.cache.values()))) is _Entry


@pytest.mark.parametrize("dtype", DTYPES)
def test_float_inputs_cast_to_the_model_dtype(dtype, rng):
    """Data that arrives in another float dtype is cast inside the step: a compiled cast
    that reads its input at the input's own dtype."""
    other = "float32" if dtype == "float64" else "float64"
    w = _tensor(rng.standard_normal((4, 3)), dtype, True)
    we = _tensor(w.detach().numpy(), dtype, True)

    def make(p):
        def step(x):
            loss = (x.to(getattr(jitgrad, dtype)) @ p).sum()
            loss.backward()
            return loss
        return step

    compiled, eager = jitgrad.compile(make(w)), make(we)
    for _ in range(3):
        x = _tensor(rng.standard_normal((2, 4)), other)
        w.grad = we.grad = None
        np.testing.assert_allclose(compiled(x).detach().numpy(), eager(x).detach().numpy(), **_tol(dtype))
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), **_tol(dtype))
    (entry,) = compiled.cache.values()
    assert type(entry) is _Entry and "to_copy" in entry.plan.names


def test_cast_recorded_for_grad_between_float_dtypes_runs_eagerly(rng):
    """A cast between float dtypes recorded for grad mixes dtypes in one backward, which a
    plan's compiled sweep does not run: the signature runs eagerly, with eager's results."""
    w = _tensor(rng.standard_normal(3), "float32", True)
    we = _tensor(w.detach().numpy(), "float32", True)

    def make(p):
        def step(x):
            loss = ((p.double() * x) ** 2).sum()
            loss.backward()
            return loss
        return step

    compiled, eager = jitgrad.compile(make(w)), make(we)
    for _ in range(2):
        x = _tensor(rng.standard_normal(3), "float64")
        w.grad = we.grad = None
        np.testing.assert_allclose(compiled(x).detach().numpy(), eager(x).detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), rtol=1e-6)
    (entry,) = compiled.cache.values()
    assert type(entry) is _Eager


@pytest.mark.parametrize("fn", ["allclose", "equal"])
def test_python_bools_from_data_are_graph_breaks(fn):
    def step(x):
        return x * 2.0 if getattr(jitgrad, fn)(x, x * 1.0) else x

    compiled = jitgrad.compile(step)
    x = jitgrad.tensor([1.0, 2.0])
    np.testing.assert_array_equal(compiled(x).numpy(), [2.0, 4.0])
    (entry,) = compiled.cache.values()
    assert type(entry) is _Eager and fn in entry.breaks[0][0]
    with pytest.raises(jitgrad.compiler.api.GraphBreak, match=fn):
        jitgrad.compile(step, fullgraph=True)(x)


def _mlp(seed, dtype):
    jitgrad.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_mlp_training_step_replays(dtype, rng):
    """The issue's small MLP (b16, 32-32-32-1, MSE, SGD): the whole step is one plan, and
    a target network evaluated without grad inside the step replays too."""
    dt = getattr(jitgrad, dtype)

    def make():
        model, target = _mlp(0, dt), _mlp(1, dt)
        opt = jitgrad.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x, y):
            with jitgrad.no_grad():
                t = target(x) * 0.5
            loss = F.mse_loss(model(x), y + t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step, model

    (eager, me), (step, mc) = make(), make()
    compiled = jitgrad.compile(step)
    for _ in range(5):
        x, y = rng.standard_normal((16, 32)), rng.standard_normal((16, 1))
        lc = compiled(_tensor(x, dtype), _tensor(y, dtype))
        le = eager(_tensor(x, dtype), _tensor(y, dtype))
        np.testing.assert_allclose(lc.detach().numpy(), le.detach().numpy(), **_tol(dtype))
        for pc, pe in zip(mc.parameters(), me.parameters()):
            np.testing.assert_allclose(pc.detach().numpy(), pe.detach().numpy(), **_tol(dtype))
    (entry,) = compiled.cache.values()
    assert type(entry) is _Entry, entry.breaks if type(entry) is _Eager else entry
    assert entry.plan.names.count("addmm") == 6
