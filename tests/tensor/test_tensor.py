"""Tensor creation, attributes, in-place helpers and repr (PyTorch semantics)."""
import re

import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- creation / dtypes

def test_tensor_dtype_inference():
    assert jitgrad.tensor([1.0, 2.0]).dtype == jitgrad.float32
    assert jitgrad.tensor(3.5).dtype == jitgrad.float32
    assert jitgrad.tensor([1, 2]).dtype == jitgrad.int64
    assert jitgrad.tensor(7).dtype == jitgrad.int64
    assert jitgrad.tensor([True, False]).dtype == jitgrad.bool
    assert jitgrad.tensor([1, 2.5]).dtype == jitgrad.float32
    assert jitgrad.tensor(np.zeros(3)).dtype == jitgrad.float64  # numpy dtype is kept
    assert jitgrad.tensor(np.zeros(3, dtype=np.float32)).dtype == jitgrad.float32
    assert jitgrad.tensor(np.arange(3)).dtype == jitgrad.int64
    assert jitgrad.tensor([1, 2], dtype=jitgrad.float64).dtype == jitgrad.float64
    assert jitgrad.tensor([1.7, 2.2], dtype=jitgrad.int64).tolist() == [1, 2]
    assert jitgrad.tensor([[1, 2], [3, 4]], dtype=jitgrad.float32).dtype == jitgrad.float32


def test_dtypes_are_distinct_and_float32_is_default():
    dts = [jitgrad.float32, jitgrad.float64, jitgrad.int64, jitgrad.bool]
    for i, a in enumerate(dts):
        for j, b in enumerate(dts):
            assert (a == b) == (i == j)
    assert jitgrad.zeros(2).dtype == jitgrad.float32


def test_tensor_values_and_shape():
    t = jitgrad.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert t.shape == (2, 3)
    assert tuple(t.shape) == (2, 3)
    assert t.size() == (2, 3)
    assert t.size(0) == 2 and t.size(1) == 3 and t.size(-1) == 3
    assert t.ndim == 2 and t.dim() == 2
    assert t.numel() == 6
    assert t.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    n = t.numpy()
    assert isinstance(n, np.ndarray) and n.dtype == np.float32 and n.shape == (2, 3)
    s = jitgrad.tensor(2.5)
    assert s.shape == () and s.ndim == 0 and s.numel() == 1
    assert s.item() == 2.5 and isinstance(s.item(), float)
    assert isinstance(jitgrad.tensor(3).item(), int)
    assert jitgrad.tensor([7]).item() == 7
    assert jitgrad.tensor([[True]]).item() is True
    assert jitgrad.tensor(4.0).tolist() == 4.0


def test_tensor_from_tensor_like_data_and_nested():
    t = jitgrad.tensor([[[1, 2]], [[3, 4]]])
    assert t.shape == (2, 1, 2)
    assert t.tolist() == [[[1, 2]], [[3, 4]]]
    e = jitgrad.tensor([])
    assert e.shape == (0,) and e.numel() == 0 and e.dtype == jitgrad.float32


@pytest.mark.parametrize("name", ["zeros", "ones"])
def test_zeros_ones(name):
    f = getattr(jitgrad, name)
    val = 0.0 if name == "zeros" else 1.0
    a = f(2, 3)
    b = f((2, 3))
    c = f([4])
    for t in (a, b):
        assert t.shape == (2, 3) and t.dtype == jitgrad.float32
        assert np.all(t.numpy() == val)
        assert t.requires_grad is False
    assert c.shape == (4,)
    d = f(2, dtype=jitgrad.float64, requires_grad=True)
    assert d.dtype == jitgrad.float64 and d.requires_grad and d.is_leaf
    i = f(3, dtype=jitgrad.int64)
    assert i.dtype == jitgrad.int64 and i.tolist() == [int(val)] * 3
    s = f(())
    assert s.shape == ()


def test_full():
    t = jitgrad.full((2, 3), 1.5)
    assert t.shape == (2, 3) and t.dtype == jitgrad.float32
    assert np.all(t.numpy() == 1.5)
    assert jitgrad.full((2,), 7).dtype == jitgrad.int64  # torch infers from fill value
    assert jitgrad.full((2,), True).dtype == jitgrad.bool
    t = jitgrad.full((3,), 2.0, dtype=jitgrad.float64, requires_grad=True)
    assert t.dtype == jitgrad.float64 and t.requires_grad
    assert t.tolist() == [2.0, 2.0, 2.0]


def test_arange():
    for args, kwargs in [((5,), {}), ((2, 7), {}), ((0, 10, 3), {}), ((5.0,), {}),
                         ((0, 1, 0.25), {}), ((1, -2, -1), {}), ((5,), {"dtype": jitgrad.float64})]:
        targs = dict(kwargs)
        if "dtype" in targs:
            targs["dtype"] = torch.float64
        j = jitgrad.arange(*args, **kwargs)
        t = torch.arange(*args, **targs)
        assert j.tolist() == t.tolist(), args
        assert str(j.dtype).split(".")[-1] == str(t.dtype).split(".")[-1], args


def test_randn_rand_statistics():
    a = jitgrad.randn(200, 100)
    assert a.shape == (200, 100) and a.dtype == jitgrad.float32
    n = a.numpy().astype(np.float64)
    assert abs(n.mean()) < 0.03
    assert abs(n.std() - 1.0) < 0.03
    assert n.min() < -2.5 and n.max() > 2.5
    b = jitgrad.rand((200, 100))
    m = b.numpy()
    assert b.shape == (200, 100) and b.dtype == jitgrad.float32
    assert m.min() >= 0.0 and m.max() < 1.0
    assert abs(m.mean() - 0.5) < 0.02
    c = jitgrad.randn(3, dtype=jitgrad.float64, requires_grad=True)
    assert c.dtype == jitgrad.float64 and c.requires_grad and c.is_leaf
    assert not np.allclose(jitgrad.randn(10).numpy(), jitgrad.randn(10).numpy())


def test_like_factories():
    base = jitgrad.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=jitgrad.float64, requires_grad=True)
    z = jitgrad.zeros_like(base)
    o = jitgrad.ones_like(base)
    f = jitgrad.full_like(base, 3.0)
    r = jitgrad.randn_like(base)
    u = jitgrad.rand_like(base)
    for t in (z, o, f, r, u):
        assert t.shape == (2, 2)
        assert t.dtype == jitgrad.float64
        assert t.requires_grad is False  # requires_grad is not inherited
        assert t.grad_fn is None
    assert z.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert o.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert f.tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert np.all((u.numpy() >= 0) & (u.numpy() < 1))
    assert jitgrad.zeros_like(base, dtype=jitgrad.float32).dtype == jitgrad.float32
    assert jitgrad.ones_like(base, requires_grad=True).requires_grad
    i = jitgrad.tensor([1, 2])
    assert jitgrad.zeros_like(i).dtype == jitgrad.int64


def test_from_numpy_shares_memory_and_keeps_dtype():
    a = np.array([1.0, 2.0, 3.0])
    t = jitgrad.from_numpy(a)
    assert t.dtype == jitgrad.float64
    a[0] = 10.0
    assert t.tolist() == [10.0, 2.0, 3.0]
    i = jitgrad.from_numpy(np.array([1, 2], dtype=np.int64))
    assert i.dtype == jitgrad.int64
    f = jitgrad.from_numpy(np.ones((2, 2), dtype=np.float32))
    assert f.dtype == jitgrad.float32 and f.shape == (2, 2)


def test_numpy_shares_memory():
    t = jitgrad.zeros(3)
    n = t.numpy()
    n[1] = 5.0
    assert t.tolist() == [0.0, 5.0, 0.0]


def test_numpy_on_requires_grad_raises():
    t = jitgrad.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^Can't call numpy\(\) on Tensor that requires grad"):
        t.numpy()
    assert t.detach().numpy().tolist() == [1.0, 1.0]


# ---------------------------------------------------------------- autograd attributes

def test_leaf_attributes():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    assert x.requires_grad is True
    assert x.is_leaf is True
    assert x.grad is None
    assert x.grad_fn is None
    assert x.output_nr == 0
    assert x.retains_grad is False
    c = jitgrad.tensor([1.0])
    assert c.requires_grad is False and c.is_leaf is True and c.grad_fn is None


def test_nonleaf_attributes():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    assert y.requires_grad is True
    assert y.is_leaf is False
    assert y.grad_fn is not None
    assert y.output_nr == 0
    assert y.retains_grad is False
    y.retain_grad()
    assert y.retains_grad is True
    # mixing constants keeps requires_grad
    z = jitgrad.tensor([3.0, 4.0]) + y
    assert z.requires_grad is True
    # op on constants only: no graph
    w = jitgrad.tensor([3.0]) * 2
    assert w.requires_grad is False and w.grad_fn is None and w.is_leaf is True


def test_grad_is_settable():
    x = jitgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x.grad = jitgrad.tensor([0.5, 0.5, 0.5])
    assert x.grad.tolist() == [0.5, 0.5, 0.5]
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.5, 2.5, 2.5]  # accumulates into the assigned grad
    x.grad = None
    assert x.grad is None
    (x * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0, 3.0]


def test_requires_grad_():
    x = jitgrad.tensor([1.0, 2.0])
    r = x.requires_grad_()
    assert r is x
    assert x.requires_grad is True and x.is_leaf
    x.requires_grad_(False)
    assert x.requires_grad is False
    x.requires_grad_(True)
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]


def test_requires_grad_setter_attribute():
    x = jitgrad.tensor([1.0, 2.0])
    x.requires_grad = True
    assert x.requires_grad
    (x * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_detach():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    d = y.detach()
    assert d.requires_grad is False and d.grad_fn is None and d.is_leaf
    assert d.tolist() == [2.0, 4.0]
    # detach shares storage with the original
    xd = x.detach()
    xd.zero_()
    assert x.tolist() == [0.0, 0.0]
    assert y.requires_grad  # y untouched


def test_detach_():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    r = y.detach_()
    assert r is y
    assert y.requires_grad is False and y.grad_fn is None and y.is_leaf is True
    assert y.tolist() == [2.0, 4.0]


def test_data_attribute():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    d = x.data
    assert d.requires_grad is False
    assert d.grad_fn is None
    assert d.tolist() == [1.0, 2.0]
    d.zero_()  # shares storage
    assert x.tolist() == [0.0, 0.0]
    assert x.requires_grad is True


def test_clone_is_copy_with_grad():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    c = x.clone()
    assert c.requires_grad and not c.is_leaf and c.grad_fn is not None
    (c * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    p = jitgrad.tensor([1.0, 2.0])
    q = p.clone()
    q.zero_()
    assert p.tolist() == [1.0, 2.0]  # clone does not share memory


def test_zero_and_copy_and_version():
    t = jitgrad.tensor([1.0, 2.0, 3.0])
    assert t._version == 0
    r = t.zero_()
    assert r is t
    assert t.tolist() == [0.0, 0.0, 0.0]
    assert t._version == 1
    r = t.copy_(jitgrad.tensor([4.0, 5.0, 6.0]))
    assert r is t
    assert t.tolist() == [4.0, 5.0, 6.0]
    assert t._version == 2
    t.copy_(jitgrad.tensor(9.0))  # broadcasting copy
    assert t.tolist() == [9.0, 9.0, 9.0]
    t.copy_(jitgrad.tensor([1.5, 2.5, 3.5], dtype=jitgrad.float64))  # dtype conversion
    assert t.dtype == jitgrad.float32
    assert t.tolist() == [1.5, 2.5, 3.5]
    assert t._version == 4


def test_grad_zero_seed_pattern():
    x = jitgrad.tensor([1.0], requires_grad=True)
    z = x * 2 * 3
    z.backward(retain_graph=True)
    assert x.grad.tolist() == [6.0]
    x.grad.zero_()
    assert x.grad.tolist() == [0.0]
    z.backward()
    assert x.grad.tolist() == [6.0]


def test_copy_under_no_grad_copies_values_only():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    t = jitgrad.zeros(2)
    y = x * 1.0
    # copy into a fresh non-grad buffer under no_grad then use - values only
    with jitgrad.no_grad():
        t.copy_(y)
    assert t.tolist() == [1.0, 2.0]
    assert t.requires_grad is False


# ---------------------------------------------------------------- repr / str

def _norm_dtype_prefix(s):
    # Accept either ``torch.`` or ``jitgrad.`` in the dtype part only.
    return re.sub(r"dtype=jitgrad\.", "dtype=torch.", s)


@pytest.mark.parametrize("maker,expected", [
    (lambda T: T.tensor([3.0]), "tensor([3.])"),
    (lambda T: T.tensor([1.0, 2.0]), "tensor([1., 2.])"),
    (lambda T: T.tensor(4.0), "tensor(4.)"),
    (lambda T: T.tensor([2.0], requires_grad=True), "tensor([2.], requires_grad=True)"),
    (lambda T: T.tensor([1.0, 2.0, 3.0], requires_grad=True).sum(), "tensor(6., grad_fn=<SumBackward0>)"),
    (lambda T: T.tensor(2.0, requires_grad=True) * 2, "tensor(4., grad_fn=<MulBackward0>)"),
    (lambda T: T.tensor([1.0, 2.0], dtype=T.float64), "tensor([1., 2.], dtype=torch.float64)"),
    (lambda T: T.tensor([2.0], dtype=T.float64, requires_grad=True),
     "tensor([2.], dtype=torch.float64, requires_grad=True)"),
    (lambda T: (T.tensor([2.0], dtype=T.float64, requires_grad=True) * 2).sum(),
     "tensor(4., dtype=torch.float64, grad_fn=<SumBackward0>)"),
    (lambda T: T.tensor([1, 2, 3]), "tensor([1, 2, 3])"),
    (lambda T: T.tensor([True, False]), "tensor([ True, False])"),
    (lambda T: T.tensor([[1.0, 2.0], [3.0, 4.0]]), "tensor([[1., 2.],\n        [3., 4.]])"),
    (lambda T: T.tensor([0.5, 1.25]), "tensor([0.5000, 1.2500])"),
    (lambda T: T.tensor([-1.0, 2.0]), "tensor([-1.,  2.])"),
])
def test_repr_like_torch(maker, expected):
    t_repr = repr(maker(torch))
    assert t_repr == expected  # guards the expectation itself
    j = maker(jitgrad)
    assert _norm_dtype_prefix(repr(j)) == expected
    assert _norm_dtype_prefix(str(j)) == expected


def test_repr_of_grad_after_backward():
    x = jitgrad.tensor([2.0], requires_grad=True)
    (x * 3).sum().backward()
    assert repr(x.grad) == "tensor([3.])"
