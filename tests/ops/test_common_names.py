"""Names that everyday small-model code uses, each against torch: values, gradients, node
names where jitgrad builds torch's graph, and errors. repeat_interleave, broadcast_to /
broadcast_tensors / broadcast_shapes, unflatten, Tensor.where, F.glu / softmin / rms_norm,
nn.RMSNorm and nn.Unflatten."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")
LIBS = (torch, jitgrad)
A = np.arange(6.0).reshape(2, 3) * 0.5 + 0.1
B = np.random.default_rng(3).standard_normal((2, 3, 4))


def _outcome(T, call, data):
    x = T.tensor(data, requires_grad=True)
    try:
        y = call(T, x)
    except Exception as e:  # noqa: BLE001  (its type and message are compared)
        return type(e).__name__, str(e).split("\n")[0]
    ys = y if isinstance(y, tuple) else (y,)
    total = sum((t * t).sum() for t in ys if t.requires_grad)
    if isinstance(total, T.Tensor):
        total.backward()
    return ([tuple(t.shape) for t in ys], [str(t.dtype) for t in ys], [t.detach().numpy() for t in ys],
            None if x.grad is None else x.grad.numpy())


CASES = {  # name: (call, input, compare node names)
    "repeat_interleave int": (lambda T, x: x.repeat_interleave(2), A),
    "repeat_interleave dim": (lambda T, x: T.repeat_interleave(x, 3, dim=-1), A),
    "repeat_interleave counts": (lambda T, x: x.repeat_interleave(T.tensor([1, 0, 2]), dim=1), A),
    "repeat_interleave one count": (lambda T, x: x.repeat_interleave(T.tensor([2]), dim=0), A),
    "repeat_interleave 0-d count": (lambda T, x: x.repeat_interleave(T.tensor(2)), A),
    "repeat_interleave counts only": (lambda T, x: (T.repeat_interleave(T.tensor([1, 3, 0, 2])),), A),
    "repeat_interleave bad size": (lambda T, x: x.repeat_interleave(T.tensor([1, 2, 3]), dim=0), A),
    "repeat_interleave negative": (lambda T, x: x.repeat_interleave(-1), A),
    "repeat_interleave negative count": (lambda T, x: x.repeat_interleave(T.tensor([1, -1]), dim=0), A),
    "repeat_interleave float counts": (lambda T, x: x.repeat_interleave(T.tensor([1.0, 2.0]), dim=0), A),
    "repeat_interleave 2-d counts": (lambda T, x: x.repeat_interleave(T.tensor([[1, 2]]), dim=0), A),
    "repeat_interleave list": (lambda T, x: x.repeat_interleave([1, 2], dim=0), A),
    "broadcast_to": (lambda T, x: x.broadcast_to((4, 2, 3)), A),
    "broadcast_to -1": (lambda T, x: T.broadcast_to(x, (5, -1, 3)), A),
    "broadcast_to bad": (lambda T, x: T.broadcast_to(x, (3, 3)), A),
    "broadcast_tensors": (lambda T, x: T.broadcast_tensors(x, T.ones(4, 1, 1, dtype=T.float64)), A),
    "broadcast_tensors bad": (lambda T, x: T.broadcast_tensors(x, T.ones(4, 2)), A),
    "unflatten": (lambda T, x: x.unflatten(2, (2, 2)), B),
    "unflatten -1": (lambda T, x: T.unflatten(x, -1, (-1, 1, 2)), B),
    "unflatten bad": (lambda T, x: x.unflatten(1, (2, 2)), B),
    "unflatten empty": (lambda T, x: x.unflatten(1, ()), B),
    "unflatten two -1": (lambda T, x: x.unflatten(1, (-1, -1)), B),
    "where method": (lambda T, x: x.where(x > 1, 0.0), A),
    "where method tensor": (lambda T, x: x.where(x > 1, -x), A),
    "glu": (lambda T, x: T.nn.functional.glu(x), B),
    "glu dim": (lambda T, x: T.nn.functional.glu(x, 0), B),
    "glu odd": (lambda T, x: T.nn.functional.glu(x, 1), B),
    "glu scalar": (lambda T, x: T.nn.functional.glu(x.sum()), B),
    "glu int": (lambda T, x: T.nn.functional.glu(x.long()), B),
    "softmin": (lambda T, x: T.nn.functional.softmin(x, 1), B),
    "rms_norm": (lambda T, x: T.nn.functional.rms_norm(x, (4,)), B),
    "rms_norm 2 dims eps weight": (lambda T, x: T.nn.functional.rms_norm(
        x, (3, 4), T.tensor(np.linspace(0.5, 2, 12).reshape(3, 4)), 1e-3), B),
    "rms_norm float32 weight": (lambda T, x: T.nn.functional.rms_norm(x, [4], T.ones(4)), B),
    "rms_norm bad shape": (lambda T, x: T.nn.functional.rms_norm(x, (3,)), B),
    "rms_norm bad weight": (lambda T, x: T.nn.functional.rms_norm(x, (4,), T.ones(3)), B),
    "rms_norm empty shape": (lambda T, x: T.nn.functional.rms_norm(x, ()), B),
    "rms_norm int": (lambda T, x: T.nn.functional.rms_norm(x.long(), (4,)), B),
    "RMSNorm": (lambda T, x: T.nn.RMSNorm(4, dtype=T.float64)(x), B),
    "RMSNorm eps no affine": (lambda T, x: T.nn.RMSNorm([3, 4], eps=0.1, elementwise_affine=False)(x), B),
    "Unflatten": (lambda T, x: T.nn.Unflatten(1, (3, 1))(x), B),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_against_torch(name):
    call, data = CASES[name]
    ref, mine = (_outcome(T, call, data) for T in LIBS)
    if isinstance(ref[0], str) or isinstance(mine[0], str):
        assert mine == ref
        return
    assert mine[:2] == ref[:2]
    for a, b in zip(mine[2], ref[2]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    if ref[3] is None:
        assert mine[3] is None
    else:
        np.testing.assert_allclose(mine[3], ref[3], rtol=1e-12, atol=1e-12)


def test_broadcast_shapes():
    for shapes in [((2, 3), (4, 1, 1), 3), ((), (1,)), ((5,), 1), ((2, 1), (1, 3), (4, 1, 1))]:
        assert jitgrad.broadcast_shapes(*shapes) == torch.broadcast_shapes(*shapes)
    for T in LIBS:
        with pytest.raises(RuntimeError, match="Attempting to broadcast a dimension of length 2 at -1! Mismatching "
                                               "argument at index 1 had \\(4, 2\\)"):
            T.broadcast_shapes((2, 3), (4, 2))


def test_modules_print_and_save_as_torch():
    for T in LIBS:
        assert repr(T.nn.RMSNorm(3)) == "RMSNorm((3,), eps=None, elementwise_affine=True)"
        assert repr(T.nn.Unflatten(1, (3, 1))) == "Unflatten(dim=1, unflattened_size=(3, 1))"
        assert list(T.nn.RMSNorm(3).state_dict()) == ["weight"]
        assert T.nn.RMSNorm(3, elementwise_affine=False).weight is None


def test_gradcheck_and_forward_mode():
    x = jitgrad.tensor(B, requires_grad=True)
    F = jitgrad.nn.functional
    for fn in (lambda t: F.rms_norm(t, (4,)), lambda t: F.glu(t), lambda t: t.repeat_interleave(2, dim=1),
               lambda t: F.softmin(t, 2), lambda t: t.unflatten(2, (2, 2)).sin(), lambda t: t.broadcast_to((2, 2, 3, 4))):
        assert jitgrad.autograd.gradcheck(fn, (x,), check_forward_ad=True)


ACTIVATIONS = {
    "threshold": lambda T, x: T.nn.functional.threshold(x, 0.2, -1.0),
    "threshold int": lambda T, x: T.nn.functional.threshold(x.long(), 0.5, 2.5),
    "threshold bool": lambda T, x: T.nn.functional.threshold(x > 0, 0.5, 1),
    "Threshold": lambda T, x: T.nn.Threshold(0.1, 20.0)(x),
    "tanhshrink": lambda T, x: T.nn.Tanhshrink()(x), "tanhshrink int": lambda T, x: T.nn.functional.tanhshrink(x.long()),
    "softshrink": lambda T, x: T.nn.functional.softshrink(x, 0.3), "Softshrink": lambda T, x: T.nn.Softshrink()(x),
    "softshrink negative": lambda T, x: T.nn.functional.softshrink(x, -1.0),
    "softshrink int": lambda T, x: T.nn.functional.softshrink(x.long()),
    "hardshrink": lambda T, x: T.nn.Hardshrink(0.3)(x), "hardshrink int": lambda T, x: T.nn.functional.hardshrink(x.long()),
    "hardshrink negative": lambda T, x: T.nn.functional.hardshrink(x, -1.0),
    "GLU": lambda T, x: T.nn.GLU(0)(x.reshape(2, 3)), "Softmin": lambda T, x: T.nn.Softmin(0)(x),
    "ravel": lambda T, x: x.reshape(3, 2).t().ravel(), "torch.ravel": lambda T, x: T.ravel(x.reshape(2, 3)),
}
X = np.array([-2.0, -0.3, 0.0, 0.25, 0.4, 1.5])


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_against_torch(name):
    ref, mine = (_outcome(T, ACTIVATIONS[name], X) for T in LIBS)
    if isinstance(ref[0], str) or isinstance(mine[0], str):
        assert mine == ref
        return
    assert mine[:2] == ref[:2]
    np.testing.assert_allclose(mine[2][0], ref[2][0], rtol=1e-12, atol=1e-12)
    if ref[3] is not None:
        np.testing.assert_allclose(mine[3], ref[3], rtol=1e-12, atol=1e-12)


def test_activation_modules_print_as_torch():
    for T in LIBS:
        got = [repr(m) for m in (T.nn.GLU(), T.nn.Softmin(1), T.nn.Tanhshrink(), T.nn.Softshrink(), T.nn.Hardshrink(0.2),
                                 T.nn.Threshold(0.1, 20), T.nn.Threshold(0.1, 20, True))]
        assert got == ["GLU(dim=-1)", "Softmin(dim=1)", "Tanhshrink()", "Softshrink(0.5)", "Hardshrink(0.2)",
                       "Threshold(threshold=0.1, value=20)", "Threshold(threshold=0.1, value=20, inplace=True)"]
