"""Device errors as PyTorch gives them: no GPU, .numpy() of a CUDA tensor, devices mixed
in one op, an out-of-range device index; and the device plumbing (factories, .to,
.cuda(), .cpu(), repr) against the CPU."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jitgrad

NO_GPU = textwrap.dedent("""
    import jitgrad
    assert not jitgrad.cuda.is_available() and jitgrad.cuda.device_count() == 0
    makers = [lambda: jitgrad.ones(3, device="cuda"), lambda: jitgrad.tensor([1.], device="cuda:0"),
              lambda: jitgrad.zeros(2, device=jitgrad.device("cuda")), lambda: jitgrad.arange(3, device="cuda"),
              lambda: jitgrad.ones(1).to("cuda"), lambda: jitgrad.ones(1).cuda(), lambda: jitgrad.randn(2, device="cuda")]
    for make in makers:
        try:
            make()
        except AssertionError as e:
            assert str(e).startswith("Torch not compiled with CUDA enabled"), e
            assert "numba-cuda" in str(e), e
        else:
            raise SystemExit("no error without a GPU")
    print("ok")
""")


@pytest.mark.no_gpu
def test_without_a_gpu_cuda_requests_raise_torchs_error():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a GPU machine hides its GPU for this check
    out = subprocess.run([sys.executable, "-c", NO_GPU], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_factories_and_moves_keep_values_dtype_and_device():
    host = np.arange(6, dtype=np.float64).reshape(2, 3)
    for t in (jitgrad.tensor(host, device="cuda"), jitgrad.from_numpy(host).to("cuda"),
              jitgrad.from_numpy(host).cuda(), jitgrad.as_tensor(host, device="cuda:0")):
        assert t.device == jitgrad.device("cuda", 0) and t.is_cuda and t.get_device() == 0
        assert t.dtype == jitgrad.float64 and tuple(t.shape) == (2, 3)
        np.testing.assert_array_equal(t.cpu().numpy(), host)
        assert t.cpu().device.type == "cpu"
    for make in (jitgrad.zeros, jitgrad.ones, jitgrad.empty, jitgrad.randn, jitgrad.rand):
        t = make(2, 3, device="cuda")
        assert t.is_cuda and tuple(t.shape) == (2, 3) and t.dtype == jitgrad.float32
    assert jitgrad.full((2,), 7, device="cuda").cpu().tolist() == [7, 7]
    assert jitgrad.eye(2, device="cuda").cpu().tolist() == [[1., 0.], [0., 1.]]
    like = jitgrad.zeros_like(jitgrad.ones(2, device="cuda"))
    assert like.is_cuda  # a *_like keeps its input's device, as torch
    jitgrad.manual_seed(3)
    a = jitgrad.randn(4, device="cuda").cpu()
    jitgrad.manual_seed(3)
    np.testing.assert_array_equal(a.numpy(), jitgrad.randn(4).numpy())


def test_numpy_of_a_cuda_tensor_is_torchs_type_error():
    t = jitgrad.ones(2, device="cuda")
    with pytest.raises(TypeError, match=r"^can't convert cuda:0 device type tensor to numpy\. Use Tensor\.cpu\(\)"):
        t.numpy()
    with pytest.raises(TypeError, match="can't convert cuda:0"):
        np.asarray(t)
    assert t.tolist() == [1.0, 1.0] and jitgrad.ones(1, device="cuda").item() == 1.0  # these copy, as torch


def test_device_index_out_of_range():
    with pytest.raises(RuntimeError, match="CUDA error: invalid device ordinal"):
        jitgrad.ones(1, device="cuda:1")


def test_repr_names_the_device():
    t = jitgrad.tensor([1., 2.], device="cuda", dtype=jitgrad.float64, requires_grad=True)
    assert repr(t) == "tensor([1., 2.], device='cuda:0', dtype=torch.float64, requires_grad=True)"


def test_moves_are_differentiable_both_ways():
    x = jitgrad.tensor([1., 2., 3.], dtype=jitgrad.float64, requires_grad=True)
    y = x.cuda()
    assert y.grad_fn.name() == "ToCopyBackward0"
    z = y.cpu()
    assert z.grad_fn.name() == "ToCopyBackward0" and not z.is_cuda
    (z * z).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2., 4., 6.])
    w = jitgrad.ones(2, device="cuda", dtype=jitgrad.float64, requires_grad=True)
    w.cpu().sum().backward()
    assert w.grad.is_cuda and w.grad.cpu().tolist() == [1., 1.]


def test_out_of_memory_is_torchs_error_and_leaves_nothing_behind():
    x = jitgrad.ones(3, device="cuda", requires_grad=True)
    with pytest.raises(jitgrad.cuda.OutOfMemoryError, match="^CUDA out of memory. Tried to allocate"):
        jitgrad.empty(2 ** 46, device="cuda")
    assert issubclass(jitgrad.cuda.OutOfMemoryError, RuntimeError)
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]  # what was there is intact and usable
