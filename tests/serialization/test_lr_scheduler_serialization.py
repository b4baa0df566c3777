"""jitgrad.optim.lr_scheduler (StepLR, CosineAnnealingLR) against torch 2.13, and jitgrad.save /
jitgrad.load (an .npz + JSON format, no pickle): round trips, state dicts, corrupt files."""
import io
import json
import os
import warnings
from collections import OrderedDict

import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")

LRS = [0.1, 0.03, 1.0]


# ----------------------------------------------------------------------------- schedulers

def _opt(T, lrs=LRS):
    groups = [{"params": [T.zeros(2, dtype=T.float64, requires_grad=True)], "lr": lr} for lr in lrs]
    return T.optim.SGD(groups, lr=0.5)


def _make(T, kind, kw, opt=None):
    opt = opt if opt is not None else _opt(T)
    return opt, getattr(T.optim.lr_scheduler, kind)(opt, **kw)


def _run(opt, sched, n):
    out = []
    for _ in range(n):
        opt.step()
        sched.step()
        out.append((list(sched.get_last_lr()), [g["lr"] for g in opt.param_groups], sched.last_epoch))
    return out


CONFIGS = [
    ("StepLR", {"step_size": 3, "gamma": 0.5}),
    ("StepLR", {"step_size": 1, "gamma": 0.9}),
    ("StepLR", {"step_size": 7}),
    ("CosineAnnealingLR", {"T_max": 10}),
    ("CosineAnnealingLR", {"T_max": 7, "eta_min": 0.001}),
    ("CosineAnnealingLR", {"T_max": 50, "eta_min": 0.01}),
    ("CosineAnnealingLR", {"T_max": 1}),
]


def _assert_seq_close(a, b):
    assert len(a) == len(b)
    for (la, ga, ea), (lb, gb, eb) in zip(a, b):
        assert ea == eb
        np.testing.assert_allclose(la, lb, rtol=0, atol=1e-12)
        np.testing.assert_allclose(ga, gb, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind,kw", CONFIGS, ids=[f"{k}-{v}" for k, v in CONFIGS])
def test_scheduler_matches_torch(kind, kw):
    oj, sj = _make(jitgrad, kind, kw)
    ot, st = _make(torch, kind, kw)
    # construction: initial_lr recorded, epoch 0, lrs untouched
    assert [g["initial_lr"] for g in oj.param_groups] == LRS == [g["initial_lr"] for g in ot.param_groups]
    assert sj.last_epoch == st.last_epoch == 0
    assert sj.get_last_lr() == st.get_last_lr() == LRS
    assert sj.base_lrs == st.base_lrs
    _assert_seq_close(_run(oj, sj, 50), _run(ot, st, 50))


@pytest.mark.parametrize("kind,kw", CONFIGS[::2], ids=[k for k, _ in CONFIGS[::2]])
def test_scheduler_state_dict_round_trip(kind, kw):
    ot, st = _make(torch, kind, kw)
    ref = _run(ot, st, 30)
    oj, sj = _make(jitgrad, kind, kw)
    _run(oj, sj, 12)
    sd = sj.state_dict()
    assert "optimizer" not in sd
    assert set(sd) == set(st.state_dict())
    # resume: a fresh optimizer/scheduler pair, optimizer state first (it carries lr / initial_lr)
    o2, s2 = _make(jitgrad, kind, kw)
    o2.load_state_dict(oj.state_dict())
    s2.load_state_dict(sd)
    assert s2.last_epoch == 12 and s2.get_last_lr() == sj.get_last_lr()
    _assert_seq_close(_run(o2, s2, 18), ref[12:])


@pytest.mark.parametrize("kind,kw", [("StepLR", {"step_size": 3, "gamma": 0.5}),
                                     ("CosineAnnealingLR", {"T_max": 10, "eta_min": 0.01})])
def test_scheduler_resume_with_last_epoch(kind, kw):
    def go(T):
        opt = _opt(T)
        for g in opt.param_groups:
            g["initial_lr"] = g["lr"]
        return _run(opt, getattr(T.optim.lr_scheduler, kind)(opt, last_epoch=4, **kw), 20)
    _assert_seq_close(go(jitgrad), go(torch))


def test_scheduler_resume_without_initial_lr_raises():
    with pytest.raises(KeyError, match="initial_lr"):
        jitgrad.optim.lr_scheduler.StepLR(_opt(jitgrad), 2, last_epoch=3)


def test_scheduler_misc_api():
    sched = jitgrad.optim.lr_scheduler
    assert issubclass(sched._LRScheduler, sched.LRScheduler) and sched._LRScheduler.__name__ == "_LRScheduler"
    with pytest.raises(TypeError, match="is not an Optimizer"):
        sched.StepLR(object(), 2)
    for T in (jitgrad, torch):
        opt, s = _make(T, "StepLR", {"step_size": 2})
        with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
            s.step()  # stepping the scheduler first skips an lr: torch warns
        opt, s = _make(T, "StepLR", {"step_size": 2})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            opt.step()
            s.step()
        with pytest.warns(UserWarning, match="get_last_lr"):
            s.get_lr()


# ----------------------------------------------------------------------------- save / load

def _round_trip(obj, tmp_path, use_path=True):
    if use_path:
        p = tmp_path / "ckpt.pt"
        jitgrad.save(obj, p)
        return jitgrad.load(p)
    buf = io.BytesIO()
    jitgrad.save(obj, buf)
    buf.seek(0)
    return jitgrad.load(buf)


@pytest.mark.parametrize("use_path", [True, False], ids=["path", "fileobj"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool"])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 4), (0, 2)])
def test_tensor_round_trip(dtype, shape, use_path, tmp_path):
    arr = (np.random.default_rng(0).standard_normal(shape) * 5).astype(dtype)
    t = jitgrad.tensor(arr)
    out = _round_trip(t, tmp_path, use_path)
    assert type(out) is jitgrad.Tensor and out.dtype == t.dtype and tuple(out.shape) == shape
    assert out.requires_grad is False and out.is_leaf
    np.testing.assert_array_equal(out.numpy(), arr)


def test_requires_grad_restored_like_torch(tmp_path):
    def go(T, save, load):
        a = T.tensor([1.0, 2.0], requires_grad=True)
        p = T.nn.Parameter(T.tensor([3.0]))
        q = T.nn.Parameter(T.tensor([3.0]), requires_grad=False)
        buf = io.BytesIO()
        save([a, a * 2, p, q, a.detach(), a], buf)
        buf.seek(0)
        out = load(buf)
        return [(type(x).__name__, x.requires_grad, x.is_leaf) for x in out], out[0] is out[5]
    assert go(jitgrad, jitgrad.save, jitgrad.load) == go(torch, torch.save, torch.load)


def test_nested_structure_round_trip(tmp_path):
    t = jitgrad.tensor([1.5, 2.5], dtype=jitgrad.float64)
    obj = OrderedDict([
        ("w", t), ("again", t), (3, {"x": None, 7: [1, 2.0, True, "s", (t, -4)]}), ("arr", np.arange(6).reshape(2, 3)),
        ("scalars", [float("inf"), 10 ** 20, np.float32(1.25), np.int64(-3)]), ("empty", ({}, [], ())),
        ((1, "k"), "tuple key"),
    ])
    out = _round_trip(obj, tmp_path)
    assert type(out) is OrderedDict and list(out) == list(obj)
    assert out["w"] is out["again"]
    assert type(out[3]) is dict and list(out[3]) == ["x", 7]
    assert out[3]["x"] is None and out[3][7][:4] == [1, 2.0, True, "s"]
    assert [type(v) for v in out[3][7][:4]] == [int, float, bool, str]
    assert type(out[3][7][4]) is tuple and out[3][7][4][0] is out["w"] and out[3][7][4][1] == -4
    assert out["arr"].dtype == np.int64 and np.array_equal(out["arr"], obj["arr"])
    s = out["scalars"]
    assert s[0] == float("inf") and s[1] == 10 ** 20 and type(s[2]) is np.float32 and type(s[3]) is np.int64
    assert out["empty"] == ({}, [], ()) and type(out["empty"]) is tuple
    assert out[(1, "k")] == "tuple key"


def _model(T, seed):
    T.manual_seed(seed)
    return T.nn.Sequential(T.nn.Linear(4, 8), T.nn.ReLU(), T.nn.Linear(8, 1))


def test_model_state_dict_round_trip(tmp_path):
    m = _model(jitgrad, 0)
    sd = m.state_dict()
    out = _round_trip(sd, tmp_path)
    assert type(out) is OrderedDict and list(out) == list(sd)
    for k in sd:
        assert out[k].dtype == sd[k].dtype and out[k].requires_grad is False
        np.testing.assert_array_equal(out[k].numpy(), sd[k].numpy())
    fresh = _model(jitgrad, 1)
    x = jitgrad.randn(5, 4)
    assert not np.array_equal(fresh(x).detach().numpy(), m(x).detach().numpy())
    fresh.load_state_dict(out)
    np.testing.assert_array_equal(fresh(x).detach().numpy(), m(x).detach().numpy())


def _train(model, opt, xs, ys):
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()


def test_adam_state_dict_resume_matches_uninterrupted(tmp_path):
    jitgrad.manual_seed(5)
    xs = [jitgrad.randn(6, 4) for _ in range(10)]
    ys = [jitgrad.randn(6, 1) for _ in range(10)]

    ref = _model(jitgrad, 0)
    ref_opt = jitgrad.optim.Adam(ref.parameters(), lr=0.01, betas=(0.8, 0.99))
    _train(ref, ref_opt, xs, ys)

    m = _model(jitgrad, 0)
    opt = jitgrad.optim.Adam(m.parameters(), lr=0.01, betas=(0.8, 0.99))
    _train(m, opt, xs[:4], ys[:4])
    jitgrad.save({"model": m.state_dict(), "optim": opt.state_dict()}, tmp_path / "ck.pt")

    ck = jitgrad.load(tmp_path / "ck.pt")
    osd = ck["optim"]
    assert sorted(osd["state"]) == list(range(4)) and type(osd["param_groups"][0]["betas"]) is tuple
    assert osd["state"][0]["step"] == 4.0
    m2 = _model(jitgrad, 9)
    m2.load_state_dict(ck["model"])
    opt2 = jitgrad.optim.Adam(m2.parameters(), lr=0.5)
    opt2.load_state_dict(osd)
    assert opt2.param_groups[0]["lr"] == 0.01
    _train(m2, opt2, xs[4:], ys[4:])
    for a, b in zip(ref.parameters(), m2.parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_file_is_plain_npz(tmp_path):
    p = tmp_path / "t.pt"  # no .npz suffix added to the name
    t = jitgrad.tensor([[1, 2], [3, 4]])
    jitgrad.save({"t": t, "n": 3}, p)
    assert os.listdir(tmp_path) == ["t.pt"]
    with np.load(p, allow_pickle=False) as npz:
        meta = json.loads(str(npz["__jitgrad__"][()]))
        idx = meta["obj"]["dict"][0][1]["tensor"]
        np.testing.assert_array_equal(npz[f"a{idx}"], t.numpy())


def test_truncated_file_raises_runtime_error(tmp_path):
    p = tmp_path / "ck.pt"
    jitgrad.save({"w": jitgrad.randn(100, 10)}, p)
    data = p.read_bytes()
    for n in (0, 10, len(data) // 2, len(data) - 5):
        bad = tmp_path / f"cut{n}.pt"
        bad.write_bytes(data[:n])
        with pytest.raises(RuntimeError, match="Invalid jitgrad file") as e:
            jitgrad.load(bad)
        assert str(bad) in str(e.value)


def test_random_bytes_raise_runtime_error(tmp_path):
    p = tmp_path / "junk.pt"
    p.write_bytes(np.random.default_rng(1).bytes(1000))
    with pytest.raises(RuntimeError, match="Invalid jitgrad file"):
        jitgrad.load(p)
    with pytest.raises(RuntimeError, match="Invalid jitgrad file"):
        jitgrad.load(io.BytesIO(b"PK\x03\x04" + b"\0" * 50))


def test_foreign_npz_and_npy_raise_runtime_error(tmp_path):
    np.savez(tmp_path / "other.npz", x=np.ones(3))
    with pytest.raises(RuntimeError, match="not a jitgrad checkpoint"):
        jitgrad.load(tmp_path / "other.npz")
    np.save(tmp_path / "arr.npy", np.ones(3))
    with pytest.raises(RuntimeError, match="not an .npz archive"):
        jitgrad.load(tmp_path / "arr.npy")


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        jitgrad.load(tmp_path / "nope.pt")
    with pytest.raises(FileNotFoundError):
        torch.load(tmp_path / "nope.pt")


def test_unsupported_types_raise_type_error(tmp_path):
    for bad in (object(), {"a": {1, 2}}, [lambda: 0], {jitgrad.tensor(1): 1}, np.array([object()])):
        with pytest.raises(TypeError, match="jitgrad.save cannot store"):
            jitgrad.save(bad, io.BytesIO())
    cyc = []
    cyc.append(cyc)
    with pytest.raises(ValueError, match="circular"):
        jitgrad.save(cyc, io.BytesIO())


def test_load_arguments():
    buf = io.BytesIO()
    jitgrad.save(jitgrad.ones(2), buf)
    for kw in ({"weights_only": False}, {"map_location": "cpu"}, {"map_location": torch.device("cpu")}):
        buf.seek(0)
        assert jitgrad.load(buf, **kw).tolist() == [1.0, 1.0]
    buf.seek(0)
    if jitgrad.cuda.is_available():  # tests/cuda/test_api.py has the rest of map_location on a device
        assert jitgrad.load(buf, map_location="cuda:0").device == jitgrad.device("cuda:0")
    else:
        with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device but "
                                               r"torch.cuda.is_available\(\) is False"):
            jitgrad.load(buf, map_location="cuda:0")
