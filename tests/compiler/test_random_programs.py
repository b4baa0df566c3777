"""Random programs (the hypothesis generator of tests/ops/test_property.py) replay like eager.

Each program runs as a training step: leaf 0 is the call's argument, the other leaves are
parameters the step closes over and updates with SGD. Compiled and eager twins run it
three times on new argument values; every intermediate, the loss, the argument's and the
parameters' gradients and the parameters must agree (f64 rtol 1e-12, f32 1e-5). A
program made only of ops with forward kernels on every branch must make a plan; others
(softmax, max, transposes, comparisons ...) may break to eager as their kernels land.
"""
import numpy as np
import pytest
from compile_helpers import ATOL, RTOL, as_np, plans
from engine.test_boundary_dtypes import BINARY as MIXED_BINARY
from engine.test_boundary_dtypes import UNARY as MIXED_UNARY
from engine.test_boundary_dtypes import _constant, mixed_programs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ops.test_property import programs, run_program

import jitgrad

# test_property's ops whose primitives replay on every branch (elementwise, sum / mean)
REPLAYABLE = {"exp_tanh", "sin", "cos", "tanh", "sigmoid", "relu", "abs", "neg", "log_sq", "sqrt_sq", "pow3",
              "rpow", "rsub", "rdiv", "scale", "clamp", "sum_last_keep", "mean_first_keep", "clone",
              "add", "sub", "mul", "div", "pow", "maximum", "minimum"}


def leaf_values(rng, shapes):
    out = []
    for s in shapes:
        mag = rng.uniform(0.2, 1.5, size=s)
        out.append(mag * np.where(rng.random(size=s) < 0.5, -1.0, 1.0))
    return out


def close_scaled(got, want, dtype, msg):
    """Elementwise rtol, with an atol scaled to the array's magnitude: a program's value
    near zero can come from cancelling large terms, each off by a rounding."""
    g, w = as_np(got), as_np(want)
    assert g.shape == w.shape and g.dtype == w.dtype, f"{msg}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
    scale = max(1.0, float(np.abs(w).max(initial=0.0)))
    np.testing.assert_allclose(g, w, rtol=RTOL[dtype], atol=ATOL[dtype] * scale, err_msg=msg)


def close_grad(got, want, dtype, msg):
    if want.grad is None:
        assert got.grad is None, f"{msg} has a .grad, eager's has none"
    else:
        close_scaled(got.grad, want.grad, dtype, f"{msg}: .grad")


def make_step(params, steps):
    opt = jitgrad.optim.SGD(params, lr=0.01) if params else None

    def step(x):
        if opt is not None:
            opt.zero_grad()
        leaves = [x, *params]
        out, pool = run_program(jitgrad, leaves, steps)
        out.backward()
        if opt is not None:
            opt.step()
        return out, pool[len(leaves):]
    return step


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from(["float64", "float32"]))
def test_random_programs_replay_like_eager(prog, dtype):
    leaf_shapes, steps, seed = prog
    rng = np.random.default_rng(seed)
    dt = getattr(jitgrad, dtype)
    p0 = leaf_values(rng, leaf_shapes[1:])
    pe = [jitgrad.tensor(a, dtype=dt, requires_grad=True) for a in p0]
    pc = [jitgrad.tensor(a, dtype=dt, requires_grad=True) for a in p0]
    eager, c = make_step(pe, steps), jitgrad.compile(make_step(pc, steps))
    for k in range(3):
        (x0,) = leaf_values(rng, leaf_shapes[:1])
        xe, xc = (jitgrad.tensor(x0, dtype=dt, requires_grad=True) for _ in range(2))
        (oe, poole), (oc, poolc) = eager(xe), c(xc)
        close_scaled(oc, oe, dtype, f"call {k}: output")
        for i, (a, b) in enumerate(zip(poolc, poole)):
            close_scaled(a, b, dtype, f"call {k}: value of step {i} {steps[i]}")
        close_grad(xc, xe, dtype, f"call {k}: the argument")
        for i, (a, b) in enumerate(zip(pc, pe)):
            close_scaled(a, b, dtype, f"call {k}: parameter {i}")
            close_grad(a, b, dtype, f"call {k}: parameter {i}")
    if all(s[1] in REPLAYABLE for s in steps):
        assert plans(c), f"no plan for {steps}: {[e.breaks for e in c.cache.values()]}"


def mixed_step(steps, seed):
    """tests/engine/test_boundary_dtypes.py's program over argument x: operands of other
    dtypes and layouts (int, bool, float32 beside float64; transposed, strided, expanded,
    0-d) made in the step, the same every call (a fixed seed)."""
    def step(x):
        rng = np.random.default_rng(seed)
        pool = [x]
        for s in steps:
            a = pool[s[2]]
            if s[0] == "u":
                pool.append(MIXED_UNARY[s[1]](jitgrad, a))
                continue
            dtype, layout = s[3], s[4]
            vals = rng.integers(-2, 3, a.shape) if dtype != "bool" else rng.random(a.shape) < 0.5
            if dtype.startswith("float"):
                vals = vals + rng.uniform(-0.5, 0.5, a.shape)
            pool.append(MIXED_BINARY[s[1]](jitgrad, a, _constant(jitgrad, np.asarray(vals), dtype, layout)))
        out = pool[-1].sum()
        for p in pool[1:-1]:
            out = out + 0.1 * p.sum()
        out.backward()
        return out, pool[1:]
    return step


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a / (c + 2) with c = -2: inf (and nan), as eager
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_programs())
def test_random_mixed_dtype_programs_give_eagers_results(prog):
    shape, graph_dtype, steps, seed = prog
    step = mixed_step(steps, seed)
    c = jitgrad.compile(step)
    rng = np.random.default_rng(seed + 1)
    for k in range(3):
        x0 = rng.uniform(-1.5, 1.5, shape)
        xe, xc = (jitgrad.tensor(x0, dtype=getattr(jitgrad, graph_dtype), requires_grad=True) for _ in range(2))
        (oe, poole), (oc, poolc) = step(xe), c(xc)
        dtype = "float32" if any(p.dtype == jitgrad.float32 for p in (oe, *poole)) else graph_dtype
        close_scaled(oc, oe, dtype, f"call {k}: output")
        for i, (a, b) in enumerate(zip(poolc, poole)):
            close_scaled(a, b, dtype, f"call {k}: value of step {i} {steps[i]}")
        close_grad(xc, xe, dtype, f"call {k}: the argument")
