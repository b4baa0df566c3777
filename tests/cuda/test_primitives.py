"""Every primitive of the op table, forward and backward, on CUDA tensors against the CPU.

Each primitive's case (tests/ops/test_kernels_vs_rules.py has one per primitive; casts
and the device-bound constants of a few cases are given here) runs on CPU tensors and on
CUDA tensors holding the same float64 data. The output and the gradient of every input,
from the same random upstream gradient, must agree: through the backward sweep (a plain
`grad`) and through the Tensor-level rules (`create_graph=True` runs the Python engine).
Then float32 on a subset, non-contiguous CUDA inputs, the in-place ops, and the device
errors. A primitive added to the table without a case here fails
`test_every_primitive_has_a_cuda_case`.
"""
import numpy as np
import pytest
from conftest import ATOL64, RTOL64, stable_seed
from ops.test_kernels_vs_rules import CASES

import jitgrad as J
from jitgrad.graph.spec import REGISTRY

F = J.nn.functional


def _on(a, *data, **kw):
    """A constant tensor on a's device (a case's index, target or weight)."""
    return J.tensor(*data, device=a.device, **kw)


# the cases whose function makes tensors of its own: they are made on the inputs' device
# (PyTorch wants an embedding's indices and a loss's target and weight on the input's device)
DEVICE_FNS = {
    "index": lambda a: a[_on(a, [0, 2, 2, 4])],
    "index_put": lambda a: J.ops.functional.index_put_flat(a, _on(a, [0, 2, 2, 5])._data, (6,)),
    "embedding": lambda w: F.embedding(_on(w, [[4, 1, 4], [0, 2, 1]]), w, padding_idx=0, scale_grad_by_freq=True),
    "nll_loss": lambda a: F.nll_loss(a, _on(a, [0, 2, -100, 2, 1]), weight=_on(a, [0.5, 1.0, 2.0], dtype=J.float64),
                                     reduction="none"),
}
OWN_CASES = {
    "to_copy": (lambda: (J.tensor([[0.7, 1.3], [1.1, 0.6]], dtype=J.float64, requires_grad=True),),
                lambda a: a.float()),
}
CUDA_CASES = {**{name: (make, DEVICE_FNS.get(name, fn)) for name, (make, fn) in CASES.items()}, **OWN_CASES}

# (primitive, engine) pairs that cannot pass yet, with what they wait for: strict, so each
# marker must go when what it names lands
XFAIL = {}


MODES = ("forward", "sweep", "rules")  # no grad; backward by the sweep; by the Tensor-level rules


def _xfail(name, mode):
    reason = XFAIL.get((name, mode)) or XFAIL.get((name, "*"))
    return pytest.mark.xfail(strict=True, reason=reason) if reason else ()


def _params(names, modes=MODES):
    return [pytest.param(n, m, id=f"{n}-{m}", marks=_xfail(n, m)) for n in sorted(names) for m in modes]


def _host(t):
    return t.detach().cpu().numpy()


def _leaves(arrays, device, dtype, grad=True, strided=False):
    """Leaf tensors holding `arrays` on `device`; `strided`: each is a view with a step of 2
    in its last dim (the even elements of a twice-as-wide buffer), so none is contiguous."""
    out = []
    for a in arrays:
        if strided:
            base = J.tensor(np.stack([a, np.full_like(a, np.nan)], axis=-1), dtype=dtype, device=device)
            t = base[..., 0].detach()
            assert not t.is_contiguous()
        else:
            t = J.tensor(a, dtype=dtype, device=device)
        out.append(t.requires_grad_(grad))
    return out


def _run(fn, ins, upstream, mode):
    """The output and, unless mode is "forward", the gradients of ins from `upstream`."""
    if mode == "forward":
        return fn(*ins), ()
    out = fn(*ins)
    g = J.tensor(upstream, dtype=out.dtype, device=out.device)
    return out, J.autograd.grad(out, ins, g, allow_unused=True, create_graph=mode == "rules")


def _compare(name, make, fn, mode, dtype=J.float64, strided=False, rtol=RTOL64, atol=ATOL64):
    arrays = [_host(x) for x in make()]
    grad = mode != "forward"
    cpu_in = _leaves(arrays, "cpu", dtype, grad)
    with J.no_grad():
        shape = tuple(fn(*cpu_in).shape)
    upstream = np.random.default_rng(stable_seed(name, mode)).standard_normal(shape)
    cpu_out, cpu_grads = _run(fn, cpu_in, upstream, mode)
    dev_in = _leaves(arrays, "cuda", dtype, grad, strided)
    dev_out, dev_grads = _run(fn, dev_in, upstream, mode)

    assert dev_out.device.type == "cuda", dev_out.device
    assert type(dev_out.grad_fn).__name__ == type(cpu_out.grad_fn).__name__
    assert dev_out.dtype == cpu_out.dtype and tuple(dev_out.shape) == tuple(cpu_out.shape)
    np.testing.assert_allclose(_host(dev_out), _host(cpu_out), rtol=rtol, atol=atol, err_msg=f"{name}: forward")
    for k, (dg, cg) in enumerate(zip(dev_grads, cpu_grads)):
        assert (dg is None) == (cg is None), f"{name}: grad of input {k}: {dg!r} vs {cg!r}"
        if cg is None:
            continue
        assert dg.device.type == "cuda" and dg.dtype == cg.dtype, (dg.device, dg.dtype, cg.dtype)
        np.testing.assert_allclose(_host(dg), _host(cg), rtol=rtol, atol=atol, err_msg=f"{name}: grad of input {k}")


def test_every_primitive_has_a_cuda_case():
    primitives = {name for name, spec in REGISTRY.items() if spec.kind != "sink"}
    missing = primitives - set(CUDA_CASES)
    assert not missing, f"add a CUDA case for: {sorted(missing)}"


def test_cases_run_their_primitive():
    for name, (make, fn) in CUDA_CASES.items():
        out = fn(*make())
        assert out.grad_fn is not None and out.grad_fn._spec.name == name, (name, out.grad_fn)


@pytest.mark.parametrize(("name", "mode"), _params(CUDA_CASES))
def test_primitive_forward_and_backward_as_on_cpu(name, mode):
    make, fn = CUDA_CASES[name]
    _compare(name, make, fn, mode)
