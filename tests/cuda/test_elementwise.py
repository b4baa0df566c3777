"""Elementwise ufuncs on CUDA arrays (gpu/kernels/elementwise.py), against numpy on the same
data: every ufunc of the device's formula table at float64, float32, int64 and bool
operands and their mixes, with numpy's result dtypes; broadcasting, strided views, scalars
(NEP 50), out=, numpy's edge values (x / 0, log(0), NaN), the errors; the Tensor-level
elementwise ops on device="cuda" against the CPU; and the generated kernels compiled for a
real GPU (PTX), which the simulator cannot check."""
import itertools
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.special
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitgrad
from jitgrad.gpu import formulas
from jitgrad.gpu.array import KERNELS, DeviceArray
from jitgrad.graph.spec import REGISTRY

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"

F8 = np.array([[-2.5, -1.0, -0.5, 0.0], [0.5, 1.0, 2.0, 3.5], [np.nan, np.inf, -np.inf, 1e-3]])
F8_B = np.array([[2.0, -1.0, 0.0, -0.0], [0.25, -3.0, 1.0, np.nan], [2.0, np.inf, 0.5, -7.25]])
I8 = np.array([[-3, -2, -1, 0], [1, 2, 3, 4], [5, 7, 10, -6]], dtype=np.int64)
I8_B = np.array([[2, -3, 1, 5], [0, 4, -2, 3], [1, 3, 0, 2]], dtype=np.int64)
BOOL = np.array([[True, False, True, False], [False, False, True, True], [True, True, False, False]])
BOOL_B = np.array([[True, True, False, False], [True, False, True, False], [False, True, False, True]])


def _data(dtype, second=False):
    base = {"f": (F8, F8_B), "i": (I8, I8_B), "b": (BOOL, BOOL_B)}[np.dtype(dtype).kind][second]
    return base.astype(dtype)


def _host_operands(ufunc, dtypes):
    ops = [_data(dt, second=j > 0) for j, dt in enumerate(dtypes)]
    if ufunc is np.power and all(np.dtype(dt).kind in "ib" for dt in dtypes):
        ops[1] = np.abs(ops[1])   # numpy raises on negative integer powers (see test_integer_edge_values_do_not_trap)
    if ufunc is np.reciprocal and np.dtype(dtypes[0]).kind in "ib":
        ops[0] = np.where(ops[0] == 0, 1, ops[0]).astype(dtypes[0])   # numpy's 1 / 0 is C's undefined
    if ufunc is np._core.umath.clip:
        ops[1], ops[2] = np.minimum(ops[1], ops[2]), np.maximum(ops[1], ops[2])
    return ops


def _check_same(got, want):
    assert isinstance(got, DeviceArray)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    g = got.get()
    if want.dtype.kind == "f":
        # float32 kernels may compute in float64 and round once (numpy rounds per step)
        rtol = 1e-12 if want.dtype == np.float64 else 2e-6
        np.testing.assert_allclose(g, want, rtol=rtol, atol=0, equal_nan=True)
        np.testing.assert_array_equal(np.signbit(g[g == 0]), np.signbit(want[want == 0]))
    else:
        np.testing.assert_array_equal(g, want)


# the table's ufuncs: scipy's erf joins it when the kernels load (scipy.special is slow to import)
_UFUNCS = sorted(set(formulas.TABLE) | {scipy.special.erf}, key=lambda u: u.__name__)


def _calls():
    """(ufunc, operand dtypes) for every ufunc of the table: each dtype alone and two mixes."""
    out = []
    for ufunc in _UFUNCS:
        combos = [(dt,) * ufunc.nin for dt in ("f8", "f4", "i8", "?")]
        if ufunc.nin == 2:
            combos += [("i8", "f4"), ("?", "f8"), ("f4", "f8"), ("i8", "?")]
        if ufunc.nin == 3:
            combos += [("f4", "f8", "i8")]
        out += [pytest.param(ufunc, c, id=f"{ufunc.__name__}-{'-'.join(c)}") for c in combos]
    return out


def _resolves(ufunc, dtypes):
    try:
        ufunc.resolve_dtypes(tuple(np.dtype(d) for d in dtypes) + (None,))
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("ufunc,dtypes", _calls())
def test_every_ufunc_matches_numpy(ufunc, dtypes):
    host = _host_operands(ufunc, dtypes)
    dev = [DeviceArray.from_host(h) for h in host]
    if not _resolves(ufunc, dtypes):
        with pytest.raises(TypeError) as numpy_error:
            ufunc(*host)
        with pytest.raises(type(numpy_error.value), match="^" + re.escape(str(numpy_error.value))):
            ufunc(*dev)
        return
    with np.errstate(all="ignore"):
        want = ufunc(*host)
    _check_same(ufunc(*dev), want)


def test_a_plan_is_reused_for_the_same_layouts_with_other_data():
    h = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    d = DeviceArray.from_host(h)
    for k in range(2):   # same shapes, strides and dtypes: the first call's plan, other offsets
        for s in (2.0, -1.5):
            _check_same(np.multiply(d[k], s), h[k] * s)
            _check_same(np.add(d[k].T, d[1 - k, :, 0]), h[k].T + h[1 - k, :, 0])
            _check_same(np.maximum(d[k], np.array(s + 8)), np.maximum(h[k], np.array(s + 8)))   # 0-d host: a scalar
        with pytest.raises(RuntimeError, match="^Expected all tensors to be on the same device"):
            np.maximum(d[k], np.array([1.0]))   # a host array of one dimension is never a cached scalar
    u = DeviceArray.from_host(np.arange(3, dtype=np.uint8))
    _check_same(np.add(u, 1), np.arange(1, 4, dtype=np.uint8))   # the plan is made ...
    with pytest.raises(OverflowError, match="Python integer 256 out of bounds for uint8"):
        np.add(u, 256)   # ... and a Python int is still checked against the loop's dtype


def test_the_op_tables_forward_formulas_are_the_device_kernels():
    registered = 0
    for spec in REGISTRY.values():
        f = spec.forward
        if spec.kind == "ew" and isinstance(f, np.ufunc) and spec.fwd and len(spec.args) == f.nin \
                and "p0" not in spec.fwd:
            assert formulas.lookup(f, "f") == (spec.args, spec.fwd), spec.name
            registered += 1
    assert registered >= 15   # add, sub, mul, div, exp, log, ..., maximum, minimum
    assert formulas.lookup(np.subtract, "f") == (("self", "other"), "self - other")   # not rsub's p0 - self
    with pytest.raises(ValueError, match="different forward formulas"):
        formulas.register_spec(np.add, ("self", "other"), "other + self")


def test_integer_edge_values_do_not_trap():
    """numpy's integer loops: x // 0 is 0, powers by squaring wrap; a negative exponent,
    which numpy refuses, gives C's truncated 1 / x ** -e on the device (a kernel cannot raise)."""
    a = np.array([7, -7, 0, 3, -1, 1, 2], dtype=np.int64)
    b = np.array([0, 0, 0, 2, 3, -5, 63], dtype=np.int64)
    da, db = DeviceArray.from_host(a), DeviceArray.from_host(b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.floor_divide(da, db).get(), np.floor_divide(a, b))
    np.testing.assert_array_equal(np.power(da, DeviceArray.from_host(np.abs(b))).get(), np.power(a, np.abs(b)))
    with pytest.raises(ValueError, match="Integers to negative integer powers are not allowed"):
        np.power(a, b)
    np.testing.assert_array_equal(np.power(da, db).get()[3:6], [9, -1, 1])


@pytest.mark.parametrize("view", ["transposed", "sliced", "reversed", "broadcast_row", "broadcast_col",
                                  "zero_d", "offset_row"])
def test_strided_and_broadcast_operands(view):
    big = np.arange(48, dtype=np.float64).reshape(6, 8) / 7 - 3
    small = np.linspace(-2, 2, 12).reshape(3, 4)
    dbig, dsmall = DeviceArray.from_host(big), DeviceArray.from_host(small)
    pick = {
        "transposed": (lambda a: a[:4, :3].T, lambda a: a),
        "sliced": (lambda a: a[1::2, ::2], lambda a: a),
        "reversed": (lambda a: a[::-2, 7:3:-1], lambda a: a),
        "broadcast_row": (lambda a: a[0, :4].reshape(1, 4), lambda a: a),
        "broadcast_col": (lambda a: a[:3, 2:3], lambda a: a[0]),
        "zero_d": (lambda a: a[2, 5], lambda a: a),
        "offset_row": (lambda a: a[5, 4:], lambda a: a[:, ::-1]),
    }[view]
    left, right = pick[0](dbig), pick[1](dsmall)
    hleft, hright = pick[0](big), pick[1](small)
    for ufunc in (np.add, np.multiply, np.true_divide, np.maximum, np.less, np.power):
        with np.errstate(all="ignore"):
            _check_same(ufunc(left, right), np.asarray(ufunc(hleft, hright)))
            _check_same(ufunc(right, left), np.asarray(ufunc(hright, hleft)))
    bcast = np.broadcast_to(small[:, :1], (3, 4))
    _check_same(np.exp(dsmall[:, :1].broadcast_to((3, 4))), np.exp(bcast))


@pytest.mark.parametrize("dtype", ["f8", "f4", "i8", "?"])
def test_scalars_follow_nep50(dtype):
    h = _data(dtype)
    d = DeviceArray.from_host(h)
    scalars = [2, 2.5, True, np.float32(1.5), np.float64(-0.5), np.int64(3), np.array(4.0), np.array(2, np.int32)]
    for s, ufunc in itertools.product(scalars, (np.add, np.multiply, np.greater, np.maximum, np.true_divide)):
        if not _resolves(ufunc, (dtype, np.result_type(s))):
            continue
        with np.errstate(all="ignore"):
            _check_same(ufunc(d, s), np.asarray(ufunc(h, s)))
            _check_same(ufunc(s, d), np.asarray(ufunc(s, h)))


_DTYPES = ("f8", "f4", "i8", "i4", "i1", "u1", "?")


@st.composite
def _random_call(draw):
    """A table ufunc on operands of random dtypes and mutually broadcastable shapes, each
    given as a plain, a transposed or a stepped view of device memory."""
    ufunc = draw(st.sampled_from(_UFUNCS))
    shape = draw(st.lists(st.integers(1, 3), max_size=3))
    ops = []
    for _ in range(ufunc.nin):
        sub = [d if draw(st.booleans()) else 1 for d in shape][draw(st.integers(0, len(shape))):]
        dt = np.dtype(draw(st.sampled_from(_DTYPES)))
        seed = draw(st.integers(0, 2 ** 16))
        rng = np.random.default_rng(seed)
        if dt.kind == "f":
            h = np.asarray(rng.choice([0.0, -0.0, 1.5, -2.25, 3.0, np.nan, np.inf, -np.inf, 0.5], size=sub), dt)
        elif dt.kind == "b":
            h = np.asarray(rng.random(sub) < 0.5)
        else:
            h = np.asarray(rng.integers(-4 if dt.kind == "i" else 0, 6, size=sub)).astype(dt)
        ops.append((h, draw(st.sampled_from(["plain", "transposed", "stepped"]))))
    return ufunc, ops


def _device_view(h, how):
    if how == "transposed" and h.ndim >= 2:
        return DeviceArray.from_host(np.ascontiguousarray(h.T)).T
    if how == "stepped" and h.ndim >= 1:
        wide = np.repeat(h, 2, axis=-1)
        return DeviceArray.from_host(wide)[..., ::2]
    return DeviceArray.from_host(h).reshape(h.shape)


@settings(max_examples=80, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_random_call())
def test_random_dtypes_shapes_and_views_match_numpy(call):
    ufunc, ops = call
    host = [h for h, _ in ops]
    if all(h.dtype.kind in "iub" for h in host):
        if ufunc is np.power:
            host[1] = np.abs(host[1])       # numpy refuses negative integer powers
        if ufunc is np.reciprocal:
            host[0] = np.where(host[0] == 0, 1, host[0]).astype(host[0].dtype)   # numpy's 1 / 0 is C's
    dev = [_device_view(h, how) for h, (_, how) in zip(host, ops)]
    try:
        with np.errstate(all="ignore"):
            want = np.asarray(ufunc(*host))
    except TypeError as numpy_error:
        with pytest.raises(type(numpy_error), match="^" + re.escape(str(numpy_error))):
            ufunc(*dev)
        return
    got = ufunc(*dev)
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol = 1e-12 if want.dtype.itemsize >= 8 else 1e-3 if want.dtype == np.float16 else 2e-6
    np.testing.assert_allclose(got.get(), want, rtol=rtol, atol=0, equal_nan=True)


def test_python_int_out_of_the_loops_range_is_numpys_error():
    u = np.arange(3, dtype=np.uint8)
    with pytest.raises(OverflowError) as numpy_error:
        np.add(u, 300)
    with pytest.raises(OverflowError, match=str(numpy_error.value)):
        np.add(DeviceArray.from_host(u), 300)


def test_operators_and_edge_values():
    h = F8
    d = DeviceArray.from_host(h)
    with np.errstate(all="ignore"):
        for got, want in ((d + 1, h + 1), (2 - d, 2 - h), (d * d, h * h), (1 / d, 1 / h), (-d, -h), (d ** 2, h ** 2),
                          (d < 0, h < 0), (d == d, h == h), (d != 0, h != 0), (np.log(d), np.log(h)),
                          (np.sqrt(d), np.sqrt(h)), (np.floor_divide(d, 0.0), np.floor_divide(h, 0.0)),
                          (np.isinf(d), np.isinf(h)), (np.isfinite(d), np.isfinite(h)), (np.sign(d), np.sign(h)),
                          (np.exp(d * 1000), np.exp(h * 1000)), (np.sin(d), np.sin(h))):
            _check_same(got, want)
    with np.errstate(all="ignore"):
        for got, want in ((2.0 ** d, 2.0 ** h), (abs(d), abs(h))):
            _check_same(got, want)
    b = DeviceArray.from_host(BOOL)
    for got, want in ((b & ~b, BOOL & ~BOOL), (b | b, BOOL | BOOL), (~b, ~BOOL), (b ^ True, BOOL ^ True)):
        _check_same(got, want)


def test_out_writes_views_casts_and_overlaps():
    h = np.arange(12, dtype=np.float64).reshape(3, 4)
    d = DeviceArray.from_host(h)
    out = DeviceArray.from_host(np.full((5, 6), -1.0))
    r = np.add(d, 1.5, out=out[1:4, 1:5])
    assert r.buf is out.buf
    want = np.full((5, 6), -1.0)
    want[1:4, 1:5] = h + 1.5
    np.testing.assert_array_equal(out.get(), want)
    # in place, the output being an input
    np.multiply(d, d, out=d)
    np.testing.assert_array_equal(d.get(), h * h)
    # an input overlapping the output another way is read as it was (numpy copies it too)
    hv, dv = np.arange(10.0), DeviceArray.from_host(np.arange(10.0))
    np.add(dv[:-1], 1.0, out=dv[1:])
    np.add(hv[:-1], 1.0, out=hv[1:])
    np.testing.assert_array_equal(dv.get(), hv)
    # a tuple out (numpy's own form), an int result cast into a float output
    i = DeviceArray.from_host(np.arange(4))
    f = DeviceArray.empty((4,), np.float32)
    np.add(i, i, out=(f,))
    np.testing.assert_array_equal(f.get(), np.arange(4) * 2.0)
    with pytest.raises(TypeError, match=r"^Cannot cast ufunc 'add' output from dtype\('float64'\) to "
                                        r"dtype\('int64'\) with casting rule 'same_kind'"):
        np.add(d, d, out=DeviceArray.empty((3, 4), np.int64))
    with pytest.raises(ValueError, match="non-broadcastable output operand with shape"):
        np.add(d, d, out=DeviceArray.empty((4,), np.float64))
    with pytest.raises(RuntimeError, match=MIXED):
        np.add(d, d, out=np.empty((3, 4)))


def test_mixed_devices_and_shapes_raise_torchs_and_numpys_errors():
    d = DeviceArray.from_host(np.ones((2, 3)))
    for host in (np.ones(3), np.ones((2, 3)), [1.0, 2.0, 3.0]):
        with pytest.raises(RuntimeError, match="^" + MIXED.replace("!", "")):
            np.add(d, host)
        with pytest.raises(RuntimeError, match="^" + MIXED.replace("!", "")):
            np.less(host, d)
    np.testing.assert_array_equal(np.add(d, np.array(2.0)).get(), np.full((2, 3), 3.0))   # a 0-d host array: a scalar
    with pytest.raises(ValueError, match=r"operands could not be broadcast together with shapes \(2,3\) \(4,\)"):
        np.add(d, DeviceArray.from_host(np.ones(4)))


def test_what_has_no_kernel_says_so():
    d = DeviceArray.from_host(np.ones(3))
    with pytest.raises(TypeError, match="^numpy.arccosh is not supported on cuda tensors by jitgrad yet"):
        np.arccosh(d)
    with pytest.raises(TypeError, match="^numpy.subtract.accumulate is not supported on cuda tensors by jitgrad yet"):
        np.subtract.accumulate(d)
    with pytest.raises(TypeError, match="^numpy.add with where= is not supported"):
        np.add(d, d, where=DeviceArray.from_host(np.ones(3, bool)))


def test_clip_ufunc_and_missing_bounds():
    clip = np._core.umath.clip   # what np.clip calls
    h = F8
    d = DeviceArray.from_host(h)
    _check_same(clip(d, -1.0, 2), np.clip(h, -1.0, 2))
    _check_same(clip(d, None, 0.5), np.clip(h, None, 0.5))
    _check_same(clip(d, -0.5, None), np.clip(h, -0.5, None))
    i = DeviceArray.from_host(I8)
    _check_same(clip(i, 0, 4), np.clip(I8, 0, 4))
    _check_same(clip(i, 0.5, 4), np.clip(I8, 0.5, 4))
    with pytest.raises(ValueError, match="One of max or min must be given"):
        clip(d, None, None)


def test_a_spec_formula_runs_directly():
    """KERNELS['ew']: a spec's forward formula (with its float parameter) over device arrays."""
    x = np.linspace(-3, 3, 9).reshape(3, 3)
    gelu = REGISTRY["gelu"]
    for approximate, p0 in (("none", 0.0), ("tanh", 1.0)):
        got = KERNELS["ew"](gelu.fwd, gelu.args, [DeviceArray.from_host(x)], np.float64, params=(p0,))
        want = jitgrad.nn.functional.gelu(jitgrad.tensor(x), approximate=approximate).numpy()
        np.testing.assert_allclose(got.get(), want, rtol=1e-12)
    where = REGISTRY["where"]
    c = DeviceArray.from_host(np.array([True, False, True]))
    a, b = DeviceArray.from_host(np.ones(3)), DeviceArray.from_host(np.zeros((2, 1)))
    got = KERNELS["ew"](where.fwd, ("self", "other", "condition"), [a, b, c], np.float64)
    np.testing.assert_array_equal(got.get(), np.where([True, False, True], 1.0, np.zeros((2, 1))))


# numpy twins of the formula language's functions (engine/codegen.py's helpers, which the
# device's mirror), to evaluate a formula on host arrays
_NUMPY_FUNCS = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt, "sin": np.sin,
    "cos": np.cos, "tanh": np.tanh, "erf": scipy.special.erf, "where": np.where, "zeros_like": np.zeros_like,
    "sign": lambda x: np.where(np.isnan(x), 0.0, np.sign(x)), "abs": np.abs, "fmax": np.maximum, "fmin": np.minimum,
    "pow": lambda x, e: np.sqrt(x) if e == 0.5 else 1.0 / np.sqrt(x) if e == -0.5 else x ** e,
    "relu": lambda x: np.maximum(x, 0.0), "clamp": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "atan2": np.arctan2,
}
_VALUES = [np.array([[-1.5, -0.5, 0.0], [0.5, 1.0, 2.0]]), np.array([[2.0, 0.0, -1.0], [1.5, -0.25, 3.0]]),
           np.array([[0.5, 1.0, 1.5], [-2.0, 0.0, 0.75]])]


def _formulas():
    """(spec name, formula, the names it reads its operands by) for every formula of the op
    table: each elementwise forward and each input's gradient."""
    out = []
    for spec in REGISTRY.values():
        if spec.kind != "ew" or spec.name in {s for s, _, _ in out}:
            continue
        if spec.fwd:
            out.append((spec.name, spec.fwd, spec.args + (("condition",) if "condition" in spec.saves else ())))
        out += [(spec.name, g, ("grad",) + spec.saves) for g in spec.grads if g]
    return out


@pytest.mark.parametrize("name,formula,names", [pytest.param(*f, id=f"{f[0]}-{k}") for k, f in enumerate(_formulas())])
def test_every_formula_of_the_op_table_runs_on_the_device(name, formula, names):
    """The generator takes the table's formulas as they are (gradient formulas included:
    the same text the CPU kernels are compiled from), with codegen's meaning of each function."""
    host = [_VALUES[k % 3] != 0 if n == "condition" else _VALUES[k % 3] for k, n in enumerate(names)]
    dev = [DeviceArray.from_host(h) for h in host]
    for p0, p1 in ((0.0, 1.0), (0.5, 2.0), (-0.5, 0.25), (2.0, 3.0)):
        with np.errstate(all="ignore"):
            want = np.broadcast_to(eval(formula, dict(_NUMPY_FUNCS, p0=p0, p1=p1, **dict(zip(names, host)))), (2, 3))
        got = KERNELS["ew"](formula, names, dev, np.float64, params=(p0, p1))
        np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=1e-300, equal_nan=True, err_msg=formula)


# --- Tensor-level elementwise ops on device="cuda" against the CPU -----------------------------
_X = [[1.5, -2.0, 3.0], [0.5, 0.25, -1.0]]
_Y = [2.0, 3.0, -4.0]
_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "pow": lambda a, b: a.abs() ** b, "maximum": jitgrad.maximum, "minimum": jitgrad.minimum,
    "floor_div": lambda a, b: jitgrad.div(a, b, rounding_mode="floor"),
    "trunc_div": lambda a, b: jitgrad.div(a, b, rounding_mode="trunc"),
    "atan2": jitgrad.atan2,
}
_UNARY = {
    "neg": lambda a: -a, "exp": jitgrad.exp, "log": lambda a: a.abs().log(), "log1p": lambda a: a.abs().log1p(),
    "expm1": jitgrad.expm1, "sqrt": lambda a: a.abs().sqrt(), "sin": jitgrad.sin, "cos": jitgrad.cos,
    "tanh": jitgrad.tanh, "sigmoid": jitgrad.sigmoid, "relu": jitgrad.relu, "abs": jitgrad.abs,
    "reciprocal": jitgrad.reciprocal, "scalar_ops": lambda a: (2.5 * a + 1) / 3 - a ** 2 + 2 / a,
    "sqrt_pow": lambda a: a.abs() ** 0.5 + a ** -1.0, "isnan": jitgrad.isnan, "isfinite": jitgrad.isfinite,
    "asin": lambda a: (a * 0.3).asin(), "acos": lambda a: (a * 0.3).acos(), "atan": jitgrad.atan,
}


def _pair(dtype, transpose=False):
    x = jitgrad.tensor(_X, dtype=dtype)
    y = jitgrad.tensor(_Y, dtype=dtype)
    if transpose:
        x = jitgrad.tensor(np.array(_X).T.copy(), dtype=dtype).t()
    return x, y


def _same(got, want, dtype):
    assert got.is_cuda and not want.is_cuda
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
    rtol = 1e-12 if dtype == jitgrad.float64 else 2e-6
    np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=rtol, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [jitgrad.float64, jitgrad.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("transpose", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("name", list(_BINARY) + list(_UNARY))
def test_tensor_elementwise_ops_on_cuda_match_cpu(name, transpose, dtype):
    x, y = _pair(dtype, transpose)
    if name in _BINARY:
        _same(_BINARY[name](x.cuda(), y.cuda()), _BINARY[name](x, y), dtype)
        _same(_BINARY[name](y.cuda(), x.cuda()), _BINARY[name](y, x), dtype)
    else:
        _same(_UNARY[name](x.cuda()), _UNARY[name](x), dtype)


_EXACT = {   # results compared exactly: bools, integers, and ops on them
    "eq": lambda x, y, i: x == y, "ne": lambda x, y, i: x != 0.25, "lt": lambda x, y, i: x < y,
    "le": lambda x, y, i: x <= 0.5, "gt": lambda x, y, i: y > x, "ge": lambda x, y, i: x >= y,
    "and": lambda x, y, i: (x > 0) & (y > 0), "or": lambda x, y, i: (x > 0) | (y > 0),
    "xor": lambda x, y, i: (x > 0) ^ (y > 0), "not": lambda x, y, i: ~(x > 0),
    "logical": lambda x, y, i: jitgrad.logical_or(jitgrad.logical_and(x > 0, y < 0), jitgrad.logical_not(x > 1)),
    "int_scalar": lambda x, y, i: (i + 1) * 3 - 2, "int_rsub": lambda x, y, i: 1 - i, "int_pow": lambda x, y, i: i ** 2,
    "int_int": lambda x, y, i: i * i + i, "int_abs_neg": lambda x, y, i: -jitgrad.abs(i),
    "int_bits": lambda x, y, i: (i & 3) | (i ^ 5), "int_cmp": lambda x, y, i: i >= 2,
}
_MIXED_DTYPES = {   # promotion and the ops whose forward is not a bare ufunc
    "int_float_scalar": lambda x, y, i: i * 1.5, "int_div": lambda x, y, i: i / 2, "int_float": lambda x, y, i: i + x,
    "rsub": lambda x, y, i: 2 - x, "rpow": lambda x, y, i: 2 ** x, "clamp": lambda x, y, i: x.clamp(-1, 1),
    "clamp_min": lambda x, y, i: x.clamp(min=0.3), "where": lambda x, y, i: jitgrad.where(x > 0, x, y),
    "sign": lambda x, y, i: jitgrad.sign(x), "erf": lambda x, y, i: jitgrad.erf(x), "clone": lambda x, y, i: x.clone(),
}


@pytest.mark.parametrize("dtype", [jitgrad.float64, jitgrad.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(_EXACT) + list(_MIXED_DTYPES))
def test_tensor_comparisons_logic_integer_and_promoting_ops_on_cuda_match_cpu(name, dtype):
    x, y = _pair(dtype)
    i = jitgrad.tensor([[1, -2, 3], [4, 0, -1]])
    fn = _EXACT.get(name) or _MIXED_DTYPES[name]
    got, want = fn(x.cuda(), y.cuda(), i.cuda()), fn(x, y, i)
    if name in _EXACT:
        assert got.is_cuda and got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
        np.testing.assert_array_equal(got.cpu().numpy(), want.numpy())
    else:
        _same(got, want, dtype)


def test_tensor_ops_mixing_devices_raise_torchs_error():
    x, y = _pair(jitgrad.float64)
    for op in (lambda a, b: a + b, lambda a, b: a * b, jitgrad.maximum, lambda a, b: a / b):
        with pytest.raises(RuntimeError, match="^" + MIXED.replace("!", "")):
            op(x.cuda(), y)
        with pytest.raises(RuntimeError, match="^" + MIXED.replace("!", "")):
            op(x, y.cuda())
    assert (x.cuda() + jitgrad.tensor(2.0)).is_cuda   # a 0-d CPU tensor is a scalar, as torch


# --- the generated kernels compile for a real GPU ----------------------------------------------
_PTX = textwrap.dedent("""
    import numpy as np
    from numba import cuda, from_dtype, types
    import numba.cuda.dispatcher
    import jitgrad
    from jitgrad.gpu import formulas
    from jitgrad.gpu.kernels import generate

    class Device:   # compile_ptx types device functions for the current device's cc: there is none here
        compute_capability = (8, 0)
    numba.cuda.dispatcher.get_current_device = Device

    def compile(ufunc, dts, flat):
        loop = ufunc.resolve_dtypes(dts + (None,))
        names, formula = formulas.lookup(ufunc, loop[0].kind)
        casts = tuple(None if d == l else l.type for d, l in zip(dts, loop))
        ns = dict(generate.NAMESPACE, **{f"T{j}": c for j, c in enumerate(casts) if c is not None})
        exec(generate.source(formula, names, ("a",) * len(dts), casts, flat, 0), ns)
        tup = types.UniTuple(types.int64, 1 if flat else 3)
        args = [from_dtype(loop[-1])[::1], types.int64, tup, tup, types.int64]
        for d in dts:
            args += [from_dtype(d)[::1], types.int64, tup]
        ptx, _ = cuda.compile_ptx(ns["kernel"], tuple(args), cc=(8, 0))
        assert ".entry" in ptx
        return formula, loop[0]

    # every formula of the table, at the first of these dtypes it serves
    done = set()
    for ufunc in formulas.TABLE:
        for dt in ("f4", "i8", "?", "f8"):
            dts = (np.dtype(dt),) * ufunc.nin
            try:
                loop = ufunc.resolve_dtypes(dts + (None,))
            except TypeError:
                continue
            if formulas.lookup(ufunc, loop[0].kind)[1] not in done:
                done.add(compile(ufunc, dts, True)[0])
    # strided (several dimensions) and with operand casts
    for ufunc, dts in ((np.true_divide, ("i8", "f4")), (np.maximum, ("f8", "f4")), (np.less, ("i8", "f8")),
                       (np.logical_and, ("f8", "i8")), (np.power, ("i8", "i8")), (np.sign, ("f4",))):
        compile(ufunc, tuple(np.dtype(d) for d in dts), False)
    print("ok", len(done))
""")


def test_generated_kernels_compile_to_ptx():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _PTX], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.split()[:1] == ["ok"], out.stderr[-3000:]
    assert int(out.stdout.split()[1]) >= 40, out.stdout   # the sweep covered the table
