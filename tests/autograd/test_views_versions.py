"""Views, in-place writes and version counters, run on jitgrad and on torch 2.13 alike (T).

What is checked: the version counter shared by a tensor, its views and detach(), kept by
`x.data = y` and not shared by `.data`; the histories of views after an in-place write to
their base or to another view (gradients compared in float64); PyTorch's rules and errors
for in-place writes on views made under no_grad, on views of leaves, on overlapping
expand() results and on views that custom Functions return or mark dirty."""
import re
import warnings

import numpy as np
import pytest
from conftest import LIBS, assert_close

NO_GRAD_VIEW = "A view was created in no_grad mode and is being modified inplace with grad mode enabled"
NO_GRAD_REBASED = "A view was created in no_grad mode and its base or another view of its base has been modified"
LEAF_VIEW = "a view of a leaf Variable that requires grad is being used in an in-place operation."
CUSTOM_VIEW = "Output 0 of {} is a view and is being modified inplace. This view was created inside a custom Function"


def _leaf(T, *shape, seed=0):
    data = np.random.default_rng(seed).standard_normal(shape)
    return T.tensor(data, dtype=T.float64, requires_grad=True)


# --- version counters ------------------------------------------------------------------------
@LIBS
def test_views_and_detach_share_the_version_counter(T):
    x = T.ones(2, 3)
    v, d = x[0], x.detach()
    v.add_(1)
    d.mul_(2)
    assert x._version == v._version == d._version == 2


@LIBS
def test_write_through_a_detached_scalar_is_seen_by_backward(T):
    x = T.tensor(1.5, requires_grad=True)
    y = x ** 2  # saves x
    x.detach().zero_()
    with pytest.raises(RuntimeError, match="has been modified by an inplace"):
        y.backward()


@LIBS
def test_data_alias_has_a_counter_of_its_own(T):
    x = T.ones(3, requires_grad=True)
    y = x * x
    alias = x.data
    alias.add_(1)  # unseen, as PyTorch's .data is
    assert x._version == 0 and alias._version == 1
    y.backward(T.ones(3))
    assert x.grad.tolist() == [4.0, 4.0, 4.0]


@LIBS
def test_assigning_data_keeps_the_tensors_counter(T):
    y, z = T.ones(3), T.zeros(3)
    y.add_(1)
    z.add_(1)
    z.add_(1)
    y.data = z
    assert (y._version, z._version) == (1, 2)
    y.add_(1)  # (z's counter counts it too on jitgrad: see README, differences)
    assert y._version == 2
    assert z.tolist() == [3.0, 3.0, 3.0]


# --- histories of views after in-place writes ---------------------------------------------------
def _base_written_after_view(T):
    x = _leaf(T, 2, 3)
    a = x.clone()
    v = a[0]
    a.mul_(2)
    return x, (v * v).sum()


def _sibling_view_written(T):
    x = _leaf(T, 2, 3)
    a = x * 1.0
    v, w = a[0], a[:, 1]
    v.mul_(3)
    return x, (w * w).sum() + (a * a).sum()


def _view_of_view_written(T):
    x = _leaf(T, 2, 3)
    a = x * 2.0
    v = a.view(6)
    v2 = v[1:3]
    v2.mul_(v2.detach() + 5)
    return x, (a * a).sum() + (v * 10).sum() + v2.sum()


def _written_under_no_grad(T):
    x = _leaf(T, 2, 3)
    a = x.clone()
    v = a[1]
    with T.no_grad():
        a.mul_(2)
    return x, (v * a[1]).sum()


def _setitem_on_view(T):
    x = _leaf(T, 3, 4)
    w = _leaf(T, 4, seed=1)
    a = x.clone()
    rows = a[1:]
    rows[0] = w * 2
    return x, (a.sin() * 3).sum() + rows.pow(2).sum()


def _transposed_in_place(T):
    x = _leaf(T, 2, 3)
    a = x.clone()
    row = a[0]
    a.transpose_(0, 1)
    col = a[1]
    a.mul_(a.detach() + 1)
    return x, a.sum() + (row * 2).sum() + (col * 10).sum()


def _view_transposed_in_place(T):
    x = _leaf(T, 3, 4)
    a = x.clone()
    v = a[:, 1:]
    v.transpose_(0, 1)
    v.mul_(v.detach() + 2)
    return x, a.pow(2).sum() + (v[0] * 3).sum()


@LIBS
@pytest.mark.parametrize("case", [_base_written_after_view, _sibling_view_written, _view_of_view_written,
                                  _written_under_no_grad, _setitem_on_view, _transposed_in_place,
                                  _view_transposed_in_place])
def test_view_histories_follow_inplace_writes(T, case):
    import torch

    x, loss = case(T)
    loss.backward()
    tx, tloss = case(torch)
    tloss.backward()
    assert_close(loss, tloss)
    assert_close(x.grad, tx.grad)


@LIBS
def test_retain_grad_follows_an_inplace_write(T):
    x = _leaf(T, 3)
    a = x.clone()
    a.retain_grad()
    a.mul_(2)
    (a * a).sum().backward()
    assert_close(a.grad, (x * 4).detach())
    v = x.clone()[1:]
    v.retain_grad()
    v.mul_(3)
    (v * v).sum().backward()
    assert_close(v.grad, (x[1:] * 6).detach())


# --- views made under no_grad -------------------------------------------------------------------
@LIBS
def test_view_made_under_no_grad(T):
    x = T.ones(3, requires_grad=True)
    a = x.clone()
    with T.no_grad():
        v = a[0:2]
    assert v.requires_grad and v.is_leaf and v.grad_fn is None and v._is_view() and v._base is a
    with pytest.raises(RuntimeError, match=NO_GRAD_VIEW):
        v.mul_(2)
    with T.no_grad():
        w = x[1:]
    with pytest.raises(RuntimeError, match=NO_GRAD_VIEW):
        w.add_(1)  # of a leaf: the no_grad rule is reported first
    with pytest.raises(RuntimeError, match="is a view of a view which was created in no_grad mode and is being"):
        v[0:1].add_(1)
    with T.no_grad():
        v.mul_(2)  # inside no_grad it is allowed
    a.mul_(2)
    with pytest.raises(RuntimeError, match=NO_GRAD_REBASED):
        v.grad_fn
    assert repr(v).endswith("grad_fn=<Invalid>)")


@LIBS
def test_view_made_under_no_grad_of_a_plain_tensor(T):
    b = T.ones(3)
    with T.no_grad():
        u = b[0:2]
    assert not u.requires_grad
    u.add_(1)
    b.mul_(2)
    assert u.grad_fn is None and b.tolist() == [4.0, 4.0, 2.0]


# --- in-place rules -----------------------------------------------------------------------------
@LIBS
def test_inplace_on_a_view_of_a_leaf(T):
    x = T.ones(2, 3, requires_grad=True)
    for view in (x[0], x.view(6), x.t(), x[:, 1:], x.unsqueeze(0)):
        with pytest.raises(RuntimeError, match=LEAF_VIEW):
            view.add_(1)
    with pytest.raises(RuntimeError, match=LEAF_VIEW):
        x[0][1:].mul_(2)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        x.add_(1)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        x.t_()
    with T.no_grad():
        x[0].add_(1)
    assert x.tolist() == [[2.0] * 3, [1.0] * 3]


@LIBS
def test_detach_inplace(T):
    x = T.ones(4, 4, requires_grad=True)
    view = x[1:3]
    with pytest.raises(RuntimeError, match=re.escape("Can't detach views in-place. Use detach() instead")):
        view.detach_()
    x.detach_()  # detaching the base leaves its views as they were
    assert not x.requires_grad and view.requires_grad and view.grad_fn is not None and view._base is x


@LIBS
def test_expand_result_is_a_view_that_may_be_written_when_nothing_repeats(T):
    x = T.ones(3)
    e = x.expand(1, 3)
    assert e._is_view()
    e.add_(1)
    assert x.tolist() == [2.0, 2.0, 2.0]
    overlapping = T.ones(3, 1).expand(3, 2)
    with pytest.raises(RuntimeError, match="unsupported operation: more than one element of the written-to tensor"):
        overlapping.add_(1)
    with pytest.raises(RuntimeError, match="unsupported operation: more than one element of the written-to tensor"):
        overlapping[0] = 2.0


# --- custom Functions -------------------------------------------------------------------------
def _functions(T):
    class ViewOf(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g

    class Same(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class AddOne(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class Doubles(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            ctx.save_for_backward(x)
            return x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2

    class MarksOther(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.clone()
            ctx.mark_dirty(y)
            return y

        @staticmethod
        def backward(ctx, g):
            return g

    return ViewOf, Same, AddOne, Doubles, MarksOther


@LIBS
def test_inplace_on_views_a_function_returns(T):
    ViewOf, Same, *_ = _functions(T)
    x = T.ones(3, requires_grad=True)
    a = x.clone()
    for fn in (ViewOf, Same):
        for inp in (a, x):
            out = fn.apply(inp)
            assert out is not inp and out._is_view()
            with pytest.raises(RuntimeError, match=CUSTOM_VIEW.format(fn.__name__)):
                out.add_(1)


@LIBS
def test_mark_dirty_rules(T):
    _, _, AddOne, _, MarksOther = _functions(T)
    x = T.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=LEAF_VIEW):
        AddOne.apply(x[0:2])
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad has been used in an in-place"):
        AddOne.apply(x)
    with pytest.warns(UserWarning, match="ctx.mark_dirty\\(\\) received a tensor that was not an input"):
        MarksOther.apply(x)


@LIBS
def test_mark_dirty_on_a_view_rebases_its_base(T):
    import torch

    def run(lib):
        x = _leaf(lib, 2, 3)
        a = x * 2.0
        out = _functions(lib)[2].apply(a[1])
        return x, out, (a * a).sum() + (out * 3).sum()

    x, out, loss = run(T)
    assert out._is_view()
    loss.backward()
    tx, _, tloss = run(torch)
    tloss.backward()
    assert_close(loss, tloss)
    assert_close(x.grad, tx.grad)


@LIBS
def test_mark_dirty_and_save_does_not_keep_the_tensor_alive(T):
    import gc
    import weakref

    _, _, _, Doubles, _ = _functions(T)
    gc.collect()
    gc.disable()
    try:
        x = T.ones(3, requires_grad=True)
        y = x.clone()
        out = Doubles.apply(y)
        out.sum().backward()
        ref = weakref.ref(y)
        del y, out
        assert ref() is None
    finally:
        gc.enable()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_no_warning_for_marking_an_input():
    import jitgrad

    *_, AddOne, _, _ = _functions(jitgrad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AddOne.apply(jitgrad.ones(3, requires_grad=True).clone())


@LIBS
def test_hooks_of_views_after_an_inplace_write(T):
    fired = []
    base = T.tensor([1.0, 2.0], requires_grad=True).clone()
    view, view2 = base[:], base[:]
    view.register_hook(lambda g: fired.append("view, before"))
    view2.register_hook(lambda g: fired.append("view2, before"))
    view.mul_(2)
    view2.grad_fn  # torch refreshes a view's grad_fn when it is read
    view2.register_hook(lambda g: fired.append(("view2, after", g.tolist())))
    (view + view2 * 3).sum().backward()
    assert fired == [("view2, after", [3.0, 3.0])]


@LIBS
def test_hooks_before_and_after_an_inplace_write(T):
    fired = []
    out = T.ones(3, requires_grad=True) * 1.0
    out.register_hook(lambda g: fired.append(("before", g.tolist())))  # the old value's gradient
    out.mul_(2)
    out.register_hook(lambda g: fired.append(("after", g.tolist())))
    out.sum().backward()
    assert sorted(fired) == [("after", [1.0] * 3), ("before", [2.0] * 3)]


@LIBS
def test_view_of_a_plain_tensor_follows_its_base_into_the_graph(T):
    r = T.tensor([2.0], dtype=T.float64, requires_grad=True)
    x = T.ones(5, dtype=T.float64)
    v = x[1]
    assert not v.requires_grad and v.grad_fn is None
    x.mul_(r)
    assert v.requires_grad
    (v * 3).backward()
    assert r.grad.tolist() == [3.0]


@LIBS
def test_detach_shares_a_counter_kept_by_data_assignment(T):
    x = T.ones(2)
    x.data = T.zeros(3)
    d = x.detach()
    d.add_(1)
    alias = x.data
    alias.detach().add_(1)
    assert x._version == d._version == 1 and alias._version == 1


@LIBS
def test_inplace_through_a_long_chain_of_views(T):
    x = T.ones(4, dtype=T.float64, requires_grad=True)
    a = x.clone()
    v = a
    for _ in range(3000):  # deeper than Python's recursion limit
        v = v.view(4)
    v.mul_(3)
    a.sum().backward()
    assert x.grad.tolist() == [3.0] * 4


def _dirty_functions(T):
    class TwoOut(T.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            a.add_(b)
            ctx.mark_dirty(a)
            return a, a + b

        @staticmethod
        def backward(ctx, ga, gab):
            return ga + gab, ga + gab

    class NotReturned(T.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            a.add_(1)
            ctx.mark_dirty(a)
            return a.clone()

        @staticmethod
        def backward(ctx, g):
            return g

    class MarksTempView(T.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            out = a.clone().view_as(a)
            ctx.mark_dirty(out)
            return out

        @staticmethod
        def backward(ctx, g):
            return g

    return TwoOut, NotReturned, MarksTempView


@LIBS
def test_mark_dirty_errors(T):
    TwoOut, NotReturned, MarksTempView = _dirty_functions(T)
    x = T.ones(2, requires_grad=True)
    b = T.ones(2, requires_grad=True)
    c, d = TwoOut.apply(x.clone(), b)  # a dirty input that is no view may come with other outputs
    (c * d).sum().backward()
    assert x.grad.tolist() == [5.0, 5.0]
    with pytest.raises(RuntimeError, match="If your Function modifies inplace an input that is a view of another "
                                           "Tensor, your Function cannot return more than one Tensor"):
        TwoOut.apply(x.clone().view_as(x), b)
    with pytest.raises(RuntimeError, match="Some elements marked as dirty during the forward method were not "
                                           "returned as output"):
        NotReturned.apply(x.clone())
    with pytest.raises(RuntimeError, match=re.escape("ctx.mark_dirty() received a tensor that was not an input.")):
        MarksTempView.apply(x.clone())


@LIBS
def test_inplace_on_outputs_of_multi_output_views(T):
    x = T.ones(2, 3, requires_grad=True)
    a = x.clone()
    for k, piece in enumerate(a.unbind()):
        with pytest.raises(RuntimeError, match=f"Output {k} of Unbind is a view and is being modified inplace. This "
                                               "view is the output of a function that returns multiple views."):
            piece.add_(1)
    with pytest.raises(RuntimeError, match="Output 1 of Split is a view and is being modified inplace"):
        a.split(1)[1].mul_(2)
    with pytest.raises(RuntimeError, match="Output 0 of Slice is a view and is being modified inplace. This view is "
                                           "the output of a function that returns multiple views"):
        a.chunk(2)[0][:, 1:].mul_(2)
    pieces = a.unbind()
    a.mul_(2)
    with pytest.raises(RuntimeError, match="Output 0 of Unbind is a view and its base or another view of its base "
                                           "has been modified inplace"):
        pieces[0].grad_fn
    plain = T.ones(2, 3).unbind()
    plain[0].add_(1)  # nothing requires grad: allowed
    with T.no_grad():
        piece = x.clone().requires_grad_().unbind()[0]  # its base requires grad
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode and is being modified inplace"):
        piece.add_(1)
    with T.inference_mode():
        c = T.ones(2, 3, requires_grad=True)
    assert all(p.is_inference() and not p.requires_grad for p in c.unbind() + (c.narrow(0, 0, 1),))
