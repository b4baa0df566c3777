"""jitgrad.nn losses (modules and functional forms; class weights, pos_weight, 1-D input): jitgrad
against torch 2.13.

Every comparison test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``)
from identical initial weights (copied in from numpy arrays) and compares values, gradients and
parameter trajectories (float64 to 1e-10 unless stated, float32 with float32 tolerance).  Tests of
random behaviour (initialisation bounds, dropout masks) run once per library, so torch also has to
pass them.
"""

import numpy as np
import pytest
from conftest import F_, both, nn_, ten, to_np

import jitgrad

torch = pytest.importorskip("torch")



# ============================================================================= 5. losses

REDUCTIONS = pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
FORMS = pytest.mark.parametrize("form", ["module", "functional"])


def loss_call(T, form, module_name, fn_name, args, **kw):
    if form == "module":
        return getattr(nn_(T), module_name)(**kw)(*args)
    return getattr(F_(T), fn_name)(*args, **kw)


@FORMS
@REDUCTIONS
def test_mse_loss(form, reduction):
    r = np.random.default_rng(12)
    a, b = r.normal(size=(4, 3)), r.normal(size=(4, 3))

    def run(T):
        x = ten(T, a, rg=True)
        loss = loss_call(T, form, "MSELoss", "mse_loss", (x, ten(T, b)), reduction=reduction)
        (loss * ten(T, np.arange(1.0, 13.0).reshape(4, 3) if reduction == "none" else 1.0)).sum().backward()
        return dict(loss=loss, grad=x.grad)

    both(run)


@FORMS
def test_mse_loss_default_reduction_is_mean(form):
    r = np.random.default_rng(13)
    a, b = r.normal(size=(3, 5)), r.normal(size=(3, 5))

    def run(T):
        x = ten(T, a, rg=True)
        loss = loss_call(T, form, "MSELoss", "mse_loss", (x, ten(T, b)))
        loss.backward()
        return dict(loss=loss, grad=x.grad, shape=list(loss.shape))

    j, t = both(run)
    assert t["shape"] == []


TARGETS = np.array([0, 3, 1, 4, 2, 3, 0], dtype=np.int64)


@FORMS
@REDUCTIONS
@pytest.mark.parametrize("ignore", ["none", "default", "custom"])
def test_nll_loss(form, reduction, ignore):
    r = np.random.default_rng(14)
    logits = r.normal(size=(7, 5))
    tgt = TARGETS.copy()
    kw = dict(reduction=reduction)
    if ignore == "default":
        tgt[[1, 4]] = -100
    elif ignore == "custom":
        kw["ignore_index"] = 3          # targets 1 and 5 are 3
    g = np.arange(1.0, 8.0)

    def run(T):
        z = ten(T, logits, rg=True)
        lsm = F_(T).log_softmax(z, dim=1)
        loss = loss_call(T, form, "NLLLoss", "nll_loss", (lsm, T.tensor(tgt, dtype=T.int64)), **kw)
        (loss * ten(T, g) if reduction == "none" else loss).sum().backward()
        return dict(loss=loss, grad=z.grad)

    both(run)


@FORMS
@REDUCTIONS
@pytest.mark.parametrize("case", ["plain", "default_ignore", "custom_ignore", "smoothing", "smoothing_ignore"])
def test_cross_entropy(form, reduction, case):
    r = np.random.default_rng(15)
    logits = r.normal(size=(7, 5)) * 2
    tgt = TARGETS.copy()
    kw = dict(reduction=reduction)
    if case in ("default_ignore", "smoothing_ignore"):
        tgt[[0, 5]] = -100
    if case == "custom_ignore":
        kw["ignore_index"] = 0          # targets 0 and 6 are 0
    if case.startswith("smoothing"):
        kw["label_smoothing"] = 0.1
    g = np.arange(1.0, 8.0)

    def run(T):
        z = ten(T, logits, rg=True)
        loss = loss_call(T, form, "CrossEntropyLoss", "cross_entropy", (z, T.tensor(tgt, dtype=T.int64)), **kw)
        (loss * ten(T, g) if reduction == "none" else loss).sum().backward()
        return dict(loss=loss, grad=z.grad)

    both(run)


def test_cross_entropy_float32():
    r = np.random.default_rng(16)
    logits = (r.normal(size=(6, 4)) * 3).astype(np.float32)
    tgt = np.array([0, 1, 2, 3, 1, 0], dtype=np.int64)

    def run(T):
        z = ten(T, logits, "float32", rg=True)
        loss = nn_(T).CrossEntropyLoss()(z, T.tensor(tgt, dtype=T.int64))
        loss.backward()
        return dict(loss=loss, grad=z.grad)

    both(run, dtype="float32")


def test_cross_entropy_matches_log_softmax_plus_nll():
    r = np.random.default_rng(17)
    logits = r.normal(size=(7, 5))

    def run(T):
        F = F_(T)
        z = ten(T, logits)
        t = T.tensor(TARGETS, dtype=T.int64)
        return dict(ce=F.cross_entropy(z, t), nll=F.nll_loss(F.log_softmax(z, dim=1), t))

    j, _ = both(run)
    np.testing.assert_allclose(to_np(j["ce"]), to_np(j["nll"]), rtol=1e-12)


@FORMS
@REDUCTIONS
@pytest.mark.parametrize("targets", ["binary", "soft"])
def test_bce_with_logits(form, reduction, targets):
    r = np.random.default_rng(18)
    logits = r.normal(size=(5, 3)) * 3
    y = (r.random(size=(5, 3)) < 0.5).astype(np.float64) if targets == "binary" else r.random(size=(5, 3))
    g = np.arange(1.0, 16.0).reshape(5, 3)

    def run(T):
        z = ten(T, logits, rg=True)
        loss = loss_call(T, form, "BCEWithLogitsLoss", "binary_cross_entropy_with_logits", (z, ten(T, y)),
                         reduction=reduction)
        (loss * ten(T, g) if reduction == "none" else loss).sum().backward()
        return dict(loss=loss, grad=z.grad)

    both(run)


def test_bce_with_logits_at_zero_logit():
    """At logit 0 the gradient is sigmoid(0) - y (torch's analytic formula, no kink)."""
    logits = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, -1.0]])
    y = np.array([[1.0, 0.0, 0.3], [0.5, 1.0, 0.0]])

    def run(T):
        z = ten(T, logits, rg=True)
        loss = F_(T).binary_cross_entropy_with_logits(z, ten(T, y), reduction="sum")
        loss.backward()
        return dict(loss=loss, grad=z.grad)

    both(run)


def test_bce_with_logits_large_logits_are_finite():
    logits = np.array([[-100.0, 100.0, 50.0], [-50.0, 20.0, 30.0]])
    y = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])

    def run(T):
        z = ten(T, logits, rg=True)
        loss = F_(T).binary_cross_entropy_with_logits(z, ten(T, y))
        loss.backward()
        return dict(loss=loss, grad=z.grad)

    j, _ = both(run)
    assert np.isfinite(to_np(j["loss"])).all()


# ============================================================================= 9. class weights, pos_weight, 1-D input

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_class_weights(reduction, smoothing):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((6, 4)), rng.random(4) + 0.5
    t = np.array([0, 3, 1, -100, 2, 3])

    def run(T):
        xi = ten(T, x, rg=True)
        loss = nn_(T).CrossEntropyLoss(weight=ten(T, w), reduction=reduction, label_smoothing=smoothing)(
            xi, T.tensor(t))
        g, = T.autograd.grad(loss.sum(), xi)
        return loss, g

    both(run)


def test_nll_and_cross_entropy_single_sample():
    x = np.random.default_rng(4).standard_normal(5)

    def run(T):
        xi = ten(T, x, rg=True)
        a = F_(T).cross_entropy(xi, T.tensor(2))
        b = F_(T).nll_loss(xi, T.tensor(1), reduction="none")
        g, = T.autograd.grad(a + b, xi)
        return a, b, g

    both(run)


def test_bce_with_logits_weight_and_pos_weight():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((6, 4)), (rng.random((6, 4)) > 0.5) * 1.0
    x[0, 0] = 0.0

    def run(T):
        xi = ten(T, x, rg=True)
        loss = nn_(T).BCEWithLogitsLoss(weight=ten(T, [1.0, 0.5, 2.0, 1.0]), pos_weight=ten(T, [1.0, 2.0, 3.0, 0.5]))(
            xi, ten(T, y))
        g, = T.autograd.grad(loss, xi)
        return loss, g

    both(run)


def test_cross_entropy_target_out_of_range_raises():
    def run(T):
        with pytest.raises(IndexError, match="Target 9 is out of bounds"):
            F_(T).cross_entropy(ten(T, np.zeros((2, 3))), T.tensor([0, 9]))

    import torch
    run(jitgrad)
    run(torch)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_graph_is_nll_over_log_softmax(reduction):
    """One NllLossBackward0 node over LogSoftmaxBackward0, as in torch (not a chain of
    index/mul/sum nodes)."""
    x = np.random.default_rng(6).standard_normal((4, 3))

    def run(T):
        loss = F_(T).cross_entropy(ten(T, x, rg=True), T.tensor([0, 2, 1, 2]), reduction=reduction)
        nll = loss.grad_fn
        return [nll.name(), nll.next_functions[0][0].name()]

    j, t = both(run)
    assert t == ["NllLossBackward0", "LogSoftmaxBackward0"] and j == t
