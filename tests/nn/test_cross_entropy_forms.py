"""cross_entropy and nll_loss in each of torch's forms, values and gradients against torch:
class indices for (C,), (N, C) and (N, C, d1, ...) inputs, class probabilities (a target of the
input's shape), label smoothing (a negative one is ignored, as torch does), class weights,
ignore_index and every reduction."""
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import jitgrad  # noqa: E402

SHAPES = [(5,), (4, 5), (3, 5, 2), (2, 5, 3, 2), (2, 5, 1, 2, 2)]


def run(T, fn, x, t, w):
    xt = T.tensor(x, requires_grad=True)
    tt = T.tensor(t)
    out = fn(T, xt, tt, None if w is None else T.tensor(w))
    out.sum().backward()
    return out.detach().numpy(), xt.grad.numpy()


def check(fn, x, t, w):
    (jo, jg), (to, tg) = run(jitgrad, fn, x, t, w), run(torch, fn, x, t, w)
    assert jo.shape == to.shape and jo.dtype == to.dtype
    np.testing.assert_allclose(jo, to, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(jg, tg, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("shape,reduction,smoothing,weighted",
                         list(itertools.product(SHAPES, ("mean", "sum", "none"), (0.0, 0.2, -0.3), (False, True))))
def test_class_indices(shape, reduction, smoothing, weighted):
    rng = np.random.default_rng(abs(hash((shape, reduction, smoothing, weighted))) % 2**32)
    c = shape[0] if len(shape) == 1 else shape[1]
    x = rng.standard_normal(shape)
    tshape = () if len(shape) == 1 else shape[:1] + shape[2:]
    t = rng.integers(0, c, tshape)
    if t.ndim:
        t.reshape(-1)[0] = 1  # ignored below
    w = rng.uniform(0.5, 2.0, c) if weighted else None

    def ce(T, x, t, w):
        return T.nn.functional.cross_entropy(x, t, w, ignore_index=1 if t.ndim else -100, reduction=reduction,
                                             label_smoothing=smoothing)
    check(ce, x, t, w)
    if not smoothing:
        def nll(T, x, t, w):
            return T.nn.functional.nll_loss(x, t, w, ignore_index=1 if t.ndim else -100, reduction=reduction)
        check(nll, x, t, w)


@pytest.mark.parametrize("shape,reduction,smoothing,weighted",
                         list(itertools.product(SHAPES, ("mean", "sum", "none"), (0.0, 0.3), (False, True))))
def test_class_probabilities(shape, reduction, smoothing, weighted):
    rng = np.random.default_rng(abs(hash((shape, reduction, smoothing, weighted, 1))) % 2**32)
    c = shape[0] if len(shape) == 1 else shape[1]
    x = rng.standard_normal(shape)
    t = rng.uniform(0, 1, shape)  # need not sum to 1: torch does not ask it
    w = rng.uniform(0.5, 2.0, c) if weighted else None

    def ce(T, x, t, w):
        return T.nn.functional.cross_entropy(x, t, w, reduction=reduction, label_smoothing=smoothing)
    check(ce, x, t, w)


def test_float_class_indices_are_refused():
    """A float target of the batch's shape is not truncated to class indices: torch's error."""
    for T in (torch, jitgrad):
        with pytest.raises(RuntimeError, match="^expected target dtype to be Long or Byte, but got Float"):
            T.nn.functional.cross_entropy(T.ones(2, 3), T.tensor([0.0, 2.0]))


def test_probabilities_in_the_module():
    x = np.random.default_rng(0).standard_normal((4, 3))
    t = np.full((4, 3), 1 / 3)
    vals = [T.nn.CrossEntropyLoss(label_smoothing=0.1)(T.tensor(x), T.tensor(t)).item() for T in (jitgrad, torch)]
    assert vals[0] == pytest.approx(vals[1], rel=1e-12)
