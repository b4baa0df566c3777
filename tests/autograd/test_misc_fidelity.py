"""Smaller PyTorch 2.13 behaviours of the autograd surface: the non-leaf .grad warning, user
attributes on tensors, attribute deletion and .data assignment errors, numpy() under
no_grad, anomaly mode's error reports, no numpy floating-point warnings, and a 2,000-deep
reentrant backward. Each test runs on jitgrad and on torch (the LIBS parameter)."""
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from conftest import LIBS, ROOT, assert_close

pytest.importorskip("torch")


def warnings_of(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn()
    return [(x.category, str(x.message)) for x in w]


@LIBS
def test_reading_a_non_leaf_grad_warns_unless_it_is_retained_or_set(T):
    x = T.ones(2, requires_grad=True)
    y = x * 2
    w = warnings_of(lambda: y.grad)
    assert len(w) == 1 and w[0][0] is UserWarning
    assert w[0][1].startswith("The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its "
                              ".grad attribute won't be populated during autograd.backward().")
    assert warnings_of(lambda: x.grad) == []
    y.retain_grad()
    assert warnings_of(lambda: y.grad) == []
    z = x * 3
    z.grad = T.ones(2)
    assert warnings_of(lambda: z.grad) == []
    assert warnings_of(lambda: (x * 2).detach().grad) == []


@LIBS
def test_tensors_take_user_attributes(T):
    t = T.ones(2, requires_grad=True)
    t.label = "weights"
    t.step = 3
    assert (t.label, t.step) == ("weights", 3)
    assert not hasattr(T.ones(2), "label")
    y = t * 2
    y.tag = "activation"
    y.sum().backward()
    assert y.tag == "activation"


@LIBS
def test_attribute_deletion_and_data_assignment_errors(T):
    x = T.randn(5, 5, requires_grad=True)
    x.grad = T.ones(5, 5)
    del x.grad
    assert x.grad is None
    with pytest.raises(RuntimeError, match="^Deleting tensor data is not allowed. Delete tensor instead!$"):
        del x.data
    with pytest.raises(TypeError, match="^Variable data has to be a tensor, but got NoneType$"):
        x.data = None
    with pytest.raises(RuntimeError, match="^requires_grad must be a bool$"):
        del x.requires_grad
    with pytest.raises(RuntimeError, match="^Deletion of _grad_fn not allowed. Detach tensor instead!$"):
        del x._grad_fn
    with pytest.raises(RuntimeError, match="^Deletion of _backwards_hooks not allowed!$"):
        del x._backward_hooks
    assert x._backward_hooks is None
    h = lambda g: g  # noqa: E731
    x.register_hook(h)
    assert list(x._backward_hooks.values()) == [h]


@LIBS
def test_integer_data_on_a_leaf_that_requires_grad_is_rejected(T):
    a = T.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="^data set to a tensor that requires gradients must be floating point "
                                           "or complex dtype$"):
        a.data = T.ones(2, dtype=T.int64)
    assert a.dtype == T.float32
    a.data = T.ones(3, dtype=T.float64)  # another float dtype and size is fine
    assert a.dtype == T.float64 and a.shape == (3,)
    b = T.ones(2)
    b.data = T.ones(2, dtype=T.int64)  # without requires_grad too
    assert b.dtype == T.int64


@LIBS
def test_numpy_on_a_tensor_that_requires_grad(T):
    x = T.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="Can't call numpy\\(\\) on Tensor that requires grad. Use "
                                           "tensor.detach\\(\\).numpy\\(\\) instead."):
        x.numpy()
    with T.no_grad():
        assert x.numpy().tolist() == [1.0, 2.0]
    assert x.numpy(force=True).tolist() == [1.0, 2.0]


@LIBS
def test_anomaly_mode_names_the_node_whose_saved_value_was_modified(T):
    msgs = []
    with pytest.raises(RuntimeError, match="one of the variables needed for gradient computation has been "
                                           "modified by an inplace operation"):
        with warnings.catch_warnings(record=True) as w:
            with T.autograd.detect_anomaly():
                a = T.randn(5, requires_grad=True)
                d1 = a + 1
                d2 = d1 ** 2
                d1 += 1
                T.autograd.grad(d2.sum(), a)
        msgs = [str(x.message) for x in w]
    msgs = [str(x.message) for x in w]
    assert len(msgs) == 2
    assert "Anomaly Detection has been enabled" in msgs[0]
    assert msgs[1].startswith("Error detected in PowBackward0. Traceback of forward call that caused the error:")
    assert "d2 = d1 ** 2" in msgs[1]


def nan_pair(T):
    class Inner(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, fail_first):
            ctx.fail_first = fail_first
            return x * 2

        @staticmethod
        def backward(ctx, g):
            bad = g * float("nan")
            return (bad, None) if ctx.fail_first else (g, None)

    class Outer(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sum(0, keepdim=True)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return Inner.apply(g.expand(3) * x, True)

    return Outer


@LIBS
def test_anomaly_mode_reports_a_nested_node_and_the_node_that_made_it(T):
    Outer = nan_pair(T)
    x = T.rand(3, requires_grad=True)
    with warnings.catch_warnings(record=True) as w:
        with pytest.raises(RuntimeError, match="Function 'InnerBackward' returned nan values in its 0th output."):
            with T.autograd.detect_anomaly():
                out = Outer.apply(x)  # made in anomaly mode: it has a traceback
                (gx,) = T.autograd.grad(out, (x,), create_graph=True)
                gx.sum().backward()
    msgs = [str(m.message) for m in w]
    assert len(msgs) == 3, msgs
    assert msgs[1].startswith("Error detected in InnerBackward. Traceback of forward call that caused the error:")
    assert "Inner.apply" in msgs[1]
    assert "Previous calculation was induced by OuterBackward. Traceback of forward call that induced the " \
           "previous calculation:" in msgs[2]
    assert "Outer.apply(x)" in msgs[2]


@LIBS
def test_anomaly_mode_without_a_forward_traceback(T):
    Outer = nan_pair(T)
    x = T.rand(3, requires_grad=True)
    out = Outer.apply(x)
    (gx,) = T.autograd.grad(out, (x,), create_graph=True)  # Inner is made outside anomaly mode
    with warnings.catch_warnings(record=True) as w:
        with pytest.raises(RuntimeError, match="Function 'InnerBackward' returned nan values in its 0th output."):
            with T.autograd.detect_anomaly():
                gx.sum().backward()
    msgs = [str(m.message) for m in w]
    assert len(msgs) == 2
    assert msgs[1].startswith("Error detected in InnerBackward. No forward pass information available. Enable "
                              "detect anomaly during forward pass for more information.")


@LIBS
def test_division_by_zero_and_log_of_zero_give_no_warning(T):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = T.tensor([0.0, 1.0, -1.0], dtype=T.float64, requires_grad=True)
        y = (a / 0.0).sum() + T.log(a).sum() + (a ** -1.0).sum() + T.sqrt(a).sum()
        y.backward()
        (g,) = T.autograd.grad((T.log(a) * a).sum(), a, create_graph=True)
    assert w == []
    assert np.isnan(a.grad.detach().numpy()).any() and np.isnan(g.detach().numpy()).any()


def test_numpy_warnings_stay_off_under_warnings_as_errors():
    """A suite run with -W error must not fail on jitgrad's own inf/nan arithmetic."""
    code = textwrap.dedent("""
        import jitgrad
        x = jitgrad.tensor([0.0], requires_grad=True)
        (x / 0.0 + jitgrad.log(x)).sum().backward()
        print(x.grad.tolist())
    """)
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[inf]"


@LIBS
def test_a_two_thousand_deep_reentrant_backward(T):
    class DeepReentrant(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with T.enable_grad():
                ctx.x = x.detach().requires_grad_() - 1
            return ctx.x.detach()

        @staticmethod
        def backward(ctx, g):
            if ctx.x < 0:
                return g
            with T.enable_grad():
                DeepReentrant.apply(ctx.x).sum().backward()
            return g

    for depth in (2000.0, 200.0):
        v = T.tensor(depth, requires_grad=True)
        DeepReentrant.apply(v).sum().backward()
        assert v.grad.item() == 1.0


@LIBS
def test_reentrant_backward_deep_enough_for_a_new_thread_keeps_the_grad_mode(T):
    modes = []

    class Nest(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, n):
            ctx.n = n
            return x * 2

        @staticmethod
        def backward(ctx, g):
            modes.append(T.is_grad_enabled())
            if ctx.n > 0:
                with T.enable_grad():
                    y = T.ones(1, requires_grad=True)
                    (Nest.apply(y, ctx.n - 1) + y / 0.0 * 0.0).sum().backward()  # nan: no warning either
                    assert np.isnan(y.grad.numpy()).all()
            return g * 2, None

    x = T.ones(1, requires_grad=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        Nest.apply(x, 100).sum().backward()
    assert w == []
    assert modes == [False] * 101
    assert_close(x.grad, [2.0])


@LIBS
def test_a_size_stays_a_size_when_sliced_added_or_repeated(T):
    s = T.ones(2, 3).shape
    assert repr(s[1:]) == "torch.Size([3])" and repr(s[::-1]) == "torch.Size([3, 2])"
    assert repr(s + (4,)) == "torch.Size([2, 3, 4])" and repr((1,) + s) == "torch.Size([1, 2, 3])"
    assert repr(s * 2) == "torch.Size([2, 3, 2, 3])" and repr(2 * s) == "torch.Size([2, 3, 2, 3])"
    assert s[0] == 2 and type(s[0]) is int
    assert f"got {s[1:]}" == "got torch.Size([3])"
    assert s[1:] == (3,) and s[1:].numel() == 3
