"""The CUDA API around the ops: Module.to/cuda/cpu, optimizers over CUDA parameters (one
kernel launch per group), jitgrad.save/load of CUDA tensors with map_location, and memory
shared with other libraries (DLPack, __cuda_array_interface__). Checked against the same
calls on the CPU (float64, and float32 where the kernels' arithmetic matters) and against
torch on the CPU where jitgrad's CPU path is not the reference."""
import gc
import io
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import ROOT, assert_close

import jitgrad
from jitgrad import nn
from jitgrad._core import dlpack
from jitgrad.gpu import array as garray
from jitgrad.gpu import driver
from jitgrad.graph.tensor import wrap

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def host(t):
    return t.detach().cpu().numpy()


def on(dev, a, requires_grad=False):
    return jitgrad.tensor(np.asarray(a), device=dev, requires_grad=requires_grad)


# -- Module.to / cuda / cpu -------------------------------------------------------------------

def _module():
    m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    m.register_buffer("steps", jitgrad.tensor([1, 2]))
    m.register_buffer("scale", jitgrad.tensor([0.5]))
    for p in m.parameters():
        p.grad = jitgrad.full(tuple(p.shape), 0.25)
    return m


def test_module_to_cuda_moves_parameters_and_grads_in_place():
    m = _module()
    params = list(m.parameters())
    before = [host(p) for p in params]
    assert m.to("cuda") is m
    assert [p for p in m.parameters()] == params  # the same Parameter objects
    for p, b in zip(params, before):
        assert p.is_cuda and p.grad.is_cuda and isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf
        np.testing.assert_array_equal(host(p), b)
        np.testing.assert_array_equal(host(p.grad), np.full(b.shape, 0.25, b.dtype))
    assert all(b.is_cuda for b in m.buffers())
    assert m.steps.dtype == jitgrad.int64 and host(m.steps).tolist() == [1, 2]
    assert m.cpu() is m
    assert all(not t.is_cuda for t in list(m.parameters()) + list(m.buffers()))
    for p, b in zip(params, before):
        np.testing.assert_array_equal(host(p), b)
    assert m.cuda() is m and all(p.device == jitgrad.device("cuda:0") for p in m.parameters())


def test_module_to_device_and_dtype_casts_floating_tensors_only():
    m = _module()
    m.to(jitgrad.device("cuda"), jitgrad.float64)
    assert all(p.dtype == jitgrad.float64 and p.grad.dtype == jitgrad.float64 and p.is_cuda for p in m.parameters())
    assert m.steps.dtype == jitgrad.int64 and m.scale.dtype == jitgrad.float64 and m.steps.is_cuda
    m.to(jitgrad.zeros(1, dtype=jitgrad.float32))  # to(tensor): its device and dtype
    assert all(p.dtype == jitgrad.float32 and not p.is_cuda for p in m.parameters())
    m.to(device="cuda").float()
    assert all(p.dtype == jitgrad.float32 and p.is_cuda for p in m.parameters())


def test_module_to_matches_torch_semantics():
    """Parameters stay the same objects with converted grads; buffers are replaced; a
    non-floating dtype is refused (torch's message)."""
    def run(T):
        m = T.nn.Linear(2, 2)
        m.register_buffer("b", T.ones(2))
        w, buf = m.weight, m.b
        m.weight.grad = T.ones(2, 2)
        m.double()
        try:
            m.to(T.int64)
            e = None
        except TypeError as err:
            e = str(err)
        return (m.weight is w, str(m.weight.grad.dtype), m.b is buf, str(m.b.dtype), e)

    assert run(jitgrad) == run(torch)


def test_module_state_dict_loads_across_devices():
    src = _module()
    dst = _module().cuda()
    for p in src.parameters():
        p.data = jitgrad.randn(*p.shape)
    dst.load_state_dict(src.state_dict())  # a CPU checkpoint into a CUDA model
    for (k, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert b.is_cuda, k
        np.testing.assert_array_equal(host(a), host(b))
    back = _module()
    back.load_state_dict(dst.state_dict())  # and a CUDA one into a CPU model
    for a, b in zip(src.parameters(), back.parameters()):
        np.testing.assert_array_equal(host(a), host(b))
    dst.zero_grad(set_to_none=False)
    assert all(not host(p.grad).any() and p.grad.is_cuda for p in dst.parameters())
    nn.init.normal_(dst[0].weight)  # an initialiser on a CUDA parameter fills it on the device
    assert dst[0].weight.is_cuda and host(dst[0].weight).std() > 0


# -- optimizers ---------------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd": lambda ps: jitgrad.optim.SGD(ps, lr=0.1),
    "sgd-momentum-wd": lambda ps: jitgrad.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.05),
    "sgd-nesterov-maximize": lambda ps: jitgrad.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, maximize=True),
    "adam": lambda ps: jitgrad.optim.Adam(ps, lr=0.01),
    "adam-wd-amsgrad": lambda ps: jitgrad.optim.Adam(ps, lr=0.01, weight_decay=0.1, amsgrad=True),
    "adamw-amsgrad-maximize": lambda ps: jitgrad.optim.AdamW(ps, lr=0.02, amsgrad=True, maximize=True),
    "rmsprop": lambda ps: jitgrad.optim.RMSprop(ps, lr=0.01),
    "rmsprop-centered-momentum-wd-maximize": lambda ps: jitgrad.optim.RMSprop(
        ps, lr=0.01, alpha=0.3, centered=True, momentum=0.5, weight_decay=0.1, maximize=True),
}
TORCH = {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW, "RMSprop": torch.optim.RMSprop}
SHAPES = [(3, 4), (4,), (), (2, 1, 3)]


def _train(make, dev, dtype, steps, rng_seed=0, groups=False):
    rng = np.random.default_rng(rng_seed)
    init = [rng.standard_normal(s) for s in SHAPES]
    grads = [[rng.standard_normal(s) for s in SHAPES] for _ in range(steps)]
    ps = [nn.Parameter(on(dev, np.asarray(a, dtype))) for a in init]
    opt = make([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.03}] if groups else ps)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = on(dev, np.asarray(g, dtype))
        opt.step()
    return ps, opt, init, grads


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_optimizer_on_cuda_matches_cpu_and_torch(name, dtype):
    make = OPTIMIZERS[name]
    gpu, opt, init, grads = _train(make, "cuda", dtype, 3)
    cpu, _, _, _ = _train(make, "cpu", dtype, 3)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-14)
    for a, b in zip(gpu, cpu):
        assert a.is_cuda and a.dtype == b.dtype
        np.testing.assert_allclose(host(a), host(b), **tol)
    for state in opt.state.values():
        for k, v in state.items():
            if isinstance(v, jitgrad.Tensor):
                assert v.is_cuda and v.dtype == gpu[0].dtype, k
    # and torch's optimizer, over the same steps
    tps = [torch.nn.Parameter(torch.tensor(np.asarray(a, dtype))) for a in init]
    cls = TORCH[type(opt).__name__]
    topt = cls(tps, **{k: v for k, v in opt.defaults.items()})
    for gs in grads:
        for p, g in zip(tps, gs):
            p.grad = torch.tensor(np.asarray(g, dtype))
        topt.step()
    for a, b in zip(gpu, tps):
        np.testing.assert_allclose(host(a), b.detach().numpy(), **tol)


def test_one_launch_per_group_and_dtype(monkeypatch):
    calls = []
    driver.require()
    real = garray.KERNELS["adam"]
    monkeypatch.setitem(garray.KERNELS, "adam", lambda rows, *a: calls.append(len(rows)) or real(rows, *a))
    _train(OPTIMIZERS["adam"], "cuda", "float32", 2, groups=True)
    assert calls == [2, 2, 2, 2]  # two groups of two parameters, two steps: one launch each
    calls.clear()
    ps = [nn.Parameter(on("cuda", np.ones(3, np.float32))), nn.Parameter(on("cuda", np.ones(2)))]
    for p in ps:
        p.grad = jitgrad.ones_like(p)
    jitgrad.optim.Adam(ps).step()
    assert sorted(calls) == [1, 1]  # a launch per dtype


def test_strided_parameter_and_gradient():
    """A transposed CUDA parameter is updated in place (through a contiguous copy), and a
    transposed gradient is read as the parameter's layout."""
    rng = np.random.default_rng(1)
    w, g = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    out = []
    for dev in ("cpu", "cuda"):
        p = nn.Parameter(on(dev, w))
        base = on(dev, w.T.copy())
        p.data = base.t()  # a strided view: the step must write through to base
        p.grad = on(dev, g.T.copy()).t()
        opt = jitgrad.optim.SGD([p], lr=0.1, momentum=0.5)
        opt.step()
        opt.step()
        out.append((host(p), host(base)))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-12)
    np.testing.assert_allclose(out[1][1], out[0][0].T, rtol=1e-12)


@pytest.mark.parametrize("name", ["sgd-momentum-wd", "adam"])
def test_mixed_devices_raise_torchs_error_and_change_nothing(name):
    ps = [nn.Parameter(on("cpu", np.ones(3))) for _ in range(3)]
    for p in ps:
        p.grad = on("cpu", np.ones(3))
    ps[2]._grad._data = garray.DeviceArray.from_host(np.ones(3))  # as a .data swap would leave it
    opt = OPTIMIZERS[name](ps)
    with pytest.raises(RuntimeError, match="^" + MIXED.replace("!", "") + "!$"):
        opt.step()
    assert all(host(p).tolist() == [1.0, 1.0, 1.0] for p in ps) and not opt.state  # checked before any update


def test_optimizer_zero_grad_keeps_cuda_grads():
    ps, opt, _, _ = _train(OPTIMIZERS["sgd"], "cuda", "float64", 1)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad.is_cuda and not host(p.grad).any() for p in ps)


def test_state_dict_keeps_devices_and_load_moves_state_to_the_parameters():
    make = OPTIMIZERS["adam-wd-amsgrad"]
    ps, opt, init, grads = _train(make, "cuda", "float32", 2)
    sd = opt.state_dict()
    assert all(v.is_cuda for s in sd["state"].values() for v in s.values() if isinstance(v, jitgrad.Tensor))
    # a CUDA state dict into an optimizer over CPU parameters: the state comes to the CPU
    cpu = [nn.Parameter(jitgrad.tensor(host(p))) for p in ps]
    copt = make(cpu)
    copt.load_state_dict(sd)
    assert all(not v.is_cuda for s in copt.state.values() for v in s.values() if isinstance(v, jitgrad.Tensor))
    # a CPU float64 state dict into a CUDA float32 optimizer: moved and cast to the parameters
    sd64 = copt.state_dict()
    for s in sd64["state"].values():
        for k, v in s.items():
            if isinstance(v, jitgrad.Tensor):
                s[k] = v.double()
    gpu = [nn.Parameter(on("cuda", host(p))) for p in ps]
    gopt = make(gpu)
    gopt.load_state_dict(sd64)
    for s in gopt.state.values():
        for v in s.values():
            if isinstance(v, jitgrad.Tensor):
                assert v.is_cuda and v.dtype == jitgrad.float32
    # the state saved is a copy: a further step changes the state dict's tensors in neither
    before = {k: host(v) for k, v in sd["state"][0].items() if isinstance(v, jitgrad.Tensor)}
    rng = np.random.default_rng(7)
    gs = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    for a, b, c, g in zip(ps, gpu, cpu, gs):
        a.grad, b.grad, c.grad = on("cuda", g), on("cuda", g), on("cpu", g)
    for o in (opt, gopt, copt):
        o.step()
    for k, v in before.items():
        np.testing.assert_array_equal(host(sd["state"][0][k]), v)
    for a, b, c in zip(ps, gpu, cpu):  # resumed from the state dict = never interrupted
        np.testing.assert_allclose(host(b), host(a), rtol=1e-6)
        np.testing.assert_allclose(host(c), host(a), rtol=1e-5, atol=1e-6)


# -- jitgrad.save / load ---------------------------------------------------------------------------

def _saved(obj):
    buf = io.BytesIO()
    jitgrad.save(obj, buf)
    buf.seek(0)
    return buf


def test_save_load_keeps_cuda_tensors_on_cuda():
    w = nn.Parameter(on("cuda", np.arange(6.0).reshape(2, 3)))
    t = on("cuda", np.array([1, 2, 3]))
    c = on("cpu", np.array([0.5]))
    back = jitgrad.load(_saved({"w": w, "w_again": w.detach(), "t": t, "c": c, "same": t}))
    assert isinstance(back["w"], nn.Parameter) and back["w"].requires_grad and back["w"].is_cuda
    assert back["t"].is_cuda and back["t"].dtype == jitgrad.int64 and not back["c"].is_cuda
    assert back["same"] is back["t"]
    np.testing.assert_array_equal(host(back["w"]), np.arange(6.0).reshape(2, 3))
    back["w_again"]._data[0, 0] = 9.0  # saved sharing one storage, loaded sharing it on the device
    assert host(back["w"])[0, 0] == 9.0


@pytest.mark.parametrize("where", ["cpu", "cpu-device", "dict", "fn-keep", "fn-none", "cuda-for-cpu-file"])
def test_load_map_location(where):
    saved = {"g": on("cuda", [1.0, 2.0]), "c": on("cpu", [3.0])}
    ml = {"cpu": "cpu", "cpu-device": jitgrad.device("cpu"), "dict": {"cuda:0": "cpu"},
          "fn-keep": lambda storage, loc: storage, "fn-none": lambda storage, loc: None,
          "cuda-for-cpu-file": "cuda"}[where]
    seen = []
    if where.startswith("fn"):
        fn = ml

        def ml(storage, loc):
            seen.append((loc, storage.is_cuda))
            return fn(storage, loc)
    back = jitgrad.load(_saved(saved), map_location=ml)
    want = {"cpu": (False, False), "cpu-device": (False, False), "dict": (False, False),
            "fn-keep": (False, False), "fn-none": (True, False), "cuda-for-cpu-file": (True, True)}[where]
    assert (back["g"].is_cuda, back["c"].is_cuda) == want
    assert host(back["g"]).tolist() == [1.0, 2.0] and host(back["c"]).tolist() == [3.0]
    if seen:  # torch calls fn(storage on the CPU, the saved location)
        assert sorted(seen) == [("cpu", False), ("cuda:0", False)]


def test_load_map_location_errors_as_torch():
    buf = _saved({"g": on("cuda", [1.0])})
    with pytest.raises(RuntimeError, match=r"^don't know how to restore data location of "
                                           r"torch.storage.UntypedStorage \(tagged with xyz\)$"):
        jitgrad.load(buf, map_location="xyz")
    buf.seek(0)
    with pytest.raises(TypeError, match="^'int' object is not callable$"):
        jitgrad.load(buf, map_location=3)
    buf.seek(0)

    def refuse(storage, loc):
        raise KeyError(loc)
    with pytest.raises(KeyError, match="cuda:0"):  # the function's own error, not an "invalid file"
        jitgrad.load(buf, map_location=refuse)


@pytest.mark.parametrize("device", ["cuda:7", 0, "mps"])
def test_a_file_naming_another_device_is_refused(device):
    meta = {"format": 1, "obj": {"tensor": 0, "ref": 0, "requires_grad": False, "parameter": False, "device": device}}
    buf = io.BytesIO()
    np.savez(buf, a0=np.ones(2), __jitgrad__=np.array(json.dumps(meta)))
    buf.seek(0)
    with pytest.raises(RuntimeError, match=f"^Invalid jitgrad file .*tensor record with invalid device {device!r}"):
        jitgrad.load(buf)


NO_GPU_LOAD = textwrap.dedent("""
    import sys
    import jitgrad
    path = sys.argv[1]
    try:
        jitgrad.load(path)
    except RuntimeError as e:
        assert str(e).startswith("Attempting to deserialize object on a CUDA device but "
                                 "torch.cuda.is_available() is False. If you are running on a CPU-only machine, "
                                 "please use torch.load with map_location=torch.device('cpu') to map your storages "
                                 "to the CPU."), e
    else:
        raise SystemExit("loaded a CUDA tensor without a GPU")
    t = jitgrad.load(path, map_location="cpu")["g"]
    assert t.tolist() == [1.0, 2.0] and not t.is_cuda
    print("ok")
""")


def test_loading_cuda_tensors_without_a_gpu(tmp_path):
    path = str(tmp_path / "cuda.pt")
    jitgrad.save({"g": on("cuda", [1.0, 2.0])}, path)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = subprocess.run([sys.executable, "-c", NO_GPU_LOAD, path], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# -- DLPack -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_dlpack_cpu_round_trips_with_torch_and_numpy_share_memory(dtype):
    a = np.arange(12).reshape(3, 4).astype(dtype)
    j = jitgrad.tensor(a)
    t = torch.from_dlpack(j)
    n = np.from_dlpack(j)
    assert str(t.dtype) == f"torch.{dtype}" and n.dtype == a.dtype and n.flags.writeable
    t[0, 1] = 1   # torch writes, jitgrad and numpy see it
    n[2, 3] = 0   # numpy writes, jitgrad and torch see it
    np.testing.assert_array_equal(j.numpy(), t.numpy())
    np.testing.assert_array_equal(j.numpy(), n)
    back = jitgrad.from_dlpack(t[:, ::2].t())  # a strided view of torch's memory
    want = t[:, ::2].t().numpy()
    assert back.shape == jitgrad.Size(want.shape) and back.dtype == j.dtype
    np.testing.assert_array_equal(back.numpy(), want)
    t[1, 2] = 0 if dtype == "bool" else 7
    assert back.numpy()[1, 1] == t[1, 2].item()


def test_dlpack_capsules_and_lifetimes():
    j = jitgrad.tensor([1.0, 2.0, 3.0])
    capsule = j.__dlpack__()  # the older, unversioned kind: what a consumer asking nothing gets
    assert j.__dlpack_device__() == (dlpack.CPU, 0)
    shared = jitgrad.from_dlpack(capsule)
    shared._array()[0] = 5.0
    assert j.tolist() == [5.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="^from_dlpack received an invalid capsule. Note that DLTensor capsules "
                                           "can be consumed only once"):
        jitgrad.from_dlpack(capsule)
    del capsule, shared
    gc.collect()
    live = len(dlpack._live)
    x = jitgrad.from_dlpack(np.arange(4.0)[::-1])  # the producer is held: nothing else refers to it
    gc.collect()
    assert x.tolist() == [3.0, 2.0, 1.0, 0.0]
    y = np.from_dlpack(jitgrad.tensor([1.0]))
    unused = jitgrad.tensor([2.0]).__dlpack__(max_version=(1, 0))
    assert len(dlpack._live) == live + 2  # numpy's, and the unused capsule's (which goes with it)
    del x, y, unused
    gc.collect()
    assert len(dlpack._live) == live


def test_dlpack_errors():
    with pytest.raises(RuntimeError, match="^Can't export tensors that require gradient, use tensor.detach()"):
        jitgrad.ones(2, requires_grad=True).__dlpack__()
    with pytest.raises(TypeError, match="^can't convert np.ndarray of type uint8"):
        jitgrad.from_dlpack(np.zeros(2, np.uint8))
    with pytest.raises(TypeError, match="from_dlpack"):
        jitgrad.from_dlpack([1, 2])


def test_dlpack_cuda_round_trip_shares_device_memory():
    g = on("cuda", np.arange(6.0).reshape(2, 3))
    assert g.__dlpack_device__() == (dlpack.CUDA, 0)
    for view in (g, g.t(), wrap(g._data[:, 1:])):  # an offset view, made below the ops
        back = jitgrad.from_dlpack(view)
        assert back.is_cuda and back.shape == view.shape
        np.testing.assert_array_equal(host(back), host(view))
    back = jitgrad.from_dlpack(g.t().__dlpack__())
    back._data[2, 1] = -1.0  # a write through the capsule's tensor shows in the producer's
    assert host(g)[1, 2] == -1.0


# -- __cuda_array_interface__ ---------------------------------------------------------------------

class _Producer:
    """Another library's CUDA array: just the interface (what cupy and numba expose)."""

    def __init__(self, desc):
        self.__cuda_array_interface__ = desc


def test_cuda_array_interface_of_a_cuda_tensor():
    g = on("cuda", np.arange(6, dtype=np.float32).reshape(2, 3))
    desc = g.__cuda_array_interface__
    assert desc["shape"] == (2, 3) and desc["typestr"] == "<f4" and desc["version"] == 3
    assert desc["strides"] is None and desc["data"] == (g._data.ptr, False)
    assert g.t().__cuda_array_interface__["strides"] == (4, 12)
    assert not hasattr(jitgrad.ones(2), "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="^Can't get __cuda_array_interface__ on non-CUDA tensor type: "
                                             "torch.FloatTensor If CUDA data is required use tensor.cuda()"):
        jitgrad.ones(2).__cuda_array_interface__
    with pytest.raises(RuntimeError, match="^Can't get __cuda_array_interface__ on Variable that requires grad"):
        jitgrad.ones(2, device="cuda", requires_grad=True).__cuda_array_interface__


def test_as_tensor_shares_and_tensor_copies_a_cuda_array():
    g = on("cuda", np.arange(6.0).reshape(2, 3))
    producer = _Producer(g.t().__cuda_array_interface__)  # strided, as a cupy transpose would be
    shared = jitgrad.as_tensor(producer)
    same = jitgrad.as_tensor(producer, device="cuda")
    copied = jitgrad.tensor(producer)
    cast = jitgrad.as_tensor(producer, dtype=jitgrad.float32)
    on_host = jitgrad.tensor(producer, device="cpu")
    for t in (shared, same, copied, cast):
        assert t.is_cuda and t.shape == jitgrad.Size([3, 2])
    assert cast.dtype == jitgrad.float32 and not on_host.is_cuda
    g._data[1, 0] = 100.0
    assert host(shared)[0, 1] == 100.0 and host(same)[0, 1] == 100.0  # shared
    assert host(copied)[0, 1] == 3.0 and host(cast)[0, 1] == 3.0 and on_host.numpy()[0, 1] == 3.0  # copies
    del producer, g
    gc.collect()
    assert host(shared)[0, 1] == 100.0  # the producer's memory is held by the tensor


def test_tensor_of_a_cuda_tensor_copies_it_on_the_device():
    g = on("cuda", [1.0, 2.0], requires_grad=True)
    for t in (jitgrad.tensor(g), jitgrad.tensor(g, dtype=jitgrad.float32), jitgrad.tensor(g.detach(), device="cpu")):
        assert host(t).tolist() == [1.0, 2.0] and t.is_leaf and not t.requires_grad
    c = jitgrad.tensor(g)
    c._data[0] = 5.0
    assert c.is_cuda and host(g).tolist() == [1.0, 2.0]


def test_numba_device_arrays():
    """numba's own device arrays: through __cuda_array_interface__ on a GPU; the simulator's
    have none, so there the same is checked with the interface numba would give."""
    a = np.arange(4.0)
    if driver.simulated():
        dev = garray.DeviceArray.from_host(a)
        src = _Producer({"shape": (4,), "typestr": "<f8", "data": (dev.ptr, False), "strides": None, "version": 3})
    else:
        src = driver.cuda().to_device(a)
    t = jitgrad.as_tensor(src, device="cuda")
    assert t.is_cuda and host(t).tolist() == a.tolist()


# -- nn layers on CUDA, forward and backward, against the CPU ------------------------------------

def _layer_cases():
    rng = np.random.default_rng(3)
    x4 = rng.standard_normal((2, 3))
    img = rng.standard_normal((2, 1, 5, 5))
    return {
        "linear": (lambda: nn.Linear(3, 4), lambda m, x: m(x).sum(), x4),
        "mlp": (lambda: nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2), nn.GELU()),
                lambda m, x: m(x).sum(), x4),
        "layernorm": (lambda: nn.LayerNorm(3), lambda m, x: (m(x) * m(x)).sum(), x4),
        "conv-pool": (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2)),
                      lambda m, x: m(x).sum(), img),
        "cross-entropy": (lambda: nn.Linear(3, 4),
                          lambda m, x: nn.CrossEntropyLoss()(m(x), jitgrad.tensor([1, 3], device=x.device)), x4),
        "mse": (lambda: nn.Linear(3, 2), lambda m, x: nn.MSELoss()(m(x), jitgrad.zeros(2, 2, device=x.device)), x4),
    }


@pytest.mark.parametrize("case", ["linear", "mlp", "layernorm", "conv-pool", "cross-entropy", "mse", "embedding"])
def test_nn_layers_on_cuda_match_cpu(case):
    if case == "embedding":
        make, loss, x = (lambda: nn.Embedding(5, 3), lambda m, i: (m(i) * m(i)).sum(), np.array([[0, 4], [4, 2]]))
    else:
        make, loss, x = _layer_cases()[case]
    jitgrad.manual_seed(0)
    cpu = make().double()
    gpu = make().double()
    gpu.load_state_dict(cpu.state_dict())
    gpu.cuda()
    results = []
    for m, dev in ((cpu, "cpu"), (gpu, "cuda")):
        xt = on(dev, x, requires_grad=x.dtype.kind == "f")
        out = loss(m, xt)
        out.backward()
        results.append((out, [p.grad for p in m.parameters()], xt.grad))
    (oc, gc_, xc), (og, gg, xg) = results
    assert og.is_cuda and all(g.is_cuda for g in gg)
    assert_close(host(og), host(oc))
    for a, b in zip(gg, gc_):
        assert_close(host(a), host(b))
    if xc is not None:
        assert xg.is_cuda
        assert_close(host(xg), host(xc))


def test_training_steps_on_cuda_match_cpu():
    """Module.cuda, forward, backward and an optimizer step, three times: the CUDA model ends
    where the CPU one does."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((4, 3)), np.array([0, 1, 1, 0])
    models = []
    for dev in ("cpu", "cuda"):
        jitgrad.manual_seed(1)
        m = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2)).double().to(dev)
        opt = jitgrad.optim.Adam(m.parameters(), lr=0.05)
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(m(on(dev, x)), on(dev, y)).backward()
            opt.step()
        models.append(m)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert b.is_cuda
        assert_close(host(b), host(a))


def test_utils_dlpack_as_torch():
    t = jitgrad.tensor([1.0, 2.0])
    back = jitgrad.utils.dlpack.from_dlpack(jitgrad.utils.dlpack.to_dlpack(t))
    back._array()[1] = 3.0
    assert t.tolist() == [1.0, 3.0]
    assert torch.utils.dlpack.from_dlpack(jitgrad.utils.dlpack.to_dlpack(t)).tolist() == [1.0, 3.0]
