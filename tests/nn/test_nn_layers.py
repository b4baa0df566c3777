"""jitgrad.nn layers (Linear, activations, Flatten, Dropout) and nn.init: jitgrad against torch 2.13.

Every comparison test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``)
from identical initial weights (copied in from numpy arrays) and compares values, gradients and
parameter trajectories (float64 to 1e-10 unless stated, float32 with float32 tolerance).  Tests of
random behaviour (initialisation bounds, dropout masks) run once per library, so torch also has to
pass them.
"""
import math

import numpy as np
import pytest
from conftest import LIBS, both, gen_array, init_, nn_, set_param, ten, to_np

torch = pytest.importorskip("torch")



# ============================================================================= 3. nn.Linear

@LIBS
def test_linear_default_init_bounds(T):
    nn = nn_(T)
    fan_in, fan_out = 16, 400
    lin = nn.Linear(fan_in, fan_out)
    w, b = to_np(lin.weight), to_np(lin.bias)
    assert tuple(lin.weight.shape) == (fan_out, fan_in)
    assert tuple(lin.bias.shape) == (fan_out,)
    assert str(lin.weight.dtype).split(".")[-1] == "float32"
    assert lin.in_features == fan_in and lin.out_features == fan_out
    bound = 1.0 / math.sqrt(fan_in)
    for name, v in (("weight", w), ("bias", b)):
        assert np.all(np.abs(v) <= bound + 1e-7), f"{name} outside ±1/sqrt(in_features)"
        assert np.abs(v).max() > 0.9 * bound, f"{name} does not fill ±1/sqrt(in_features)"
        assert abs(v.mean()) < 0.1 * bound, f"{name} not centred"
    # uniform on [-bound, bound]: std = bound / sqrt(3)
    assert abs(w.std() / (bound / math.sqrt(3)) - 1) < 0.05
    # two layers are initialised differently
    assert not np.array_equal(to_np(nn.Linear(fan_in, fan_out).weight), w)


@pytest.mark.parametrize("shape", [(5, 4), (3, 5, 4), (4,)], ids=["2d", "3d", "1d"])
def test_linear_forward_backward(shape):
    r = np.random.default_rng(3)
    w, b = r.normal(size=(8, 4)), r.normal(size=(8,))
    x = r.normal(size=shape)
    g = r.normal(size=shape[:-1] + (8,))

    def run(T):
        lin = nn_(T).Linear(4, 8).to(T.float64)
        set_param(T, lin.weight, w)
        set_param(T, lin.bias, b)
        xt = ten(T, x, rg=True)
        out = lin(xt)
        (out * ten(T, g)).sum().backward()
        return dict(out=out, x_grad=xt.grad, w_grad=lin.weight.grad, b_grad=lin.bias.grad,
                    grad_fn=out.grad_fn is not None)

    both(run)


def test_linear_no_bias():
    r = np.random.default_rng(4)
    w = r.normal(size=(3, 4))
    x = r.normal(size=(6, 4))

    def run(T):
        lin = nn_(T).Linear(4, 3, bias=False).to(T.float64)
        set_param(T, lin.weight, w)
        xt = ten(T, x, rg=True)
        out = lin(xt)
        out.pow(2).sum().backward()
        return dict(bias_is_none=lin.bias is None, names=[n for n, _ in lin.named_parameters()],
                    out=out, x_grad=xt.grad, w_grad=lin.weight.grad, s=str(lin))

    j, t = both(run)
    assert t["bias_is_none"] is True and t["names"] == ["weight"]


def test_linear_float32():
    r = np.random.default_rng(5)
    w, b = r.normal(size=(8, 4)).astype(np.float32), r.normal(size=(8,)).astype(np.float32)
    x = r.normal(size=(5, 4)).astype(np.float32)

    def run(T):
        lin = nn_(T).Linear(4, 8)
        set_param(T, lin.weight, w)
        set_param(T, lin.bias, b)
        xt = ten(T, x, "float32", rg=True)
        out = lin(xt)
        out.sum().backward()
        return dict(out=out, x_grad=xt.grad, w_grad=lin.weight.grad, b_grad=lin.bias.grad)

    both(run, dtype="float32")


# ============================================================================= 4. activations, Flatten, Dropout

@pytest.mark.parametrize("name", ["ReLU", "Tanh", "Sigmoid"])
def test_activation_modules(name):
    r = np.random.default_rng(6)
    x = gen_array(r, (4, 5))
    g = gen_array(r, (4, 5))

    def run(T):
        mod = getattr(nn_(T), name)()
        xt = ten(T, x, rg=True)
        out = mod(xt)
        (out * ten(T, g)).sum().backward()
        return dict(out=out, grad=xt.grad, s=str(mod), params=len(list(mod.parameters())))

    both(run)


@pytest.mark.parametrize("args", [(), (0,), (2,), (1, 2), (0, -2)])
def test_flatten(args):
    r = np.random.default_rng(8)
    x = gen_array(r, (2, 3, 4, 5))

    def run(T):
        mod = nn_(T).Flatten(*args)
        xt = ten(T, x, rg=True)
        out = mod(xt)
        w = ten(T, np.arange(out.numel(), dtype=np.float64).reshape(tuple(out.shape)))
        (out * w).sum().backward()
        return dict(shape=list(out.shape), out=out, grad=xt.grad)

    j, t = both(run)
    if args == ():
        assert t["shape"] == [2, 60]


@LIBS
def test_dropout_eval_is_identity(T):
    r = np.random.default_rng(9)
    x, g = gen_array(r, (20, 30)), gen_array(r, (20, 30))
    d = nn_(T).Dropout(0.5)
    assert d.training is True
    d.eval()
    xt = ten(T, x, rg=True)
    out = d(xt)
    (out * ten(T, g)).sum().backward()
    np.testing.assert_array_equal(to_np(out), x)
    np.testing.assert_array_equal(to_np(xt.grad), g)


@LIBS
@pytest.mark.parametrize("p", [0.5, 0.2])
def test_dropout_train_mask_and_scale(T, p):
    r = np.random.default_rng(10)
    x, g = gen_array(r, (200, 500)), gen_array(r, (200, 500))
    d = nn_(T).Dropout(p)
    xt = ten(T, x, rg=True)
    out = d(xt)
    o = to_np(out)
    assert o.shape == x.shape
    kept = o != 0
    frac_zero = 1.0 - kept.mean()
    assert abs(frac_zero - p) < 0.02, f"fraction zeroed {frac_zero}, expected about {p}"
    np.testing.assert_allclose(o[kept], x[kept] / (1 - p), rtol=1e-12)
    (out * ten(T, g)).sum().backward()
    expected = np.where(kept, g / (1 - p), 0.0)
    np.testing.assert_allclose(to_np(xt.grad), expected, rtol=1e-12, atol=0)
    # a second call draws a different mask
    assert not np.array_equal(to_np(d(ten(T, x))) != 0, kept)


@LIBS
def test_dropout_p0_is_identity_in_train_mode(T):
    r = np.random.default_rng(11)
    x, g = gen_array(r, (20, 30)), gen_array(r, (20, 30))
    d = nn_(T).Dropout(0.0)
    xt = ten(T, x, rg=True)
    out = d(xt)
    (out * ten(T, g)).sum().backward()
    np.testing.assert_array_equal(to_np(out), x)
    np.testing.assert_array_equal(to_np(xt.grad), g)


def test_dropout_repr_and_default_p():
    def run(T):
        nn = nn_(T)
        return dict(default=str(nn.Dropout()), p=str(nn.Dropout(0.2)), default_p=nn.Dropout().p)

    both(run)


# ============================================================================= 6. nn.init

def _param(T, shape, dtype="float32"):
    return nn_(T).Parameter(T.zeros(*shape, dtype=getattr(T, dtype)))


def _check_uniform(v, bound):
    assert np.all(np.abs(v) <= bound * (1 + 1e-6)), f"max |v| {np.abs(v).max()} > bound {bound}"
    assert np.abs(v).max() > 0.9 * bound, f"max |v| {np.abs(v).max()} does not reach bound {bound}"
    assert abs(v.mean()) < 0.1 * bound
    assert abs(v.std() / (bound / math.sqrt(3)) - 1) < 0.08


def _in_place(T, p, r):
    assert r is p, "init function must return the tensor it was given"
    assert p.is_leaf and p.requires_grad and p.grad_fn is None


@LIBS
@pytest.mark.parametrize("shape,fan_in", [((50, 100), 100), ((16, 8, 3, 3), 72)])
@pytest.mark.parametrize("a", [None, math.sqrt(5)])
def test_init_kaiming_uniform(T, shape, fan_in, a):
    p = _param(T, shape)
    r = init_(T).kaiming_uniform_(p) if a is None else init_(T).kaiming_uniform_(p, a=a)
    _in_place(T, p, r)
    aa = 0.0 if a is None else a
    gain = math.sqrt(2.0 / (1 + aa ** 2))
    _check_uniform(to_np(p), gain * math.sqrt(3.0 / fan_in))


@LIBS
@pytest.mark.parametrize("gain", [None, 2.0])
def test_init_xavier_uniform(T, gain):
    p = _param(T, (60, 90), "float64")
    r = init_(T).xavier_uniform_(p) if gain is None else init_(T).xavier_uniform_(p, gain=gain)
    _in_place(T, p, r)
    assert str(p.dtype).split(".")[-1] == "float64"
    _check_uniform(to_np(p), (gain or 1.0) * math.sqrt(6.0 / (60 + 90)))


@LIBS
def test_init_normal(T):
    p = _param(T, (400, 500))
    r = init_(T).normal_(p, mean=1.0, std=2.0)
    _in_place(T, p, r)
    v = to_np(p)
    assert abs(v.mean() - 1.0) < 0.05
    assert abs(v.std() - 2.0) < 0.05
    p2 = _param(T, (400, 500))
    init_(T).normal_(p2)
    v2 = to_np(p2)
    assert abs(v2.mean()) < 0.02 and abs(v2.std() - 1.0) < 0.02


@LIBS
@pytest.mark.parametrize("fn", ["zeros_", "ones_", "constant_"])
def test_init_fill(T, fn):
    p = nn_(T).Parameter(T.full((3, 4), 7.5, dtype=T.float64))
    init = init_(T)
    r = init.constant_(p, 0.25) if fn == "constant_" else getattr(init, fn)(p)
    _in_place(T, p, r)
    expected = {"zeros_": 0.0, "ones_": 1.0, "constant_": 0.25}[fn]
    np.testing.assert_array_equal(to_np(p), np.full((3, 4), expected))
    assert str(p.dtype).split(".")[-1] == "float64"


@LIBS
def test_init_on_plain_tensor(T):
    t = T.full((2, 3), 3.0)
    r = init_(T).zeros_(t)
    assert r is t
    np.testing.assert_array_equal(to_np(t), np.zeros((2, 3)))
