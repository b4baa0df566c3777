"""Every primitive of the op table, forward and backward, on CUDA tensors against the CPU.

Each primitive's case (tests/ops/test_kernels_vs_rules.py has one per primitive; casts
and the device-bound constants of a few cases are given here) runs on CPU tensors and on
CUDA tensors holding the same float64 data. The output and the gradient of every input,
from the same random upstream gradient, must agree: through the backward sweep (a plain
`grad`) and through the Tensor-level rules (`create_graph=True` runs the Python engine);
so must forward-mode tangents. Then float32 on a subset, non-contiguous CUDA inputs,
indexing by every kind of index, the rules' other branches (zeros, ties), the in-place
ops and their version counters, devices mixed in one op, gradcheck and jacobian /
hessian on CUDA inputs. A primitive added to the table without a case here fails
`test_every_primitive_has_a_cuda_case`.
"""
import numpy as np
import pytest
from conftest import ATOL32, ATOL64, RTOL32, RTOL64, stable_seed
from ops.test_kernels_vs_rules import CASES

import jitgrad as J
import jitgrad.autograd.forward_ad as fwAD
from jitgrad.autograd.gradcheck import GradcheckError
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
    "nll_loss": lambda a: F.nll_loss(a, _on(a, [0, 2, -100, 2, 1]), weight=_on(a, [0.5, 1.0, 2.0], dtype=a.dtype),
                                     reduction="none"),
}
OWN_CASES = {
    "to_copy": (lambda: (J.tensor([[0.7, 1.3], [1.1, 0.6]], dtype=J.float64, requires_grad=True),),
                lambda a: a.float()),
}
# not on the device yet: nextafter's forward has no device formula (test_nextafter_on_cuda_says_so)
HOST_ONLY = {"nextafter"}
CUDA_CASES = {**{name: (make, DEVICE_FNS.get(name, fn)) for name, (make, fn) in CASES.items() if name not in HOST_ONLY},
              **OWN_CASES}
# as_strided addresses the storage: on the strided views below its positions are other elements (or none)
STORAGE_ADDRESSED = {"as_strided"}

MODES = ("forward", "sweep", "rules")  # no grad; backward by the sweep; by the Tensor-level rules


def _params(names, modes=MODES):
    return [pytest.param(n, m, id=f"{n}-{m}") for n in sorted(names) for m in modes]


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
            assert t._data.size < 2 or not t._data.is_c_contiguous()
        else:
            t = J.tensor(a, dtype=dtype, device=device)
        out.append(t.requires_grad_(grad))
    return out


def _run(fn, ins, upstream, mode):
    """The output and, unless mode is "forward", the gradients of ins from `upstream`."""
    out = fn(*ins)
    if mode == "forward":
        return out, ()
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
    if grad and name in REGISTRY:
        assert cpu_out.grad_fn._spec.name == name, cpu_out.grad_fn  # the case runs its primitive
    assert type(dev_out.grad_fn).__name__ == type(cpu_out.grad_fn).__name__
    assert dev_out.dtype == cpu_out.dtype and tuple(dev_out.shape) == tuple(cpu_out.shape)
    np.testing.assert_allclose(_host(dev_out), _host(cpu_out), rtol=rtol, atol=atol, err_msg=f"{name}: forward")
    for k, (dg, cg) in enumerate(zip(dev_grads, cpu_grads)):
        assert (dg is None) == (cg is None), f"{name}: grad of input {k}: {dg!r} vs {cg!r}"
        if cg is None:
            continue
        assert dg.device.type == "cuda" and dg.dtype == cg.dtype, (dg.device, dg.dtype, cg.dtype)
        np.testing.assert_allclose(_host(dg), _host(cg), rtol=rtol, atol=atol, err_msg=f"{name}: grad of input {k}")


# primitives with a test of their own here
OWN_TESTS = {"to_device": "test_to_device_moves_the_value_and_the_gradient_back",
             "nextafter": "test_nextafter_on_cuda_says_so"}  # HOST_ONLY: its clear error is the test


def test_every_primitive_has_a_cuda_case():
    primitives = {name for name, spec in REGISTRY.items() if spec.kind != "sink"}
    missing = primitives - set(CUDA_CASES) - set(OWN_TESTS)
    assert not missing, f"add a CUDA case for: {sorted(missing)}"


@pytest.mark.parametrize(("name", "mode"), _params(CUDA_CASES))
def test_primitive_forward_and_backward_as_on_cpu(name, mode):
    make, fn = CUDA_CASES[name]
    _compare(name, make, fn, mode)


@pytest.mark.parametrize("name", sorted(CUDA_CASES))
def test_primitive_jvp_as_on_cpu(name):
    """Forward-mode AD: the output's tangent from random input tangents, as on the CPU."""
    make, fn = CUDA_CASES[name]
    arrays = [_host(x) for x in make()]
    rng = np.random.default_rng(stable_seed(name, "jvp"))
    tangents = [rng.standard_normal(a.shape) for a in arrays]
    results = {}
    for device in ("cpu", "cuda"):
        with fwAD.dual_level():
            duals = [fwAD.make_dual(p, t) for p, t in zip(_leaves(arrays, device, J.float64, grad=False),
                                                          _leaves(tangents, device, J.float64, grad=False))]
            results[device] = fwAD.unpack_dual(fn(*duals))
    (cpu_primal, cpu_tangent), (dev_primal, dev_tangent) = results["cpu"], results["cuda"]
    assert dev_tangent.device.type == "cuda" and dev_tangent.dtype == cpu_tangent.dtype
    np.testing.assert_allclose(_host(dev_primal), _host(cpu_primal), rtol=RTOL64, atol=ATOL64)
    np.testing.assert_allclose(_host(dev_tangent), _host(cpu_tangent), rtol=RTOL64, atol=ATOL64)


def test_to_device_moves_the_value_and_the_gradient_back():
    """to_device (ToCopyBackward0) both ways: the gradient lands on the input's device."""
    a = np.array([[0.7, -1.3], [1.1, 0.6]])
    g = np.array([[0.5, 2.0], [-1.0, 3.0]])
    for src, dst in (("cpu", "cuda"), ("cuda", "cpu")):
        x = J.tensor(a, dtype=J.float64, device=src, requires_grad=True)
        y = x.to(dst)
        assert y.device.type == dst and type(y.grad_fn).__name__ == "ToCopyBackward0"
        np.testing.assert_array_equal(_host(y), a)
        (gx,) = J.autograd.grad(y * 3.0, x, J.tensor(g, dtype=J.float64, device=dst))
        assert gx.device.type == src
        np.testing.assert_array_equal(_host(gx), 3.0 * g)


# indexing a CUDA tensor: indices of every kind PyTorch takes (CPU index tensors included)
INDEXING = {
    "cpu index tensor": lambda a: a[J.tensor([3, 0, 3])],
    "list": lambda a: a[[1, -1], 1:],
    "two index tensors": lambda a: a[_on(a, [0, 2, 4]), _on(a, [2, 0, 1])],
    "bool mask": lambda a: a[a > 0.0],
    "slice, None and Ellipsis": lambda a: a[None, -4:-1, ..., :2],
    "int and index tensor": lambda a: a[2, _on(a, [1, 1, 0])],
}


@pytest.mark.parametrize("kind", sorted(INDEXING), ids=lambda k: k.replace(" ", "-"))
def test_indexing_kinds_as_on_cpu(kind):
    make = lambda: (J.tensor(np.linspace(-1.0, 1.3, 15).reshape(5, 3), dtype=J.float64),)  # noqa: E731
    _compare(kind, make, INDEXING[kind], "sweep")


# the rules' other branches: zeros in a product, ties at a maximum
def _const(*data):
    return lambda: (J.tensor(np.array(data, dtype=np.float64)),)


BRANCHES = {
    "prod with a zero": (_const([0.5, 0.0, 2.0], [1.5, 0.7, -0.4]), lambda a: a.prod(1)),
    "prod_all with two zeros": (_const([0.5, 0.0], [0.0, 0.7]), lambda a: a.prod()),
    "max with ties": (_const([0.5, 2.0], [2.0, -0.7]), lambda a: a.max()),
    "amax with ties": (_const([0.5, 2.0, 2.0], [1.0, 1.0, -0.7]), lambda a: a.amax(1)),
    "max along a dim with ties": (_const([0.5, 2.0, 2.0], [1.0, 1.0, -0.7]), lambda a: a.max(1).values),
}


@pytest.mark.parametrize(("label", "mode"), _params(BRANCHES, ("sweep", "rules")))
def test_rule_branches_as_on_cpu(label, mode):
    make, fn = BRANCHES[label]
    _compare(label, make, fn, mode)


# --- float32, and inputs that are not contiguous ----------------------------------------------

FLOAT32 = ("add", "mul", "div", "exp", "tanh", "sigmoid", "sum", "mean", "amax", "max_dim", "index", "cat",
           "matmul", "addmm", "softmax", "log_softmax", "layer_norm", "convolution", "nll_loss")


@pytest.mark.parametrize(("name", "mode"), _params(FLOAT32, ("sweep",)))
def test_float32_as_on_cpu(name, mode):
    make, fn = CUDA_CASES[name]
    _compare(name, make, fn, mode, dtype=J.float32, rtol=RTOL32, atol=ATOL32)


@pytest.mark.parametrize(("name", "mode"), _params(set(CUDA_CASES) - STORAGE_ADDRESSED, ("sweep",)))
def test_non_contiguous_inputs_as_on_cpu(name, mode):
    make, fn = CUDA_CASES[name]
    _compare(name, make, fn, mode, strided=True)


def test_nextafter_on_cuda_says_so():
    a = J.tensor([1.0, 2.0], device="cuda")
    with pytest.raises(TypeError, match="nextafter is not supported on cuda tensors"):
        J.nextafter(a, a + 1)


# --- in-place ops ---------------------------------------------------------------------------

def _setitem(z, index, value):
    z[index] = value
    return z


# (x, y) -> result, on a copy of x (x is a leaf: writing into it is an error)
INPLACE = {
    "add_": lambda x, y: (x * 1.0).add_(y, alpha=2.0),
    "sub_": lambda x, y: (x * 1.0).sub_(y),
    "mul_": lambda x, y: (x * 1.0).mul_(y),
    "div_": lambda x, y: (x * 1.0).div_(y),
    "iadd": lambda x, y: _iadd(x * 1.0, y),
    "clamp_": lambda x, y: (x * y).clamp_(-0.5, 0.5),
    "copy_": lambda x, y: (x * 1.0).copy_(y) * x,
    "copy_ from a row": lambda x, y: (x * 1.0).copy_(y[1]) * x,
    "zero_": lambda x, y: (x * y).zero_() + x,
    "fill_": lambda x, y: (x * y).fill_(1.5) * x,
    "fill_ with a 0-d tensor": lambda x, y: (x * 1.0).fill_(y[1, 2]) * x,
    "setitem slice": lambda x, y: _setitem(x * 1.0, (slice(0, 2), slice(1, None)), y[1:, :3]),
    "setitem number": lambda x, y: _setitem(x * y, (1, 2), 0.25),
    "setitem index tensor": lambda x, y: _setitem(x * 1.0, J.tensor([2, 0], device=x.device), y[:2]),
    "setitem index list": lambda x, y: _setitem(x * 1.0, ([0, 2], [1, 3]), y[0, :2]),
    "setitem mask": lambda x, y: _setitem(x * 1.0, x > 0, y[x > 0]),
    "write through a view": lambda x, y: _view_write(x * 1.0, y),
    "add_ through a transposed view": lambda x, y: _transposed_write(x * 1.0, y),
}


def _transposed_write(z, y):
    z.t().add_(y.t() * 2.0)  # strided writes into z's storage
    return z


def _iadd(z, y):
    z += y
    return z


def _view_write(z, y):
    z[1].mul_(y[0])  # a view of a non-leaf: the base's history takes the write (CopySlices)
    z[:, 0].add_(y[:, 1])
    return z


@pytest.mark.parametrize("name", sorted(INPLACE), ids=lambda n: n.replace(" ", "-"))
def test_inplace_forward_and_backward_as_on_cpu(name):
    rng = np.random.default_rng(stable_seed(name))
    arrays = [rng.uniform(0.3, 1.5, (3, 4)) * rng.choice([-1.0, 1.0], (3, 4)) for _ in range(2)]
    upstream = rng.standard_normal((3, 4))
    results = {}
    for device in ("cpu", "cuda"):
        x, y = _leaves(arrays, device, J.float64)
        out = INPLACE[name](x, y)
        results[device] = out, J.autograd.grad(out, (x, y), J.tensor(upstream, device=device), allow_unused=True)
    (cpu_out, cpu_grads), (dev_out, dev_grads) = results["cpu"], results["cuda"]
    assert dev_out.device.type == "cuda" and type(dev_out.grad_fn).__name__ == type(cpu_out.grad_fn).__name__
    np.testing.assert_allclose(_host(dev_out), _host(cpu_out), rtol=RTOL64, atol=ATOL64)
    for dg, cg in zip(dev_grads, cpu_grads):
        assert (dg is None) == (cg is None)
        if cg is not None:
            assert dg.device.type == "cuda"
            np.testing.assert_allclose(_host(dg), _host(cg), rtol=RTOL64, atol=ATOL64)


def test_inplace_without_grad_writes_the_storage_and_its_views():
    x = J.tensor(np.arange(12.0).reshape(3, 4), device="cuda")
    row = x[1]
    x.add_(1.0)
    row.mul_(2.0)
    x[0, :2] = J.tensor([-1.0, -2.0], device="cuda")
    x[:, 3] = 0.5
    want = np.arange(12.0).reshape(3, 4) + 1.0
    want[1] *= 2.0
    want[0, :2] = [-1.0, -2.0]
    want[:, 3] = 0.5
    np.testing.assert_array_equal(_host(x), want)
    np.testing.assert_array_equal(_host(row), want[1])
    assert x._version == row._version == 4


def test_a_reshape_that_can_be_a_view_is_one():
    """torch's reshape (and numpy's) is a view when the strides allow it, even of a
    non-contiguous tensor: writes through it reach the base, as on the CPU."""
    for device in ("cpu", "cuda"):
        x = J.tensor(np.arange(6.0).reshape(2, 3), device=device)
        x.t().reshape(1, 3, 2).add_(100.0)
        np.testing.assert_array_equal(_host(x), np.arange(6.0).reshape(2, 3) + 100.0, err_msg=device)


def test_copy_from_the_cpu_into_a_cuda_tensor_and_back():
    """copy_ across devices is allowed, as in PyTorch, and differentiable: each side's
    gradient stays on its device."""
    src = J.tensor([1.0, 2.0, 3.0], dtype=J.float64, requires_grad=True)
    dst = J.zeros(3, dtype=J.float64, device="cuda") * J.tensor([1.0, 1.0, 1.0], device="cuda", dtype=J.float64)
    out = dst.copy_(src)
    assert out.device.type == "cuda"
    np.testing.assert_array_equal(_host(out), [1.0, 2.0, 3.0])
    (g,) = J.autograd.grad(out, src, J.tensor([0.5, 1.0, 2.0], dtype=J.float64, device="cuda"))
    assert g.device.type == "cpu"
    np.testing.assert_array_equal(g.numpy(), [0.5, 1.0, 2.0])
    host = J.zeros(3, dtype=J.float64)
    host.copy_(J.tensor([4.0, 5.0, 6.0], dtype=J.float64, device="cuda"))
    np.testing.assert_array_equal(host.numpy(), [4.0, 5.0, 6.0])


def test_a_saved_value_written_in_place_fails_backward_as_in_torch():
    x = J.tensor([0.5, 1.0, 1.5], dtype=J.float64, device="cuda", requires_grad=True)
    y = x.exp()
    y.add_(1.0)
    with pytest.raises(RuntimeError, match=r"^one of the variables needed for gradient computation has been "
                                           r"modified by an inplace operation: \[torch\.cuda\.DoubleTensor \[3\]\]"
                                           r".* is at version 1; expected version 0 instead\."):
        y.sum().backward()


def test_a_view_written_in_place_bumps_the_shared_version():
    x = J.tensor([[0.5, 1.0], [1.5, 2.0]], dtype=J.float64, device="cuda", requires_grad=True)
    y = x * 2.0
    z = y.sin()  # saves y
    y[0].zero_()  # a write through a view of y
    assert y._version == 1
    with pytest.raises(RuntimeError, match=r"^one of the variables needed for gradient computation has been "
                                           r"modified by an inplace operation"):
        z.sum().backward()


def test_inplace_on_a_leaf_that_requires_grad_is_torchs_error():
    x = J.ones(3, dtype=J.float64, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^a leaf Variable that requires grad is being used in an in-place "
                                           r"operation\.$"):
        x.add_(1.0)
    with J.no_grad():
        x.mul_(3.0)
    np.testing.assert_array_equal(_host(x), [3.0, 3.0, 3.0])


# --- devices mixed in one op ---------------------------------------------------------------------

MIXED = r"^Expected all tensors to be on the same device, but found at least two devices"


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "where", "matmul", "cat", "lt",
                                "add_", "mul_", "index"])
def test_an_op_mixing_a_cpu_and_a_cuda_tensor_raises(op):
    a = J.tensor([[1.0, 2.0], [3.0, 4.0]], device="cuda")
    b = J.tensor([[0.5, 1.5], [2.5, 3.5]])
    run = {
        "add": lambda a, b: a + b, "sub": lambda a, b: b - a, "mul": lambda a, b: a * b, "div": lambda a, b: b / a,
        "pow": lambda a, b: a ** b, "maximum": J.maximum, "where": lambda a, b: J.where(a > 2.0, a, b),
        "matmul": lambda a, b: a @ b, "cat": lambda a, b: J.cat([a, b]), "lt": lambda a, b: a < b,
        "add_": lambda a, b: a.add_(b), "mul_": lambda a, b: b.mul_(a),
        "index": lambda a, b: b[J.tensor([0, 1], device="cuda")],
    }[op]
    msg = r"^indices should be either on cpu or on the same device as the indexed tensor" if op == "index" else MIXED
    with pytest.raises(RuntimeError, match=msg):
        run(a, b)


def test_a_0d_cpu_tensor_and_numbers_go_with_a_cuda_tensor():
    """As in PyTorch, a 0-d CPU tensor is a scalar beside a CUDA tensor: the result is on
    the GPU, and its gradient is on the CPU."""
    a = J.tensor([1.0, 2.0, 3.0], dtype=J.float64, device="cuda", requires_grad=True)
    s = J.tensor(2.0, dtype=J.float64, requires_grad=True)
    y = (a * s + 1.0) / s - J.tensor(0.5, dtype=J.float64)
    assert y.device.type == "cuda"
    np.testing.assert_allclose(_host(y), [1.0, 2.0, 3.0], rtol=RTOL64)
    y.sum().backward()
    assert a.grad.device.type == "cuda" and s.grad.device.type == "cpu"
    np.testing.assert_allclose(_host(a.grad), [1.0, 1.0, 1.0], rtol=RTOL64)
    np.testing.assert_allclose(s.grad.numpy(), -3.0 / 4.0, rtol=RTOL64)


# --- gradcheck on CUDA inputs --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mul", "matmul", "softmax", "index", "prod"])
def test_gradcheck_on_cuda_inputs(name):
    make, fn = CUDA_CASES[name]
    ins = _leaves([_host(x) for x in make()], "cuda", J.float64)
    assert J.autograd.gradcheck(fn, ins)
    assert J.autograd.gradcheck(fn, ins, fast_mode=True)


def test_gradgradcheck_and_forward_ad_check_on_cuda_inputs():
    x, w = _leaves([np.array([[0.5, 1.2], [0.7, 0.9]]), np.array([[0.3, -1.2], [0.4, 0.8]])], "cuda", J.float64)

    def f(a, b):
        return ((a @ b).exp() * a).sum(0)
    assert J.autograd.gradcheck(f, (x, w), check_forward_ad=True, check_batched_grad=True)
    assert J.autograd.gradgradcheck(f, (x, w), gen_non_contig_grad_outputs=True)


def test_gradcheck_on_cuda_inputs_catches_a_wrong_backward():
    class WrongSquare(J.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x  # the factor 2 forgotten

    x = J.tensor([[0.5, 1.25], [1.5, 0.75]], dtype=J.float64, device="cuda", requires_grad=True)
    with pytest.raises(GradcheckError, match=r"^Jacobian mismatch for output 0 with respect to input 0,\n"
                                             r"numerical:tensor\(\[\[1\.0000,"):
        J.autograd.gradcheck(WrongSquare.apply, (x,))


@pytest.mark.parametrize("how", [{}, {"vectorize": True}, {"vectorize": True, "strategy": "forward-mode"}],
                         ids=["rows", "vectorized", "forward-mode"])
def test_jacobian_and_hessian_of_cuda_inputs_as_on_cpu(how):
    arrays = [np.array([0.5, 1.2, 0.7]), np.array([[0.5, -1.2, 0.7], [0.1, 0.2, -0.3]])]

    def f(a, b):
        return (b @ a.exp()) * a[:2]

    def g(a):
        return (a.exp() * a.sin()).sum()
    results = {}
    for device in ("cpu", "cuda"):
        ins = tuple(_leaves(arrays, device, J.float64, grad=False))
        hess = J.autograd.functional.hessian(g, ins[0], vectorize=how.get("vectorize", False))
        results[device] = (*J.autograd.functional.jacobian(f, ins, **how), hess)
    for dev, cpu in zip(results["cuda"], results["cpu"]):
        assert dev.device.type == "cuda"
        np.testing.assert_allclose(_host(dev), _host(cpu), rtol=RTOL64, atol=ATOL64)
