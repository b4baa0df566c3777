"""utils.checkpoint as PyTorch 2.13 has it: the non-reentrant form (recompute on unpack),
its checks, checkpoint_sequential, and the reentrant form's limits. Each test runs on
jitgrad and on torch with the same expectations (the LIBS parameter)."""
import importlib
import warnings

import numpy as np
import pytest
from conftest import LIBS, assert_close

torch = pytest.importorskip("torch")
import torch.utils.checkpoint  # noqa: E402, F401, F811

import jitgrad.utils.checkpoint  # noqa: E402, F401


def ckpt(T):
    return importlib.import_module(T.__name__ + ".utils.checkpoint")


def leaf(T, values):
    return T.tensor(values, dtype=T.float64, requires_grad=True)


@LIBS
@pytest.mark.parametrize("reentrant", [True, False])
def test_gradients_equal_the_unchecked_ones_including_a_module_s_weights(T, reentrant):
    rs = np.random.RandomState(0)
    lin = T.nn.Linear(3, 2).double()
    with T.no_grad():
        lin.weight.copy_(T.tensor(rs.randn(2, 3)))
        lin.bias.copy_(T.tensor(rs.randn(2)))
    x = leaf(T, rs.randn(4, 3))

    def f(x):
        return lin(x).tanh().exp()

    f(x).sum().backward()
    want = [x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]
    x.grad = lin.weight.grad = lin.bias.grad = None
    ckpt(T).checkpoint(f, x, use_reentrant=reentrant).sum().backward()
    for got, w in zip([x.grad, lin.weight.grad, lin.bias.grad], want):
        assert_close(got, w)


@LIBS
def test_non_reentrant_graph_is_the_function_s_own_and_grad_works(T):
    a = leaf(T, [0.5, -1.0, 2.0])
    out = ckpt(T).checkpoint(T.exp, a, use_reentrant=False)
    assert type(out.grad_fn).__name__ == "ExpBackward0"  # no checkpoint node in between
    (g,) = T.autograd.grad(out.sum(), (a,))
    assert_close(g, np.exp([0.5, -1.0, 2.0]))


@LIBS
def test_recompute_runs_once_per_backward_and_per_access_outside_backward(T):
    count = [0]

    def f(a):
        count[0] += 1
        return T.exp(a * a)

    a = leaf(T, [1.0, 2.0])
    d = ckpt(T).checkpoint(f, a, use_reentrant=False)
    assert count[0] == 1
    d.grad_fn._saved_result
    d.grad_fn._saved_result
    assert count[0] == 3
    d.sum().backward()
    assert count[0] == 4
    with pytest.raises(RuntimeError, match="after they have already been freed"):
        d.grad_fn._saved_result


@LIBS
def test_retain_graph_backward_twice_recomputes_each_time(T):
    count = [0]

    def f(a):
        count[0] += 1
        return a.sin().exp()

    a = leaf(T, [0.3])
    out = ckpt(T).checkpoint(f, a, use_reentrant=False).sum()
    out.backward(retain_graph=True)
    out.backward()
    assert count[0] == 3
    assert_close(a.grad, [2 * np.exp(np.sin(0.3)) * np.cos(0.3)])


def nondeterministic(first, then):
    calls = [0]

    def fn(x):
        calls[0] += 1
        return first(x) if calls[0] == 1 else then(x)
    return fn


@LIBS
def test_a_rerun_saving_fewer_tensors_is_an_error_and_more_is_early_stopped(T):
    def three(x):
        return x.sin().exp().sin()

    def two(x):
        return x.sin().exp()

    a = leaf(T, [0.7])
    out = ckpt(T).checkpoint(nondeterministic(three, two), a, use_reentrant=False)
    with pytest.raises(RuntimeError, match="A different number of tensors was saved during the original forward "
                                           "and recomputation.\nNumber of tensors saved during forward: 3\nNumber "
                                           "of tensors saved during recomputation: 2."):
        out.backward()
    ckpt(T).checkpoint(nondeterministic(two, three), a, use_reentrant=False).backward()
    assert_close(a.grad, [np.exp(np.sin(0.7)) * np.cos(0.7)])
    assert issubclass(ckpt(T).CheckpointError, RuntimeError)


@LIBS
def test_a_rerun_saving_other_shapes_is_an_error_unless_the_check_is_off(T):
    def two(x):
        return x.sin().exp()

    def two_wider(x):
        return x.expand(2).sin().exp()

    a = leaf(T, [0.7])
    out = ckpt(T).checkpoint(nondeterministic(two, two_wider), a, use_reentrant=False)
    with pytest.raises(RuntimeError, match=r"Recomputed values for the following tensors have different metadata "
                                           r"than during the forward pass.\ntensor at position 0:\nsaved metadata: "
                                           r"\{'shape': torch.Size\(\[1\]\), 'dtype': torch.float64, 'device': "
                                           r"device\(type='cpu'\)\}"):
        out.sum().backward()
    with pytest.raises(ValueError, match="determinism_check should be one of"):
        ckpt(T).checkpoint(two, a, use_reentrant=False, determinism_check="strict")


@LIBS
def test_a_saved_tensor_is_unpacked_once_per_backward(T):
    seen = []

    class Saves(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            try:
                ctx.saved_tensors
            except RuntimeError as e:
                seen.append(str(e))
            return g * 2

    a = leaf(T, [1.0])
    ckpt(T).checkpoint(lambda x: Saves.apply(x * 3), a, use_reentrant=False).sum().backward()
    assert len(seen) == 1 and seen[0].startswith(
        "torch.utils.checkpoint: Unpack is being triggered for a tensor that was already unpacked once.")
    assert_close(a.grad, [6.0])


@LIBS
def test_a_saved_input_that_needs_no_grad_comes_back_as_the_same_object(T):
    got = []

    class SavesOther(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(y)
            return x * 1

        @staticmethod
        def backward(ctx, g):
            got.append(ctx.saved_tensors[0])
            return g, None

    a = leaf(T, 1.0)
    b = T.tensor(1.0, dtype=T.float64)
    ckpt(T).checkpoint(SavesOther.apply, a, b, use_reentrant=False).backward()
    assert got[0] is b


@LIBS
def test_dict_inputs_and_outputs_kwargs_and_non_tensor_values(T):
    w = leaf(T, [[1.0, 2.0], [3.0, 4.0]])

    def f(inputs, scale, power=1):
        return {"out": (inputs["x"] @ w * scale) ** power, "tag": "kept"}, 7

    x = T.tensor([[0.5, -1.0]], dtype=T.float64)
    res, seven = ckpt(T).checkpoint(f, {"x": x}, 3.0, power=2, use_reentrant=False)
    assert seven == 7 and res["tag"] == "kept"
    res["out"].sum().backward()
    y = np.array([[0.5, -1.0]]) @ np.array([[1.0, 2.0], [3.0, 4.0]]) * 3
    assert_close(w.grad, np.array([[0.5], [-1.0]]) * 3 * 2 * y)


@LIBS
def test_random_state_is_replayed_in_the_rerun(T):
    T.manual_seed(0)
    x = leaf(T, np.ones(64))

    def f(x):
        return T.nn.functional.dropout(x, 0.5, training=True) * x

    out = ckpt(T).checkpoint(f, x, use_reentrant=False)
    mask = (out.detach() != 0)
    out.sum().backward()
    assert_close(x.grad, np.where(mask.numpy(), 4.0, 0.0))


@LIBS
def test_the_reentrant_form_rejects_grad_and_backward_inputs_and_recovers(T):
    a = leaf(T, [[0.1, 0.2], [0.3, 0.4]])
    msg = "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad()"
    with pytest.raises(RuntimeError, match=msg):
        T.autograd.grad(ckpt(T).checkpoint(T.exp, a, use_reentrant=True).sum(), (a,))
    with pytest.raises(RuntimeError, match=msg):
        ckpt(T).checkpoint(T.exp, a, use_reentrant=True).sum().backward(inputs=[a])
    ckpt(T).checkpoint(T.exp, a, use_reentrant=True).sum().backward()
    assert_close(a.grad, np.exp([[0.1, 0.2], [0.3, 0.4]]))


@LIBS
def test_the_reentrant_form_needs_an_output_with_grad_and_takes_no_kwargs(T):
    a = leaf(T, [1.0])

    def detached(x):
        with T.no_grad():
            return x * 2

    out = ckpt(T).checkpoint(detached, a, use_reentrant=True)
    out = out + a
    with pytest.raises(RuntimeError, match="none of output has requires_grad=True, this checkpoint"):
        out.sum().backward()
    out = ckpt(T).checkpoint(detached, a, use_reentrant=False) + a  # fine without reentrancy
    out.sum().backward()
    assert_close(a.grad, [1.0])
    with pytest.raises(ValueError, match="Unexpected keyword arguments: power"):
        ckpt(T).checkpoint(lambda x, power: x ** power, a, power=2, use_reentrant=True)


@LIBS
def test_the_use_reentrant_warning_only_when_it_is_not_passed(T):
    a = leaf(T, [1.0])
    layers = [T.nn.Linear(1, 1).double(), T.nn.Linear(1, 1).double()]
    for call in (lambda **kw: ckpt(T).checkpoint(lambda x: x * 2, a, **kw),
                 lambda **kw: ckpt(T).checkpoint_sequential(layers, 2, a, **kw)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            call(use_reentrant=False)
        assert not w
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            call()
        assert len(w) == 1 and w[0].category is UserWarning
        assert "the use_reentrant parameter should be passed explicitly" in str(w[0].message)


@LIBS
@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_sequential_matches_the_plain_sequential(T, reentrant):
    rs = np.random.RandomState(1)
    model = T.nn.Sequential(*[T.nn.Linear(3, 3).double() for _ in range(4)])
    with T.no_grad():
        for p in model.parameters():
            p.copy_(T.tensor(rs.randn(*p.shape)))
    x = leaf(T, rs.randn(2, 3))
    model(x).tanh().sum().backward()
    want = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    out = ckpt(T).checkpoint_sequential(model, 2, x, use_reentrant=reentrant)
    assert type(out.grad_fn).__name__ == "AddmmBackward0"  # the last segment runs unchecked
    out.tanh().sum().backward()
    for got, w in zip([p.grad for p in model.parameters()] + [x.grad], want):
        assert_close(got, w)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: foo"):
        ckpt(T).checkpoint_sequential(model, 2, x, use_reentrant=reentrant, foo=1)


@LIBS
def test_a_hook_calling_backward_inside_a_checkpointed_backward(T):
    def fn(a):
        x = a.sin().cos()
        return x, x.sin()

    a = leaf(T, 1.0)
    x, out = ckpt(T).checkpoint(fn, a, use_reentrant=False)
    out.grad_fn.register_hook(lambda *_: x.backward(retain_graph=True))
    out.backward(retain_graph=True)
    dx = -np.sin(np.sin(1.0)) * np.cos(1.0)  # d cos(sin a) / da: the hook's backward, then out's
    assert_close(a.grad, dx * (1 + np.cos(np.cos(np.sin(1.0)))))


@LIBS
def test_early_stop_off_makes_a_longer_rerun_an_error(T):
    def two(x):
        return x.sin().exp()

    def three(x):
        return x.sin().exp().sin()

    a = leaf(T, [0.7])
    with ckpt(T).set_checkpoint_early_stop(False):
        out = ckpt(T).checkpoint(nondeterministic(two, three), a, use_reentrant=False)
    with pytest.raises(RuntimeError, match="trying to save more tensors during recomputation than during the "
                                           "original forward pass"):
        out.backward()
