"""Operands of another dtype (issue 8, class 1): the compiled kernels read every saved value
at the dtype of their row, so a bool mask, an int tensor or data of the other float type
must be converted where it is recorded, and results must take torch's dtype, not numpy's.

Every case runs the same code in jitgrad and torch (float64 or float32 graphs) and compares
values, dtypes and gradients. The random programs at the end mix operand dtypes, layouts
and 0-d operands, so that a bug of this class is something they find."""
import itertools

import numpy as np
import pytest
from conftest import assert_close
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitgrad

torch = pytest.importorskip("torch")

DTYPES = ("bool", "int32", "int64", "float32", "float64")


def _leaf(T, values, dtype="float32"):
    return T.tensor(values, dtype=getattr(T, dtype), requires_grad=True)


def _compare(fn, *, rtol=1e-6, atol=1e-7):
    """fn(T) -> (output, leaves): same value, dtype and leaf gradients in both libraries."""
    jout, jleaves = fn(jitgrad)
    tout, tleaves = fn(torch)
    assert str(jout.dtype) == str(tout.dtype)
    assert_close(jout, tout, rtol=rtol, atol=atol, msg="value")
    jout.sum().backward()
    tout.sum().backward()
    for i, (a, b) in enumerate(zip(jleaves, tleaves)):
        assert str(a.grad.dtype) == str(b.grad.dtype), f"grad dtype of leaf {i}"
        assert_close(a.grad, b.grad, rtol=rtol, atol=atol, msg=f"grad of leaf {i}")


X = [-1.0, 2.0, 3.0, -0.5, 0.25, 4.0]

CASES = {
    "bool mask": lambda T, x: x * (x > 0),
    "bool mask, float64 graph": lambda T, x: x.double() * (x > 0),
    "mask first": lambda T, x: (x > 0) * x,
    "int64 operand": lambda T, x: x * T.tensor([1, 2, 3, 4, 5, 6]),
    "int32 operand": lambda T, x: x * T.tensor([1, 2, 3, 4, 5, 6], dtype=T.int32),
    "float32 beside float64": lambda T, x: x.double() * T.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
    "float64 beside float32": lambda T, x: x * T.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=T.float64),
    "divide by int tensor": lambda T, x: x / T.tensor([1, 2, 4, 8, 2, 1]),
    "int tensor divided": lambda T, x: T.tensor([1, 2, 4, 8, 2, 1]) / x,
    "power of int tensor": lambda T, x: x ** T.tensor([1, 2, 3, 2, 1, 0]),
    "int tensor minus": lambda T, x: T.tensor([1, 2, 3, 4, 5, 6]) - x,
    "maximum with int": lambda T, x: T.maximum(x, T.tensor([0, 5, 1, 0, 0, 9])),
    "where with int zero": lambda T, x: T.where(x > 0, x, T.tensor(0)),
    "where with float64 zero-d": lambda T, x: T.where(x > 0, x, T.tensor(0.5, dtype=T.float64)),
    "0-d float64 times float32": lambda T, x: x * T.tensor(3.0, dtype=T.float64),
    "0-d bool times": lambda T, x: x * T.tensor(True),
    "one-element mask broadcast": lambda T, x: x * T.tensor([True]),
    "bool scalar mask of a 1-element graph": lambda T, x: x[:1] * T.tensor([True]),
    "mask in a reduction": lambda T, x: (x * (x < 3)).sum(0, keepdim=True),
    "int in a matmul chain": lambda T, x: (x * T.tensor([1, 0, 1, 0, 1, 0])).reshape(2, 3) @ T.ones(3, 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_operand_of_another_dtype(name):
    def fn(T):
        x = _leaf(T, X)
        return CASES[name](T, x), [x]
    _compare(fn)


def test_large_bool_mask_reads_no_further_than_the_mask():
    # before: the mask was read as float32 by address, 4x its size (a segfault at 5e7)
    n = 2_000_000
    x = jitgrad.ones(n, requires_grad=True)
    m = jitgrad.tensor(np.arange(n) % 3 == 0)
    (x * m).sum().backward()
    assert x.grad.dtype == jitgrad.float32
    np.testing.assert_array_equal(x.grad.numpy(), (np.arange(n) % 3 == 0).astype(np.float32))


def test_bce_with_logits_targets_of_the_other_float_type():
    def fn(T):
        x = _leaf(T, [0.5, -1.0, 2.0, 0.0])
        t = T.tensor([1.0, 0.0, 1.0, 0.5], dtype=T.float64)
        w = T.tensor([1.0, 2.0, 0.5, 1.0], dtype=T.float64)
        loss = T.nn.functional.binary_cross_entropy_with_logits(x, t, weight=w, reduction="none")
        return loss, [x]
    _compare(fn)


def test_mse_against_int_target():
    def fn(T):
        x = _leaf(T, [0.5, -1.0, 2.0, 0.0])
        return T.nn.functional.mse_loss(x, T.tensor([1, 0, 2, 1]).float(), reduction="none") * \
            T.tensor([1, 2, 3, 4]), [x]
    _compare(fn)


def test_embedding_with_int32_indices():
    def fn(T):
        w = _leaf(T, np.arange(12.0).reshape(4, 3).tolist())
        idx = T.tensor([[0, 3], [3, 1]], dtype=T.int32)
        return T.nn.functional.embedding(idx, w), [w]
    _compare(fn)


def test_layer_norm_and_linear_with_float64_input_beside_float32_weights_raise_like_torch():
    for T in (jitgrad, torch):
        lin = T.nn.Linear(3, 2)
        with pytest.raises(RuntimeError, match="same dtype|dtype"):
            lin(T.ones(4, 3, dtype=T.float64))


@pytest.mark.parametrize("da,db", list(itertools.product(DTYPES, DTYPES)))
@pytest.mark.parametrize("shapes", [((3,), (3,)), ((), (3,)), ((3,), ()), ((), ())])
def test_promotion_follows_torch(da, db, shapes):
    rng = np.random.default_rng(0)

    def make(T, dt, shape):
        vals = rng.integers(1, 4, size=shape)
        return T.tensor(vals.astype(bool) if dt == "bool" else vals, dtype=getattr(T, dt))

    for op in (lambda T, a, b: a + b, lambda T, a, b: a * b, lambda T, a, b: T.maximum(a, b),
               lambda T, a, b: T.where(a > 1, a, b), lambda T, a, b: a / b):
        if da == db == "bool" and op.__code__.co_code == (lambda T, a, b: a + b).__code__.co_code:
            continue  # bool + bool is bool in both; covered by the others
        j = op(jitgrad, make(jitgrad, da, shapes[0]), make(jitgrad, db, shapes[1]))
        t = op(torch, make(torch, da, shapes[0]), make(torch, db, shapes[1]))
        assert str(j.dtype) == str(t.dtype), (da, db, shapes)


@pytest.mark.parametrize("case", [lambda T, x, m: m - x, lambda T, x, m: x - m, lambda T, x, m: 1 - m,
                                  lambda T, x, m: m - 1, lambda T, x, m: T.sub(x, m)])
def test_subtracting_a_bool_tensor_raises_like_torch(case):
    for T in (jitgrad, torch):
        with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor is not supported"):
            case(T, T.ones(3), T.tensor([True, False, True]))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("number", [2, 2.5, True])
def test_python_number_promotion_follows_torch(dt, number):
    j = jitgrad.tensor([1, 0, 1], dtype=getattr(jitgrad, dt))
    t = torch.tensor([1, 0, 1], dtype=getattr(torch, dt))
    for op in (lambda a, s: a + s, lambda a, s: a * s, lambda a, s: s * a):
        assert str(op(j, number).dtype) == str(op(t, number).dtype), (dt, number)


# --- random programs over mixed operand dtypes and layouts ----------------------------
SHAPES = [(3,), (2, 3), (3, 1), (2, 1, 3)]
LAYOUTS = ("contiguous", "transposed", "stepped", "broadcast", "zero-d")
BINARY = {
    "add": lambda T, a, c: a + c,
    "mul": lambda T, a, c: a * c,
    "rmul": lambda T, a, c: c * a,
    "sub": lambda T, a, c: c * 1 - a,           # * 1: torch refuses to subtract a bool tensor
    "div": lambda T, a, c: a / (c + 2),         # c + 2 keeps bool and int constants away from 0
    "pow": lambda T, a, c: (a * a + 0.5) ** (c * 1),
    "maximum": lambda T, a, c: T.maximum(a, c),
    "where": lambda T, a, c: T.where(a > 0, a, c),
    "mask": lambda T, a, c: a * (c > 0),
}
UNARY = {
    "tanh": lambda T, a: a.tanh(),
    "sum_keep": lambda T, a: a.sum(-1, keepdim=True),
    "amax_keep": lambda T, a: a.amax(-1, keepdim=True),
    "square": lambda T, a: a * a,
    "relu": lambda T, a: a.relu(),
}


def _constant(T, arr, dtype, layout):
    """A tensor of `arr`'s values laid out as asked; numpy builds the data, the library
    makes the layout, so both libraries see the same strides."""
    t = T.tensor(arr.astype(dtype))
    if layout == "transposed" and arr.ndim >= 2:
        return T.tensor(np.ascontiguousarray(arr.astype(dtype).swapaxes(0, -1))).transpose(0, -1)
    if layout == "stepped" and arr.ndim >= 1:
        wide = np.repeat(arr.astype(dtype), 2, axis=-1)
        return T.tensor(wide)[..., ::2]
    if layout == "broadcast" and arr.ndim >= 1:
        return T.tensor(arr.astype(dtype)[..., :1]).expand(*arr.shape)
    if layout == "zero-d":
        return T.tensor(arr.astype(dtype).reshape(-1)[0])
    return t


@st.composite
def mixed_programs(draw):
    shape = draw(st.sampled_from(SHAPES))
    graph_dtype = draw(st.sampled_from(["float32", "float64"]))
    steps = []
    for i in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            steps.append(("u", draw(st.sampled_from(sorted(UNARY))), draw(st.integers(0, i))))
        else:
            steps.append(("b", draw(st.sampled_from(sorted(BINARY))), draw(st.integers(0, i)),
                          draw(st.sampled_from(DTYPES)), draw(st.sampled_from(LAYOUTS)), draw(st.booleans())))
    return shape, graph_dtype, steps, draw(st.integers(0, 2 ** 31 - 1))


def _run_mixed(T, shape, graph_dtype, steps, seed):
    rng = np.random.default_rng(seed)
    x = T.tensor(rng.uniform(-1.5, 1.5, shape), dtype=getattr(T, graph_dtype), requires_grad=True)
    pool = [x]
    leaves = [x]  # x, then the float constants made leaves that require grad (of either float dtype)
    for step in steps:
        a = pool[step[2]]
        if step[0] == "u":
            pool.append(UNARY[step[1]](T, a))
            continue
        dtype, layout = step[3], step[4]
        vals = rng.integers(-2, 3, a.shape) if dtype != "bool" else rng.random(a.shape) < 0.5
        if dtype.startswith("float"):
            vals = vals + rng.uniform(-0.5, 0.5, a.shape)
        c = _constant(T, np.asarray(vals), dtype, layout)
        if step[5] and dtype.startswith("float") and layout != "broadcast":
            c = c.detach().requires_grad_()
            leaves.append(c)
        pool.append(BINARY[step[1]](T, a, c))
    out = pool[-1].sum()
    for p in pool[1:-1]:
        out = out + 0.1 * p.sum()
    return out, pool, leaves


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_programs())
def test_random_mixed_dtype_programs_match_torch(prog):
    shape, graph_dtype, steps, seed = prog
    jout, jpool, jx = _run_mixed(jitgrad, shape, graph_dtype, steps, seed)
    tout, tpool, tx = _run_mixed(torch, shape, graph_dtype, steps, seed)
    # torch evaluates a formula on a saved float32 operand in float32 (PowBackward1's
    # exponent - 1); jitgrad casts the operand to the graph's dtype first: float32 tolerances
    low = graph_dtype == "float32" or any(s[0] == "b" and s[3] == "float32" for s in steps) or \
        any(str(p.dtype) == "torch.float32" for p in tpool)
    rtol, atol = (2e-5, 1e-5) if low else (1e-9, 1e-11)
    for i, (jp, tp) in enumerate(zip(jpool, tpool)):
        assert str(jp.dtype) == str(tp.dtype), f"dtype of node {i}"
        assert_close(jp, tp, rtol=rtol, atol=atol, msg=f"value of node {i}")
    # every such graph runs on the compiled engine: rows at the other float dtype, and those
    # that mix dtypes, are handed back one by one (engine/compiled.py)
    before = jitgrad.autograd.engine_stats()["python_calls"]
    jout.backward()
    assert jitgrad.autograd.engine_stats()["python_calls"] == before
    tout.backward()
    for i, (a, b) in enumerate(zip(jx, tx)):
        if b.grad is None:
            assert a.grad is None, f"grad of leaf {i}"
            continue
        assert str(a.grad.dtype) == str(b.grad.dtype), f"grad dtype of leaf {i}"
        assert_close(a.grad, b.grad, rtol=rtol, atol=atol, msg=f"grad of leaf {i}")
