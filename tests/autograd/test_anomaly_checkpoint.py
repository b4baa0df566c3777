"""Anomaly mode and activation checkpointing, against PyTorch."""
import warnings

import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")
import torch.utils.checkpoint  # noqa: E402, F811

import jitgrad.utils.checkpoint  # noqa: E402,F401


def nan_backward(T):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with T.autograd.detect_anomaly():
            x = T.tensor([-1.0, 4.0], dtype=T.float64, requires_grad=True)
            y = x.sqrt()  # the line the forward traceback must point at
            try:
                y.sum().backward()
                err = None
            except RuntimeError as e:
                err = str(e)
    return err, [str(w.message) for w in caught], y


def test_nan_in_backward_raises_like_torch_and_prints_forward_traceback():
    jerr, jwarn, jy = nan_backward(jitgrad)
    terr, twarn, _ = nan_backward(torch)
    assert jerr == terr == "Function 'SqrtBackward0' returned nan values in its 0th output."
    assert any(w.startswith("Anomaly Detection has been enabled") for w in jwarn)
    detail = [w for w in jwarn if w.startswith("Error detected in SqrtBackward0. Traceback of forward call")]
    assert detail and "test_anomaly_checkpoint.py" in detail[0] and "x.sqrt()" in detail[0]
    assert "traceback_" in jy.grad_fn.metadata


def test_set_detect_anomaly_function_and_context_manager():
    for T in (jitgrad, torch):
        assert not T.is_anomaly_enabled() if T is torch else not T.autograd.is_anomaly_enabled()
        with T.autograd.set_detect_anomaly(True):
            x = T.tensor([1.0], requires_grad=True)      # the seed document's example
            z = (x ** 2).sum()
            z.backward()
            assert (T.is_anomaly_enabled() if T is torch else T.autograd.is_anomaly_enabled())
        assert x.grad.tolist() == [2.0]
        T.autograd.set_detect_anomaly(True)
        T.autograd.set_detect_anomaly(False)
        assert not (T.is_anomaly_enabled() if T is torch else T.autograd.is_anomaly_enabled())


def test_anomaly_mode_without_nan_gives_the_same_gradients():
    x = np.array([0.3, 1.7, 2.2])
    out = []
    for T in (jitgrad, torch):
        t = T.tensor(x, requires_grad=True)
        with T.autograd.set_detect_anomaly(True):
            (t.exp() * t.sin()).sum().backward()
        out.append(t.grad.numpy())
    np.testing.assert_allclose(out[0], out[1], rtol=1e-12)


def mlp(h, w1, w2):
    return (h @ w1).tanh() @ w2


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_gradients_equal_plain_and_torch(reentrant):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in [(4, 3), (3, 5), (5, 2)]]
    results = []
    for T, cp in ((jitgrad, jitgrad.utils.checkpoint.checkpoint), (torch, torch.utils.checkpoint.checkpoint)):
        for use_cp in (True, False):
            x, w1, w2 = [T.tensor(a, requires_grad=True) for a in arrays]
            y = cp(mlp, x, w1, w2, use_reentrant=reentrant) if use_cp else mlp(x, w1, w2)
            (y.sin() * y).sum().backward()
            results.append([t.grad.numpy().copy() for t in (x, w1, w2)])
    for r in results[1:]:
        for a, b in zip(results[0], r):
            np.testing.assert_allclose(a, b, rtol=1e-12)


def test_checkpoint_node_name_and_non_tensor_arguments():
    x = jitgrad.tensor([1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
    y = jitgrad.utils.checkpoint.checkpoint(lambda t, k: (t * k).exp(), x, 3.0, use_reentrant=True)
    assert type(y.grad_fn).__name__ == "CheckpointFunctionBackward"
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.exp(3 * np.array([1.0, 2.0])), rtol=1e-12)


def test_checkpoint_without_use_reentrant_warns_like_torch():
    x = jitgrad.tensor([1.0], requires_grad=True)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        jitgrad.utils.checkpoint.checkpoint(lambda t: t * 2, x)
