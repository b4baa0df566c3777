"""saved_tensors_hooks and the saved values nodes expose, against PyTorch."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")


def run_with_hooks(T, scale):
    events = []

    def pack(t):
        events.append(("pack", tuple(t.shape), t.requires_grad))
        return t.detach() * scale   # what is kept (e.g. offloaded) may differ from the tensor

    def unpack(t):
        events.append(("unpack", tuple(t.shape)))
        return t

    x = T.tensor([0.5, 1.5], dtype=T.float64, requires_grad=True)
    with T.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = (x * x).exp().sum()
    y.backward()
    return events, x.grad.numpy().copy()


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_pack_unpack_calls_and_gradients_match_torch(scale):
    jev, jg = run_with_hooks(jitgrad, scale)
    tev, tg = run_with_hooks(torch, scale)
    assert jev == tev
    np.testing.assert_allclose(jg, tg, rtol=1e-12)


def test_hooks_apply_to_custom_function_saves():
    out = []
    for T in (jitgrad, torch):
        class Sq(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return 2 * g * x

        calls = []
        x = T.tensor([3.0], dtype=T.float64, requires_grad=True)
        with T.autograd.graph.saved_tensors_hooks(lambda t: calls.append("p") or t * 10,
                                                  lambda t: calls.append("u") or t):
            y = Sq.apply(x)
        y.sum().backward()
        out.append((calls, x.grad.item()))
    assert out[0] == out[1]


def test_outside_the_context_nothing_is_packed():
    calls = []
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    with jitgrad.autograd.graph.saved_tensors_hooks(lambda t: calls.append(1) or t, lambda t: t):
        pass
    (x * x).sum().backward()
    assert calls == [] and x.grad.tolist() == [2.0, 4.0]


def test_saved_values_are_inspectable_like_torch():
    for T in (jitgrad, torch):
        x = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
        w = T.tensor([3.0, 4.0], dtype=T.float64, requires_grad=True)
        m = x * w
        e = x.exp()
        assert m.grad_fn._saved_self.tolist() == [1.0, 2.0]
        assert m.grad_fn._saved_other.tolist() == [3.0, 4.0]
        np.testing.assert_allclose(e.grad_fn._saved_result.detach().numpy(), np.exp([1.0, 2.0]))
        assert type(e.grad_fn._saved_result.grad_fn).__name__ == "ExpBackward0"
        e.sum().backward()
        with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
            e.grad_fn._saved_result
