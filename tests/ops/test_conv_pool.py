"""nn.Conv2d / F.conv2d and nn.MaxPool2d / F.max_pool2d: jitgrad against torch 2.13.

Each comparison runs the same code with both libraries (``T``) from identical numpy data and
compares outputs and gradients (float64 to 1e-10, float32 to 1e-5)."""

import numpy as np
import pytest
from conftest import F_, LIBS, both, err_of, nn_, to_np

import jitgrad

torch = pytest.importorskip("torch")



def _kk(k):
    return k if isinstance(k, tuple) else (k, k)


CONV_CONFIGS = [
    # (input shape, out channels, kernel, stride, padding, dilation, groups, bias)
    ((2, 3, 7, 6), 4, 1, 1, 0, 1, 1, True),
    ((2, 3, 7, 6), 4, 3, 1, 0, 1, 1, True),
    ((2, 3, 7, 6), 4, 3, 1, 1, 1, 1, True),
    ((2, 3, 9, 8), 5, 5, 1, 2, 1, 1, True),
    ((2, 3, 9, 8), 5, 3, 2, 1, 1, 1, True),
    ((2, 3, 10, 9), 5, 3, 2, 0, 1, 1, False),
    ((2, 3, 9, 8), 4, 3, 1, "same", 1, 1, True),
    ((2, 3, 9, 8), 4, (2, 4), 1, "same", 1, 1, True),
    ((2, 3, 9, 8), 4, 3, 1, "same", 2, 1, True),
    ((2, 3, 9, 8), 4, 3, 1, "valid", 1, 1, True),
    ((2, 3, 11, 10), 4, 3, 1, 2, 2, 1, True),
    ((1, 2, 8, 11), 3, (3, 5), (2, 1), (1, 2), (1, 2), 1, True),
    ((3, 7, 7), 4, 3, 1, 1, 1, 1, True),                # unbatched
    ((3, 8, 9), 2, (1, 3), 2, 0, 1, 1, False),         # unbatched, non-square
    ((2, 4, 7, 7), 6, 3, 1, 1, 1, 2, True),            # groups
    ((2, 4, 8, 7), 4, 3, 2, 1, 1, 4, True),            # depthwise
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("cfg", CONV_CONFIGS, ids=[str(i) for i in range(len(CONV_CONFIGS))])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_conv2d_forward_backward(cfg, dtype):
    shape, cout, k, s, p, d, g, has_bias = cfg
    rng = np.random.default_rng(abs(hash(str(cfg))) % 2**31)
    cin = shape[-3]
    x = rng.standard_normal(shape)
    w = rng.standard_normal((cout, cin // g) + _kk(k))
    b = rng.standard_normal(cout)

    def run(T):
        dt = getattr(T, dtype)
        X = T.tensor(x, dtype=dt, requires_grad=True)
        W = T.tensor(w, dtype=dt, requires_grad=True)
        B = T.tensor(b, dtype=dt, requires_grad=True) if has_bias else None
        y = F_(T).conv2d(X, W, B, stride=s, padding=p, dilation=d, groups=g)
        go = T.tensor(np.cos(np.arange(y.numel())).reshape(tuple(y.shape)), dtype=dt)
        (y * go).sum().backward()
        return dict(y=y, gx=X.grad, gw=W.grad, gb=B.grad if has_bias else None,
                    name=y.grad_fn.name(), shape=list(y.shape))

    if dtype == "float64":
        both(run)
        return
    # float32: sums of up to a few hundred products, so the tolerance is relative to the scale
    j, t = run(jitgrad), run(torch)
    assert j["name"] == t["name"] and j["shape"] == t["shape"]
    for key in ("y", "gx", "gw", "gb"):
        if t[key] is None:
            assert j[key] is None
            continue
        assert str(j[key].dtype) == str(t[key].dtype)
        a, e = to_np(j[key]), to_np(t[key])
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(e).max()), err_msg=key)


def test_conv2d_partial_requires_grad():
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)

    def run(T):
        X = T.tensor(x)
        W = T.tensor(w, requires_grad=True)
        B = T.tensor(b)
        y = F_(T).conv2d(X, W, B, padding=1)
        y.pow(2).sum().backward()
        return dict(y=y, gw=W.grad, gx=X.grad, gb=B.grad)

    both(run)


def test_conv2d_no_grad():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))

    def run(T):
        W = T.tensor(w, requires_grad=True)
        with T.no_grad():
            y = F_(T).conv2d(T.tensor(x), W)
        return dict(y=y, rg=y.requires_grad, fn=y.grad_fn is None)

    both(run)


@pytest.mark.parametrize("cfg", [((1, 2, 5, 5), 2, 3, 1, 1, 1), ((1, 2, 6, 5), 3, (2, 3), 2, 1, 2),
                                 ((2, 5, 5), 2, 3, 1, "same", 1)])
def test_conv2d_finite_differences(cfg):
    """Central differences in float64 (jitgrad has no gradcheck)."""
    shape, cout, k, s, p, d = cfg
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((cout, shape[-3]) + _kk(k))
    b = rng.standard_normal(cout)
    F = F_(jitgrad)

    def f(xa, wa, ba):
        y = F.conv2d(jitgrad.tensor(xa), jitgrad.tensor(wa), jitgrad.tensor(ba), s, p, d)
        return float((y * y).sum().item())

    X = jitgrad.tensor(x, requires_grad=True)
    W = jitgrad.tensor(w, requires_grad=True)
    B = jitgrad.tensor(b, requires_grad=True)
    y = F.conv2d(X, W, B, s, p, d)
    (y * y).sum().backward()
    eps = 1e-6
    for i, (arr, grad) in enumerate([(x, X.grad), (w, W.grad), (b, B.grad)]):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            args = [x.copy(), w.copy(), b.copy()]
            args[i][idx] += eps
            fp = f(*args)
            args[i][idx] -= 2 * eps
            fm = f(*args)
            num[idx] = (fp - fm) / (2 * eps)
        np.testing.assert_allclose(to_np(grad), num, rtol=1e-6, atol=1e-6)


POOL_CONFIGS = [
    dict(kernel_size=2),
    dict(kernel_size=3),
    dict(kernel_size=3, stride=1),
    dict(kernel_size=2, stride=1),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=1, padding=1),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1)),
    dict(kernel_size=2, stride=1, dilation=2),
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
]


@pytest.mark.parametrize("kw", POOL_CONFIGS, ids=[str(i) for i in range(len(POOL_CONFIGS))])
@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (3, 6, 7)], ids=["batched", "unbatched"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_max_pool2d(kw, shape, dtype):
    x = np.random.default_rng(4).standard_normal(shape)

    def run(T):
        dt = getattr(T, dtype)
        X = T.tensor(x, dtype=dt, requires_grad=True)
        y, idx = F_(T).max_pool2d(X, return_indices=True, **kw)
        y2 = F_(T).max_pool2d(X, **kw)
        go = T.tensor(np.sin(np.arange(y.numel())).reshape(tuple(y.shape)), dtype=dt)
        (y * go).sum().backward()
        return dict(y=y, y2=y2, idx=idx, gx=X.grad, name=y.grad_fn.name(), idx_rg=idx.requires_grad)

    both(run, dtype)


def test_max_pool2d_ties_and_module():
    x = np.zeros((1, 1, 4, 4))
    x[0, 0, 1, 1] = x[0, 0, 0, 1] = 1.0  # tie in the first window: the first maximum wins

    def run(T):
        X = T.tensor(x, requires_grad=True)
        m = nn_(T).MaxPool2d(2, return_indices=True)
        y, idx = m(X)
        z = nn_(T).MaxPool2d(3, stride=1, padding=1)(X)
        (y.sum() + z.sum()).backward()
        return dict(y=y, idx=idx, z=z, gx=X.grad, repr=repr(m))

    both(run)


def test_small_cnn_forward_backward():
    rng = np.random.default_rng(5)
    arrays = dict(w1=rng.standard_normal((8, 1, 3, 3)) * 0.3, b1=rng.standard_normal(8) * 0.1,
                  w2=rng.standard_normal((16, 8, 3, 3)) * 0.1, b2=rng.standard_normal(16) * 0.1,
                  w3=rng.standard_normal((10, 16 * 5 * 5)) * 0.05, b3=rng.standard_normal(10) * 0.1)
    x = rng.standard_normal((4, 1, 14, 14))
    target = np.array([1, 3, 0, 9])

    def run(T):
        nn = nn_(T)
        m = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3),
                          nn.ReLU(), nn.Flatten(), nn.Linear(16 * 5 * 5, 10)).double()
        with T.no_grad():
            for (name, p), key in zip(m.named_parameters(), ["w1", "b1", "w2", "b2", "w3", "b3"]):
                p.copy_(T.tensor(arrays[key]))
        out = m(T.tensor(x))
        loss = nn.CrossEntropyLoss()(out, T.tensor(target))
        loss.backward()
        return dict(out=out, loss=loss, grads={n: p.grad for n, p in m.named_parameters()}, repr=repr(m))

    both(run)


@LIBS
def test_conv2d_module_init_and_shapes(T):
    nn = nn_(T)
    T.manual_seed(0)
    m = nn.Conv2d(3, 8, (3, 5), stride=2, padding=1, bias=True)
    assert tuple(m.weight.shape) == (8, 3, 3, 5) and tuple(m.bias.shape) == (8,)
    fan_in = 3 * 3 * 5
    bound = 1 / np.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)) gives the same bound
    assert np.abs(to_np(m.weight)).max() <= bound + 1e-12
    assert np.abs(to_np(m.bias)).max() <= bound + 1e-12
    assert np.abs(to_np(m.weight)).max() > 0.5 * bound
    assert m.weight.dtype == T.float32
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    y = m(T.zeros(2, 3, 9, 9))
    assert tuple(y.shape) == (2, 8, 5, 4)
    assert nn.Conv2d(3, 8, 3, bias=False).bias is None


def test_reprs():
    def run(T):
        nn = nn_(T)
        return [repr(nn.Conv2d(1, 8, 3)), repr(nn.Conv2d(3, 4, (3, 5), stride=2, padding=1, dilation=2, bias=False)),
                repr(nn.Conv2d(4, 8, 3, padding="same", groups=2)), repr(nn.Conv2d(4, 8, 3, padding="valid")),
                repr(nn.MaxPool2d(2)), repr(nn.MaxPool2d(3, 1, 1, ceil_mode=True)),
                repr(nn.MaxPool2d((2, 3), stride=(1, 2)))]

    both(run)


def test_errors():
    def run(T):
        F, nn = F_(T), nn_(T)
        x = T.zeros(2, 4, 10, 10)
        w = T.zeros(8, 3, 3, 3)
        return [
            err_of(lambda: F.conv2d(x, w)),
            err_of(lambda: F.conv2d(x[:, :3, :2, :2], w)),
            err_of(lambda: F.conv2d(T.zeros(10, 10), w)),
            err_of(lambda: F.conv2d(x[:, :3], w, stride=2, padding="same")),
            err_of(lambda: F.conv2d(x[:, :3], w, padding="foo")),
            err_of(lambda: nn.Conv2d(3, 4, 3, stride=2, padding="same")),
            err_of(lambda: nn.Conv2d(3, 4, 3, groups=2)),
            err_of(lambda: F.conv2d(x[:, :3], w.double())),
            err_of(lambda: F.max_pool2d(x, 3, padding=2)),
            err_of(lambda: F.max_pool2d(x[:, :, :1, :1], 2)),
            err_of(lambda: F.max_pool2d(T.zeros(10, 10), 2)),
        ]

    j, t = both(run)
    assert all(e is not None for e in t)


@pytest.mark.parametrize("cfg", [CONV_CONFIGS[2], CONV_CONFIGS[11], CONV_CONFIGS[14]], ids=["pad", "odd", "groups"])
def test_conv2d_double_backward(cfg):
    """grad of a function of the input gradient (create_graph), as torch's ConvolutionBackward0
    double backward: exercises the Tensor-level rule and differentiates through it."""
    shape, cout, k, s, p, d, g, has_bias = cfg
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((cout, shape[-3] // g) + _kk(k))
    b = rng.standard_normal(cout)

    def run(T):
        X, W, B = (T.tensor(a, requires_grad=True) for a in (x, w, b))
        y = F_(T).conv2d(X, W, B, stride=s, padding=p, dilation=d, groups=g)
        gx, gw, gb = T.autograd.grad((y * y).sum(), (X, W, B), create_graph=True)
        ((gx * gx).sum() + (gw ** 3).sum() + gb.sum() * gx.sum()).backward()
        return dict(gx=gx, gw=gw, gb=gb, X=X.grad, W=W.grad, B=B.grad)

    both(run)


def test_max_pool2d_double_backward():
    x = np.random.default_rng(10).standard_normal((2, 2, 5, 6))

    def run(T):
        X = T.tensor(x, requires_grad=True)
        y = F_(T).max_pool2d(X, 3, stride=2, padding=1)
        (gx,) = T.autograd.grad((y ** 3).sum(), X, create_graph=True)
        (gx * gx).sum().backward()
        return dict(gx=gx, X=X.grad)

    both(run)


def test_max_pool2d_padding_never_wins():
    """A window whose inside values are all -inf picks a position inside the input."""
    x = np.full((1, 1, 3, 3), -np.inf)
    x[0, 0, 2, 2] = 1.0

    def run(T):
        X = T.tensor(x, requires_grad=True)
        y, idx = F_(T).max_pool2d(X, 3, stride=2, padding=1, return_indices=True)
        y.sum().backward()
        return dict(y=y, idx=idx, gx=X.grad)

    both(run)


def test_max_pool2d_nan_and_inf():
    x = np.random.default_rng(6).standard_normal((1, 2, 4, 6))
    x[0, 0, 0, 0] = x[0, 0, 1, 1] = x[0, 0, 2, 4] = np.nan  # a NaN wins (the last one, as torch's CPU kernel)
    x[0, 1, 0, 0] = np.inf
    x[0, 1, 2, 2] = -np.inf

    def run(T):
        X = T.tensor(x, requires_grad=True)
        y, idx = F_(T).max_pool2d(X, 2, return_indices=True)
        z = F_(T).max_pool2d(X, 3, stride=1, padding=1)
        (y.sum() + z.sum()).backward()
        return dict(y=T.tensor(np.nan_to_num(to_np(y), nan=99.0)), idx=idx,
                    z=T.tensor(np.nan_to_num(to_np(z), nan=99.0)),
                    gx=X.grad)

    both(run)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding,kernel,shape", [(1, 3, (2, 2, 5, 6)), ((2, 1), (3, 2), (2, 5, 4)), ("same", (3, 4), (1, 2, 5, 6))],
                         ids=["p1", "asym-unbatched", "same"])
def test_conv2d_padding_modes(mode, padding, kernel, shape):
    r = np.random.default_rng(12)
    x = r.standard_normal(shape)
    w = r.standard_normal((3, shape[-3]) + _kk(kernel))

    def run(T):
        conv = nn_(T).Conv2d(shape[-3], 3, kernel, padding=padding, padding_mode=mode).to(T.float64)
        with T.no_grad():
            conv.weight.copy_(T.tensor(w))
            conv.bias.copy_(T.tensor(np.arange(3.0)))
        X = T.tensor(x, requires_grad=True)
        y = conv(X)
        (gx,) = T.autograd.grad((y * y).sum(), X, create_graph=True)
        gx.sum().backward()
        node = y.grad_fn if y.dim() == 4 else y.grad_fn.next_functions[0][0]   # unbatched: under a squeeze
        pad_node = node.next_functions[0][0].name()
        return dict(y=y, gx=gx, ggx=X.grad, gw=conv.weight.grad, repr=repr(conv),
                    pad_node=pad_node if mode != "circular" else None)

    both(run)


def test_conv2d_padding_mode_errors():
    def run(T):
        nn = nn_(T)
        x = T.zeros(1, 2, 3, 3)
        return [err_of(lambda: nn.Conv2d(2, 3, 3, padding=(1, 3), padding_mode="reflect")(x)),
                err_of(lambda: nn.Conv2d(2, 3, 3, padding=(3, 1), padding_mode="reflect")(x)),
                err_of(lambda: nn.Conv2d(2, 3, 3, padding=(4, 1), padding_mode="circular")(x)),
                # torch lists the modes from a set, in no fixed order: compare the start
                err_of(lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="mirror"))[1][:27]]

    both(run)
