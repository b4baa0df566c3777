"""jitgrad.compile replays the shape ops: views, expand, permute, indexing, cat / stack,
the padding gathers, detach / .data.

Each case is a training step's forward built on one op. The same step runs compiled (on
one set of parameters) and eagerly (on a twin set), over several calls with new inputs:
the losses and the parameters' gradients must agree, and the compiled function must hold
a plan (not an eager fallback) whose program contains the op. Every case runs once with
the op on a tensor that requires grad (recorded for the backward) and once on the input
alone (no grad: reported to the recorder by the op itself).
"""
import numpy as np
import pytest

import jitgrad
from jitgrad.compiler.api import _Eager, _Entry
from jitgrad.graph.spec import BY_OP
from jitgrad.kernels.shape import f_gather
from jitgrad.ops import shape as shape_ops
from jitgrad.ops.nn import _pad2d
from jitgrad.ops.shape import RESHAPE_ALIAS, _view_like, index_put_flat

DTYPES = ["float64", "float32"]


def _tol(dtype):
    return dict(rtol=1e-12, atol=1e-12) if dtype == "float64" else dict(rtol=1e-5, atol=1e-6)


def _tensor(a, dtype, rg=False):
    return jitgrad.tensor(np.asarray(a), dtype=getattr(jitgrad, dtype), requires_grad=rg)


def _idx(a):
    return jitgrad.tensor(np.asarray(a, dtype=np.int64))


class Case:
    """op(h) -> a tensor, where h is x * w (grad) or x itself (no grad); w has x's shape.
    `args(rng)`: extra tensor arguments of the step (index tensors), passed to op."""

    def __init__(self, name, shape, op, names, args=None):
        self.name, self.shape, self.op, self.names, self.args = name, shape, op, names, args


def _pad(mode):
    return lambda h: _pad2d(h, (2, 1, 1, 2), mode)  # what Conv2d(padding_mode=...) runs


CASES = [
    Case("view", (3, 4), lambda h: h.view(2, 6) * h.view(-1)[:6].view(2, 3).view(6)[None, :].view(1, 6),
         ["view"]),
    Case("reshape_flatten", (2, 3, 4), lambda h: h.reshape(6, 4).flatten() + h.flatten(1).reshape(-1), ["view"]),
    Case("unsafe_view", (3, 4), lambda h: _view_like(RESHAPE_ALIAS, h, h._data.reshape(4, 3)), ["unsafe_view"]),
    Case("squeeze", (3, 1, 4, 1), lambda h: h.squeeze() * 2.0, ["squeeze"]),
    Case("squeeze_dim", (3, 1, 4, 1), lambda h: h.squeeze(1).squeeze(-1), ["squeeze_dim"]),
    Case("unsqueeze", (3, 4), lambda h: h.unsqueeze(1) * h.unsqueeze(0).unsqueeze(-1), ["unsqueeze"]),
    Case("expand", (3, 1, 4), lambda h: h.expand(2, 3, 5, 4) * h.expand_as(jitgrad.zeros(3, 2, 4)).sum(),
         ["expand"]),
    Case("permute", (2, 3, 4), lambda h: h.permute(2, 0, 1) * h.permute(-1, 0, 1).permute(0, 1, 2), ["permute"]),
    Case("transpose", (2, 3, 4), lambda h: h.transpose(0, 2).transpose(1, -1), ["transpose"]),
    Case("t", (3, 4), lambda h: h.t() * h.T.permute(0, 1), ["t", "permute"]),
    Case("select", (3, 4, 5), lambda h: h[1] * h[:, 2][0, 1] + h[-1, :, 3][:, None], ["select"]),
    Case("slice", (3, 4, 5), lambda h: h[:, 1:3] * h[..., ::-2][:, :2, 1:2], ["slice"]),
    Case("split", (3, 4, 5), lambda h: h.split(2, 1)[1] * h.chunk(2, 1)[0].sum() + h.narrow(2, 1, 3)[:, :2, :1],
         ["split", "slice"]),
    Case("split_with_sizes", (3, 4), lambda h: h.split([1, 3], 1)[1] * h.select(1, 0)[:, None], ["split_with_sizes",
                                                                                                  "select"]),
    Case("unbind", (3, 4), lambda h: h.unbind(0)[2] * h.unbind(1)[1].sum(), ["unbind"]),
    Case("diagonal", (3, 4, 5), lambda h: h.diagonal(1, 0, 2) * h.diagonal(-1, 1, 2).sum(), ["diagonal"]),
    Case("repeat", (3, 4), lambda h: h.repeat(2, 1, 2) * 2.0, ["repeat"]),
    Case("index_list", (3, 4), lambda h: h[[2, 0, 2]] * h[:, [True, False, True, True]].sum(), ["index"]),
    Case("index_tensor", (5, 4), lambda h, i, j: h[i] * h[j, 1:].sum() + h[i, j.reshape(-1)[:3]].sum(),
         ["index positions", "index"],
         args=lambda r: (_idx(r.integers(-5, 5, 3)), _idx(r.integers(0, 4, (2, 2))))),
    Case("index_put", (3, 4), lambda h: index_put_flat(h.reshape(-1)[:5], np.array([0, 7, 7, 3, 11]), (3, 4)),
         ["index_put"]),
    Case("cat", (3, 4), lambda h: jitgrad.cat([h, h * 2.0, h[:, :1]], 1) * jitgrad.cat([h, h[:1]], 0).sum(),
         ["cat"]),
    Case("stack", (3, 4), lambda h: jitgrad.stack([h, h * 3.0], 1) + jitgrad.stack([h, h], -1).sum(), ["stack"]),
    Case("reflection_pad2d", (2, 3, 4), _pad("reflect"), ["reflection_pad2d"]),
    Case("replication_pad2d", (2, 3, 4), _pad("replicate"), ["replication_pad2d"]),
    Case("circular_pad2d", (2, 3, 4), _pad("circular"), ["index"]),
]


def _step(case, w, grad):
    """With grad the op runs on x * w; without, on x alone, and w's gradient then reads
    the op's result through the loss."""
    def step(x, *args):
        if grad:
            y = case.op(x * w, *args)
            loss = (y * y).sum()
        else:
            y = case.op(x, *args)
            loss = (y * y).sum() * (w * w).sum()
        loss.backward()
        return loss.detach()
    return step


def _run(case, dtype, grad, rng, calls=4):
    w0 = rng.uniform(0.5, 1.5, case.shape) * np.where(rng.random(case.shape) < 0.5, -1.0, 1.0)
    wc, we = _tensor(w0, dtype, True), _tensor(w0, dtype, True)
    compiled = jitgrad.compile(_step(case, wc, grad))
    eager = _step(case, we, grad)
    for _ in range(calls):
        x = rng.standard_normal(case.shape)
        args = case.args(rng) if case.args else ()
        wc.grad = we.grad = None
        lc = compiled(_tensor(x, dtype), *args)
        le = eager(_tensor(x, dtype), *args)
        np.testing.assert_allclose(lc.numpy(), le.numpy(), **_tol(dtype))
        np.testing.assert_allclose(wc.grad.numpy(), we.grad.numpy(), **_tol(dtype))
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


def _compare(step_of, dtype, rng, make_args, wshape, calls=3):
    """step_of(w) -> a step; compiled on one w, eager on its twin, over new arguments."""
    w0 = rng.standard_normal(wshape)
    wc, we = _tensor(w0, dtype, True), _tensor(w0, dtype, True)
    compiled, eager = jitgrad.compile(step_of(wc)), step_of(we)
    for _ in range(calls):
        args = make_args(rng)
        wc.grad = we.grad = None
        np.testing.assert_allclose(compiled(*args).numpy(), eager(*args).numpy(), **_tol(dtype))
        np.testing.assert_allclose(wc.grad.numpy(), we.grad.numpy(), **_tol(dtype))
    (entry,) = compiled.cache.values()
    return entry


@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_ops_on_int_tensors_replay_in_python(dtype, rng):
    """Index tensors reshaped, transposed, joined and indexed in the step: the plan's
    kernels run one float dtype, so these are Python instructions, recomputed per call."""
    def step_of(w):
        def step(x, i):
            k = jitgrad.cat([i.t().reshape(-1), i[0], i[:, 1].unsqueeze(0).expand(2, 2).reshape(-1)])
            k = jitgrad.stack([k, k], 0).permute(1, 0)[:, 0]
            k = k[i.reshape(-1)[1:4]]  # an int tensor indexed by an int tensor
            y = (x * w)[k]
            loss = (y * y).sum()
            loss.backward()
            return loss.detach()
        return step
    entry = _compare(step_of, dtype, rng, lambda r: (_tensor(r.standard_normal((6, 3)), dtype),
                                                     _idx(r.integers(0, 6, (2, 3)))), (6, 3))
    assert type(entry) is _Entry, entry.breaks
    names = entry.plan.names
    assert {"t", "view", "cat", "stack", "permute", "select", "slice", "index", "index positions"} <= set(names)


@pytest.mark.parametrize("dtype", DTYPES)
def test_detach_and_data_are_their_source(dtype, rng):
    def step_of(w):
        def step(x):
            h = x * w
            loss = (h * h.detach()).sum() + (h.data * w).sum()
            loss.backward()
            return loss.detach()
        return step
    entry = _compare(step_of, dtype, rng, lambda r: (_tensor(r.standard_normal((3, 4)), dtype),), (3, 4))
    assert type(entry) is _Entry, entry.breaks
    assert entry.plan.names.count("mul") == 3  # x * w and the two products: detach and .data add nothing


def test_boolean_mask_tensor_is_a_graph_break(rng):
    def step_of(w):
        def step(x, m):
            y = (x * w)[m]
            loss = (y * y).sum()
            loss.backward()
            return loss.detach()
        return step
    def args(r):
        return _tensor(r.standard_normal((4, 3)), "float64"), jitgrad.tensor(r.random((4, 3)) < 0.5)
    entry = _compare(step_of, "float64", rng, args, (4, 3))
    assert type(entry) is _Eager
    assert any("boolean mask" in reason for reason, _ in entry.breaks)


def test_cat_of_several_dtypes(rng):
    """Without grad it is a Python instruction (numpy promotes); with grad a graph break
    (the kernel reads one dtype)."""
    def step_of(grad):
        def make(w):
            def step(x, y):
                c = jitgrad.cat([x * w, y], 0) if grad else jitgrad.cat([x, y], 0) * w.sum()
                loss = (c * c).sum()
                loss.backward()
                return loss.detach()
            return step
        return make
    def args(r):
        return _tensor(r.standard_normal((2, 3)), "float64"), _tensor(r.standard_normal((1, 3)), "float32")
    entry = _compare(step_of(False), "float64", rng, args, (2, 3))
    assert type(entry) is _Entry and "cat" in entry.plan.names
    entry = _compare(step_of(True), "float64", rng, args, (2, 3))
    assert type(entry) is _Eager and any("several dtypes" in reason for reason, _ in entry.breaks)


def test_every_gather_kernel_user_takes_its_positions_as_constants():
    """f_gather reads the positions; an op whose positions are data (max(dim), max_pool2d)
    must bring its own forward kernel (an alias that does not say its positions are
    constants inherits no kernel)."""
    users = [s for s in BY_OP if s.fwd_kernel is f_gather]
    assert {"index", "select", "slice", "reflection_pad2d", "replication_pad2d"} <= {s.name for s in users}
    for s in users:
        assert "_flat_index" in s.consts, s.name


@pytest.mark.parametrize("index", [
    (1,), (slice(None), slice(1, 3)), (np.array([2, 0, 2]),), (Ellipsis, None, np.array([1, 3])),
    (np.array([0, 2]), slice(None), np.array([1, 3])), (1, slice(None, None, -2), np.array([[1], [3]])),
    (np.array([[True, False, True, True]] * 3),), (slice(None), slice(0, 0)),
])
def test_positions_per_dim_equal_arange(index, monkeypatch):
    """Large tensors get their gather positions per dim (no arange of their size)."""
    expected = np.asarray(np.arange(60).reshape(3, 4, 5)[index]).reshape(-1)
    monkeypatch.setattr(shape_ops, "_SMALL", 0)
    np.testing.assert_array_equal(shape_ops._positions((3, 4, 5), index), expected)
