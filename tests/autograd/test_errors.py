"""Error types and messages must match PyTorch; state must survive the error."""
import numpy as np
import pytest
from conftest import assert_close, capture

import jitgrad

torch = pytest.importorskip("torch")


def check_same_error(j_fn, t_fn, n=40, expected_prefix=None):
    te = capture(t_fn)
    je = capture(j_fn)
    assert te is not None, "torch did not raise - test is wrong"
    assert je is not None, f"jitgrad did not raise (torch raised {type(te).__name__}: {te})"
    assert type(je) is type(te) or isinstance(je, type(te)), f"{type(je).__name__} vs torch {type(te).__name__}: {je}"
    tmsg, jmsg = str(te), str(je)
    if expected_prefix is not None:
        assert tmsg.startswith(expected_prefix), tmsg
    k = min(n, len(tmsg))
    assert jmsg[:k] == tmsg[:k], f"\njitgrad: {jmsg!r}\ntorch:   {tmsg!r}"
    return je, te


def test_backward_non_scalar_without_gradient():
    x = jitgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    tx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    ty = tx * 2
    check_same_error(lambda: y.backward(), lambda: ty.backward(), n=100,
                     expected_prefix="grad can be implicitly created only for scalar outputs")
    # state not corrupted: the graph is still intact
    y.backward(jitgrad.ones(3))
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    je = capture(lambda: jitgrad.autograd.grad(x * 3, x))
    te = capture(lambda: torch.autograd.grad(tx * 3, tx))
    assert type(je) is RuntimeError and str(je).startswith(str(te)[:40])


def test_backward_without_grad_fn():
    check_same_error(lambda: jitgrad.tensor([1.0]).backward(), lambda: torch.tensor([1.0]).backward(), n=100,
                     expected_prefix="element 0 of tensors does not require grad and does not have a grad_fn")
    c = jitgrad.tensor(2.0)
    tc = torch.tensor(2.0)
    check_same_error(lambda: (c * 3).backward(), lambda: (tc * 3).backward(), n=100)
    x = jitgrad.tensor(1.0, requires_grad=True)
    tx = torch.tensor(1.0, requires_grad=True)
    check_same_error(lambda: jitgrad.autograd.grad(c * 3, x), lambda: torch.autograd.grad(tc * 3, tx), n=60)
    (x * 3).backward()
    assert x.grad.item() == 3.0


def test_backward_under_no_grad_output():
    x = jitgrad.tensor(1.0, requires_grad=True)
    tx = torch.tensor(1.0, requires_grad=True)
    with jitgrad.no_grad():
        y = x * 2
    with torch.no_grad():
        ty = tx * 2
    check_same_error(lambda: y.backward(), lambda: ty.backward(), n=70)


def test_second_backward_through_freed_graph():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    ty = (tx * tx).sum()
    y.backward()
    ty.backward()
    check_same_error(lambda: y.backward(), lambda: ty.backward(), n=120,
                     expected_prefix="Trying to backward through the graph a second time")
    assert x.grad.tolist() == [2.0, 4.0]  # failed call did not accumulate
    (x * x).sum().backward()  # a fresh graph works
    assert x.grad.tolist() == [4.0, 8.0]


@pytest.mark.parametrize("via", ["backward", "grad"])
def test_gradient_of_wrong_shape(via):
    x = jitgrad.tensor([[1.0, 2.0, 3.0]] * 2, requires_grad=True)
    tx = torch.tensor([[1.0, 2.0, 3.0]] * 2, requires_grad=True)
    y = x * 2
    ty = tx * 2
    if via == "backward":
        jf = lambda: y.backward(jitgrad.ones(3))  # noqa: E731
        tf = lambda: ty.backward(torch.ones(3))  # noqa: E731
    else:
        jf = lambda: jitgrad.autograd.grad(y, x, grad_outputs=jitgrad.ones(3))  # noqa: E731
        tf = lambda: torch.autograd.grad(ty, tx, grad_outputs=torch.ones(3))  # noqa: E731
    je, te = check_same_error(jf, tf, expected_prefix="Mismatch in shape: grad_output[0] has a shape of ")
    assert "Mismatch in shape: grad_output[0] has a shape of " in str(je)
    assert "[3]" in str(je) and "[2, 3]" in str(je), str(je)
    # still usable afterwards
    y.backward(jitgrad.ones(2, 3))
    assert x.grad.tolist() == [[2.0, 2.0, 2.0]] * 2


def test_unused_input_in_grad():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    w = jitgrad.tensor([3.0], requires_grad=True)
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    tw = torch.tensor([3.0], requires_grad=True)
    y = (x * 2).sum()
    ty = (tx * 2).sum()
    te = capture(lambda: torch.autograd.grad(ty, [tx, tw], retain_graph=True))
    je = capture(lambda: jitgrad.autograd.grad(y, [x, w], retain_graph=True))
    assert isinstance(te, RuntimeError)
    assert type(je) is RuntimeError, je
    # torch >= 2.x: "The differentiated Tensor at index 1 appears to not have been used ..."
    # older torch:  "One of the differentiated Tensors appears to not have been used ..."
    tail = "appears to not have been used in the graph. Set allow_unused=True if this is the desired behavior."
    assert str(te).endswith(tail)
    assert str(je) in (str(te), "One of the differentiated Tensors " + tail), str(je)
    gx, gw = jitgrad.autograd.grad(y, [x, w], allow_unused=True, retain_graph=True)
    assert gx.tolist() == [2.0, 2.0] and gw is None
    gx, gw = jitgrad.autograd.grad(y, [x, w], allow_unused=True, materialize_grads=True)
    assert gw.tolist() == [0.0]
    assert w.grad is None and x.grad is None


def test_add_shape_mismatch():
    a, b = jitgrad.ones(3, requires_grad=True), jitgrad.ones(4, requires_grad=True)
    ta, tb = torch.ones(3, requires_grad=True), torch.ones(4, requires_grad=True)
    check_same_error(lambda: a + b, lambda: ta + tb, n=200,
                     expected_prefix="The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0")
    check_same_error(lambda: a * b, lambda: ta * tb, n=200)
    # 2-D, mismatch at dimension 1
    c, d = jitgrad.ones(2, 3), jitgrad.ones(2, 5)
    check_same_error(lambda: c - d, lambda: torch.ones(2, 3) - torch.ones(2, 5), n=200)
    (a + a).sum().backward()
    assert a.grad.tolist() == [2.0, 2.0, 2.0]
    assert b.grad is None


def test_mm_shape_mismatch():
    a = jitgrad.ones(2, 3, requires_grad=True)
    b = jitgrad.ones(4, 5, requires_grad=True)
    ta = torch.ones(2, 3, requires_grad=True)
    tb = torch.ones(4, 5, requires_grad=True)
    check_same_error(lambda: jitgrad.mm(a, b), lambda: torch.mm(ta, tb), n=200,
                     expected_prefix="mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")
    check_same_error(lambda: a @ b, lambda: ta @ tb, n=200)
    c = jitgrad.ones(3, 5, requires_grad=True)
    (a @ c).sum().backward()
    assert a.grad.tolist() == [[5.0] * 3] * 2


@pytest.mark.parametrize("maker", [
    lambda T: T.tensor([1, 2], requires_grad=True),
    lambda T: T.zeros(2, dtype=T.int64, requires_grad=True),
    lambda T: T.ones(2, dtype=T.int64, requires_grad=True),
    lambda T: T.tensor([True], requires_grad=True),
])
def test_requires_grad_on_integer_tensor(maker):
    check_same_error(lambda: maker(jitgrad), lambda: maker(torch), n=100,
                     expected_prefix="Only Tensors of floating point and complex dtype can require gradients")


def test_requires_grad_setter_on_integer_tensor():
    t = jitgrad.tensor([1, 2])
    te = capture(lambda: setattr(torch.tensor([1, 2]), "requires_grad", True))
    je = capture(lambda: setattr(t, "requires_grad", True))
    assert isinstance(te, RuntimeError) and isinstance(je, RuntimeError)
    assert "floating point" in str(je)
    assert t.requires_grad is False
    assert t.tolist() == [1, 2]


def test_float_ops_still_work_after_errors():
    x = jitgrad.tensor([1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
    for bad in (lambda: x + jitgrad.ones(3), lambda: (x * 2).backward(), lambda: x @ jitgrad.ones(3, 2)):
        assert isinstance(capture(bad), RuntimeError)
    y = (x.exp() * x).sum()
    y.backward()
    assert_close(x.grad, np.exp([1.0, 2.0]) * (1 + np.array([1.0, 2.0])))
