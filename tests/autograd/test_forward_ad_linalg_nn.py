"""Forward-mode tangents of the linalg and nn primitives against PyTorch's torch.func.jvp,
in float64, through the functions users call (a @ b, addmm, F.linear, F.conv2d,
F.layer_norm, nn.Conv2d's padding modes...): varied shapes and arguments, non-contiguous
primals and tangents, tangents on only some inputs; then the tangent's own backward
(reverse-over-forward) and a Hessian-vector product (forward-over-reverse) of a small
network against torch's."""
import numpy as np
import pytest
import torch
from conftest import assert_close

import jitgrad as J
import jitgrad.autograd.forward_ad as fwAD

rng = np.random.default_rng(20)


def arr(*shape, positive=False):
    a = rng.standard_normal(shape)
    return np.abs(a) + 0.5 if positive else a


def _noncontig(a):
    """A jitgrad tensor with a's values whose data is a strided view (every other column
    of a wider array)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        return J.tensor(a)
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],))
    wide[..., ::2] = a
    x = J.tensor(wide)[..., ::2]
    assert a.size <= 1 or not x._data.flags.c_contiguous
    return x


def check(f, primals, tangents, noncontig=False):
    """f(T, *inputs) with T jitgrad or torch: jitgrad's output and tangent, from dual
    tensors, equal torch.func.jvp's over the inputs that have a tangent (None: no tangent,
    the input is a constant)."""
    live = [i for i, tg in enumerate(tangents) if tg is not None]
    tin = [torch.tensor(p) for p in primals]

    def g(*xs):
        args = list(tin)
        for i, x in zip(live, xs):
            args[i] = x
        return f(torch, *args)

    want, want_t = torch.func.jvp(g, tuple(tin[i] for i in live), tuple(torch.tensor(tangents[i]) for i in live))
    make = _noncontig if noncontig else (lambda a: J.tensor(np.asarray(a, dtype=np.float64)))
    with fwAD.dual_level():
        args = [make(p) if tg is None else fwAD.make_dual(make(p), make(tg)) for p, tg in zip(primals, tangents)]
        out, out_t = fwAD.unpack_dual(f(J, *args))
        assert out_t is not None, "no tangent came out"
        assert_close(out, want, msg="primal")
        assert_close(out_t, want_t, msg="tangent")
        assert out_t.dtype == out.dtype and tuple(out_t.shape) == tuple(out.shape)


def every_subset(n):
    """Which inputs carry a tangent: each one alone, and all of them."""
    return [tuple(j == i for j in range(n)) for i in range(n)] + [(True,) * n]


def run(f, shapes, noncontig=False, positive=()):
    primals = [arr(*s, positive=i in positive) for i, s in enumerate(shapes)]
    for which in every_subset(len(shapes)):
        tangents = [arr(*s) if w else None for s, w in zip(shapes, which)]
        check(f, primals, tangents, noncontig)


# --- linalg ----------------------------------------------------------------------------------
@pytest.mark.parametrize("noncontig", [False, True])
@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 2)), ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 2)),
                                   ((2, 1, 3, 4), (3, 4, 2)), ((5, 3, 4), (4,)), ((4,), (2, 4, 3)),
                                   ((2, 3, 4), (2, 4, 5))])
def test_matmul(sa, sb, noncontig):
    run(lambda T, a, b: a @ b, [sa, sb], noncontig)


@pytest.mark.parametrize("name,sa,sb", [("mm", (3, 4), (4, 2)), ("dot", (5,), (5,)), ("mv", (3, 4), (4,)),
                                        ("bmm", (2, 3, 4), (2, 4, 5)), ("matmul", (3, 4), (4, 2))])
def test_named_products(name, sa, sb):
    run(lambda T, a, b: getattr(T, name)(a, b), [sa, sb])
    run(lambda T, a, b: getattr(a, name)(b), [sa, sb], noncontig=True)


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, -1.5)])
@pytest.mark.parametrize("s_in", [(3, 5), (5,), (1, 5), (3, 1), ()])
def test_addmm(s_in, beta, alpha):
    run(lambda T, i, a, b: T.addmm(i, a, b, beta=beta, alpha=alpha), [s_in, (3, 4), (4, 5)])


def test_addmm_of_a_transposed_operand():
    run(lambda T, i, a, b: T.addmm(i, a, b.t()), [(3, 5), (3, 4), (5, 4)], noncontig=True)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("sx", [(4,), (3, 4), (2, 3, 4), (2, 1, 3, 4)])
def test_linear(sx, bias):
    shapes = [sx, (5, 4)] + ([(5,)] if bias else [])
    run(lambda T, x, w, *b: T.nn.functional.linear(x, w, *b), shapes)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 2)])
def test_trace(shape):
    run(lambda T, x: T.trace(x), [shape])
    run(lambda T, x: x.trace(), [shape], noncontig=True)


# --- softmax / log_softmax -------------------------------------------------------------------
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,dim", [((5,), 0), ((3, 4), 1), ((3, 4), 0), ((3, 4), -1), ((2, 3, 4), 1),
                                       ((2, 3, 4), -3), ((), 0), ((), -1)])
def test_softmax(shape, dim, log):
    name = "log_softmax" if log else "softmax"
    run(lambda T, x: getattr(T.nn.functional, name)(x, dim), [shape])
    run(lambda T, x: getattr(x, name)(dim), [shape], noncontig=True)


def test_softmax_then_log_softmax_chain():
    run(lambda T, x: (x.softmax(1) * 3.0).log_softmax(0), [(3, 4)])


# --- layer_norm --------------------------------------------------------------------------------
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize("shape,norm", [((3, 5), (5,)), ((3, 2, 4), (2, 4)), ((2, 3, 4), [4]), ((6,), (6,))])
def test_layer_norm(shape, norm, affine):
    ns = tuple(norm)
    shapes = [shape] + [ns] * (affine != "none") + [ns] * (affine == "both")

    def f(T, x, *p):
        w = p[0] if affine in ("weight", "both") else None
        b = p[-1] if affine in ("bias", "both") else None
        return T.nn.functional.layer_norm(x, norm, w, b, eps=1e-3)

    run(f, shapes)
    run(f, shapes, noncontig=True)


# --- embedding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"padding_idx": 0}, {"padding_idx": -1, "scale_grad_by_freq": True},
                                {"max_norm": 1.0}])
@pytest.mark.parametrize("idx", [[[4, 1, 4], [0, 2, 1]], [3, 3, 0], 2])
def test_embedding(idx, kw):
    def f(T, w):
        return T.nn.functional.embedding(T.tensor(idx), w * 1.0, **kw)  # max_norm renorms its weight: a copy

    primals = [arr(5, 3) * 2]
    check(f, primals, [arr(5, 3)])
    check(f, primals, [arr(5, 3)], noncontig=True)


# --- nll_loss / cross_entropy ------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    target = [0, 2, -100, 2, 1]
    weight = [0.5, 1.0, 2.0]

    def f(T, x):
        w = T.tensor(weight, dtype=T.float64) if weighted else None
        return T.nn.functional.nll_loss(x, T.tensor(target), weight=w, reduction=reduction)

    run(f, [(5, 3)])
    run(f, [(5, 3)], noncontig=True)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_nll_loss_of_one_sample(reduction):
    run(lambda T, x: T.nn.functional.nll_loss(x, T.tensor(1), reduction=reduction), [(4,)])


@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.1}, {"weighted": True, "reduction": "sum"}])
def test_cross_entropy(kw):
    kw = dict(kw)
    weighted = kw.pop("weighted", False)

    def f(T, x):
        w = T.tensor([1.0, 2.0, 0.5, 1.0], dtype=T.float64) if weighted else None
        return T.nn.functional.cross_entropy(x, T.tensor([1, 0, 3]), weight=w, **kw)

    run(f, [(3, 4)])


# --- convolution -------------------------------------------------------------------------------
CONVS = [
    ((2, 3, 6, 5), (4, 3, 3, 3), {}),
    ((2, 4, 6, 5), (6, 2, 3, 2), {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2), "groups": 2}),
    ((1, 2, 7, 7), (3, 2, 2, 3), {"stride": 3, "padding": 1}),  # the stride skips trailing rows
    ((1, 2, 5, 6), (2, 2, 3, 2), {"padding": "same", "dilation": 2}),
    ((6, 5, 4), (4, 3, 1, 2), {"groups": 2}),  # unbatched
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("sx,sw,kw", CONVS)
def test_conv2d(sx, sw, kw, bias):
    shapes = [sx, sw] + ([(sw[0],)] if bias else [])
    run(lambda T, x, w, *b: T.nn.functional.conv2d(x, w, *b, **kw), shapes)


def test_conv2d_noncontiguous():
    run(lambda T, x, w, b: T.nn.functional.conv2d(x, w, b, padding=1), [(1, 2, 4, 5), (3, 2, 3, 3), (3,)],
        noncontig=True)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_conv2d_padding_modes(mode):
    """nn.Conv2d pads in its padding mode (a reflection / replication gather), then convolves."""
    w0 = arr(3, 2, 3, 2)

    def f(T, x):
        conv = T.nn.Conv2d(2, 3, (3, 2), padding=(1, 2), padding_mode=mode, bias=False, dtype=T.float64)
        with T.no_grad():
            conv.weight.copy_(T.tensor(w0))
        return conv(x)

    run(f, [(2, 2, 4, 5)])
    run(f, [(2, 4, 5)], noncontig=True)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_uneven_padding(mode):
    def f(T, x):  # jitgrad has no F.pad: its gather takes (top, bottom, left, right)
        return T.nn.functional.pad(x, (3, 0, 1, 2), mode) if T is torch else J.nn.conv._pad2d(x, (1, 2, 3, 0), mode)

    run(f, [(2, 3, 4)])
    run(f, [(1, 2, 3, 4)], noncontig=True)


# --- max_pool2d --------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,kw", [((2, 3, 5, 6), {"kernel_size": 3, "stride": 2, "padding": 1}),
                                      ((1, 2, 6, 6), {"kernel_size": 2}),
                                      ((2, 7, 6), {"kernel_size": (3, 2), "dilation": (2, 1), "ceil_mode": True}),
                                      ((1, 1, 5, 5), {"kernel_size": 2, "stride": 2, "ceil_mode": True})])
def test_max_pool2d(shape, kw):
    run(lambda T, x: T.nn.functional.max_pool2d(x, **kw), [shape])
    run(lambda T, x: T.nn.functional.max_pool2d(x, **kw, return_indices=True)[0], [shape], noncontig=True)


# --- tangents of tangents: reverse-over-forward and forward-over-reverse ----------------------
def _log_softmax_written_out(h, dim):
    return h - h.exp().sum(dim, keepdim=True).log()


def _layer_norm_written_out(x, shape, w, b, eps=1e-5):
    c = x - x.mean(-1, keepdim=True)
    y = c / ((c * c).mean(-1, keepdim=True) + eps).sqrt()
    return y * w + b


def _net(T, x, w1, b1, w2, g, b, written_out=False):
    F = T.nn.functional
    layer_norm, log_softmax = (_layer_norm_written_out, _log_softmax_written_out) if written_out else \
        (F.layer_norm, F.log_softmax)
    h = layer_norm(F.linear(x, w1, b1), (5,), g, b)
    h = F.conv2d(h.reshape(2, 1, 3, 5), w2, padding=1)
    h = F.max_pool2d(h, 2, stride=1).reshape(2, -1)
    return log_softmax(h, 1).trace()


NET_SHAPES = [(6, 4), (5, 4), (5,), (2, 1, 3, 3), (5,), (5,)]

# name: (f(T, *inputs), shapes, reference(T, *inputs) for torch or None: f itself). torch's
# own layer_norm, softmax and log_softmax tangents cannot be differentiated as they should
# (log_softmax's and softmax's JVPs write an exp in place; layer_norm's backward through
# its tangent takes the saved rstd as a constant), so the reference writes them out.
BACKWARD_CASES = {
    "net": (_net, NET_SHAPES, lambda T, *a: _net(T, *a, written_out=True)),
    "matmul": (lambda T, a, b: a @ b, [(2, 3, 4), (4, 2)], None),
    "addmm": (lambda T, i, a, b: T.addmm(i, a, b, beta=0.5, alpha=2.0), [(3, 5), (3, 4), (4, 5)], None),
    "softmax": (lambda T, x: T.nn.functional.softmax(x, 0), [(4, 3)],
                lambda T, x: x.exp() / x.exp().sum(0, keepdim=True)),
    "layer_norm": (lambda T, x, w, b: T.nn.functional.layer_norm(x, (4,), w, b), [(3, 4), (4,), (4,)],
                   lambda T, x, w, b: _layer_norm_written_out(x, (4,), w, b)),
    "nll_loss": (lambda T, x: T.nn.functional.nll_loss(x, T.tensor([1, 0, 2])), [(3, 4)], None),
    "embedding": (lambda T, w: T.nn.functional.embedding(T.tensor([1, 0, 1]), w, padding_idx=0), [(3, 4)], None),
    "conv2d": (lambda T, x, w, b: T.nn.functional.conv2d(x, w, b, stride=2, padding=1),
               [(1, 2, 5, 4), (3, 2, 2, 3), (3,)], None),
}


@pytest.mark.parametrize("name", sorted(BACKWARD_CASES))
def test_backward_through_a_tangent(name):
    """grad of <v, J(x) t> by x and t, from the tangent's own graph (reverse-over-forward)."""
    f, shapes, reference = BACKWARD_CASES[name]
    primals = [arr(*s) for s in shapes]
    tangents = [arr(*s) for s in shapes]
    grads = []
    for T in (J, torch):
        ps = [T.tensor(p, requires_grad=True) for p in primals]
        ts = [T.tensor(t, requires_grad=True) for t in tangents]
        fw = T.autograd.forward_ad
        with fw.dual_level():
            out = (reference if T is torch and reference else f)(T, *[fw.make_dual(p, t) for p, t in zip(ps, ts)])
            tangent = fw.unpack_dual(out).tangent
            v = T.tensor(np.linspace(-1.0, 2.0, tangent.numel()).reshape(tuple(tangent.shape)))
            grads.append(T.autograd.grad((tangent * v).sum(), ps + ts, allow_unused=True))
    for mine, theirs in zip(*grads):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert_close(mine, theirs)


def test_hessian_vector_product_forward_over_reverse():
    """Inside a dual level, the tangent of a create_graph gradient is H v."""
    primals = [arr(*s) for s in NET_SHAPES]
    tangents = [arr(*s) for s in NET_SHAPES]
    hvps = []
    for T in (J, torch):
        fw = T.autograd.forward_ad
        with fw.dual_level():
            ps = [fw.make_dual(T.tensor(p, requires_grad=True), T.tensor(t)) for p, t in zip(primals, tangents)]
            grads = T.autograd.grad(_net(T, *ps), ps, create_graph=True)
            hvps.append([fw.unpack_dual(g).tangent for g in grads])
    for mine, theirs in zip(*hvps):
        assert_close(mine, theirs)
