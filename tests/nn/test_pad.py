"""F.pad against torch: constant padding (negative pads crop, a value, integer tensors) and
the reflect / replicate / circular modes of every supported rank: values, gradients, node
names, finite differences, and torch's errors."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")
rng = np.random.default_rng(11)

CASES = [
    ((2, 3, 4, 5), (1, 2), {}), ((2, 3, 4, 5), (1, 2, 0, 1), dict(value=3.0)), ((2, 3, 4, 5), (-1, 2, 1, -2), {}),
    ((3,), (2, 1), {}), ((2, 3), (0, 0), {}), ((2, 3), (1, 1, 1, 1), dict(mode="constant")),
    ((2, 3, 4, 5), (1, 2, 1, 1), dict(mode="reflect")), ((2, 3, 4), (1, 2), dict(mode="reflect")),
    ((3, 4), (3, 2), dict(mode="replicate")), ((2, 3, 4, 5), (1, 2, 3, 1), dict(mode="replicate")),
    ((2, 3, 4, 5), (1, 2, 3, 1), dict(mode="circular")), ((1, 2, 3, 4, 5), (1, 1, 2, 1, 1, 2), dict(mode="reflect")),
    ((2, 3, 4, 5), (1, 1, 2, 1, 1, 2), dict(mode="replicate")), ((2, 3, 4), (2, 1), dict(mode="circular")),
    ((2, 3, 4), (-1, 1), dict(mode="replicate")),
]


@pytest.mark.parametrize("shape,pad,kw", CASES)
def test_values_grads_and_node_names(shape, pad, kw):
    a = rng.standard_normal(shape)
    xs = [T.tensor(a, requires_grad=True) for T in (torch, jitgrad)]
    ys = [T.nn.functional.pad(x, pad, **kw) for T, x in zip((torch, jitgrad), xs)]
    np.testing.assert_array_equal(ys[1].detach().numpy(), ys[0].detach().numpy())
    if kw.get("mode") != "circular" and not kw.get("value"):   # (torch builds those from copies / two nodes)
        assert ys[1].grad_fn.name() == ys[0].grad_fn.name()
    g = rng.standard_normal(tuple(ys[0].shape))
    for T, x, y in zip((torch, jitgrad), xs, ys):
        (y * T.tensor(g)).sum().backward()
    np.testing.assert_allclose(xs[1].grad.numpy(), xs[0].grad.numpy(), rtol=1e-12, atol=1e-12)


def test_finite_differences_forward_mode_and_integers():
    x = jitgrad.tensor(rng.standard_normal((2, 3, 4)), requires_grad=True)
    F = jitgrad.nn.functional
    for kw in (dict(), dict(mode="reflect"), dict(mode="replicate"), dict(mode="circular")):
        assert jitgrad.autograd.gradcheck(lambda t: F.pad(t, (2, 1), **kw) ** 2, (x,), check_forward_ad=True)
    for T in (torch, jitgrad):
        out = T.nn.functional.pad(T.arange(3), (1, 1), value=2.5)
        assert out.tolist() == [2, 0, 1, 2, 2] and out.dtype == T.int64


@pytest.mark.parametrize("call", [
    lambda T, x: T.nn.functional.pad(x, (1, 2, 3)), lambda T, x: T.nn.functional.pad(x, (1,) * 10),
    lambda T, x: T.nn.functional.pad(x, (-3, -3)), lambda T, x: T.nn.functional.pad(x, (1, 2), mode="reflect"),
    lambda T, x: T.nn.functional.pad(x[0, 0, 0], (1, 2), mode="reflect"),
    lambda T, x: T.nn.functional.pad(x, (1, 2), mode="foo"), lambda T, x: T.nn.functional.pad(x, (1.5, 2)),
    lambda T, x: T.nn.functional.pad(x, (1, 2, 1, 1), mode="reflect", value=2.0),
    lambda T, x: T.nn.functional.pad(x, (5, 0, 0, 0), mode="reflect"),
    lambda T, x: T.nn.functional.pad(x, (0, 0, 0, 4), mode="reflect"),
    lambda T, x: T.nn.functional.pad(x, (6, 0, 0, 0), mode="circular"),
])
def test_errors_match_torch(call):
    found = []
    for T in (torch, jitgrad):
        with pytest.raises(Exception) as e:
            call(T, T.zeros(2, 3, 4, 5))
        found.append(e)
    assert found[1].type is found[0].type, (found[1].value, found[0].value)
    assert str(found[1].value) == str(found[0].value)
