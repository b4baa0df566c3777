"""Inference mode and inference tensors, run on jitgrad and on torch 2.13 alike (T).

What is checked: which tensors are inference tensors (made in inference mode, views of
them), their version counter, the rules for mixing them with normal tensors (functional,
view and in-place ops on either side of the boundary) and the errors PyTorch raises for
each forbidden case, with its wording."""
import pytest
from conftest import LIBS

FORBID_INPLACE = "Inplace update to inference tensor outside InferenceMode is not allowed"
NO_SAVE = "Inference tensors cannot be saved for backward"
VIEW_INPLACE = "A view was created in inference mode and is being modified inplace in normal mode"
VIEW_REBASED = "A view was created in inference mode and its base or another view of its base has been modified"


def _add(x):
    return x.add_(2)


def _setitem(x):
    x[0] = 3.0


def _transpose(x):
    return x.transpose_(0, 1)


INPLACE = pytest.mark.parametrize("fn", [_add, _setitem, _transpose], ids=["add_", "setitem", "transpose_"])
RG = pytest.mark.parametrize("rg", [False, True], ids=["plain", "requires_grad"])


@LIBS
def test_mode_flag_nests_and_restores(T):
    assert not T.is_inference_mode_enabled()
    with T.inference_mode():
        assert T.is_inference_mode_enabled() and not T.is_grad_enabled()
        with T.inference_mode(False):
            assert not T.is_inference_mode_enabled() and T.is_grad_enabled()
        assert T.is_inference_mode_enabled()
    assert not T.is_inference_mode_enabled() and T.is_grad_enabled()


@LIBS
@RG
def test_decorated_function_returns_inference_tensor(T, rg):
    @T.inference_mode()
    def square(x):
        assert T.is_inference_mode_enabled()
        return x * x

    out = square(T.ones(2, 3, requires_grad=rg))
    assert T.is_inference(out) and out.is_inference() and not out.requires_grad


@LIBS
def test_factories_make_inference_tensors(T):
    with T.inference_mode():
        a = T.ones(2, 3)
        b = T.zeros(2, requires_grad=True)  # requires_grad is kept
        c = T.tensor([1.0, 2.0]).requires_grad_(False)
    assert a.is_inference() and not a.requires_grad
    assert b.is_inference() and b.requires_grad
    assert c.is_inference() and not c.requires_grad
    assert not T.ones(2).is_inference()


@LIBS
def test_inference_tensor_has_no_version_counter(T):
    with T.inference_mode():
        a = T.ones(2)
    with pytest.raises(RuntimeError, match="Inference tensors do not track version counter"):
        a._version
    assert T.ones(2)._version == 0


@LIBS
def test_normal_tensor_written_in_inference_mode_keeps_its_version(T):
    s = T.ones(2, 3, requires_grad=True)
    a = s.clone()
    out = a * a  # saves a
    with T.inference_mode():
        a.add_(2)
    assert not a.is_inference() and a._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(T.ones_like(out))


@LIBS
@RG
def test_ops_in_inference_mode(T, rg):
    with T.inference_mode():
        c = T.ones(2, 3, requires_grad=rg)
        prod = c * c
        view = c.view(-1)
        row = c[0]
        c.add_(1)  # an inference tensor may be written in inference mode
        assert c.requires_grad == rg
    for t in (prod, view, row):
        assert t.is_inference() and not t.requires_grad
    assert c.is_inference()


@LIBS
@RG
def test_inference_tensor_outside_inference_mode(T, rg):
    with T.inference_mode():
        c = T.ones(2, 3, requires_grad=rg)
    doubled = c + T.ones(2, 3)  # a normal tensor among the inputs: autograd runs
    assert not doubled.is_inference() and doubled.requires_grad == rg
    view = c.view(-1)  # a view of an inference tensor: an inference tensor, not a view
    assert view.is_inference() and not view.requires_grad and not view._is_view() and view.is_leaf
    assert c.t().is_inference() and c[0].is_inference()


@LIBS
@INPLACE
def test_inplace_on_inference_tensor_outside_inference_mode(T, fn):
    with T.inference_mode():
        c = T.ones(2, 3)
        leaf = T.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=FORBID_INPLACE):
        fn(c)
    if fn is _add:
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
            fn(leaf)
        with pytest.raises(RuntimeError, match=FORBID_INPLACE):
            c[0] = 1.0
        with T.no_grad(), pytest.raises(RuntimeError, match=FORBID_INPLACE):
            c.mul_(2)


@LIBS
@RG
@INPLACE
def test_normal_tensor_written_in_inference_mode_stays_normal(T, rg, fn):
    a = T.ones(2, 3, requires_grad=rg).clone()
    with T.inference_mode():
        fn(a)
        fn(a)
        v = a.view(-1)
        assert not a.is_inference() and a.requires_grad == rg
        assert not v.is_inference() and v.requires_grad == rg
    fn(a)
    assert not a.is_inference() and a.requires_grad == rg


@LIBS
@RG
def test_view_of_normal_tensor_made_in_inference_mode(T, rg):
    a = T.ones(2, 3, requires_grad=rg).clone()
    with T.inference_mode():
        out = a.view(-1)
        tmp = out.view(-1)
        for v in (out, tmp):
            assert not v.is_inference() and v.requires_grad == rg and v._is_view() and v.is_leaf
    squared = out * out
    assert not squared.is_inference() and squared.requires_grad == rg
    if rg:
        with pytest.raises(RuntimeError, match=VIEW_INPLACE):
            out.add_(2)
    else:
        out.add_(2)
        assert a._version == 1
    assert out.view(2, 3).requires_grad == rg


@LIBS
@RG
def test_view_made_in_inference_mode_written_there(T, rg):
    a = T.ones(2, 3, requires_grad=rg).clone()
    with T.inference_mode():
        tmp = a.view(-1).view(-1)
        tmp.add_(2)
        assert not tmp.is_inference() and tmp.requires_grad == rg
        assert a._version == tmp._version == 1


@LIBS
@RG
@INPLACE
def test_inplace_on_view_made_in_inference_mode(T, rg, fn):
    a = T.ones(2, 3, requires_grad=rg).clone()
    with T.inference_mode():
        view = a.view_as(a)
    if rg:  # (setitem writes a view of the view: torch words it "Output 0 of Select is a view of a view which")
        with pytest.raises(RuntimeError, match="created in inference mode and is being modified inplace in normal"):
            fn(view)
    else:
        fn(view)


@LIBS
@RG
def test_view_made_in_inference_mode_after_its_base_is_written(T, rg):
    a = T.ones(2, 3, requires_grad=rg).clone()
    with T.inference_mode():
        view = a.view(-1)
    a.add_(2)
    if rg:
        with pytest.raises(RuntimeError, match=VIEW_REBASED):
            view.grad_fn
        with pytest.raises(RuntimeError, match=VIEW_REBASED):
            view.is_leaf
        assert "grad_fn=<Invalid>" in repr(view)
    else:
        assert view.grad_fn is None


@LIBS
def test_mixing_inference_and_normal_tensors(T):
    s = T.ones(2, 3, requires_grad=True)
    with T.inference_mode():
        c = T.ones(2, 3, requires_grad=True)
    out = c.add(s)  # add saves nothing: allowed, and c gets its gradient
    assert not out.is_inference() and out.requires_grad
    out.backward(T.ones_like(out))
    assert c.grad.tolist() == [[1.0] * 3] * 2
    with pytest.raises(RuntimeError, match=NO_SAVE):
        c * s
    # an op on inference tensors alone runs without autograd (they have no autograd key)
    assert not c.sin().requires_grad and not (c * c).requires_grad and not c.sum().requires_grad
    assert (c.sin() * c).requires_grad  # c.sin() is saved, c is not
    with pytest.raises(RuntimeError, match=NO_SAVE):
        s @ c.t()
    with T.inference_mode():
        d = T.ones(2, 3)
    a = s.clone()
    with pytest.raises(RuntimeError, match=NO_SAVE):
        a.mul_(d)
    b = T.ones(2, 3).clone()
    b.mul_(d)  # nothing requires grad: nothing is saved


@LIBS
@RG
def test_view_as_across_the_boundary(T, rg):
    s = T.ones(1, 2, 3, requires_grad=rg)
    with T.inference_mode():
        c = T.ones(1, 2, 3)
    tmp = c.view_as(s)
    assert tmp.is_inference() and not tmp.requires_grad
    tmp = s.view_as(c)
    assert not tmp.is_inference() and tmp.requires_grad == rg


@LIBS
def test_detach_and_data_inside_inference_mode(T):
    x = T.ones(3, requires_grad=True)
    with T.inference_mode():
        c = T.ones(3)
        assert not x.detach().is_inference() and not x.data.is_inference()
    assert c.detach().is_inference() and c.data.is_inference()
