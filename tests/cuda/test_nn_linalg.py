"""Matrix products and the nn primitives on CUDA tensors, forward and backward, against the
same ops on the CPU (float64: to rounding; float32: to float32's precision): matmul / mm /
bmm / mv / dot (transposed operands, broadcast batches), addmm, linear, trace, conv2d, conv_transpose2d,
max_pool2d, softmax, log_softmax, layer_norm, embedding, nll_loss, cross_entropy, gelu.
Then the device errors these ops raise, and the gemm backends."""
import ctypes
import sys
import types

import numpy as np
import pytest

import jitgrad
import jitgrad.nn.functional as F
from jitgrad.gpu import driver
from jitgrad.gpu.array import KERNELS, DeviceArray
from jitgrad.gpu.kernels import blas

TOL = {np.float64: dict(rtol=1e-10, atol=1e-12), np.float32: dict(rtol=2e-4, atol=2e-5)}


def _tensors(arrays, device, grads):
    out = []
    for a, g in zip(arrays, grads):
        if isinstance(a, np.ndarray):
            out.append(jitgrad.tensor(a, device=device, requires_grad=g and a.dtype.kind == "f"))
        else:
            out.append(a)
    return out


def check(fn, *arrays, grads=None, dtype=np.float64, seed=0):
    """fn on CUDA tensors against fn on CPU ones: every output, then the gradient of every
    float input after backward with the same random output gradients (None where the CPU's is)."""
    arrays = [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in arrays]
    grads = grads if grads is not None else [True] * len(arrays)
    cpu, dev = _tensors(arrays, "cpu", grads), _tensors(arrays, "cuda", grads)
    outs_c, outs_d = fn(*cpu), fn(*dev)
    outs_c = outs_c if isinstance(outs_c, tuple) else (outs_c,)
    outs_d = outs_d if isinstance(outs_d, tuple) else (outs_d,)
    tol = TOL[np.dtype(dtype).type]
    for c, d in zip(outs_c, outs_d):
        assert d.is_cuda and d.dtype == c.dtype and tuple(d.shape) == tuple(c.shape)
        np.testing.assert_allclose(d.detach().cpu().numpy(), c.detach().numpy(), **tol)
    rng = np.random.default_rng(seed)
    roots = [(c, d) for c, d in zip(outs_c, outs_d) if c.requires_grad]
    if not roots:
        return
    for k, (c, d) in enumerate(roots):
        g = rng.standard_normal(tuple(c.shape)).astype(c.detach().numpy().dtype)
        c.backward(jitgrad.tensor(g), retain_graph=k < len(roots) - 1)
        d.backward(jitgrad.tensor(g, device="cuda"), retain_graph=k < len(roots) - 1)
    for c, d in zip(cpu, dev):
        if isinstance(c, jitgrad.Tensor) and c.requires_grad:
            if c.grad is None:  # an input the op does not differentiate (nll_loss's class weights)
                assert d.grad is None
                continue
            assert d.grad is not None and d.grad.is_cuda
            np.testing.assert_allclose(d.grad.cpu().numpy(), c.grad.numpy(), **tol)


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape)


# --- matrix products --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 6)), ((7,), (7,)), ((4, 7), (7,)), ((7,), (7, 3)),
                                   ((2, 5, 7), (7, 3)), ((7,), (2, 7, 3)), ((2, 1, 5, 4), (3, 4, 2)),
                                   ((3, 4, 5), (3, 5, 2))])
def test_matmul_shapes_and_broadcast_batches(sa, sb, dtype):
    check(jitgrad.matmul, rand(*sa), rand(*sb, seed=1), dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matmul_of_transposed_and_sliced_operands(dtype):
    check(lambda a, b: a.t() @ b.t(), rand(6, 5), rand(4, 6), dtype=dtype)
    check(lambda a, b: a.transpose(1, 2) @ b[:, ::2], rand(2, 7, 3), rand(7, 10), dtype=dtype)
    check(lambda a, b: jitgrad.bmm(a.transpose(1, 2), b), rand(3, 6, 5), rand(3, 6, 4), dtype=dtype)


def test_mm_bmm_mv_dot():
    check(jitgrad.mm, rand(3, 17), rand(17, 9))
    check(jitgrad.bmm, rand(2, 3, 4), rand(2, 4, 5))
    check(jitgrad.mv, rand(5, 4), rand(4))
    check(jitgrad.dot, rand(9), rand(9, seed=3))


def test_integer_matmul_is_exact():
    a = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    b = np.arange(8, dtype=np.int64).reshape(4, 2) * 3
    out = jitgrad.matmul(jitgrad.tensor(a, device="cuda"), jitgrad.tensor(b, device="cuda"))
    assert out.is_cuda and out.dtype == jitgrad.int64
    np.testing.assert_array_equal(out.cpu().numpy(), a @ b)


def test_long_inner_dimension():
    check(jitgrad.mm, rand(9, 70), rand(70, 11))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_addmm_beta_alpha_and_broadcast_input(dtype):
    check(lambda i, a, b: jitgrad.addmm(i, a, b, beta=0.5, alpha=-2.0), rand(3, 5), rand(3, 4), rand(4, 5), dtype=dtype)
    check(lambda i, a, b: jitgrad.addmm(i, a, b), rand(5), rand(3, 4), rand(4, 5), dtype=dtype)
    check(lambda i, a, b: jitgrad.addmm(i, a, b, beta=0.0), rand(1, 5), rand(3, 4), rand(4, 5), dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_linear(dtype):
    check(F.linear, rand(4, 6), rand(3, 6), rand(3), dtype=dtype)
    check(F.linear, rand(2, 4, 6), rand(3, 6), rand(3), dtype=dtype)
    check(lambda x, w: F.linear(x, w), rand(2, 4, 6), rand(3, 6), dtype=dtype)


def test_linear_layer_moved_to_cuda():
    jitgrad.manual_seed(0)
    layer = jitgrad.nn.Linear(6, 4).double()
    x = rand(5, 6)
    ref = layer(jitgrad.tensor(x)).sum()
    ref.backward()
    wg, bg = layer.weight.grad.numpy().copy(), layer.bias.grad.numpy().copy()
    layer.zero_grad()
    layer.cuda()
    out = layer(jitgrad.tensor(x, device="cuda")).sum()
    out.backward()
    np.testing.assert_allclose(out.item(), ref.item(), rtol=1e-12)
    np.testing.assert_allclose(layer.weight.grad.cpu().numpy(), wg, rtol=1e-12)
    np.testing.assert_allclose(layer.bias.grad.cpu().numpy(), bg, rtol=1e-12)


def test_trace():
    check(jitgrad.trace, rand(4, 6))
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    out = jitgrad.trace(jitgrad.tensor(a, device="cuda"))
    assert out.is_cuda and out.dtype == jitgrad.int64 and out.item() == np.trace(a)


# --- convolution and pooling ------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(), dict(stride=2), dict(padding=1), dict(padding=(2, 1), dilation=(1, 2)),
                                dict(stride=(2, 1), padding=1, dilation=2), dict(groups=2), dict(padding="same")])
def test_conv2d(kw):
    groups = kw.get("groups", 1)
    check(lambda x, w, b: F.conv2d(x, w, b, **kw), rand(2, 4, 7, 6), rand(6, 4 // groups, 3, 2), rand(6))


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, output_padding=1), dict(padding=(2, 1), dilation=(1, 2)),
                                dict(stride=2, padding=1, output_padding=1, groups=2, dilation=2)])
def test_conv_transpose2d(kw):
    groups = kw.get("groups", 1)
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), rand(2, 4, 4, 5), rand(4, 6 // groups, 3, 2), rand(6))


def test_conv2d_without_bias_float32_and_unbatched():
    check(lambda x, w: F.conv2d(x, w, padding=1), rand(2, 3, 5, 5), rand(4, 3, 3, 3), dtype=np.float32)
    check(lambda x, w, b: F.conv2d(x, w, b, groups=3), rand(3, 6, 6), rand(6, 1, 2, 2), rand(6))


def test_conv2d_padding_modes():
    for mode in ("reflect", "replicate", "circular"):
        jitgrad.manual_seed(0)
        conv = jitgrad.nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode).double()
        x = rand(2, 2, 5, 4)
        ref = conv(jitgrad.tensor(x))
        conv.cuda()
        out = conv(jitgrad.tensor(x, device="cuda"))
        np.testing.assert_allclose(out.detach().cpu().numpy(), ref.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("args", [(2,), (3, 2, 1), ((3, 2), (2, 1), (1, 0), (1, 2)), (2, None, 0, 1, True)])
def test_max_pool2d(args, dtype):
    check(lambda x: F.max_pool2d(x, *args, return_indices=True), rand(2, 3, 7, 6), dtype=dtype)


def test_max_pool2d_three_dims():
    check(lambda x: F.max_pool2d(x, 2), rand(3, 5, 4))


# --- normalisation and activations ----------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax(dim, dtype):
    check(lambda x: F.softmax(x, dim), rand(3, 4, 5), dtype=dtype)
    check(lambda x: F.log_softmax(x, dim), rand(3, 4, 5), dtype=dtype)


def test_softmax_of_a_transposed_input_and_a_scalar():
    check(lambda x: F.softmax(x.t(), 1), rand(5, 3))
    check(lambda x: F.log_softmax(x, 0), rand(1).reshape(()))


def test_softmax_gradient_kernels_match_the_rules():
    x, g = rand(3, 4, 5), rand(3, 4, 5, seed=7)
    for fn, log in ((F.softmax, False), (F.log_softmax, True)):
        xt = jitgrad.tensor(x, requires_grad=True)
        fn(xt, 1).backward(jitgrad.tensor(g))
        y = fn(jitgrad.tensor(x, device="cuda"), 1)
        got = KERNELS["nn.softmax_grad"](DeviceArray.from_host(g), y._data, (3, 4, 5), log)
        np.testing.assert_allclose(got.get(), xt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layer_norm(dtype):
    check(lambda x, w, b: F.layer_norm(x, (5,), w, b), rand(2, 3, 5), rand(5), rand(5, seed=2), dtype=dtype)
    check(lambda x: F.layer_norm(x, (3, 5), eps=1e-3), rand(2, 3, 5), dtype=dtype)
    check(lambda x, w: F.layer_norm(x, 5, w), rand(4, 5), rand(5), dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate, dtype):
    check(lambda x: F.gelu(x, approximate=approximate), rand(3, 4) * 2, dtype=dtype)
    check(lambda x: F.gelu(x.t(), approximate=approximate), rand(3, 4), dtype=dtype)


def test_dropout_draws_the_cpus_mask_for_a_seed():
    x = rand(4, 6)
    got = []
    for device in ("cpu", "cuda"):
        jitgrad.manual_seed(3)
        xt = jitgrad.tensor(x, device=device, requires_grad=True)
        out = F.dropout(xt, 0.4)
        out.backward(jitgrad.ones_like(out))
        assert out.device == xt.device and xt.grad.device == xt.device
        got.append((out.detach().cpu().numpy(), xt.grad.cpu().numpy()))
    for c, d in zip(*got):
        np.testing.assert_array_equal(d, c)
    assert (got[0][0] == 0).any() and (got[0][0] != 0).any()


# --- embedding and losses ---------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(), dict(padding_idx=3), dict(scale_grad_by_freq=True),
                                dict(padding_idx=-1, scale_grad_by_freq=True)])
def test_embedding(kw):
    idx = np.array([[1, 3, 3], [9, 0, 1]])
    check(lambda i, w: F.embedding(i, w, **kw), idx, rand(10, 4))
    check(lambda i, w: F.embedding(i, w, **kw), idx.astype(np.int32), rand(10, 4), dtype=np.float32)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 0.5, float("inf")])
def test_embedding_max_norm_renormalises_the_rows_used_once(norm_type):
    idx, w = np.array([[1, 3], [3, 0]]), rand(5, 4) * 2
    w[0] /= 100  # a row within the norm stays as it is
    got = []
    for device in ("cpu", "cuda"):
        wt = jitgrad.tensor(w, device=device)
        version = wt._version
        out = F.embedding(jitgrad.tensor(idx, device=device), wt, max_norm=1.5, norm_type=norm_type)
        assert wt._version > version
        got.append((out.cpu().numpy(), wt.cpu().numpy()))
    for c, d in zip(*got):
        np.testing.assert_allclose(d, c, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction, dtype):
    t = np.array([0, 3, -100, 2, 3])
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), rand(5, 4), t, dtype=dtype)
    check(lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction), rand(5, 4), t, rand(4) ** 2, dtype=dtype)
    check(lambda x, t: F.nll_loss(x, t, ignore_index=3, reduction=reduction), rand(5, 4), t.clip(0), dtype=dtype)


def test_nll_loss_of_one_sample_and_all_ignored():
    check(lambda x, t: F.nll_loss(x, t), rand(4), np.array(2))
    x = jitgrad.tensor(rand(3, 4), device="cuda")
    out = F.nll_loss(x, jitgrad.tensor(np.full(3, -100), device="cuda"))
    assert out.is_cuda and np.isnan(out.item())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cross_entropy(dtype):
    t = np.array([1, 0, 3, 3, 2, 0])
    check(F.cross_entropy, rand(6, 4), t, dtype=dtype)
    check(lambda x, t, w: F.cross_entropy(x, t, w, reduction="sum"), rand(6, 4), t, rand(4) ** 2, dtype=dtype)
    t[2] = -100
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.2), rand(6, 4), t, dtype=dtype)
    check(lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.1), rand(6, 4), t, rand(4) ** 2, dtype=dtype)


def test_a_small_network_end_to_end():
    """conv -> relu -> pool -> linear -> cross_entropy, one backward: every parameter's grad."""
    def net(x, t, cw, cb, lw, lb):
        h = F.max_pool2d(jitgrad.relu(F.conv2d(x, cw, cb, padding=1)), 2)
        return F.cross_entropy(F.linear(h.reshape(2, -1), lw, lb), t)
    check(net, rand(2, 1, 6, 6), np.array([1, 2]), rand(3, 1, 3, 3), rand(3), rand(4, 27), rand(4))


@pytest.mark.parametrize("fn", [
    lambda x, w: jitgrad.matmul(x, w),
    lambda x, w: F.linear(x, w.t()),
    lambda x, w: F.conv2d(x.reshape(1, 3, 2, 2), w.reshape(1, 3, 3, 1), padding=(1, 0)),
    lambda x, w: F.softmax(x @ w, 1),
    lambda x, w: F.log_softmax(x @ w, 0),
    lambda x, w: F.layer_norm(x @ w, (3,)),
    lambda x, w: F.gelu(x @ w),
    lambda x, w: F.max_pool2d((x @ w).reshape(1, 1, 4, 3), 2, 1),
])
def test_double_backward(fn):
    """grad(create_graph=True) records the backward on the device; its own backward gives
    the second derivatives the CPU gives."""
    x, w = rand(4, 3), rand(3, 3, seed=5)
    results = []
    for device in ("cpu", "cuda"):
        xt = jitgrad.tensor(x, device=device, requires_grad=True)
        wt = jitgrad.tensor(w, device=device, requires_grad=True)
        out = fn(xt, wt)
        gx, gw = jitgrad.autograd.grad((out * out).sum(), (xt, wt), create_graph=True)
        ((gx * gx).sum() + (gw ** 3).sum()).backward()
        results.append([t.detach().cpu().numpy() for t in (gx, gw, xt.grad, wt.grad)])
    for c, d in zip(*results):
        np.testing.assert_allclose(d, c, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fn,shapes", [
    (lambda x, w: x @ w, [(3, 4), (4, 2)]),
    (lambda i, a, b: jitgrad.addmm(i, a, b, beta=0.5, alpha=3.0), [(2,), (3, 4), (4, 2)]),
    (F.linear, [(3, 4), (2, 4), (2,)]),
    (jitgrad.trace, [(3, 4)]),
    (lambda x: F.softmax(x, 1), [(3, 4)]),
    (lambda x: F.log_softmax(x, 0), [(3, 4)]),
    (lambda x, w, b: F.layer_norm(x, (4,), w, b), [(3, 4), (4,), (4,)]),
    (F.gelu, [(3, 4)]),
    (lambda x, w, b: F.conv2d(x, w, b, padding=1), [(1, 2, 4, 4), (3, 2, 3, 3), (3,)]),
    (lambda x: F.max_pool2d(x, 2), [(1, 2, 4, 4)]),
    (lambda w: F.embedding(jitgrad.tensor([1, 2, 1], device=w.device), w, padding_idx=2), [(4, 3)]),
    (lambda x: F.nll_loss(x, jitgrad.tensor([1, 0, 3], device=x.device)), [(3, 4)]),
])
def test_forward_mode_ad(fn, shapes):
    """The jvp rules run on the device: the tangent of each op's output is the CPU's."""
    fw = jitgrad.autograd.forward_ad
    primals = [rand(*s, seed=k) for k, s in enumerate(shapes)]
    tangents = [rand(*s, seed=10 + k) for k, s in enumerate(shapes)]
    got = []
    for device in ("cpu", "cuda"):
        with fw.dual_level():
            duals = [fw.make_dual(jitgrad.tensor(p, device=device), jitgrad.tensor(t, device=device))
                     for p, t in zip(primals, tangents)]
            primal, tangent = fw.unpack_dual(fn(*duals))
            assert tangent.device == primal.device == duals[0].device
            got.append((primal.cpu().numpy(), tangent.cpu().numpy()))
    for c, d in zip(*got):
        np.testing.assert_allclose(d, c, rtol=1e-10, atol=1e-12)


# --- errors -----------------------------------------------------------------------------------
MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


@pytest.mark.parametrize("op", [
    lambda c, h: jitgrad.matmul(c((3, 4)), h((4, 2))),
    lambda c, h: jitgrad.matmul(h((3, 4)), c((4, 2))),
    lambda c, h: jitgrad.addmm(h((3, 2)), c((3, 4)), c((4, 2))),
    lambda c, h: F.linear(c((3, 4)), h((2, 4))),
    lambda c, h: jitgrad.matmul(c((3, 4)), h((5, 2))),
    lambda c, h: F.layer_norm(c((2, 4)), (4,), h((4,))),
    lambda c, h: F.nll_loss(c((3, 4)), jitgrad.tensor([0, 1, 2])),
    lambda c, h: F.embedding(jitgrad.tensor([0, 1]), c((3, 4))),
])
def test_mixing_devices_raises_torchs_error(op):
    def cuda(shape):
        return jitgrad.tensor(rand(*shape), device="cuda")

    def host(shape):
        return jitgrad.tensor(rand(*shape))
    with pytest.raises(RuntimeError) as e:
        op(cuda, host)
    assert str(e.value) == MIXED


def test_conv2d_names_the_devices_in_its_type_check():
    x = jitgrad.tensor(rand(1, 2, 4, 4), device="cuda")
    w = jitgrad.tensor(rand(3, 2, 3, 3))
    with pytest.raises(RuntimeError, match=r"^Input type \(torch\.cuda\.DoubleTensor\) and weight type "
                                           r"\(torch\.DoubleTensor\) should be the same or input should be a MKLDNN"):
        F.conv2d(x, w)
    with pytest.raises(RuntimeError, match=r"^Input type \(torch\.cuda\.DoubleTensor\) and bias type "
                                           r"\(torch\.DoubleTensor\) should be the same$"):
        F.conv2d(x, w.cuda(), jitgrad.tensor(rand(3)))


def test_index_errors_as_on_the_cpu():
    w = jitgrad.tensor(rand(5, 3), device="cuda")
    for bad in ([0, 5], [-1, 2]):
        with pytest.raises(IndexError, match="^index out of range in self$"):
            F.embedding(jitgrad.tensor(bad, device="cuda"), w)
    x = jitgrad.tensor(rand(3, 4), device="cuda")
    for bad, shown in (([0, 4, 9], 9), ([0, -2, 1], -2)):
        with pytest.raises(IndexError, match=f"^Target {shown} is out of bounds.$"):
            F.nll_loss(x, jitgrad.tensor(bad, device="cuda"))


def test_shape_and_dtype_errors_unchanged_on_cuda():
    a = jitgrad.tensor(rand(3, 4), device="cuda")
    with pytest.raises(RuntimeError, match=r"^mat1 and mat2 shapes cannot be multiplied \(3x4 and 3x4\)$"):
        jitgrad.mm(a, a)
    with pytest.raises(RuntimeError, match="^expected m1 and m2 to have the same dtype"):
        jitgrad.mm(a, jitgrad.tensor(rand(4, 2), device="cuda").float())


# --- the gemm backends ------------------------------------------------------------------------
def _fake_cupy():
    """cupy's asarray (of an object with __cuda_array_interface__), matmul and arithmetic
    over host memory: under the simulator a device address is a host one, so the cuBLAS
    path's hand-over (shapes, strides, dtype, pointer; the out= and epilogue forms) runs."""
    def asarray(obj):
        face = obj.__cuda_array_interface__
        assert face["version"] == 3 and face["data"][1] is False
        dt, shape, strides = np.dtype(face["typestr"]), face["shape"], face["strides"]
        span = sum((d - 1) * s for d, s in zip(shape, strides)) + dt.itemsize
        buf = (ctypes.c_char * span).from_address(face["data"][0])
        return np.ndarray(shape, dt, buffer=buf, strides=strides)
    return types.SimpleNamespace(asarray=asarray, matmul=np.matmul)


@pytest.fixture
def backend_restored():
    yield
    blas.set_backend(None)


def test_backend_choice(monkeypatch, backend_restored):
    if driver.simulated():
        assert blas.backend() == "numba"  # the simulator cannot run cuBLAS
    monkeypatch.setattr(driver, "simulated", lambda: False)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    blas.set_backend(None)
    assert blas.backend() == "cupy"
    monkeypatch.setitem(sys.modules, "cupy", None)  # not installed: import raises ImportError
    blas.set_backend(None)
    assert blas.backend() == "numba"
    with pytest.raises(ValueError):
        blas.set_backend("mkl")


def test_cupy_path_hands_over_strided_views_and_applies_the_epilogue(monkeypatch, backend_restored):
    # on a GPU the real cupy (cuBLAS), when installed; under the simulator the fake
    cupy = _fake_cupy() if driver.simulated() else pytest.importorskip("cupy")
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    calls = []
    real = blas._cupy_gemm
    monkeypatch.setattr(blas, "_cupy_gemm", lambda *args: calls.append(args) or real(*args))
    blas.set_backend("cupy")
    check(lambda a, b: a.t() @ b, rand(6, 5), rand(6, 4))
    check(jitgrad.matmul, rand(2, 1, 5, 4), rand(3, 4, 2))
    check(lambda i, a, b: jitgrad.addmm(i, a, b, beta=0.5, alpha=2.0), rand(5), rand(3, 4), rand(4, 5))
    check(lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2), rand(2, 4, 5, 5), rand(4, 2, 3, 3), rand(4))
    assert len(calls) >= 8


def test_products_run_tiled_from_tiled_min_multiply_adds():
    assert blas.kernel_for(1, 64, 64, 16) == "tiled" and blas.kernel_for(4, 64, 16, 16) == "tiled"
    assert blas.kernel_for(1, 6, 84, 24) == "small"


@pytest.mark.parametrize("kernel", ["tiled", "small"])
def test_both_gemm_kernels_on_transposed_operands_and_broadcast_batches(kernel):
    """Edge tiles (5 x 7 outputs, 6 inner: not multiples of the tile), a transposed operand,
    batch dims broadcast both ways, and every dtype the kernels take."""
    a, b = rand(2, 1, 6, 5), rand(3, 6, 7)
    out = DeviceArray.empty((2, 3, 5, 7), np.float64)
    blas.gemm_into(DeviceArray.from_host(a).swapaxes(-1, -2), DeviceArray.from_host(b), out, kernel=kernel)
    np.testing.assert_allclose(out.get(), np.matmul(a.swapaxes(-1, -2), b), rtol=1e-12)
    for dt in (np.float32, np.int32, np.int64):
        a, b = (rand(5, 6) * 4).astype(dt), (rand(6, 7) * 4).astype(dt)
        out = DeviceArray.empty((5, 7), dt)
        blas.gemm_into(DeviceArray.from_host(a), DeviceArray.from_host(b), out, kernel=kernel)
        np.testing.assert_allclose(out.get(), a @ b, rtol=1e-6)


def test_gemm_epilogue_writes_through_a_strided_output():
    """gemm_into(a, b, out, alpha, beta) = alpha * a @ b + beta * out, out a transposed view."""
    a, b, c = rand(4, 3), rand(3, 5), rand(5, 4)
    out = DeviceArray.from_host(c)
    blas.gemm_into(DeviceArray.from_host(a), DeviceArray.from_host(b), out.T, 2.0, -1.0)
    np.testing.assert_allclose(out.get(), (2.0 * a @ b - c.T).T, rtol=1e-12)


def test_numpy_matmul_on_device_arrays_follows_numpy():
    a, b = rand(2, 3, 4), rand(4)
    got = np.matmul(DeviceArray.from_host(a), DeviceArray.from_host(b))
    assert isinstance(got, DeviceArray)
    np.testing.assert_allclose(got.get(), a @ b, rtol=1e-12)
    with pytest.raises(ValueError, match="^matmul: Input operand 1 has a mismatch in its core dimension 0"):
        np.matmul(DeviceArray.from_host(a), DeviceArray.from_host(rand(3)))
    with pytest.raises(RuntimeError, match=f"^{MIXED}$"):
        np.matmul(DeviceArray.from_host(a), b)
