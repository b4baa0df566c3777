"""torch.tile, torch.diag, torch.diag_embed and Tensor.new against torch: values, gradients
(first and second order, through the compiled engine), node names, errors; new's legacy
argument forms."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")

LIBS = (torch, jitgrad)
rng = np.random.default_rng(26)

DIAG_CASES = [  # (shape, call)
    ((3,), lambda T, x: T.diag(x)), ((3,), lambda T, x: T.diag(x, 2)), ((3,), lambda T, x: T.diag(x, diagonal=-1)),
    ((1,), lambda T, x: x.diag(1)), ((0,), lambda T, x: T.diag(x, 1)), ((3, 4), lambda T, x: T.diag(x)),
    ((3, 4), lambda T, x: x.diag(2)), ((4, 3), lambda T, x: T.diag(x, -3)), ((3, 4), lambda T, x: T.diag(x, 7)),
    ((2, 3), lambda T, x: T.diag_embed(x)), ((2, 3), lambda T, x: T.diag_embed(x, 1, 0, 2)),
    ((2, 3, 2), lambda T, x: T.diag_embed(x, offset=-2, dim1=-1, dim2=1)), ((4,), lambda T, x: x.diag_embed(1)),
    ((3, 2), lambda T, x: T.tile(x, (2,))), ((3,), lambda T, x: T.tile(x, (2, 2))), ((2, 3), lambda T, x: x.tile(2)),
    ((2, 3), lambda T, x: x.tile(1, 2, 1)), ((2, 3), lambda T, x: x.tile([0, 1])), ((2,), lambda T, x: T.tile(x, ())),
    ((3,), lambda T, x: T.diag(T.diag(x) * 2.0)),
]


@pytest.mark.parametrize("shape,call", DIAG_CASES)
def test_against_torch_values_grads_and_node_names(shape, call):
    a = rng.standard_normal(shape)
    xs = [T.tensor(a, requires_grad=True) for T in LIBS]
    ys = [call(T, x) for T, x in zip(LIBS, xs)]
    assert tuple(ys[1].shape) == tuple(ys[0].shape)
    np.testing.assert_allclose(ys[1].detach().numpy(), ys[0].detach().numpy(), rtol=0, atol=0)
    assert ys[1].grad_fn.name() == ys[0].grad_fn.name()
    g = rng.standard_normal(tuple(ys[0].shape))
    if not ys[0].numel():
        return
    # second order through create_graph (these ops are linear: the grad of a squared output,
    # then that grad's own gradient)
    grads = []
    for T, x, y in zip(LIBS, xs, ys):
        (gx,) = T.autograd.grad((y * y * T.tensor(g)).sum(), x, create_graph=True)
        (ggx,) = T.autograd.grad(gx.sum(), x)
        grads.append((gx.detach().numpy(), ggx.numpy()))
    for mine, ref in zip(grads[1], grads[0]):
        np.testing.assert_allclose(mine, ref, rtol=1e-12, atol=1e-12)


def test_results_are_copies_not_views():
    x = jitgrad.arange(6.0).reshape(2, 3)
    d = jitgrad.diag(x)
    d.add_(100.0)
    assert x[0, 0].item() == 0.0   # torch's diag copies (Tensor.diagonal is the view)
    t = jitgrad.tile(x, (1,))
    t.add_(1.0)
    assert x[0, 0].item() == 0.0


def test_gradcheck_and_jvp_match_finite_differences():
    x = jitgrad.tensor(rng.standard_normal(4), requires_grad=True)
    m = jitgrad.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    assert jitgrad.autograd.gradcheck(lambda v: jitgrad.diag(v, 1) ** 2, (x,), check_forward_ad=True)
    assert jitgrad.autograd.gradcheck(lambda a: jitgrad.diag(a, -1).exp(), (m,), check_forward_ad=True)
    assert jitgrad.autograd.gradcheck(lambda a: jitgrad.tile(a, (2, 1, 2)).sin(), (m,), check_forward_ad=True)
    assert jitgrad.autograd.gradcheck(lambda a: jitgrad.diag_embed(a, 1, 0, 2).sin(), (m,), check_forward_ad=True)


def _errors(call):
    out = []
    for T in LIBS:
        with pytest.raises(Exception) as e:
            call(T)
        out.append(e)
    assert out[1].type is out[0].type, (out[1].value, out[0].value)
    assert str(out[1].value).split("\n")[0] == str(out[0].value).split("\n")[0]


@pytest.mark.parametrize("call", [
    lambda T: T.diag(T.tensor(1.0)), lambda T: T.diag(T.zeros(2, 2, 2)), lambda T: T.diag(T.zeros(3), 1.5),
    lambda T: T.diag_embed(T.tensor(1.0)), lambda T: T.diag_embed(T.zeros(3), 0, 0, 0),
    lambda T: T.diag_embed(T.zeros(3), 1.5), lambda T: T.tile(T.zeros(3), 2), lambda T: T.tile(T.zeros(3), (2.0,)),
    lambda T: T.tile(T.zeros(3), (-1,)), lambda T: T.diag_embed(T.zeros(3), 0, 0, 5),
])
def test_errors_match_torch(call):
    _errors(call)


NEW_CASES = ["x.new()", "x.new(2, 3)", "x.new((2, 3))", "x.new([2, 3])", "x.new(T.Size([2, 3]))", "x.new(2)",
             "x.new(0)", "x.new(np.array([1, 2]))", "x.new(np.array(3))", "x.new([[1, 2], [3, 4]])",
             "x.new(2, device='cpu')", "T.tensor([1, 2]).new([1.5])", "x.new(size=(2, 3))", "x.new(np.int64(3))",
             "x.new([])", "x.new(T.tensor(3.0, dtype=T.float64))", "x.new(T.tensor([1.0, 2.0], dtype=T.float64))"]


@pytest.mark.parametrize("expr", NEW_CASES)
def test_tensor_new_forms(expr):
    out = []
    for T in LIBS:
        x = T.tensor([0.5, 1.5], dtype=T.float64, requires_grad=True)
        r = eval(expr, {"T": T, "x": x, "np": np})
        values = r.detach().numpy().tolist() if "new(2" not in expr and "size" not in expr and "int64" not in expr \
            and "Size" not in expr and "array(3)" not in expr else None
        out.append((str(r.dtype), tuple(r.shape), r.requires_grad, r.grad_fn is None, values))
    assert out[1] == out[0]


def test_tensor_new_from_a_tensor_shares_its_storage():
    x = jitgrad.zeros(2, dtype=jitgrad.float64)
    src = jitgrad.tensor([1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
    r = x.new(src)
    assert r.data_ptr() == src.data_ptr() and not r.requires_grad
    with jitgrad.no_grad():
        r[0] = 7.0
    assert src[0].item() == 7.0


@pytest.mark.parametrize("expr", ["x.new(T.tensor([1.0, 2.0]))", "x.new(T.tensor([1, 2]))", "x.new(2.5)",
                                  "x.new(True)", "x.new(-1)", "x.new(2, 3.0)", "x.new(2, dtype=T.float32)",
                                  "x.new([1, 2], requires_grad=True)"])
def test_tensor_new_errors(expr):
    _errors(lambda T: eval(expr, {"T": T, "x": T.zeros(2, dtype=T.float64), "np": np}))
