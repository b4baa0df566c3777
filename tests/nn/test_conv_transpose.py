"""F.conv_transpose2d / nn.ConvTranspose2d, torch.nn.grad.conv2d_input / conv2d_weight and
torch.backends.cudnn.flags against PyTorch: values and gradients over a table of
geometries (stride, padding, output_padding, groups, dilation, bias, unbatched input),
finite differences (gradcheck, gradgradcheck, forward mode), vmap, and the errors."""
import numpy as np
import pytest
from conftest import assert_close

import jitgrad

torch = pytest.importorskip("torch")

# (input shape, weight shape, kwargs)
CASES = [
    ((2, 4, 5, 6), (4, 3, 3, 2), {}),
    ((2, 4, 5, 6), (4, 3, 3, 2), {"stride": 2}),
    ((2, 4, 5, 6), (4, 3, 3, 2), {"stride": (2, 3), "output_padding": (1, 2)}),
    ((2, 4, 5, 6), (4, 3, 3, 2), {"padding": (3, 1)}),             # a padding beyond the kernel crops
    ((2, 4, 5, 6), (4, 3, 3, 3), {"dilation": (2, 1), "padding": 1}),
    ((2, 4, 5, 6), (4, 3, 3, 3), {"dilation": 2, "output_padding": 1}),  # op < dilation
    ((2, 4, 5, 6), (4, 3, 3, 3), {"groups": 2}),
    ((1, 4, 4, 3), (4, 1, 2, 3), {"stride": 2, "padding": 1, "output_padding": 1, "groups": 4, "dilation": 2}),
    ((4, 5, 6), (4, 3, 3, 2), {"stride": 2, "padding": 1}),         # unbatched
    ((2, 4, 5, 6), (4, 3, 3, 2), {"padding": 4, "stride": 3}),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,kw", CASES)
def test_values_and_gradients(xs, ws, kw, bias):
    rng = np.random.default_rng(len(xs) + sum(ws) + len(kw))
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    b = rng.standard_normal(ws[1] * kw.get("groups", 1))
    res = []
    for T in (torch, jitgrad):
        args = [T.tensor(x, requires_grad=True), T.tensor(w, requires_grad=True)]
        if bias:
            args.append(T.tensor(b, requires_grad=True))
        out = T.nn.functional.conv_transpose2d(*args, **kw) if bias else \
            T.nn.functional.conv_transpose2d(*args, None, **kw)
        g = np.random.default_rng(7).standard_normal(tuple(out.shape))
        grads = T.autograd.grad(out, args, T.tensor(g))
        res.append((out, grads, type(out.grad_fn).__name__))
    (o_t, g_t, n_t), (o_j, g_j, n_j) = res
    assert_close(o_j, o_t, msg="forward")
    for a, e in zip(g_j, g_t):
        assert_close(a, e, msg="gradient")
    assert n_j == n_t


def test_float32_module_and_repr():
    for kw in ({}, {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2, "bias": False, "dilation": 2}):
        m_t = torch.nn.ConvTranspose2d(4, 6, 3, **kw)
        m_j = jitgrad.nn.ConvTranspose2d(4, 6, 3, **kw)
        assert repr(m_j) == repr(m_t)
        assert [tuple(p.shape) for p in m_j.parameters()] == [tuple(p.shape) for p in m_t.parameters()]
        with jitgrad.no_grad():
            for pj, pt in zip(m_j.parameters(), m_t.parameters()):
                pj.copy_(jitgrad.tensor(pt.detach().numpy()))
        x = np.random.default_rng(3).standard_normal((2, 4, 5, 5)).astype(np.float32)
        assert_close(m_j(jitgrad.tensor(x)), m_t(torch.tensor(x)), rtol=1e-5, atol=1e-5)
        # output_size picks the output_padding
        size = [2, 6] + [v - op for v, op in zip(m_t(torch.tensor(x)).shape[2:], m_t.output_padding)] \
            if m_t.stride[0] > 1 else None
        if size:
            assert_close(m_j(jitgrad.tensor(x), output_size=size), m_t(torch.tensor(x), output_size=size),
                         rtol=1e-5, atol=1e-5)
            bad = [v + 5 for v in size]
            with pytest.raises(ValueError, match="requested an output size of"):
                m_t(torch.tensor(x), output_size=bad)
            with pytest.raises(ValueError, match="requested an output size of"):
                m_j(jitgrad.tensor(x), output_size=bad)


def test_finite_differences_double_backward_and_forward_mode():
    rng = np.random.default_rng(0)
    X = jitgrad.tensor(rng.standard_normal((1, 4, 3, 3)), requires_grad=True)
    W = jitgrad.tensor(rng.standard_normal((4, 2, 3, 2)), requires_grad=True)
    B = jitgrad.tensor(rng.standard_normal(4), requires_grad=True)

    def f(x, w, b):
        return jitgrad.nn.functional.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2)
    assert jitgrad.autograd.gradcheck(f, (X, W, B), check_forward_ad=True, check_batched_grad=True)
    assert jitgrad.autograd.gradgradcheck(f, (X, W, B))


def test_vmap_and_jvp_against_torch():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 2, 4, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    wb, bb = rng.standard_normal((3, 4, 3, 3, 3)), rng.standard_normal((3, 6))
    out = []
    for T in (torch, jitgrad):
        F = T.nn.functional
        out.append((
            T.func.vmap(lambda xx: F.conv_transpose2d(xx, T.tensor(w), stride=2, output_padding=1))(T.tensor(x)),
            T.func.vmap(lambda xx, ww: F.conv_transpose2d(xx, ww, stride=2, padding=1, groups=2))(
                T.tensor(x), T.tensor(wb)),
            T.func.vmap(lambda xx: F.conv_transpose2d(xx, T.tensor(w)))(T.tensor(x[:, 0])),
            T.func.vmap(lambda b: F.conv_transpose2d(T.tensor(x[0]), T.tensor(w), b, groups=2))(T.tensor(bb)),
            *T.func.jvp(lambda xx, ww: F.conv_transpose2d(xx, ww, stride=2, dilation=2),
                        (T.tensor(x[0]), T.tensor(w)), (T.tensor(x[1]), T.tensor(w * 0.5)))))
    for a, e in zip(out[1], out[0]):
        assert_close(a, e)


ERRORS = [
    ((1, 2, 3, 3), (2, 3, 3, 3), {"output_padding": 1}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"stride": 2, "output_padding": 2}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"groups": 3}),
    ((1, 3, 3, 3), (3, 3, 3, 3), {"groups": 2}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"padding": 5}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"stride": 0}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"padding": -1}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"dilation": 0}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"output_padding": -1}),
    ((1, 3, 3, 3), (2, 3, 3, 3), {}),
    ((3, 3), (2, 3, 3, 3), {}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"bias": 4}),
]


@pytest.mark.parametrize("xs,ws,kw", ERRORS)
def test_errors_as_torch(xs, ws, kw):
    msgs = []
    for T in (torch, jitgrad):
        kw2 = dict(kw)
        if "bias" in kw2:
            kw2["bias"] = T.zeros(kw2["bias"])
        with pytest.raises(RuntimeError) as e:
            T.nn.functional.conv_transpose2d(T.zeros(xs), T.zeros(ws), **kw2)
        msgs.append(str(e.value))
    assert msgs[1] == msgs[0]


@pytest.mark.parametrize("kw", [{}, {"stride": 2}, {"stride": (2, 3), "padding": 1, "dilation": (1, 2)},
                                {"groups": 2, "stride": 2, "padding": (0, 2)}])
@pytest.mark.parametrize("size", [(2, 4, 7, 8), (2, 4, 8, 9)])
def test_nn_grad_against_torch(kw, size):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(size)
    w = rng.standard_normal((6, 4 // kw.get("groups", 1), 3, 2))
    go = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), **kw)
    g = rng.standard_normal(tuple(go.shape))
    for fn, args in (("conv2d_input", lambda T: (size, T.tensor(w), T.tensor(g))),
                     ("conv2d_weight", lambda T: (T.tensor(x), w.shape, T.tensor(g)))):
        expect = getattr(torch.nn.grad, fn)(*args(torch), **kw)
        got = getattr(jitgrad.nn.grad, fn)(*args(jitgrad), **kw)
        assert_close(got, expect, msg=fn)
    # they are differentiable: the gradient of a gradient
    gj = jitgrad.tensor(g, requires_grad=True)
    wj = jitgrad.tensor(w, requires_grad=True)
    gt = torch.tensor(g, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    for T, gg, ww in ((torch, gt, wt), (jitgrad, gj, wj)):
        T.nn.grad.conv2d_input(size, ww, gg, **kw).pow(2).sum().backward()
        T.nn.grad.conv2d_weight(T.tensor(x), w.shape, gg, **kw).pow(2).sum().backward()
    assert_close(gj.grad, gt.grad)
    assert_close(wj.grad, wt.grad)


def test_cudnn_flags_restore():
    for T in (torch, jitgrad):
        cudnn = T.backends.cudnn
        before = (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32)
        with cudnn.flags(enabled=False, benchmark=True, deterministic=True, allow_tf32=False):
            assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == (False, True, True,
                                                                                               False)
        assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == before
        with pytest.raises(KeyError):
            with cudnn.flags(enabled=False):
                raise KeyError("inside")
        assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == before
        cudnn.benchmark = True           # torch code sets the attributes directly
        assert cudnn.benchmark is True
        cudnn.benchmark = before[1]


def test_compiled_training_step_matches_eager():
    """jitgrad.compile replays a ConvTranspose2d training step (the composite records conv2d's
    row and the shape ops'): the same losses and weights as eager."""
    x = jitgrad.tensor(np.random.default_rng(0).standard_normal((2, 3, 4, 4)))
    runs = []
    for compiled in (False, True):
        jitgrad.manual_seed(0)
        m = jitgrad.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1, dtype=jitgrad.float64)
        opt = jitgrad.optim.SGD(m.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            loss = m(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss
        run = jitgrad.compile(step) if compiled else step
        runs.append(([run(x).item() for _ in range(4)], m.weight.detach().numpy().copy()))
        if compiled:   # a plan was recorded and kept (not an eager fallback)
            assert [type(e).__name__ for e in run.cache.values()] != ["_Eager"] and run.cache
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-12)
    np.testing.assert_allclose(runs[1][1], runs[0][1], rtol=1e-12)
