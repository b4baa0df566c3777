"""What PyTorch's beginner tutorials call before any autograd, against torch 2.13:
masked_fill(_), all / any, the in-place unary ops (exp_, relu_, ...), F.relu(inplace=True),
linspace / logspace, the out= keyword, float32 ** int64, and the device API
(torch.device, set_default_device, cuda / mps / accelerator availability)."""
import math
import warnings

import numpy as np
import pytest
import torch
from conftest import both, err_of, grad_fn_name

import jitgrad

X = np.array([[0.5, -1.25, 2.0, -0.75], [1.5, 0.25, -2.5, 0.125], [-0.3, 0.9, 1.1, -1.7]])


# --- masked_fill ------------------------------------------------------------------------------
MASKED = {
    "number": lambda T, x: x.masked_fill(x > 0.5, 0.25),
    "function": lambda T, x: T.masked_fill(x, x < 0, -1.0),
    "broadcast_mask": lambda T, x: x.masked_fill(T.tensor([True, False, True, False]), 3.0),
    "broadcast_self": lambda T, x: x[0].masked_fill(x > 0, 2.0),
    "tensor_value": lambda T, x: x.masked_fill(x > 0, (x * x).sum()),
    "in_place": lambda T, x: (x * 1.0).masked_fill_(x.abs() > 1, 0.0),
    "in_place_tensor_value": lambda T, x: (x * 2.0).masked_fill_(x > 0, x[0, 0]),
}


@pytest.mark.parametrize("name", sorted(MASKED))
def test_masked_fill_values_grads_and_nodes(name):
    def run(T):
        x = T.tensor(X, dtype=T.float64, requires_grad=True)
        y = MASKED[name](T, x)
        g, = T.autograd.grad((y * y).sum(), x)
        return y.detach(), g, grad_fn_name(y)
    both(run)


def test_masked_fill_keeps_the_dtype_and_runs_without_grad():
    def run(T):
        i = T.tensor([[1, 2, 3], [4, 5, 6]])
        f = T.tensor(X, dtype=T.float32)
        return (i.masked_fill(i > 2, 1.9), f.masked_fill(f > 0, 7), f.masked_fill(f < 0, T.tensor(2.5, dtype=T.float64)),
                i.masked_fill_(i == 4, -3), i)
    both(run, "float32")


MASKED_ERRORS = {
    "float_mask": lambda T: T.zeros(3).masked_fill(T.ones(3), 1.0),
    "value_not_0d": lambda T: T.zeros(3).masked_fill(T.ones(3) > 0, T.ones(3)),
    "in_place_broadcast": lambda T: T.zeros(3).masked_fill_(T.ones(2, 3) > 0, 1.0),
}


@pytest.mark.parametrize("name", sorted(MASKED_ERRORS))
def test_masked_fill_errors(name):
    assert err_of(MASKED_ERRORS[name], jitgrad) == err_of(MASKED_ERRORS[name], torch)


def test_masked_fill_in_a_compiled_step_reads_each_call_mask():
    x = jitgrad.tensor(X, dtype=jitgrad.float64)

    @jitgrad.compile
    def step(t, w):
        loss = (t.masked_fill(t > 0, 0.0) * w).sum()
        loss.backward()
        return loss.detach()
    for k in range(3):
        w = jitgrad.tensor(np.ones(4) * (k + 1), dtype=jitgrad.float64, requires_grad=True)
        t = x * (-1.0) ** k
        expect = float((t.numpy() * (t.numpy() <= 0) * (k + 1)).sum())
        assert abs(float(step(t, w)) - expect) < 1e-12
        np.testing.assert_allclose(w.grad.numpy(), (t.numpy() * (t.numpy() <= 0)).sum(0))


# --- all / any --------------------------------------------------------------------------------
def test_all_any():
    def run(T):
        x = T.tensor(X, dtype=T.float64, requires_grad=True)
        i = T.tensor([[0, 1, 2], [3, 4, 5]])
        return [x.all(), (x > 0).any(), T.all(x > -3), T.any(x > 2, dim=1), (x > 0).all(0, keepdim=True),
                x.any(-1), i.all(), i.any(0), T.all(i, dim=(0, 1)), T.zeros(0).all(), T.zeros(0).any(),
                (x > 0).all().requires_grad]
    both(run)


# --- in-place unary ops -----------------------------------------------------------------------
UNARY = ["neg", "exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tanh", "erf", "sigmoid", "relu", "abs",
         "reciprocal", "sign"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_in_place_matches_torch(name):
    def run(T):
        x = T.tensor(np.abs(X) + 0.1 if name in ("log", "sqrt") else X, dtype=T.float64, requires_grad=True)
        y = x * 1.0
        before = y._version
        r = getattr(y, name + "_")()
        g, = T.autograd.grad((y * y).sum(), x)
        return r is y, y._version - before, y.detach(), g, grad_fn_name(y)
    both(run)


@pytest.mark.parametrize("name", ["exp_", "relu_", "sigmoid_", "tanh_", "sqrt_"])
def test_unary_in_place_functions_and_no_grad(name):
    def run(T):
        x = T.tensor(np.abs(X), dtype=T.float32)
        getattr(T, name)(x)
        return x
    both(run, "float32")


def test_unary_in_place_on_a_leaf_and_on_ints():
    leaf = err_of(lambda T: T.ones(2, requires_grad=True).exp_(), jitgrad)
    assert leaf == err_of(lambda T: T.ones(2, requires_grad=True).exp_(), torch)
    for name in ("exp_", "sqrt_", "sigmoid_", "relu_"):
        f = lambda T, name=name: getattr(T.tensor([1, 2]), name)()  # noqa: E731
        j, t = err_of(f, jitgrad), err_of(f, torch)
        assert (j is None) == (t is None) and (j is None or j == t), (name, j, t)
    both(lambda T: [T.tensor([1, -2]).neg_(), T.tensor([1, -2]).abs_(), T.tensor([3, -2, 0]).sign_()])


def test_pow_in_place():
    def run(T):
        x = T.tensor(np.abs(X) + 0.5, dtype=T.float64, requires_grad=True)
        y = x * 1.0
        y.pow_(3)
        z = x * 1.0
        z **= x
        g, = T.autograd.grad((y + z).sum(), x)
        return y.detach(), z.detach(), g, grad_fn_name(y), grad_fn_name(z)
    both(run)


def test_relu_inplace_functional_and_module():
    def run(T):
        x = T.tensor(X, dtype=T.float64, requires_grad=True)
        h = x * 2.0
        a = T.nn.functional.relu(h, inplace=True)
        b = T.nn.ReLU(inplace=True)(x * 3.0)
        c = T.nn.functional.relu(x)
        g, = T.autograd.grad((a + b + c).sum(), x)
        return a is h, a.detach(), b.detach(), c.detach(), g, grad_fn_name(a), T.nn.ReLU(inplace=True).inplace, \
            repr(T.nn.ReLU(inplace=True)), repr(T.nn.ReLU())
    both(run)


def test_in_place_unary_on_a_view_updates_the_base():
    def run(T):
        x = T.tensor(X, dtype=T.float64, requires_grad=True)
        base = x * 1.0
        base[1].neg_()                # saves nothing: the later write cannot invalidate it
        base.narrow(1, 0, 2).tanh_()  # saves its result, last written
        g, = T.autograd.grad((base * base).sum(), x)
        return base.detach(), g
    both(run)


# --- linspace / logspace ----------------------------------------------------------------------
SPACES = [(-math.pi, math.pi, 2000), (0, 1, 5), (0, 10, 5), (1, -1, 7), (3, 3, 1), (0, 1, 0), (0.1, 0.7, 11),
          (-5, 17, 101), (2.5, -7.3, 9)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("args", SPACES, ids=str)
def test_linspace_is_torch_to_the_bit(args, dtype):
    j = jitgrad.linspace(*args, dtype=getattr(jitgrad, dtype)).numpy()
    t = torch.linspace(*args, dtype=getattr(torch, dtype)).numpy()
    assert j.dtype == t.dtype and j.shape == t.shape
    np.testing.assert_array_equal(j, t)


@pytest.mark.parametrize("base", [10.0, 2.0, math.e])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("args", SPACES, ids=str)
def test_logspace(args, dtype, base):
    j = jitgrad.logspace(*args, base=base, dtype=getattr(jitgrad, dtype)).numpy()
    t = torch.logspace(*args, base=base, dtype=getattr(torch, dtype)).numpy()
    assert j.dtype == t.dtype and j.shape == t.shape
    np.testing.assert_allclose(j, t, rtol=2e-7 if dtype == "float32" else 1e-15, atol=0)


def test_linspace_defaults_and_arguments():
    def run(T):
        return [T.linspace(0, 1, 4), T.linspace(T.tensor(-1.0), T.tensor(2.0), 3), T.logspace(0, 2, 3),
                T.linspace(0, 1, 3, requires_grad=True).requires_grad, T.linspace(-1, 1, 5, dtype=T.float64)]
    both(run, "float32")


SPACE_ERRORS = {
    "negative_steps": lambda T: T.linspace(0, 1, -1),
    "float_steps": lambda T: T.linspace(0, 1, 2.0),
    "bad_start": lambda T: T.logspace("a", 1, 2),
}


@pytest.mark.parametrize("name", sorted(SPACE_ERRORS))
def test_linspace_errors(name):
    j, t = err_of(SPACE_ERRORS[name], jitgrad), err_of(SPACE_ERRORS[name], torch)
    assert j[0] == t[0] and j[1].split(",")[0] == t[1].split(",")[0], (j, t)


# --- out= -------------------------------------------------------------------------------------
def test_out_keyword_writes_into_out_and_returns_it():
    def run(T):
        a = T.tensor(X, dtype=T.float32)
        o1, o2, o3 = T.empty(3, 4), T.zeros(3, 3), T.empty(3, 4, dtype=T.float64)
        r1 = T.add(a, 1.0, out=o1)
        r2 = T.matmul(a, a.T, out=o2)
        v = o3._version
        T.exp(a, out=o3)
        m = T.mul(a, a, out=T.empty(0))
        vals, idx = T.max(a, 1, out=(T.empty(3), T.empty(3, dtype=T.int64)))
        return r1 is o1, r2 is o2, o1, o2, o3, o3._version > v, m, vals, idx, T.gt(a, 0, out=T.empty(3, 4))
    both(run, "float32")


OUT_ERRORS = {
    "requires_grad_input": lambda T: T.add(T.ones(2, requires_grad=True), 1.0, out=T.empty(2)),
    "requires_grad_out": lambda T: T.mul(T.ones(2), 2.0, out=T.empty(2, requires_grad=True)),
    "float_into_long": lambda T: T.add(T.ones(2), 1.0, out=T.empty(2, dtype=T.int64)),
}


@pytest.mark.parametrize("name", sorted(OUT_ERRORS))
def test_out_errors(name):
    assert err_of(OUT_ERRORS[name], jitgrad) == err_of(OUT_ERRORS[name], torch)


def test_out_under_no_grad_and_resize_warning():
    def run(T):
        a = T.ones(3, requires_grad=True)
        with T.no_grad():
            o = T.add(a, a, out=T.empty(3))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = T.sub(T.ones(3), 2.0, out=T.zeros(2))
        return o, r, [str(x.message)[:120] for x in w if issubclass(x.category, UserWarning)]
    both(run, "float32")


# --- dtype of float32 ** int64 ----------------------------------------------------------------
def test_float32_pow_int64_stays_float32():
    def run(T):
        x = T.linspace(-1, 1, 5)
        p = T.tensor([1, 2, 3])
        w = T.ones(3, requires_grad=True)
        xx = x.unsqueeze(-1).pow(p)
        (xx * w).sum().backward()
        return xx, x ** T.tensor(2), T.pow(x, T.arange(5)), w.grad, (x.unsqueeze(-1) ** p).dtype == T.float32
    both(run, "float32")


# --- devices ----------------------------------------------------------------------------------
def test_device_api_on_a_cpu_machine(monkeypatch):
    monkeypatch.setattr(jitgrad.gpu.driver, "available", lambda: False)
    assert jitgrad.cuda.is_available() is False and torch.backends.mps.is_available() is False
    assert jitgrad.backends.mps.is_available() is False and jitgrad.backends.mps.is_built() is False
    assert jitgrad.accelerator.is_available() is False and jitgrad.accelerator.current_accelerator() is None
    # the tutorials' device line
    dev = "cuda" if jitgrad.cuda.is_available() else "mps" if jitgrad.backends.mps.is_available() else "cpu"
    x = jitgrad.ones(2, device=dev)
    assert x.device == jitgrad.device("cpu") and str(x.device) == "cpu"
    jitgrad.backends.cudnn.benchmark = True  # accepted, selects nothing
    jitgrad.backends.cudnn.benchmark = False


def test_set_default_device():
    assert jitgrad.get_default_device() == jitgrad.device("cpu")
    try:
        jitgrad.set_default_device(jitgrad.device("cpu"))
        assert jitgrad.zeros(2).device.type == "cpu" and jitgrad.linspace(0, 1, 3).device.type == "cpu"
        if jitgrad.cuda.is_available():  # a GPU or the simulator: factories land there
            jitgrad.set_default_device("cuda")
            assert jitgrad.get_default_device().type == "cuda"
            for t in (jitgrad.zeros(2), jitgrad.tensor([1.0]), jitgrad.arange(3), jitgrad.randn(2),
                      jitgrad.linspace(0, 1, 3), jitgrad.full((2,), 1.0), jitgrad.eye(2)):
                assert t.device.type == "cuda", t.device
            assert jitgrad.from_numpy(np.ones(2)).device.type == "cpu"  # shares numpy's memory: stays
    finally:
        jitgrad.set_default_device(None)
    assert jitgrad.get_default_device() == jitgrad.device("cpu") and jitgrad.zeros(1).device.type == "cpu"


def test_factories_take_out():
    def run(T):
        o = T.empty(3)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = T.zeros(2, out=o)
            rest = [T.arange(5, out=T.empty(0, dtype=T.int64)), T.linspace(0, 10, 4, out=T.empty(0, dtype=T.int64)),
                    T.ones(2, out=T.empty(2, dtype=T.int64)), T.full((2,), 1.5, out=T.empty(2, dtype=T.int64)),
                    T.eye(2, out=T.empty(0)), T.logspace(0, 1, 3, out=T.empty(3, dtype=T.float64)),
                    T.randn(2, 3, out=T.empty(0)).shape, T.empty(2, out=T.empty(0)).shape]
        return r is o, r, rest, [str(x.message) for x in w]
    both(run, "float32")
    assert err_of(lambda T: T.zeros(2, out=T.empty(2), dtype=T.float64), jitgrad) == \
        err_of(lambda T: T.zeros(2, out=T.empty(2), dtype=T.float64), torch)
