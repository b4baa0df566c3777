"""Hypothesis: random small graphs evaluated in jitgrad and torch give the same values and grads."""
import numpy as np
import pytest
from conftest import assert_close
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitgrad

torch = pytest.importorskip("torch")

BASE_SHAPES = [(3,), (2, 3), (2, 3, 4), (4, 1, 3)]

# Every op keeps operands broadcast-compatible with the base shape S:
# results are always broadcastable to S (keepdim reductions only introduce 1s).
UNARY = {
    "exp_tanh": lambda T, a: a.tanh().exp(),
    "sin": lambda T, a: a.sin(),
    "cos": lambda T, a: T.cos(a),
    "tanh": lambda T, a: T.tanh(a),
    "sigmoid": lambda T, a: a.sigmoid(),
    "relu": lambda T, a: a.relu(),
    "abs": lambda T, a: a.abs(),
    "neg": lambda T, a: -a,
    "log_sq": lambda T, a: (a * a + 1.0).log(),
    "sqrt_sq": lambda T, a: (a * a + 0.5).sqrt(),
    "pow3": lambda T, a: a ** 3,
    "rpow": lambda T, a: 1.5 ** a.tanh(),
    "rsub": lambda T, a: 2.0 - a,
    "rdiv": lambda T, a: 1.0 / (a * a + 1.0),
    "scale": lambda T, a: a * 0.5 + 0.25,
    "clamp": lambda T, a: a.clamp(-0.6, 0.8),
    "sum_last_keep": lambda T, a: a.sum(-1, keepdim=True),
    "mean_first_keep": lambda T, a: a.mean(0, keepdim=True),
    "amax_last_keep": lambda T, a: a.amax(-1, keepdim=True),
    "max_first_keep": lambda T, a: a.max(0, keepdim=True).values,
    "softmax_last": lambda T, a: a.softmax(-1),
    "log_softmax_first": lambda T, a: T.log_softmax(a, 0),
    "clone": lambda T, a: a.clone(),
    "unsqueeze_squeeze": lambda T, a: a.unsqueeze(0).squeeze(0),
    "transpose_twice": lambda T, a: a.transpose(0, -1).transpose(0, -1) if a.dim() >= 2 else a * 1.0,
    "flip_index": lambda T, a: a[..., T.tensor(list(range(a.shape[-1] - 1, -1, -1)))] if a.dim() >= 1 else a,
}

BINARY = {
    "add": lambda T, a, b: a + b,
    "sub": lambda T, a, b: a - b,
    "mul": lambda T, a, b: a * b,
    "div": lambda T, a, b: a / (b * b + 1.0),
    "pow": lambda T, a, b: (a * a + 0.5) ** b.tanh(),
    "maximum": lambda T, a, b: T.maximum(a, b),
    "minimum": lambda T, a, b: T.minimum(a, b),
    "where": lambda T, a, b: T.where(a > b, a, b * 2.0),
}

UNARY_NAMES = sorted(UNARY)
BINARY_NAMES = sorted(BINARY)


@st.composite
def programs(draw):
    base = draw(st.sampled_from(BASE_SHAPES))
    n_leaves = draw(st.integers(1, 3))
    leaf_shapes = []
    for _ in range(n_leaves):
        # a broadcast-compatible variant of the base shape
        k = draw(st.integers(0, len(base)))
        suffix = list(base[k:])
        mask = draw(st.lists(st.booleans(), min_size=len(suffix), max_size=len(suffix)))
        shape = tuple(1 if m else s for s, m in zip(suffix, mask))
        leaf_shapes.append(shape)
    leaf_shapes[0] = base  # at least one full-size leaf
    n_ops = draw(st.integers(1, 6))
    steps = []
    for i in range(n_ops):
        pool = n_leaves + i
        if draw(st.booleans()):
            steps.append(("u", draw(st.sampled_from(UNARY_NAMES)), draw(st.integers(0, pool - 1))))
        else:
            steps.append(("b", draw(st.sampled_from(BINARY_NAMES)),
                          draw(st.integers(0, pool - 1)), draw(st.integers(0, pool - 1))))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    return leaf_shapes, steps, seed


def run_program(T, leaves, steps):
    pool = list(leaves)
    for step in steps:
        if step[0] == "u":
            pool.append(UNARY[step[1]](T, pool[step[2]]))
        else:
            pool.append(BINARY[step[1]](T, pool[step[2]], pool[step[3]]))
    # sum of the last value plus a small multiple of every intermediate, so all nodes matter
    out = pool[-1].sum()
    for p in pool[len(leaves):-1]:
        out = out + 0.1 * p.sum()
    return out, pool


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_graphs_match_torch(prog):
    leaf_shapes, steps, seed = prog
    rng = np.random.default_rng(seed)
    arrays = []
    for s in leaf_shapes:
        mag = rng.uniform(0.2, 1.5, size=s)
        sign = np.where(rng.random(size=s) < 0.5, -1.0, 1.0)
        arrays.append(mag * sign)
    tl = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    jl = [jitgrad.tensor(a, dtype=jitgrad.float64, requires_grad=True) for a in arrays]
    tout, tpool = run_program(torch, tl, steps)
    jout, jpool = run_program(jitgrad, jl, steps)
    for i, (jp, tp) in enumerate(zip(jpool, tpool)):
        assert_close(jp, tp, rtol=1e-9, atol=1e-11, msg=f"value of node {i}")
    assert_close(jout, tout, rtol=1e-9, atol=1e-11, msg="output")
    tgr = torch.autograd.grad(tout, tl, allow_unused=True, retain_graph=True)
    jgr = jitgrad.autograd.grad(jout, jl, allow_unused=True, retain_graph=True)
    for i, (jg, tg) in enumerate(zip(jgr, tgr)):
        if tg is None:
            assert jg is None, f"leaf {i} unused in torch, jitgrad returned a gradient"
        else:
            assert_close(jg, tg, rtol=1e-9, atol=1e-11, msg=f"grad leaf {i}")
    jout.backward()
    tout.backward()
    for i, (a, b) in enumerate(zip(jl, tl)):
        if b.grad is None:
            assert a.grad is None
        else:
            assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-11, msg=f".grad leaf {i}")
