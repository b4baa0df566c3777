"""Sizes that change behind a row's back, and values Python hands back into the compiled
sweep (issue 8, classes 2, 6 and 11).

The compiled scheduler writes each gradient into a buffer of its row's recorded size. A
tensor whose `.data` changed size, a hook or a custom Function that returns a gradient of
another size or dtype, must give PyTorch's error, never an out-of-bounds write. Each case
is run in torch too, so the error is the one PyTorch raises."""
import numpy as np
import pytest
from conftest import assert_close

import jitgrad

torch = pytest.importorskip("torch")


def _both(fn):
    """Run fn(T) in jitgrad and torch; the same exception type and message start, or the
    same gradients."""
    results = []
    for T in (jitgrad, torch):
        try:
            results.append(("ok", fn(T)))
        except Exception as e:  # noqa: BLE001 - compared below
            results.append(("err", e))
    (jk, jv), (tk, tv) = results
    assert jk == tk, (jv, tv)
    return jv, tv


def _same_error(fn, prefix):
    je, te = _both(fn)
    assert type(je) is type(te), (je, te)
    assert str(te).startswith(prefix), te
    assert str(je).startswith(prefix), je


# --- .data assigned another shape after the tensor was recorded --------------------------
def test_non_leaf_data_resized_before_its_consumer_is_recorded():
    def fn(T):
        x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x.exp()
        y.data = T.ones(100_000)
        y.sum().backward()
    _same_error(fn, "Function SumBackward0 returned an invalid gradient at index 0 - got [100000] but expected "
                    "shape compatible with [3]")


def test_leaf_data_resized_between_two_uses():
    def fn(T):
        x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        a = x * 2
        x.data = T.ones(1000)
        ((x * 3).sum() + a.sum()).backward()
    _same_error(fn, "Function MulBackward0 returned an invalid gradient at index 0 - got [1000] but expected "
                    "shape compatible with [3]")


def test_leaf_data_resized_after_it_was_saved():
    def fn(T):
        x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        w = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x * w
        x.data = T.ones(1_000_000)
        y.sum().backward()
    _same_error(fn, "The size of tensor a (3) must match the size of tensor b (1000000)")


def test_leaf_data_resized_after_its_grad_exists():
    def fn(T):
        x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        (x * 2).sum().backward()
        x.data = T.ones(5)
        (x * 2).sum().backward()
    _same_error(fn, "The size of tensor a (3) must match the size of tensor b (5)")


def test_leaf_data_grown_after_its_grad_exists_cannot_grow_the_grad():
    def fn(T):
        x = T.tensor([1.0], requires_grad=True)
        (x * 2).sum().backward()
        x.data = T.ones(3)
        (x * 2).sum().backward()
    _same_error(fn, "output with shape [1] doesn't match the broadcast shape [3]")


def test_leaf_data_shrunk_after_its_grad_exists_broadcasts_as_torch():
    def fn(T):
        x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        (x * 2).sum().backward()
        x.data = T.ones(1)
        (x * 2).sum().backward()
        return x.grad
    jg, tg = _both(fn)
    assert_close(jg, tg)


def test_leaf_data_resized_after_a_use_that_saved_nothing():
    def fn(T):
        x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x * 2
        x.data = T.ones(5)
        y.sum().backward()
        return x.grad
    jg, tg = _both(fn)
    assert_close(jg, tg)


def test_root_data_resized_then_backward_with_a_gradient_of_the_new_size():
    def fn(T):
        x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x * 2
        y.data = T.ones(5)
        y.backward(T.ones(5))
    je, te = _both(fn)
    assert type(je) is RuntimeError and type(te) is RuntimeError


def test_data_of_another_dtype_between_two_uses():
    def fn(T):
        x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
        a = x * x
        x.data = T.ones(3, dtype=T.float64)
        ((x * x).sum() + a.sum()).backward()
        return x.grad
    jg, tg = _both(fn)
    assert str(jg.dtype) == str(tg.dtype)
    assert_close(jg, tg)


# --- hooks and custom Functions returning another size or dtype ---------------------------
def _mul_graph(T, dtype="float32"):
    x = T.tensor([1.0, 2.0, 3.0], dtype=getattr(T, dtype), requires_grad=True)
    return x, x * 2


@pytest.mark.parametrize("value,prefix", [
    (lambda T: T.ones(5), "hook '<lambda>' has changed the size of value"),
    (lambda T: T.ones(1), "hook '<lambda>' has changed the size of value"),
    (lambda T: T.ones(3, dtype=T.float64), "hook '<lambda>' has changed the type of value"),
])
@pytest.mark.parametrize("where", ["tensor", "leaf", "prehook", "posthook"])
def test_hook_that_changes_the_value(value, prefix, where):
    def fn(T):
        x, y = _mul_graph(T)
        if where == "tensor":
            y.register_hook(lambda g: value(T))
        elif where == "leaf":
            x.register_hook(lambda g: value(T))
        elif where == "prehook":
            y.grad_fn.register_prehook(lambda go: (value(T),))
        else:  # MulBackward0 of x * 2 has two inputs; the constant's gradient is None
            y.grad_fn.register_hook(lambda gi, go: (value(T), None))
        y.sum().backward()
    _same_error(fn, prefix)


def _backward_through_function(T, returned):
    """x's gradient through a custom Function whose backward returns returned(T, grad)."""
    class F(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return returned(T, g)
    x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (F.apply(x) * x).sum().backward()
    return x.grad


@pytest.mark.parametrize("returned,prefix", [
    (lambda T, g: T.ones(9), "Function FBackward returned an invalid gradient at index 0 - got [9] but expected "
                             "shape compatible with [3]"),
    (lambda T, g: T.ones(2, 2), "Function FBackward returned an invalid gradient at index 0 - got [2, 2]"),
    (lambda T, g: T.ones(1), "Function FBackward returned an invalid gradient at index 0 - got [1]"),
])
def test_custom_function_gradient_of_another_size(returned, prefix):
    _same_error(lambda T: _backward_through_function(T, returned), prefix)


@pytest.mark.parametrize("returned", [lambda T, g: g.double(), lambda T, g: T.tensor([1, 2, 3]),
                                      lambda T, g: T.ones(2, 3)])
def test_custom_function_gradient_is_cast_or_reduced_like_torch(returned):
    jg, tg = _both(lambda T: _backward_through_function(T, returned))
    assert str(jg.dtype) == str(tg.dtype)
    assert_close(jg, tg)


def test_grad_assignment_of_another_size_or_dtype():
    for value, prefix in ((lambda T: T.ones(5), "attempting to assign a gradient of size '[5]' to a tensor of size "
                                                "'[3]'"),
                          (lambda T: T.ones(3, dtype=T.float64), "attempting to assign a gradient with dtype "
                                                                 "'double' to a tensor with grad_dtype 'Float'")):
        def fn(T):
            x = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
            x.grad = value(T)
        _same_error(fn, prefix)


# --- class 6: a mixed-precision graph across tapes --------------------------------------
def test_float64_detour_and_a_penalty_on_a_new_tape():
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((512, 512)).astype(np.float32)  # > 1 MB saved: the penalty starts a new tape
    ws = rng.standard_normal((512, 512)).astype(np.float32)

    def fn(T):
        x = T.tensor(xs)
        w = T.tensor(ws, requires_grad=True)
        h = (x @ w).tanh()
        detour = (h.double() * 1.5).exp().mean().float()
        penalty = (w * w).sum()
        (detour + 1e-3 * penalty).backward()
        return w.grad
    jg, tg = _both(fn)
    assert_close(jg, tg, rtol=1e-4, atol=1e-5)


def test_mixed_rows_fall_back_before_any_tape_is_freed():
    # the newer tape is all float32 and would be swept (and freed) first
    big = jitgrad.ones(400, 400)
    w = jitgrad.ones(400, 400, requires_grad=True)
    mid = (big * w).double().sum().float()   # older tape, with float64 rows
    pen = (w * w).sum()                        # new tape
    (mid + pen).backward()
    np.testing.assert_allclose(w.grad.numpy(), 3.0)


# --- class 11: in-place writes to a saved value that was copied ---------------------------
@pytest.mark.parametrize("make,modify", [
    (lambda T: T.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])[::2], lambda T, b: b.base_add_(1.0)),
    (lambda T: T.ones(3, 2).t(), lambda T, b: b.base_add_(1.0)),
    (lambda T: T.tensor([True, False, True]), lambda T, b: b.__setitem__(0, False)),
    (lambda T: T.tensor([1, 2, 3]), lambda T, b: b.add_(1)),
    (lambda T: T.tensor([1.0, 2.0, 3.0], dtype=T.float64), lambda T, b: b.mul_(2.0)),
])
def test_in_place_write_to_a_saved_copy_is_detected(make, modify):
    def fn(T):
        b = make(T)
        x = T.ones(b.shape, requires_grad=True)
        y = x * b
        if getattr(modify, "__code__", None) and "base_add_" in modify.__code__.co_names:
            b.add_(1.0)  # through the view: its storage's version moves
        else:
            modify(T, b)
        y.sum().backward()
    _same_error(fn, "one of the variables needed for gradient computation has been modified by an inplace "
                    "operation: [")
    je, te = _both(fn)
    assert str(je).split("]")[0] == str(te).split("]")[0]  # the same tensor type and shape
