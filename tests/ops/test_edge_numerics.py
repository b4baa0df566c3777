"""Numerics at the edges against PyTorch (issue 8, class 7).

Every op runs on special inputs (0, -0., nan, inf, -inf, ties) in float64 and float32;
its forward, its gradient and its second derivative must equal torch's element by
element, NaN where torch has NaN. Three ways through the backward:
  plain   the compiled kernels (autograd.grad without create_graph),
  cg      the Tensor-level rules (create_graph=True: the Python engine),
  double  the derivative of those rules (a second grad through the recorded backward).
Vectors run the kernels' array loops; 0-d inputs run the scheduler's inline scalar branch.
"""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")

NAN, INF = float("nan"), float("inf")
SPECIAL = [0.0, -0.0, NAN, INF, -INF, 1.0, -1.0, 2.0, 0.5]
GRID_A = np.repeat(SPECIAL, len(SPECIAL))   # every pair of special values
GRID_B = np.tile(SPECIAL, len(SPECIAL))
MODES = ("plain", "cg", "double")
DTYPES = ("float64", "float32")
TOL = {"float64": {"rtol": 1e-10, "atol": 1e-12}, "float32": {"rtol": 1e-5, "atol": 1e-6}}


def _np(t):
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return t.detach().numpy(force=True).copy()  # force: torch's zero tensors (abs's double backward)
    return np.array(t.detach().numpy(), copy=True)


def _run(T, fn, arrays, dtype, mode):
    """Forward, first gradients (weighted by a ramp, so a swapped element shows) and, in
    mode "double", the gradients of sum(g * g): a list of numpy arrays (None: no gradient)."""
    dt = getattr(T, dtype)
    xs = [T.tensor(a, dtype=dt, requires_grad=True) for a in arrays]
    y = fn(T, *xs)
    w = T.tensor(np.linspace(0.5, 1.5, max(y.numel(), 1)).reshape(tuple(y.shape)), dtype=dt)
    gs = T.autograd.grad((y * w).sum(), xs, create_graph=mode != "plain", allow_unused=True)
    out = [_np(y)] + [_np(g) for g in gs]
    if mode == "double":
        terms = [(g * g).sum() for g in gs if g is not None and g.requires_grad]
        # no graph behind the gradients (relu's where()): the same as torch's zeros
        g2 = T.autograd.grad(sum(terms[1:], terms[0]), xs, allow_unused=True) if terms else [None] * len(xs)
        out += [_np(g) for g in g2]
    return out


def check(fn, arrays, dtype, mode):
    expected = _run(torch, fn, arrays, dtype, mode)
    got = _run(jitgrad, fn, arrays, dtype, mode)
    assert len(got) == len(expected), f"{len(got)} results, torch has {len(expected)}"
    for k, (a, e) in enumerate(zip(got, expected)):
        what = "forward" if k == 0 else f"gradient {k}"
        if e is None or a is None:  # an unused input: torch's zeros are the same
            assert not np.any(a if e is None else e), f"{what}: got {a}, torch has {e}"
            continue
        assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
        np.testing.assert_allclose(a, e, equal_nan=True, err_msg=f"{what} at inputs {arrays}", **TOL[dtype])


def _power(e):
    return lambda T, x: x ** e


def _rpower(b):
    return lambda T, x: b ** x


UNARY = {
    "relu": lambda T, x: T.relu(x),
    "abs": lambda T, x: T.abs(x),
    "sign": lambda T, x: T.sign(x) * 3.0,
    "sign_times_x": lambda T, x: T.sign(x) * x,
    "clamp": lambda T, x: T.clamp(x, -1.0, 1.0),
    "clamp_min": lambda T, x: T.clamp(x, min=0.0),
    "clamp_max": lambda T, x: T.clamp(x, max=0.5),
    "sqrt": lambda T, x: T.sqrt(x),
    "log": lambda T, x: T.log(x),
    "reciprocal": lambda T, x: T.reciprocal(x),
    "rdiv": lambda T, x: 2.0 / x,
    "div_by_zero": lambda T, x: x / 0.0,
    "where": lambda T, x: T.where(x > 0, x * 2.0, x * 3.0),
    **{f"pow_{e}": _power(e) for e in (0.0, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, 2.5, 1.5)},
    **{f"rpow_{b}": _rpower(b) for b in (0.0, -0.0, 2.0, 1.0)},
}
BINARY = {
    "pow": lambda T, a, b: a ** b,
    "maximum": lambda T, a, b: T.maximum(a, b),
    "minimum": lambda T, a, b: T.minimum(a, b),
    "max_of_two": lambda T, a, b: T.max(a, b),
    "min_of_two": lambda T, a, b: T.min(a, b),
    "div": lambda T, a, b: a / b,
    "where_ab": lambda T, a, b: T.where(a > b, a, b),
}
VECTORS = {
    "ties": [1.0, 3.0, 3.0, 2.0, 3.0, 0.0],
    "nan": [1.0, NAN, 3.0, 2.0, 3.0, 0.0],
    "two_nans": [NAN, 1.0, NAN, 2.0, 3.0, 0.0],
    "all_nan": [NAN] * 6,
    "infs": [INF, 1.0, INF, -INF, 3.0, -INF],
    "signed_zeros": [0.0, -0.0, 0.0, -0.0, -1.0, 1.0],
    "zero_and_nan": [0.0, 2.0, 5.0, NAN, 3.0, 1.0],
    "two_zeros_nan": [0.0, 2.0, 0.0, NAN, 3.0, 1.0],
    "zero_and_inf": [0.0, 2.0, INF, 4.0, 3.0, 1.0],
}
REDUCTIONS = {
    "amax": lambda T, x: x.amax(),
    "amin": lambda T, x: x.amin(),
    "amax_dim": lambda T, x: x.reshape(2, 3).amax(0),
    "amin_dim": lambda T, x: x.reshape(2, 3).amin(1),
    "max": lambda T, x: x.max(),
    "min": lambda T, x: x.min(),
    "max_dim": lambda T, x: x.reshape(2, 3).max(1).values,
    "min_dim_keepdim": lambda T, x: x.reshape(3, 2).min(0, keepdim=True).values,
    "prod": lambda T, x: x.prod(),
    "prod_dim": lambda T, x: x.reshape(2, 3).prod(1),
    "prod_dim0": lambda T, x: x.reshape(3, 2).prod(0),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_at_special_values(name, dtype, mode):
    check(UNARY[name], [np.array(SPECIAL)], dtype, mode)


@pytest.mark.parametrize("value", [0.0, -0.0, NAN, -1.0], ids=["0", "-0", "nan", "-1"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_scalar_branch(name, mode, value):
    """One-element rows run the scheduler's inline branch, a separate copy of the formula."""
    check(UNARY[name], [np.array(value)], "float64", mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_on_every_pair_of_special_values(name, dtype, mode):
    check(BINARY[name], [GRID_A, GRID_B], dtype, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("vec", sorted(VECTORS))
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_at_ties_nan_inf(name, vec, mode):
    if name.startswith("prod") and mode == "double" and 0.0 in VECTORS[vec]:
        # rules.prod_rule computes the product of the others without a graph when x has a
        # zero, so its second derivative is missing (zero); torch's goes through cumprod
        pytest.xfail("prod's double backward with zeros in the input is not tracked")
    check(REDUCTIONS[name], [np.array(VECTORS[vec])], "float64", mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["amax", "max", "prod_dim"])
def test_reductions_float32(name, mode):
    if name == "prod_dim" and mode == "double":
        pytest.xfail("prod's double backward with zeros in the input is not tracked")
    check(REDUCTIONS[name], [np.array(VECTORS["two_nans"])], "float32", mode)


# Upstream gradients that are not finite: torch's rules keep 0 where they write zeros
# (pow with exponent 0, max()'s unselected elements) and NaN where they multiply by a mask.
NONFINITE_GRAD = {
    "pow_0_nan_grad": ([1.0, 0.0, NAN, 2.0], lambda T, x: (x ** 0.0) * NAN),
    "pow_zero_exponent_tensor": ([1.0, 0.0, NAN, 2.0], lambda T, x: (x ** (x * 0.0)) * NAN),
    "amax_inf_grad": ([1.0, 3.0, 3.0, 2.0], lambda T, x: x.amax() * INF),
    "max_inf_grad": ([1.0, 3.0, 3.0, 2.0], lambda T, x: x.max() * INF),
    "sign_nan_grad": ([1.0, NAN, -2.0, 0.0], lambda T, x: T.sign(x) * NAN),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(NONFINITE_GRAD))
def test_nonfinite_upstream_gradient(name, mode):
    values, fn = NONFINITE_GRAD[name]
    check(fn, [np.array(values)], "float64", mode)


def test_div_gradient_does_not_underflow_float32():
    """other's gradient is -grad * ((self / other) / other): other * other underflows to 0
    in float32 at 1e-25 and gave inf where torch gives -1e25."""
    for mode in MODES:
        check(lambda T, a, b: a / b, [np.array([1e-25, 3e-30]), np.array([1e-25, 2e-30])], "float32", mode)


def test_sign_is_differentiable_with_zero_gradient():
    x = jitgrad.tensor([1.0, NAN, -2.0, 0.0], requires_grad=True)
    y = jitgrad.sign(x)
    assert type(y.grad_fn).__name__ == "SignBackward0"
    (g,) = jitgrad.autograd.grad(y.sum(), x, create_graph=True)
    assert not g.requires_grad  # torch: zeros_like, no graph
    np.testing.assert_array_equal(_np(g), np.zeros(4))
