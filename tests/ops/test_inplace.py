"""In-place ops, rebasing and version counters, against PyTorch."""
import numpy as np
import pytest
from conftest import LIB_MODULES, LIBS

torch = pytest.importorskip("torch")


def t64(T, v, rg=False):
    return T.tensor(np.array(v, dtype=np.float64), requires_grad=rg)


OPS = {
    "add_": (lambda y, w: y.add_(w), "AddBackward0"),
    "add_alpha": (lambda y, w: y.add_(w, alpha=2.0), "AddBackward0"),
    "sub_": (lambda y, w: y.sub_(w), "SubBackward0"),
    "mul_": (lambda y, w: y.mul_(w), "MulBackward0"),
    "div_": (lambda y, w: y.div_(w), "DivBackward0"),
    "iadd": (lambda y, w: y.__iadd__(w), "AddBackward0"),
    "isub": (lambda y, w: y.__isub__(w), "SubBackward0"),
    "imul": (lambda y, w: y.__imul__(w), "MulBackward0"),
    "itruediv": (lambda y, w: y.__itruediv__(w), "DivBackward0"),
    "mul_scalar": (lambda y, w: y.mul_(3.0), "MulBackward0"),
    "clamp_": (lambda y, w: y.clamp_(0.5, 2.5), "ClampBackward1"),
    "copy_": (lambda y, w: y.copy_(w), None),            # torch: CopyBackwards
    "setitem": (lambda y, w: y.__setitem__(1, w[0] * 5), None),   # torch: CopySlices
    "setitem_slice": (lambda y, w: y.__setitem__(slice(0, 2), w[1:3]), None),
    "zero_": (lambda y, w: y.zero_(), None),            # torch: ZeroBackward0
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_inplace_op_on_non_leaf_matches_torch(name):
    op, node = OPS[name]
    results = []
    for T in LIB_MODULES:
        x = t64(T, [0.5, 1.5, 2.0], rg=True)
        w = t64(T, [1.25, -0.5, 3.0], rg=True)
        y = x * 2.0
        out = op(y, w)
        assert out is (None if name.startswith("setitem") else y)  # in place: the same tensor comes back
        version = y._version
        loss = (y * y).sum()
        loss.backward()
        results.append((y.detach().numpy().copy(), x.grad.numpy().copy(),
                        None if w.grad is None else w.grad.numpy().copy(), version, type(y.grad_fn).__name__))
    (jy, jx, jw, jv, jn), (ty, tx, tw, tv, tn) = results
    np.testing.assert_allclose(jy, ty, rtol=1e-12)
    np.testing.assert_allclose(jx, tx, rtol=1e-12)
    assert (jw is None) == (tw is None)
    if tw is not None:
        np.testing.assert_allclose(jw, tw, rtol=1e-12)
    assert jv == tv
    if node is not None:
        assert jn == tn == node


@LIBS
def test_rebase_example_from_the_issue(T):
    x = t64(T, [1.0, 2.0], rg=True)
    y = x * 2
    y += 1
    assert type(y.grad_fn).__name__ == "AddBackward0"
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "MulBackward0"
    y.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


@LIBS
def test_modified_saved_value_raises(T):
    x = t64(T, [1.0, 2.0], rg=True)
    y = x.exp()
    z = (y * y).sum()       # MulBackward0 saves y
    y.add_(1.0)
    with pytest.raises(RuntimeError, match=r"one of the variables needed for gradient computation has been "
                                           r"modified by an inplace operation: \[torch\.DoubleTensor \[2\]\]"):
        z.backward()
    # nothing is corrupted: a new graph works
    x.grad = None
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]


@LIBS
def test_version_counter_shared_by_views_and_detach(T):
    y = t64(T, [1.0, 2.0, 3.0, 4.0], rg=True) * 1
    v = y.view(2, 2)
    d = y.detach()
    assert y._version == v._version == d._version == 0
    v.mul_(2)
    assert y._version == v._version == d._version == 1
    d.add_(1)  # detach shares the storage and the counter
    assert y._version == 2
    assert y.tolist() == [3.0, 5.0, 7.0, 9.0]


@LIBS
def test_writes_through_data_bypass_the_version_counter(T):
    x = t64(T, [1.0, 2.0], rg=True)
    y = x.exp()
    z = (y * 2).sum()
    y.data.mul_(10)
    assert y._version == 0
    z.backward()   # no error: .data is not tracked, and the gradient uses the changed value
    np.testing.assert_allclose(x.grad.numpy(), 20 * np.exp([1.0, 2.0]), rtol=1e-12)


@LIBS
def test_inplace_on_leaf_requiring_grad(T):
    x = t64(T, [1.0, 2.0], rg=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        x.add_(1)
    with T.no_grad():
        x.add_(1)     # allowed under no_grad
    assert x.tolist() == [2.0, 3.0] and x._version == 1
    (x * x).sum().backward()
    assert x.grad.tolist() == [4.0, 6.0]


@LIBS
def test_inplace_with_an_operand_requiring_grad_makes_a_history(T):
    a = t64(T, [1.0, 2.0])            # does not require grad
    w = t64(T, [3.0, 4.0], rg=True)
    a.mul_(w)
    assert a.requires_grad and not a.is_leaf
    a.sum().backward()
    assert w.grad.tolist() == [1.0, 2.0]


VIEW_CASES = {
    "slice_mul_": lambda y: y[0:2].mul_(3.0),
    "select_add_": lambda y: y[1].add_(5.0),
    "reshape_add_": lambda y: y.view(2, 2).add_(1.0),
    "transpose_mul_": lambda y: y.view(2, 2).t().mul_(2.0),
    "nested_view": lambda y: y.view(2, 2)[1].mul_(-1.0),
    "setitem_on_view": lambda y: y.view(2, 2).__setitem__((0, 1), 7.0),
    "slice_copy_": lambda y: y[1:3].copy_(y[0:2] * 10),
}


@pytest.mark.parametrize("name", sorted(VIEW_CASES))
def test_inplace_through_a_view_updates_the_base_like_torch(name):
    results = []
    for T in LIB_MODULES:
        x = t64(T, [1.0, -2.0, 3.0, 0.5], rg=True)
        y = x * 2.0
        VIEW_CASES[name](y)
        version = y._version
        (y * y * x).sum().backward()
        results.append((y.detach().numpy().copy(), x.grad.numpy().copy(), version))
    (jy, jg, jv), (ty, tg, tv) = results
    np.testing.assert_allclose(jy, ty, rtol=1e-12)
    np.testing.assert_allclose(jg, tg, rtol=1e-12)
    assert jv == tv


@LIBS
def test_views_from_indexing_share_the_counter(T):
    y = t64(T, [1.0, 2.0, 3.0], rg=True) * 1
    v = y[1:]
    assert v._version == y._version == 0
    v.add_(1.0)
    assert y._version == v._version == 1
    assert y.tolist() == [1.0, 3.0, 4.0]


@LIBS
@pytest.mark.parametrize("case", ["input_saved", "result_saved", "nothing_saved"])
def test_modified_one_element_saved_value(T, case):
    # one-element values are copied into jitgrad's tape when saved: the check must still see
    # an in-place write to them
    x = T.tensor(2.0, dtype=T.float64, requires_grad=True)
    a = x * 2
    if case == "input_saved":
        out = a * a          # MulBackward0 saved a
    elif case == "result_saved":
        out = a.exp()        # ExpBackward0 saved its result, which is modified below
        a = out
    else:
        out = a + 1          # AddBackward0 saves nothing
    a.add_(1)
    if case == "nothing_saved":
        out.backward()
        assert x.grad.item() == 2.0
    else:
        with pytest.raises(RuntimeError, match=r"modified by an inplace operation: \[torch\.DoubleTensor \[\]\]"):
            out.backward()
        assert x.grad is None
