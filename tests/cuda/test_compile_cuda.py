"""jitgrad.compile on CUDA tensors: the plan's kernels are CPU ones, so a step that touches
a CUDA tensor must run eagerly (a graph break naming the reason), never replay on device
memory, and give eager's results."""
import numpy as np
import pytest

import jitgrad


def _step(w, x):
    loss = ((x * w).sum() - 1.0) ** 2
    loss.backward()
    return loss


def test_a_cuda_step_runs_eagerly_with_eagers_results():
    w = jitgrad.tensor([0.5, -1.0, 2.0], dtype=jitgrad.float64, device="cuda", requires_grad=True)
    x = jitgrad.tensor([1.0, 2.0, 3.0], dtype=jitgrad.float64, device="cuda")
    step = jitgrad.compile(_step)
    for _ in range(3):
        w.grad = None
        loss = step(w, x)
        assert loss.is_cuda
    ref = jitgrad.tensor([0.5, -1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
    ref_loss = _step(ref, jitgrad.tensor([1.0, 2.0, 3.0], dtype=jitgrad.float64))
    np.testing.assert_allclose(loss.detach().cpu().numpy(), ref_loss.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(w.grad.cpu().numpy(), ref.grad.numpy(), rtol=1e-12)
    out = jitgrad.compiler.explain(_step, w, x)
    assert out.graph_break_count >= 1 and any("CUDA" in str(r) for r in out.break_reasons)


def test_fullgraph_names_the_cuda_tensor():
    w = jitgrad.ones(3, dtype=jitgrad.float64, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="CUDA tensor"):
        jitgrad.compile(_step, fullgraph=True)(w, jitgrad.ones(3, dtype=jitgrad.float64, device="cuda"))


def test_a_cuda_argument_after_cpu_calls_runs_eagerly():
    """The device is part of the signature: a CUDA argument of the shape and dtype of the
    CPU calls' is not replayed over the CPU plan (it records, breaks, and runs eagerly);
    the CPU plan still replays afterwards."""
    step = jitgrad.compile(_step)
    xs = np.array([1.0, 2.0, 3.0])
    for device in ("cpu", "cpu", "cuda", "cuda", "cpu"):
        w = jitgrad.tensor([0.5, -1.0, 2.0], dtype=jitgrad.float64, device=device, requires_grad=True)
        loss = step(w, jitgrad.tensor(xs, dtype=jitgrad.float64, device=device))
        assert loss.device.type == device
        ref = jitgrad.tensor([0.5, -1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
        ref_loss = _step(ref, jitgrad.tensor(xs, dtype=jitgrad.float64))
        np.testing.assert_allclose(loss.detach().cpu().numpy(), ref_loss.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.cpu().numpy(), ref.grad.numpy(), rtol=1e-12)
    kinds = sorted(type(e).__name__ for e in step.cache.values())
    assert kinds == ["_Eager", "_Entry"], kinds
