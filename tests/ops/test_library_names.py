"""Names PyTorch libraries check before they compute (found running torchdiffeq through the import shim),
against torch: dtype queries and complex dtypes as names, promote_types, real/imag of real tensors,
nextafter, as_strided, ndimension, the RNG state round trip; and item assignment, which writes (never
blends): NaN and inf already in the destination do not survive, on every path that records it."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float64", "int32", "int64", "bool", "complex64", "complex128"]


@pytest.mark.parametrize("name", DTYPES)
def test_dtype_queries_are_torchs(name):
    j, t = getattr(jitgrad, name), getattr(torch, name)
    assert (j.is_floating_point, j.is_complex, j.is_signed, j.itemsize) == \
        (t.is_floating_point, t.is_complex, t.is_signed, t.itemsize)
    assert repr(j) == repr(t)
    if t.is_floating_point or t.is_complex:
        assert repr(j.to_real()) == repr(t.to_real()) and repr(j.to_complex()) == repr(t.to_complex())


@pytest.mark.parametrize("a", DTYPES)
@pytest.mark.parametrize("b", DTYPES)
def test_promote_types_is_torchs(a, b):
    assert repr(jitgrad.promote_types(getattr(jitgrad, a), getattr(jitgrad, b))) == \
        repr(torch.promote_types(getattr(torch, a), getattr(torch, b)))


def test_promote_types_refuses_non_dtypes():
    for mod in (torch, jitgrad):
        with pytest.raises(TypeError, match=r"promote_types\(\): argument 'type1' \(position 1\) must be torch.dtype"):
            mod.promote_types(1, mod.float32)


def test_complex_tensor_creation_raises_clearly():
    assert jitgrad.cfloat is jitgrad.complex64 and jitgrad.cdouble is jitgrad.complex128
    for make in (lambda: jitgrad.zeros(2, dtype=jitgrad.complex64), lambda: jitgrad.tensor([1.0], dtype=jitgrad.complex128),
                 lambda: jitgrad.ones(2).to(jitgrad.complex64)):
        with pytest.raises(NotImplementedError, match="jitgrad has no complex tensors yet: torch.complex"):
            make()


@pytest.mark.parametrize("fn", ["is_floating_point", "is_complex"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool"])
def test_is_floating_point_is_complex(fn, dtype):
    j, t = jitgrad.ones(2, dtype=getattr(jitgrad, dtype)), torch.ones(2, dtype=getattr(torch, dtype))
    assert getattr(jitgrad, fn)(j) == getattr(torch, fn)(t) == getattr(j, fn)() == getattr(t, fn)()
    for mod in (torch, jitgrad):
        with pytest.raises(TypeError, match=fn + r"\(\): argument 'input' \(position 1\) must be Tensor, not float"):
            getattr(mod, fn)(1.0)


def test_real_imag_of_a_real_tensor():
    for mod in (torch, jitgrad):
        x = mod.ones(2, requires_grad=True) * 2
        assert x.real is x and mod.real(x) is x
        with pytest.raises(RuntimeError, match="imag is not implemented for tensors with non-complex dtypes."):
            x.imag
        with pytest.raises(RuntimeError, match="imag is not implemented for tensors with non-complex dtypes."):
            mod.imag(x)
    assert jitgrad.ones(2, 3).ndimension() == torch.ones(2, 3).ndimension() == 2


@pytest.mark.parametrize("da,db", [("float32", "float32"), ("float64", "float64"), ("float32", "float64")])
def test_nextafter_values_and_gradient(da, db):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(6), rng.standard_normal(6)
    a[:2], b[1] = [0.0, 1.0], 1.0  # towards itself, from zero
    ja = jitgrad.tensor(a, dtype=getattr(jitgrad, da), requires_grad=True)
    jb = jitgrad.tensor(b, dtype=getattr(jitgrad, db), requires_grad=True)
    ta = torch.tensor(a, dtype=getattr(torch, da), requires_grad=True)
    tb = torch.tensor(b, dtype=getattr(torch, db), requires_grad=True)
    jr, tr = jitgrad.nextafter(ja, jb), torch.nextafter(ta, tb)
    assert str(jr.dtype) == str(tr.dtype) and type(jr.grad_fn).__name__ == type(tr.grad_fn).__name__
    np.testing.assert_array_equal(jr.detach().numpy(), tr.detach().numpy())
    np.testing.assert_array_equal(ja.nextafter(jb).detach().numpy(), tr.detach().numpy())
    w = rng.standard_normal(6)
    (jr * jitgrad.tensor(w, dtype=jr.dtype)).sum().backward()
    (tr * torch.tensor(w, dtype=tr.dtype)).sum().backward()
    np.testing.assert_allclose(ja.grad.numpy(), ta.grad.numpy())
    np.testing.assert_allclose(jb.grad.numpy(), tb.grad.numpy())


def test_nextafter_errors_are_torchs():
    for mod in (torch, jitgrad):
        with pytest.raises(TypeError, match=r"nextafter\(\): argument 'other' \(position 2\) must be Tensor, not float"):
            mod.nextafter(mod.ones(2), 2.0)
        with pytest.raises(NotImplementedError, match="\"nextafter_cpu\" not implemented for 'Long'"):
            mod.nextafter(mod.tensor([1, 2]), mod.tensor([2, 3]))


AS_STRIDED = [((6,), (2, 2), (1, 2), None), ((6,), (3, 2), (1, 1), 1), ((6,), (), (), None), ((6,), (), (), 4),
              ((2, 3), (3, 2), (1, 3), 0), ((4, 3), (2, 2), (3, 1), 2), ((6,), (2, 3), (0, 1), None)]


@pytest.mark.parametrize("shape,size,stride,offset", AS_STRIDED)
def test_as_strided_values_and_gradient(shape, size, stride, offset):
    x = np.arange(float(np.prod(shape))).reshape(shape) + 0.5
    jx, tx = jitgrad.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    jr = jitgrad.as_strided(jx, size, stride, offset)
    tr = torch.as_strided(tx, size, stride, offset)
    np.testing.assert_array_equal(jr.detach().numpy(), tr.detach().numpy())
    assert type(jr.grad_fn).__name__ == type(tr.grad_fn).__name__ == "AsStridedBackward0"
    w = np.random.default_rng(1).standard_normal(size)
    (jr * jitgrad.tensor(w)).sum().backward()
    (tr * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(jx.grad.numpy(), tx.grad.numpy())  # repeated positions add up (stride 0)


def test_as_strided_of_a_view_reads_the_storage():
    x = np.arange(12.0)
    jv, tv = jitgrad.tensor(x)[2:].view(5, 2).t(), torch.tensor(x)[2:].view(5, 2).t()
    for args in (((2, 2), (1, 2)), ((3,), (2,), 3), ((2,), (1,), 2)):
        np.testing.assert_array_equal(jitgrad.as_strided(jv, *args).numpy(), torch.as_strided(tv, *args).numpy())
        np.testing.assert_array_equal(jv.as_strided(*args).numpy(), tv.as_strided(*args).numpy())


def test_as_strided_out_of_bounds_raises():
    for mod in (torch, jitgrad):
        with pytest.raises(RuntimeError, match=r"setStorage: sizes \[4\], strides \[2\], storage offset 0"):
            mod.as_strided(mod.ones(6), (4,), (2,))
    with pytest.raises(RuntimeError, match="mismatch in length of strides and shape"):
        jitgrad.as_strided(jitgrad.ones(6), (2,), (1, 1))


def test_rng_state_round_trip():
    jitgrad.manual_seed(3)
    state = jitgrad.get_rng_state()
    a = jitgrad.randn(5)
    jitgrad.rand(7)
    jitgrad.set_rng_state(state)
    np.testing.assert_array_equal(jitgrad.randn(5).numpy(), a.numpy())
    for T in (jitgrad, torch):  # torch's error for a state that is not its byte tensor
        with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
            T.set_rng_state(T.zeros(3))


# --- item assignment writes -----------------------------------------------------------------------
FILLS = [float("nan"), float("inf"), -float("inf")]
INDEXES = [(slice(1, 3),), (1,), ([0, 2],), (slice(None), 0), (Ellipsis, slice(0, 1))]


def _dest(mod, fill, shape=(4, 2)):
    return mod.full(shape, fill, dtype=mod.float64)


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("index", INDEXES, ids=str)
def test_setitem_overwrites_nan_inf_with_grad(fill, index):
    """The written positions hold exactly the value; the old NaN/inf stays only where nothing was written,
    and the gradients (value's, and the destination's own history) are torch's."""
    index = index if len(index) > 1 else index[0]
    out = []
    for mod in (torch, jitgrad):
        base = mod.tensor(np.linspace(1.0, 2.0, 8).reshape(4, 2), requires_grad=True)
        x = _dest(mod, fill) * base  # NaN/inf with a history
        shape = tuple(x[index].shape)
        v = mod.tensor(np.arange(1.0, 1.0 + np.prod(shape, dtype=int)).reshape(shape), requires_grad=True)
        x[index] = v * 3.0
        w = mod.tensor(np.arange(8.0).reshape(4, 2))
        x.masked_fill(~mod.isfinite(x), 0.0).mul(w).sum().backward()
        out.append((x.detach().numpy().copy(), v.grad.numpy().copy(), base.grad.numpy().copy()))
    (tx, tv, tb), (jx, jv, jb) = out
    np.testing.assert_array_equal(jx, tx)
    np.testing.assert_array_equal(jv, tv)
    np.testing.assert_array_equal(jb, tb)


@pytest.mark.parametrize("fill", FILLS)
def test_setitem_into_empty_buffer_like_torchdiffeq(fill):
    """torchdiffeq's pattern: solution = torch.empty(...); solution[i] = y_i (y_i requires grad)."""
    for_torch = None
    for mod in (torch, jitgrad):
        y0 = mod.tensor([0.5, -1.0], requires_grad=True)
        sol = _dest(mod, fill, (3, 2))
        y = y0
        for i in range(3):
            sol[i] = y
            y = y * 2.0 + 1.0
        (sol * sol).sum().backward()
        got = (sol.detach().numpy().copy(), y0.grad.numpy().copy())
        if for_torch is None:
            for_torch = got
    assert np.isfinite(got[0]).all()
    np.testing.assert_array_equal(got[0], for_torch[0])
    np.testing.assert_allclose(got[1], for_torch[1])


def test_setitem_through_a_view_overwrites():
    """An item assignment into a view of a tensor with history (CopySlices' path) writes too."""
    res = []
    for mod in (torch, jitgrad):
        a = mod.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
        x = a * mod.tensor([float("nan"), 1.0, float("inf"), 1.0])
        view = x[1:]
        v = mod.tensor([5.0, 6.0], requires_grad=True)
        view[:2] = v
        x.masked_fill(~mod.isfinite(x), 0.0).sum().backward()
        res.append((x.detach().numpy().copy(), a.grad.numpy().copy(), v.grad.numpy().copy()))
    for t, j in zip(*res):
        np.testing.assert_array_equal(j, t)


def test_setitem_repeated_index_holds_the_last_write():
    x = jitgrad.full((3,), float("inf"))
    v = jitgrad.tensor([5.0, 7.0], requires_grad=True)
    x[[0, 0]] = v
    t = torch.full((3,), float("inf"))
    t[[0, 0]] = torch.tensor([5.0, 7.0], requires_grad=True)
    np.testing.assert_array_equal(x.detach().numpy(), t.detach().numpy())


def test_setitem_tangent_overwrites():
    """Forward mode: the tangent of the written positions is the value's, not a blend with a NaN tangent."""
    import torch.autograd.forward_ad as tfwd

    import jitgrad.autograd.forward_ad as jfwd
    res = []
    for mod, fwd in ((torch, tfwd), (jitgrad, jfwd)):
        with fwd.dual_level():
            x = fwd.make_dual(mod.zeros(4, dtype=mod.float64), mod.full((4,), float("nan"), dtype=mod.float64))
            v = fwd.make_dual(mod.tensor([1.0, 2.0], dtype=mod.float64), mod.tensor([3.0, 4.0], dtype=mod.float64))
            y = x.clone()
            y[1:3] = v
            res.append(fwd.unpack_dual(y).tangent.numpy().copy())
    np.testing.assert_array_equal(res[1], res[0])


def test_setitem_under_vmap_overwrites():
    def f(row, v):
        out = row.clone()
        out[0] = v
        return out
    rows = np.array([[np.nan, 1.0], [np.inf, 2.0]])
    vals = np.array([3.0, 4.0])
    j = jitgrad.func.vmap(f)(jitgrad.tensor(rows), jitgrad.tensor(vals, requires_grad=True))
    t = torch.func.vmap(f)(torch.tensor(rows), torch.tensor(vals, requires_grad=True))
    np.testing.assert_array_equal(j.detach().numpy(), t.detach().numpy())


# --- legacy tensor types -------------------------------------------------------------------------------
TYPES = ["FloatTensor", "DoubleTensor", "LongTensor", "IntTensor", "BoolTensor"]


@pytest.mark.parametrize("name", TYPES)
def test_legacy_tensor_types(name):
    J, T = getattr(jitgrad, name), getattr(torch, name)
    for args in (([1, 0, 1],), (2, 3), (jitgrad.Size([2]),), ()):
        targs = tuple(torch.Size(a) if isinstance(a, jitgrad.Size) else a for a in args)
        j, t = J(*args), T(*targs)
        assert str(j.dtype) == str(t.dtype) and tuple(j.shape) == tuple(t.shape)
        if args and isinstance(args[0], list):
            assert j.tolist() == t.tolist()
    for d in ("float32", "float64", "int64", "int32", "bool"):
        assert isinstance(jitgrad.ones(2, dtype=getattr(jitgrad, d)), J) == \
            isinstance(torch.ones(2, dtype=getattr(torch, d)), T)
    assert jitgrad.ones(2).type() == torch.ones(2).type()
    assert jitgrad.ones(2, dtype=getattr(jitgrad, str(J.dtype)[6:])).type() == f"torch.{name}"
    assert str(jitgrad.ones(2).type(J).dtype) == str(torch.ones(2).type(T).dtype)
    assert str(jitgrad.ones(2).type(f"torch.{name}").dtype) == str(torch.ones(2).type(f"torch.{name}").dtype)


def test_type_errors_and_default_tensor_type():
    for mod in (torch, jitgrad):
        with pytest.raises(ValueError, match="invalid type: 'torch.Foo'"):
            mod.ones(2).type("torch.Foo")
        with pytest.raises(TypeError, match="only floating-point types are supported as the default type"):
            mod.set_default_tensor_type(mod.LongTensor)
    try:
        with pytest.warns(UserWarning, match=r"set_default_tensor_type\(\) is deprecated"):
            jitgrad.set_default_tensor_type(jitgrad.DoubleTensor)
        assert jitgrad.get_default_dtype() is jitgrad.float64 and jitgrad.ones(1).dtype is jitgrad.float64
        jitgrad.set_default_tensor_type("torch.FloatTensor")
        assert jitgrad.get_default_dtype() is jitgrad.float32
    finally:
        jitgrad.set_default_dtype(jitgrad.float32)


@pytest.mark.parametrize("sx,sy,dim", [((2, 3), (3,), -1), ((3, 2), (3, 2), 0), ((4,), (4,), -1), ((2, 1, 3), (5, 3), -1)])
def test_linalg_vecdot_values_and_gradient(sx, sy, dim):
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal(sx), rng.standard_normal(sy)
    jx, jy = jitgrad.tensor(x, requires_grad=True), jitgrad.tensor(y, requires_grad=True)
    tx, ty = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    jr, tr = jitgrad.linalg.vecdot(jx, jy, dim=dim), torch.linalg.vecdot(tx, ty, dim=dim)
    np.testing.assert_allclose(jr.detach().numpy(), tr.detach().numpy(), rtol=1e-12)
    if len(sx) > 1 or len(sy) > 1:  # (two vectors: torch runs vdot, VdotBackward0; jitgrad the same sum)
        assert type(jr.grad_fn).__name__ == type(tr.grad_fn).__name__
    w = rng.standard_normal(tuple(tr.shape))
    (jr * jitgrad.tensor(w)).sum().backward()
    (tr * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(jx.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(jy.grad.numpy(), ty.grad.numpy(), rtol=1e-12)


def test_linalg_vecdot_errors_and_linalg_error():
    for mod in (torch, jitgrad):
        with pytest.raises(RuntimeError, match="linalg.vecdot: Expected x and y to have the same dtype, but found x "
                                               "of type Float and y of type Double instead"):
            mod.linalg.vecdot(mod.ones(2), mod.ones(2, dtype=mod.float64))
        with pytest.raises(RuntimeError, match="linalg.vecdot: Expected a floating point or complex tensor as input. "
                                               "Got Long"):
            mod.linalg.vecdot(mod.ones(2, dtype=mod.int64), mod.ones(2, dtype=mod.int64))
        assert issubclass(mod.linalg.LinAlgError, RuntimeError) and mod.linalg.LinAlgError.__name__ == "_LinAlgError"
    assert __import__("jitgrad._C", fromlist=["_C"])._LinAlgError is jitgrad.linalg.LinAlgError


@pytest.mark.skipif(not jitgrad.cuda.is_available(), reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1 (as CI)")
def test_setitem_overwrites_on_cuda():
    x = jitgrad.full((4,), float("nan"), device="cuda") * jitgrad.ones(4, device="cuda", requires_grad=True)
    v = jitgrad.tensor([1.0, 2.0], device="cuda", requires_grad=True)
    x[1:3] = v * 3.0
    got = x.detach().cpu().numpy()
    assert np.isnan(got[[0, 3]]).all() and got[1:3].tolist() == [3.0, 6.0]
    x[1:3].sum().backward()
    assert v.grad.cpu().tolist() == [3.0, 3.0]
