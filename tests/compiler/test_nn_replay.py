"""jitgrad.compile replays the nn family as eager jitgrad runs it.

Each test builds the same state twice (a module and its optimizer, from one seed), runs a
training step eagerly on one and compiled on the other for several calls with new inputs,
and compares the outputs, the parameters and their gradients after every call (rtol 1e-12
in float64, 1e-5 in float32); the compiled function must then hold a plan, not an eager
fallback. Randomness (dropout, randn...) is compared from the same generator state.

Steps that also use ops of the linalg family (nn.Linear's addmm, the comparisons of
BCE-with-logits) name those ops as `pending`: until they have a forward kernel (the fwd-linalg
branch) the step may fall back to eager, but only for that reason (assert_replays).
"""
import numpy as np
import pytest

import jitgrad
import jitgrad.nn.functional as F
from jitgrad.compiler.api import GraphBreak
from jitgrad.graph.spec import REGISTRY

DTYPES = pytest.mark.parametrize("dtype", ["float64", "float32"])
LINEAR = ("addmm", "linear_mm", "t")


def tols(dtype):
    return dict(rtol=1e-12, atol=1e-13) if dtype == "float64" else dict(rtol=1e-5, atol=1e-6)


def close(got, want, dtype, what):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), what
        for k, (g, w) in enumerate(zip(got, want)):
            close(g, w, dtype, f"{what}[{k}]")
        return
    if want is None or not isinstance(want, jitgrad.Tensor):
        assert got == want, what
        return
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), what
    if want.dtype in (jitgrad.int64, jitgrad.int32, jitgrad.bool):
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=what)
    else:
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), err_msg=what, **tols(dtype))


def only_entry(c):
    assert len(c.cache) == 1
    return next(iter(c.cache.values()))


def _traces_comparisons():
    x = jitgrad.ones(2, dtype=jitgrad.float64)
    return jitgrad.compiler.explain(lambda x: jitgrad.where(x >= 0, x, 0.0), x).graph_break_count == 0


def assert_replays(c, pending=()):
    """The compiled function holds a plan; or, while an op in `pending` (another family's;
    "comparisons" for >= and the like) is not replayed yet, it fell back to eager for
    that reason only."""
    entry = only_entry(c)
    if type(entry).__name__ == "_Entry":
        return
    missing = [n for n in pending if (not _traces_comparisons() if n == "comparisons" else
                                      REGISTRY[n].fwd_kernel is None)]
    assert missing, f"no plan: {entry.breaks}"
    untraced = ("a tensor made in the step by an op jitgrad.compile does not trace",
                "returns a tensor the step did not make with traced ops")
    for reason, _ in entry.breaks:
        assert reason.startswith(tuple(f"{n} has no forward kernel" for n in missing) + untraced), reason


def params(state):
    return list(state[0].parameters()) if isinstance(state, tuple) else []


def compare(make, step, calls, dtype, pending=(), seeded=False, breaks=None):
    """make() -> a fresh state (the same every time); step(state, *args) -> outputs. The
    step runs eagerly on one state and compiled on another for each args of `calls`; the
    compiled one must hold a plan, or, given `breaks`, have fallen back for those reasons."""
    se, sc = make(), make()
    c = jitgrad.compile(lambda *a: step(sc, *a))
    for k, args in enumerate(calls):
        if seeded:
            jitgrad.manual_seed(100 + k)
        want = step(se, *args)
        if seeded:
            jitgrad.manual_seed(100 + k)
        got = c(*args)
        close(got, want, dtype, f"call {k}: outputs")
        for j, (pe, pc) in enumerate(zip(params(se), params(sc))):
            close(pc, pe, dtype, f"call {k}: parameter {j}")
            close(pc.grad, pe.grad, dtype, f"call {k}: grad of parameter {j}")
            assert pe.grad is not None or not pe.requires_grad or breaks is not None
    if breaks is None:
        assert_replays(c, pending)
    else:
        assert [r for r, _ in only_entry(c).breaks] == breaks
    return c


def data(rng, shape, dtype, n=4):
    return [(jitgrad.tensor(rng.standard_normal(shape), dtype=getattr(jitgrad, dtype)),) for _ in range(n)]


def with_sgd(module, lr=0.1, momentum=0.0):
    return module, jitgrad.optim.SGD(module.parameters(), lr=lr, momentum=momentum)


def train(state, loss):
    """The end of a training step: zero_grad, backward, the update (the gradients stay for
    the comparison after the call)."""
    _, opt = state
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


class Scale(jitgrad.nn.Module):
    """x * w: a parameter in front of a parameterless op."""

    def __init__(self, shape, dtype):
        super().__init__()
        self.w = jitgrad.nn.Parameter(jitgrad.rand(*shape, dtype=getattr(jitgrad, dtype)) + 0.5)

    def forward(self, x):
        return x * self.w


def seeded(make):
    def build():
        jitgrad.manual_seed(7)
        return make()
    return build


# --- softmax / log_softmax / gelu ------------------------------------------------------------
@DTYPES
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax(dtype, dim, rng):
    def step(state, x):
        y = state[0](x)
        loss = (F.softmax(y, dim) * F.softmax(y, dim)).sum() + F.log_softmax(y, dim).mean()
        with jitgrad.no_grad():
            probs = F.softmax(x, dim)
        return train(state, loss), probs, F.log_softmax(x, dim)
    compare(seeded(lambda: with_sgd(Scale((3, 4, 5), dtype))), step, data(rng, (3, 4, 5), dtype), dtype)


@DTYPES
def test_softmax_extremes(dtype):
    """-inf entries and a NaN in a group replay as eager computes them."""
    x = np.array([[0.0, -np.inf, 1.0], [np.nan, 1.0, 2.0], [-np.inf, -np.inf, -np.inf]])
    calls = [(jitgrad.tensor(x, dtype=getattr(jitgrad, dtype)),), (jitgrad.tensor(x[::-1].copy(), dtype=getattr(
        jitgrad, dtype)),)]
    compare(lambda: None, lambda _, x: (F.softmax(x, 1), F.log_softmax(x, 0)), calls, dtype)


@DTYPES
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(dtype, approximate, rng):
    def step(state, x):
        return train(state, (F.gelu(state[0](x), approximate=approximate) ** 2).sum())
    compare(seeded(lambda: with_sgd(Scale((6, 5), dtype))), step, data(rng, (6, 5), dtype), dtype)


# --- layer_norm -----------------------------------------------------------------------------
@DTYPES
@pytest.mark.parametrize("shape,affine,bias", [((5,), True, True), ((4, 5), True, True), ((5,), True, False),
                                               ((5,), False, False)])
def test_layer_norm(dtype, shape, affine, bias, rng):
    def make():
        m = jitgrad.nn.Sequential(Scale((3, 4, 5), dtype), jitgrad.nn.LayerNorm(
            shape, elementwise_affine=affine, bias=bias, dtype=getattr(jitgrad, dtype)))
        return with_sgd(m, momentum=0.9)

    def step(state, x):
        out = state[0](x)
        with jitgrad.no_grad():
            plain = F.layer_norm(x, shape)
        return train(state, (out * out * x).sum()), plain
    compare(seeded(make), step, data(rng, (3, 4, 5), dtype), dtype)


# --- embedding ------------------------------------------------------------------------------
@DTYPES
@pytest.mark.parametrize("padding_idx,freq", [(None, False), (2, False), (None, True), (-1, True)])
@pytest.mark.parametrize("itype", ["int64", "int32"])
def test_embedding(dtype, padding_idx, freq, itype, rng):
    def make():
        return with_sgd(jitgrad.nn.Embedding(7, 3, padding_idx=padding_idx, scale_grad_by_freq=freq,
                                             dtype=getattr(jitgrad, dtype)))

    def step(state, idx, c):
        out = state[0](idx)
        with jitgrad.no_grad():
            again = F.embedding(idx, state[0].weight)
        return train(state, (out * c).sum()), again
    calls = [(jitgrad.tensor(rng.integers(0, 7, (4, 5)), dtype=getattr(jitgrad, itype)),
              jitgrad.tensor(rng.standard_normal((4, 5, 3)), dtype=getattr(jitgrad, dtype))) for _ in range(4)]
    compare(seeded(make), step, calls, dtype)


def test_embedding_index_out_of_range_on_replay():
    w = jitgrad.randn(5, 2, dtype=jitgrad.float64, requires_grad=True)
    c = jitgrad.compile(lambda idx: F.embedding(idx, w).sum())
    c(jitgrad.tensor([1, 2]))
    c(jitgrad.tensor([3, 4]))
    assert_replays(c)
    with pytest.raises(IndexError, match="^index out of range in self$"):
        c(jitgrad.tensor([1, 5]))
    with pytest.raises(IndexError, match="^index out of range in self$"):
        F.embedding(jitgrad.tensor([1, 5]), w)


def test_embedding_from_a_list_is_a_constant(rng):
    def step(state, c):
        return train(state, (state[0]([[0, 2], [1, 1]]) * c).sum())
    calls = [(jitgrad.tensor(rng.standard_normal((2, 2, 3))),) for _ in range(3)]
    compare(seeded(lambda: with_sgd(jitgrad.nn.Embedding(4, 3, dtype=jitgrad.float64))), step, calls, "float64")


def test_embedding_max_norm_is_a_graph_break():
    """max_norm renormalises the weight in place: the step runs eagerly, with eager's results."""
    def step(state, idx):
        return train(state, state[0](idx).sum())
    calls = [(jitgrad.tensor([[0, 1], [2, 2]]),), (jitgrad.tensor([[3, 1], [0, 0]]),)]
    make = seeded(lambda: with_sgd(jitgrad.nn.Embedding(4, 3, max_norm=0.5, dtype=jitgrad.float64)))
    compare(make, step, calls, "float64", breaks=["embedding(max_norm=...) renormalises the weight in place"])


# --- losses ---------------------------------------------------------------------------------
def targets(rng, n, ncls, ignore=None, count=4):
    out = []
    for _ in range(count):
        t = rng.integers(0, ncls, n)
        if ignore is not None:
            t[rng.random(n) < 0.3] = ignore
        out.append(jitgrad.tensor(t))
    return out


@DTYPES
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 1])
def test_nll_loss(dtype, reduction, weighted, ignore_index, rng):
    cw = jitgrad.tensor(rng.uniform(0.5, 2.0, 5), dtype=getattr(jitgrad, dtype)) if weighted else None

    def step(state, x, t):
        loss = F.nll_loss(F.log_softmax(state[0](x), 1), t, cw, ignore_index=ignore_index, reduction=reduction)
        with jitgrad.no_grad():
            plain = F.nll_loss(x, t, cw, ignore_index=ignore_index, reduction=reduction)
        return train(state, loss.sum() if reduction == "none" else loss), plain
    xs = data(rng, (6, 5), dtype)
    calls = [(x, t) for (x,), t in zip(xs, targets(rng, 6, 5, ignore_index if ignore_index >= 0 else -100))]
    compare(seeded(lambda: with_sgd(Scale((6, 5), dtype))), step, calls, dtype)


def test_nll_loss_every_target_ignored_is_nan(rng):
    x = jitgrad.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    c = jitgrad.compile(lambda x, t: F.nll_loss(x, t, ignore_index=2))
    for t in ([0, 1, 3], [2, 2, 2], [3, 2, 1]):
        close(c(x, jitgrad.tensor(t)), F.nll_loss(x, jitgrad.tensor(t), ignore_index=2), "float64", str(t))
    assert np.isnan(c(x, jitgrad.tensor([2, 2, 2])).item())
    assert_replays(c)


def test_nll_loss_target_out_of_bounds_on_replay(rng):
    x = jitgrad.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    c = jitgrad.compile(lambda x, t: F.nll_loss(x, t))
    c(x, jitgrad.tensor([0, 1, 3]))
    c(x, jitgrad.tensor([2, 1, 3]))
    assert_replays(c)
    for bad in ([0, 4, 9], [-3, 1, 2]):
        with pytest.raises(IndexError) as eager:
            F.nll_loss(x, jitgrad.tensor(bad))
        with pytest.raises(IndexError) as replayed:
            c(x, jitgrad.tensor(bad))
        assert str(replayed.value) == str(eager.value)


@DTYPES
@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.1}, {"weight": True, "label_smoothing": 0.2},
                                {"ignore_index": 2, "label_smoothing": 0.1}, {"weight": True, "reduction": "sum"},
                                {"reduction": "none", "label_smoothing": 0.3}])
def test_cross_entropy(dtype, kw, rng):
    kw = dict(kw)
    if kw.get("weight"):
        kw["weight"] = jitgrad.tensor(rng.uniform(0.5, 2.0, 5), dtype=getattr(jitgrad, dtype))

    def make():
        return with_sgd(Scale((6, 5), dtype)) + (jitgrad.nn.CrossEntropyLoss(**kw),)

    def step(state, x, t):
        loss = state[2](state[0](x), t)
        return train(state[:2], loss.sum() if kw.get("reduction") == "none" else loss)
    xs = data(rng, (6, 5), dtype)
    calls = [(x, t) for (x,), t in zip(xs, targets(rng, 6, 5, kw.get("ignore_index")))]
    compare(seeded(make), step, calls, dtype)


@DTYPES
def test_cross_entropy_of_one_sample(dtype, rng):
    def step(state, x, t):
        return train(state, F.cross_entropy(state[0](x), t, label_smoothing=0.1) + F.cross_entropy(state[0](x), t))
    calls = [(x, jitgrad.tensor(int(rng.integers(0, 5)))) for (x,) in data(rng, (5,), dtype)]
    compare(seeded(lambda: with_sgd(Scale((5,), dtype))), step, calls, dtype)


@DTYPES
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_mse_loss(dtype, reduction, rng):
    def step(state, x, y):
        return train(state, jitgrad.nn.MSELoss(reduction=reduction)(state[0](x), y))
    calls = [(x, y) for (x,), (y,) in zip(data(rng, (6, 5), dtype), data(rng, (6, 5), dtype))]
    compare(seeded(lambda: with_sgd(Scale((6, 5), dtype))), step, calls, dtype)


@DTYPES
def test_bce_with_logits(dtype, rng):
    def step(state, x, y):
        return train(state, jitgrad.nn.BCEWithLogitsLoss()(state[0](x), y))
    calls = [(x, jitgrad.tensor(rng.integers(0, 2, (6, 5)), dtype=getattr(jitgrad, dtype)))
             for (x,) in data(rng, (6, 5), dtype)]
    compare(seeded(lambda: with_sgd(Scale((6, 5), dtype))), step, calls, dtype)


# --- convolution and pooling ----------------------------------------------------------------
@DTYPES
@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1}, {"padding": (2, 1), "dilation": 2, "bias": False},
                                {"groups": 2, "padding": "same"}])
def test_conv2d(dtype, kw, rng):
    def make():
        return with_sgd(jitgrad.nn.Conv2d(2, 4, 3, dtype=getattr(jitgrad, dtype), **kw), momentum=0.5)

    def step(state, x):
        out = state[0](x)
        with jitgrad.no_grad():
            plain = F.conv2d(x, state[0].weight, None, 1, 1, 1, state[0].groups)
        return train(state, (out * out).mean()), plain
    compare(seeded(make), step, data(rng, (2, 2, 7, 6), dtype), dtype)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_conv2d_padding_modes(mode, rng):
    def step(state, x):
        return train(state, (state[0](x) ** 2).mean())
    make = seeded(lambda: with_sgd(jitgrad.nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode, dtype=jitgrad.float64)))
    compare(make, step, data(rng, (2, 2, 5, 6), "float64"), "float64")


@DTYPES
def test_conv2d_unbatched(dtype, rng):
    def step(state, x):
        return train(state, (state[0](x) ** 2).mean())
    make = seeded(lambda: with_sgd(jitgrad.nn.Conv2d(2, 3, 3, dtype=getattr(jitgrad, dtype))))
    compare(make, step, data(rng, (2, 5, 6), dtype), dtype)


@DTYPES
def test_max_pool2d_unbatched(dtype, rng):
    def step(state, x):
        return train(state, (F.max_pool2d(state[0](x), 2, 1) ** 2).sum())
    compare(seeded(lambda: with_sgd(Scale((3, 5, 4), dtype))), step, data(rng, (3, 5, 4), dtype), dtype)


@DTYPES
@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=(2, 3), stride=1, dilation=2, ceil_mode=True)])
def test_max_pool2d(dtype, kw, rng):
    def step(state, x):
        out, idx = jitgrad.nn.MaxPool2d(return_indices=True, **kw)(state[0](x))
        with jitgrad.no_grad():
            plain, plain_idx = F.max_pool2d(x, return_indices=True, **kw)
        return train(state, (out * out).sum()), idx, plain, plain_idx
    compare(seeded(lambda: with_sgd(Scale((2, 3, 7, 6), dtype))), step, data(rng, (2, 3, 7, 6), dtype), dtype)


def test_max_pool2d_ties_and_nan():
    """The argmax is the data's, at every replay: ties take the first, a NaN wins."""
    w = jitgrad.ones(1, 1, 4, 4, dtype=jitgrad.float64, requires_grad=True)

    def step(x):
        out = F.max_pool2d(x * w, 2)
        out.sum().backward()
        g = w.grad
        w.grad = None
        return out, g
    c = jitgrad.compile(step)
    for x in (np.arange(16.0), np.ones(16), np.where(np.arange(16) % 5 == 0, np.nan, 1.0), -np.arange(16.0)):
        x = jitgrad.tensor(x.reshape(1, 1, 4, 4))
        close(c(x), step(x), "float64", "ties")
    assert_replays(c)


# --- dropout and randomness -----------------------------------------------------------------
@DTYPES
@pytest.mark.parametrize("p", [0.3, 0.0, 1.0])
def test_dropout_draws_what_eager_draws(dtype, p, rng):
    def make():
        return with_sgd(jitgrad.nn.Sequential(Scale((6, 5), dtype), jitgrad.nn.Dropout(p)))

    def step(state, x):
        return train(state, (state[0](x) ** 2).sum())
    compare(seeded(make), step, data(rng, (6, 5), dtype), dtype, seeded=True)


def test_dropout_replays_fresh_masks(rng):
    """Without reseeding, each replay draws a new mask: the one eager would draw next."""
    x = jitgrad.ones(50, dtype=jitgrad.float64)
    c = jitgrad.compile(lambda x: F.dropout(x, 0.5))
    jitgrad.manual_seed(3)
    got = [c(x).numpy() for _ in range(4)]
    jitgrad.manual_seed(3)
    want = [F.dropout(x, 0.5).numpy() for _ in range(4)]
    assert_replays(c)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert not np.array_equal(got[1], got[2])


def test_dropout_train_and_eval(rng):
    """Switching the module to eval mode re-records (no dropout), and back."""
    def step(state, x):
        return train(state, (state[0](x) ** 2).sum())
    se, sc = (seeded(lambda: with_sgd(jitgrad.nn.Sequential(Scale((4, 3), "float64"), jitgrad.nn.Dropout(0.5))))()
              for _ in range(2))
    c = jitgrad.compile(lambda x: step(sc, x))
    for k, ((x,), mode) in enumerate(zip(data(rng, (4, 3), "float64", 6), ["train", "train", "eval", "eval",
                                                                            "train", "train"])):
        for m in (se[0], sc[0]):
            m.train(mode == "train")
        jitgrad.manual_seed(k)
        want = step(se, x)
        jitgrad.manual_seed(k)
        close(c(x), want, "float64", f"call {k} ({mode})")
        close(sc[0][0].w, se[0][0].w, "float64", f"call {k}: w")
    assert all(type(e).__name__ == "_Entry" for e in c.cache.values())


@DTYPES
def test_random_factories_draw_what_eager_draws(dtype):
    dt = getattr(jitgrad, dtype)
    w = jitgrad.ones(3, 4, dtype=dt, requires_grad=True)

    def step(x):
        noise = jitgrad.randn(3, 4, dtype=dt) + jitgrad.rand(3, 4, dtype=dt) * jitgrad.randn_like(x)
        loss = (x * w + noise * jitgrad.rand_like(x)).sum()
        loss.backward()
        g = w.grad
        w.grad = None
        return loss, noise, g
    c = jitgrad.compile(step)
    for k in range(4):
        x = jitgrad.full((3, 4), float(k), dtype=dt)
        jitgrad.manual_seed(k)
        want = step(x)
        jitgrad.manual_seed(k)
        close(c(x), want, dtype, f"call {k}")
    assert_replays(c)


def test_manual_seed_inside_the_step():
    def step(x):
        a = x + jitgrad.rand(4, dtype=jitgrad.float64)
        jitgrad.manual_seed(5)
        return a, x + jitgrad.rand(4, dtype=jitgrad.float64)
    c = jitgrad.compile(step)
    x = jitgrad.zeros(4, dtype=jitgrad.float64)
    outs = [c(x) for _ in range(3)]
    assert_replays(c)
    jitgrad.manual_seed(5)
    seeded_draw = jitgrad.rand(4, dtype=jitgrad.float64)
    for a, b in outs:
        close(b, seeded_draw, "float64", "after manual_seed")
    np.testing.assert_array_equal(outs[1][0].numpy(), outs[2][0].numpy())  # drawn after the seed of the call before
    assert not np.array_equal(outs[0][0].numpy(), outs[1][0].numpy())


# --- tensors made in the step ---------------------------------------------------------------
def test_constants_made_in_the_step(rng):
    f64 = jitgrad.float64

    def step(x):
        t = (jitgrad.zeros(2, 3, dtype=f64) + jitgrad.ones(2, 3, dtype=f64) * 2 + jitgrad.full((2, 3), 0.5, dtype=f64)
             + jitgrad.tensor([[1.0, 2.0, 3.0]], dtype=f64) + jitgrad.eye(2, 3, dtype=f64)
             + jitgrad.arange(3, dtype=f64) + jitgrad.zeros_like(x) + jitgrad.full_like(x, 3.0)
             + jitgrad.ones_like(x) + jitgrad.from_numpy(np.array([7.0, 8.0, 9.0])) + jitgrad.empty(0, dtype=f64).sum()
             + jitgrad.as_tensor([1.5, 2.5, 3.5], dtype=f64))
        return x * t + jitgrad.Tensor([4.0, 5.0, 6.0])  # the default dtype (float32), cast to x's
    c = jitgrad.compile(step)
    for _ in range(3):
        x = jitgrad.tensor(rng.standard_normal((2, 3)))
        close(c(x), step(x), "float64", "constants")
    assert_replays(c)


def test_tensor_of_a_traced_tensor_is_a_graph_break(rng):
    w = jitgrad.ones(3, dtype=jitgrad.float64, requires_grad=True)
    c = jitgrad.compile(lambda x: jitgrad.tensor(x * w) * 2)
    for _ in range(2):
        x = jitgrad.tensor(rng.standard_normal(3))
        close(c(x), jitgrad.tensor(x * w) * 2, "float64", "tensor(t)")
    assert [r for r, _ in only_entry(c).breaks][0] == "tensor() of a tensor reads its value in the step"


def test_a_leaf_requiring_grad_made_in_the_step_is_a_graph_break():
    def step(x):
        h = jitgrad.zeros(3, dtype=jitgrad.float64, requires_grad=True)
        (x * h).sum().backward()
        return h.grad
    c = jitgrad.compile(step)
    x = jitgrad.tensor([1.0, 2.0, 3.0])
    for _ in range(2):
        close(c(x), step(x), "float64", "leaf")
    assert [r for r, _ in only_entry(c).breaks][0].startswith("a tensor requiring grad created in the step")
    with pytest.raises(GraphBreak, match="a tensor requiring grad created in the step"):
        jitgrad.compile(step, fullgraph=True)(x)


# --- layers together ------------------------------------------------------------------------
@DTYPES
def test_linear_relu_mse_step(dtype, rng):
    def make():
        m = jitgrad.nn.Sequential(jitgrad.nn.Linear(5, 8, dtype=getattr(jitgrad, dtype)), jitgrad.nn.ReLU(),
                                  jitgrad.nn.Linear(8, 1, dtype=getattr(jitgrad, dtype)))
        return m, jitgrad.optim.Adam(m.parameters(), lr=0.01)

    def step(state, x, y):
        return train(state, F.mse_loss(state[0](x), y))
    calls = [(x, y) for (x,), (y,) in zip(data(rng, (16, 5), dtype), data(rng, (16, 1), dtype))]
    compare(seeded(make), step, calls, dtype)


@DTYPES
def test_transformer_like_block(dtype, rng):
    """Embedding, LayerNorm, GELU, dropout and a linear head under cross-entropy."""
    dt = getattr(jitgrad, dtype)

    def make():
        m = jitgrad.nn.Sequential(jitgrad.nn.Embedding(11, 6, padding_idx=0, dtype=dt), jitgrad.nn.LayerNorm(6, dtype=dt),
                                  jitgrad.nn.GELU(), jitgrad.nn.Dropout(0.2), jitgrad.nn.Linear(6, 11, dtype=dt))
        return m, jitgrad.optim.AdamW(m.parameters(), lr=0.01)

    def step(state, idx, t):
        return train(state, F.cross_entropy(state[0](idx), t, label_smoothing=0.05))
    calls = [(jitgrad.tensor(rng.integers(0, 11, 8)), jitgrad.tensor(rng.integers(0, 11, 8))) for _ in range(4)]
    compare(seeded(make), step, calls, dtype, seeded=True)


def test_digits_cnn_step(rng):
    """The digits example's CNN (conv, relu, pool, flatten, linear; cross-entropy, Adam)."""
    from jitgrad.examples.digits import build_cnn, cnn_weights

    weights = cnn_weights()

    def make():
        m = build_cnn(jitgrad, weights)
        return m, jitgrad.optim.Adam(m.parameters(), lr=0.01)

    def step(state, x, y):
        return train(state, jitgrad.nn.CrossEntropyLoss()(state[0](x), y))
    calls = [(jitgrad.tensor(rng.uniform(0, 16, (8, 1, 8, 8)).astype(np.float32)),
              jitgrad.tensor(rng.integers(0, 10, 8))) for _ in range(4)]
    compare(make, step, calls, "float32")


class _NoLinear(jitgrad.nn.Module):
    """Every nn primitive with a made saved value, without another family's ops."""

    def __init__(self, dtype):
        super().__init__()
        dt = getattr(jitgrad, dtype)
        self.emb = jitgrad.nn.Embedding(6, 8, padding_idx=1, scale_grad_by_freq=True, dtype=dt)
        self.conv = jitgrad.nn.Conv2d(2, 2, 3, padding=1, dtype=dt)
        self.pool = jitgrad.nn.MaxPool2d(2)
        self.norm = jitgrad.nn.LayerNorm(4, dtype=dt)
        self.bare = jitgrad.nn.LayerNorm(4, elementwise_affine=False, dtype=dt)

    def forward(self, idx, x, t):
        h = self.pool(self.conv(x * self.emb(idx)))       # (2, 2, 4, 8) * (4, 8) -> (2, 2, 2, 4)
        h = self.bare(self.norm(h))
        return F.nll_loss(F.log_softmax(h.sum((0, 1)), 1), t), h


@DTYPES
def test_compiled_module_hands_back_a_graph(dtype, rng):
    """jitgrad.compile(module): the backward runs after the call, reading the saved values the
    forward kernels made (layer_norm's mean and rstd, the pool's argmax, embedding's and
    nll_loss's indices and coefficients) from the arena of that call."""
    def make():
        jitgrad.manual_seed(3)
        return _NoLinear(dtype)
    me, mc = make(), make()
    compiled = jitgrad.compile(mc)
    dt = getattr(jitgrad, dtype)
    calls = [(jitgrad.tensor(rng.integers(0, 6, 4)), jitgrad.tensor(rng.standard_normal((2, 2, 4, 8)), dtype=dt),
              jitgrad.tensor(rng.integers(0, 4, 2))) for _ in range(4)]
    outs = [(me(*a), compiled(*a)) for a in calls]
    for k, (want, got) in reversed(list(enumerate(outs))):  # an earlier call's graph outlives later calls
        close(got, want, dtype, f"call {k}")
        me.zero_grad()
        mc.zero_grad()
        (want[0] + want[1].sum()).backward()
        (got[0] + got[1].sum()).backward()
        for (name, pe), pc in zip(me.named_parameters(), mc.parameters()):
            close(pc.grad, pe.grad, dtype, f"call {k}: {name}.grad")
    assert_replays(compiled._compiled)


# --- the forward kernels read the params the backward rows have -----------------------------
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "embedding", "nll_loss", "convolution", "batch_norm",
                                  "max_pool2d"])
def test_forward_kernel_reads_the_declared_int_params(name):
    """A forward kernel's `a, b = xs[p + 1], xs[p + 2]` reads name the spec's int params at
    their declared offsets (convolution's and the pool's geometry are read as one slice)."""
    import inspect
    import re

    spec = REGISTRY[name]
    fn = getattr(spec.fwd_kernel, "py_func", spec.fwd_kernel)
    src = inspect.getsource(fn)
    for callee in set(re.findall(r"\b(_\w+)\(i, prog", src)):  # a shared body (softmax's _normalise)
        k = fn.__globals__[callee]
        src += inspect.getsource(getattr(k, "py_func", k))
    reads = {}
    for lhs, rhs in re.findall(r"^\s*([\w, ]+?)\s*=\s*(xs\[p \+ \d+\][^\n]*)$", src, re.M):
        offs = re.findall(r"xs\[p \+ (\d+)\]", rhs)
        names = [n.strip() for n in lhs.split(",")]
        assert len(offs) == len(names), rhs
        reads.update(zip(names, map(int, offs)))
    slices = re.findall(r"xs\[p \+ 1:p \+ (\d+)\]", src)
    assert reads or slices, f"{name}: no int params read"
    aliases = {"pad": "padding_idx", "ignore": "ignore_index"}
    for var, off in reads.items():
        assert off == spec.ioff(aliases.get(var, var)), f"{name}: {var} read at p + {off}"
    for end in slices:
        assert int(end) == len(spec.iparams) + 1, f"{name}: reads {int(end) - 1} int params of {len(spec.iparams)}"
