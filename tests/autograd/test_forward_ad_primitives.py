"""Every primitive's forward-mode tangent (its entry's JVP), in float64.

Each case of tests/ops/test_kernels_vs_rules.py (there is one for every primitive) is run
with a random tangent on every input, and the output's tangent J t is held against
- the reverse mode, which is tested against PyTorch: <v, J t> = sum_j <J_j^T v, t_j>
  for a random v (the adjoint identity, to 1e-10), and
- central finite differences of the forward, (f(x + e t) - f(x - e t)) / 2e.
The coverage check fails when a primitive is added without a JVP (an elementwise entry's
comes from its gradient formulas; a structural entry names its `jvp`).
"""
import numpy as np
import pytest
from ops.test_kernels_vs_rules import CASES

import jitgrad as J
import jitgrad.autograd.forward_ad as fwAD
from jitgrad.graph.spec import REGISTRY

rng = np.random.default_rng(11)

# primitives with no forward formula on purpose, as in PyTorch: none so far
NO_JVP = set()
# cases whose backward is deliberately not the forward's transpose (PyTorch's embedding with
# padding_idx and scale_grad_by_freq): only finite differences hold their JVP
NOT_ADJOINT = {"embedding"}


def test_every_primitive_has_a_jvp():
    missing = sorted(name for name, spec in REGISTRY.items()
                     if spec.kind == "struct" and spec.jvp is None and name not in NO_JVP)
    assert not missing, f"declare a jvp for: {missing}"


def _jvp(fn, primals, tangents):
    with fwAD.dual_level():
        duals = [fwAD.make_dual(p, t) for p, t in zip(primals, tangents)]
        out = fn(*duals)
        primal, tangent = fwAD.unpack_dual(out)
    assert tangent is not None, "no tangent came out"
    return primal, tangent


@pytest.mark.parametrize("name", sorted(CASES))
def test_jvp_matches_vjp_and_finite_differences(name):
    make, fn = CASES[name]
    ins = make()
    primals = [x.detach() for x in ins]
    tangents = [J.tensor(rng.standard_normal(tuple(x.shape)), dtype=J.float64) for x in ins]
    out, jt = _jvp(fn, primals, tangents)
    assert tuple(jt.shape) == tuple(out.shape) and jt.dtype == out.dtype

    # adjoint identity against the (PyTorch-tested) reverse mode
    if name not in NOT_ADJOINT:
        y = fn(*ins)
        v = J.tensor(rng.standard_normal(tuple(y.shape)), dtype=J.float64)
        vjps = J.autograd.grad(y, ins, v, allow_unused=True)
        lhs = float((v * jt).sum())
        rhs = sum(float((g * t).sum()) for g, t in zip(vjps, tangents) if g is not None)
        assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(rhs)), (lhs, rhs)

    # central differences (the cases keep inputs away from kinks)
    eps = 1e-6
    with J.no_grad():
        hi = fn(*[p + eps * t for p, t in zip(primals, tangents)]).numpy()
        lo = fn(*[p - eps * t for p, t in zip(primals, tangents)]).numpy()
    np.testing.assert_allclose(jt.numpy(), (hi - lo) / (2 * eps), rtol=1e-5, atol=1e-6)
