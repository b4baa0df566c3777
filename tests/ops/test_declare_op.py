"""Adding an elementwise primitive is one entry: `jitgrad.ops.defop` declares it (forward,
node name, gradient formula, saved names) and the Tensor method, the jitgrad.ops function,
the compiled kernel and the Python engine's rule all come from it.

The throwaway op is declared in a child process, because the table is process-wide (the
coverage check of test_kernels_vs_rules would see it). It is declared after a first
backward there: the engine then moves to the module of the grown table
(engine/compiled.py `scheduler()`). log1p / expm1, declared the same way in ops/elementwise.py, are held
against torch here too."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import jitgrad as J

_CHILD = textwrap.dedent('''
    import numpy as np
    import jitgrad as J
    from jitgrad.engine import codegen
    from jitgrad.graph.spec import REGISTRY

    before, _ = codegen.module_source()
    w = J.tensor([1.0, 2.0], dtype=J.float64, requires_grad=True)
    (w * w).sum().backward()                       # loads the generated module of the table as it was
    cube = J.ops.defop("cube", "CubeBackward0", lambda x: x * x * x, "grad * 3.0 * self * self", saves=("self",))
    assert REGISTRY["cube"].node_name == "CubeBackward0" and J.ops.cube is cube and J.cube is cube
    x0 = np.array([0.5, -1.25, 2.0, 3.0])
    x = J.tensor(x0, dtype=J.float64, requires_grad=True)
    after, src = codegen.module_source()
    assert after != before                         # a new entry is a new module (content-hashed)
    y = x.cube()                                   # the Tensor method comes from the entry
    assert type(y.grad_fn).__name__ == "CubeBackward0"
    assert np.allclose(y.grad_fn._saved_self.detach().numpy(), x0)
    np.testing.assert_allclose(y.detach().numpy(), x0 ** 3)
    y.sum().backward()                             # the compiled kernel generated from the formula
    np.testing.assert_allclose(x.grad.numpy(), 3 * x0 ** 2, rtol=1e-12)
    # finite differences
    eps = 1e-6
    fd = ((x0 + eps) ** 3 - (x0 - eps) ** 3) / (2 * eps)
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-6)
    # create_graph: the formula runs on Tensors, so the second derivative is 6x
    x.grad = None
    (g,) = J.autograd.grad(cube(x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), 3 * x0 ** 2, rtol=1e-12)
    (h,) = J.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(h.numpy(), 6 * x0, rtol=1e-12)
    # broadcasting and float32 go through the same kernel
    x32 = J.tensor(x0.astype(np.float32), requires_grad=True)
    (x32.cube() * 2.0).sum().backward()
    np.testing.assert_allclose(x32.grad.numpy(), 6 * x0 ** 2, rtol=1e-5)
    print("OK")
''')

def _run(code):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


def test_a_primitive_declared_from_test_code_after_the_first_backward():
    _run(_CHILD)


def test_defop_rejects_a_formula_reading_an_undeclared_name():
    with pytest.raises(ValueError, match="not saved"):
        J.ops.elementwise.elementwise("_bad_decl", "BadBackward0", "grad * self")  # saves=() but reads self
    with pytest.raises(ValueError, match="no formula reads"):
        J.ops.elementwise.elementwise("_bad_decl2", "BadBackward0", "grad", saves=("self",))


@pytest.mark.parametrize("name,lo,hi", [("log1p", -0.9, 3.0), ("expm1", -3.0, 2.0)])
def test_log1p_expm1_match_torch(name, lo, hi):
    rng = np.random.default_rng(3)
    x0 = rng.uniform(lo, hi, (3, 4))
    x = J.tensor(x0, dtype=J.float64, requires_grad=True)
    xt = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    y, yt = getattr(J, name)(x), getattr(torch, name)(xt)
    assert type(y.grad_fn).__name__ == type(yt.grad_fn).__name__
    np.testing.assert_allclose(y.detach().numpy(), yt.detach().numpy(), rtol=1e-14)
    np.testing.assert_allclose(getattr(x, name)().detach().numpy(), yt.detach().numpy(), rtol=1e-14)  # method
    # saved value, as torch names it
    saved = "_saved_self" if name == "log1p" else "_saved_result"
    np.testing.assert_allclose(getattr(y.grad_fn, saved).detach().numpy(),
                               getattr(yt.grad_fn, saved).detach().numpy(), rtol=1e-14)
    w0 = rng.standard_normal((3, 4))
    # plain backward (compiled kernel)
    (y * J.tensor(w0)).sum().backward()
    (yt * torch.tensor(w0)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-13)
    # finite differences
    f = {"log1p": np.log1p, "expm1": np.expm1}[name]
    eps = 1e-6
    fd = (f(x0 + eps) - f(x0 - eps)) / (2 * eps) * w0
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-6, atol=1e-9)
    # create_graph double backward
    (g,) = J.autograd.grad(getattr(J, name)(x).sum(), x, create_graph=True)
    (gt,) = torch.autograd.grad(getattr(torch, name)(xt).sum(), xt, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), gt.detach().numpy(), rtol=1e-13)
    (h,) = J.autograd.grad((g * J.tensor(w0)).sum(), x)
    (ht,) = torch.autograd.grad((gt * torch.tensor(w0)).sum(), xt)
    np.testing.assert_allclose(h.numpy(), ht.numpy(), rtol=1e-12)
