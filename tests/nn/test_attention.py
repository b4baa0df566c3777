"""F.scaled_dot_product_attention against torch 2.13: values and gradients (query, key, value
and a float mask) in float64 and float32 for causal, boolean and float masks (a row masked
entirely gives 0, with a 0 gradient, as torch's safe softmax), scale (negative too), grouped
heads, broadcast batch dims; torch's errors for bad inputs; dropout's expectation."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")

rng = np.random.default_rng(7)
CASES = [  # (q, k, v shapes, mask kind, kwargs)
    ((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 3), None, {}),
    ((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 3), None, dict(is_causal=True)),
    ((2, 3, 6, 4), (2, 3, 6, 4), (2, 3, 6, 4), None, dict(is_causal=True, scale=0.7)),
    ((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 3), None, dict(scale=-0.3)),
    ((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 3), "bool", {}),
    ((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 3), "bool with empty row", {}),
    ((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 3), "float", {}),
    ((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 3), "float with -inf row", {}),
    ((2, 4, 5, 8), (1, 4, 6, 8), (4, 6, 3), "float (2, 1, 5, 6)", {}),
    ((2, 4, 5, 8), (2, 2, 6, 8), (2, 1, 6, 3), None, dict(enable_gqa=True)),
    ((5, 8), (6, 8), (6, 3), None, dict(is_causal=True)),
    ((1, 2, 3, 5, 4), (1, 2, 3, 5, 4), (1, 2, 3, 5, 2), None, dict(dropout_p=0.0)),
]


def _mask(kind):
    if kind is None:
        return None
    if kind.startswith("bool"):
        m = rng.random((5, 6)) < 0.6
        m[:, 0] = True
        if "empty" in kind:
            m[2] = False
        return m
    m = rng.standard_normal((2, 1, 5, 6) if "(2, 1" in kind else (5, 6))
    if "-inf" in kind:
        m[3] = -np.inf
    return m


def _run(T, arrays, mask, kw, dtype):
    dt = getattr(T, dtype)
    ts = [T.tensor(a, dtype=dt, requires_grad=True) for a in arrays]
    m = None
    if mask is not None:
        m = T.tensor(mask) if mask.dtype == bool else T.tensor(mask, dtype=dt, requires_grad=True)
    y = T.nn.functional.scaled_dot_product_attention(*ts, attn_mask=m, **kw)
    y.backward(T.tensor(np.cos(np.arange(y.numel())).reshape(tuple(y.shape)), dtype=dt))
    extra = [m.grad.numpy()] if m is not None and m.requires_grad else []
    return [y.detach().numpy()] + [t.grad.numpy() for t in ts] + extra


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("qs,ks,vs,mask,kw", CASES)
def test_values_and_grads_match_torch(qs, ks, vs, mask, kw, dtype):
    arrays = [rng.standard_normal(s) for s in (qs, ks, vs)]
    m = _mask(mask)
    ref, mine = _run(torch, arrays, m, kw, dtype), _run(jitgrad, arrays, m, kw, dtype)
    tol = 1e-12 if dtype == "float64" else 3e-6
    assert len(mine) == len(ref)
    for a, b in zip(mine, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_gradcheck_and_second_order():
    q, k, v = (jitgrad.tensor(rng.standard_normal(s), requires_grad=True) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 2)))
    mask = jitgrad.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    F = jitgrad.nn.functional
    assert jitgrad.autograd.gradcheck(lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3]),
                                      (q, k, v, mask), check_forward_ad=True)
    assert jitgrad.autograd.gradgradcheck(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True), (q, k, v))


def test_a_float32_mask_with_float64_inputs():
    """torch takes a float32 mask ("bool or float") whatever the query's dtype."""
    arrays = [rng.standard_normal(s) for s in ((3, 4), (5, 4), (5, 2))]
    m = rng.standard_normal((3, 5))
    out = []
    for T in (torch, jitgrad):
        q, k, v = (T.tensor(a) for a in arrays)
        out.append(T.nn.functional.scaled_dot_product_attention(q, k, v, T.tensor(m, dtype=T.float32)).numpy())
    assert out[1].dtype == out[0].dtype == np.float64
    np.testing.assert_allclose(out[1], out[0], rtol=1e-12)


def _errors(call):
    found = []
    for T in (torch, jitgrad):
        with pytest.raises(Exception) as e:
            call(T, T.nn.functional.scaled_dot_product_attention)
        found.append(e)
    assert found[1].type is found[0].type, (found[1].value, found[0].value)
    assert str(found[1].value) == str(found[0].value)


def _qkv(T, hq=4, hk=4, hv=4, dtype="float64"):
    dt = getattr(T, dtype)
    return T.zeros(2, hq, 5, 8, dtype=dt), T.zeros(2, hk, 6, 8, dtype=dt), T.zeros(2, hv, 6, 3, dtype=dt)


@pytest.mark.parametrize("call", [
    lambda T, f: f(*_qkv(T), attn_mask=T.ones(5, 6, dtype=T.bool), is_causal=True),
    lambda T, f: f(*_qkv(T), attn_mask=T.ones(5, 7, dtype=T.bool)),
    lambda T, f: f(*_qkv(T), attn_mask=T.ones(5, 6, dtype=T.long)),
    lambda T, f: f(*_qkv(T, dtype="float32"), attn_mask=T.ones(5, 6, dtype=T.float64)),
    lambda T, f: f(*_qkv(T), attn_mask=T.zeros(1, 2, 4, 5, 6, dtype=T.float64)),
    lambda T, f: f(_qkv(T)[0], _qkv(T)[1].float(), _qkv(T)[2]),
    lambda T, f: f(_qkv(T)[0], _qkv(T)[1][..., :7], _qkv(T)[2]),
    lambda T, f: f(_qkv(T)[0][0, 0, 0], _qkv(T)[1][0, 0, 0], _qkv(T)[2][0, 0, 0]),
    lambda T, f: f(*_qkv(T, hq=3, hk=2, hv=2), enable_gqa=True),
    lambda T, f: f(*_qkv(T, hk=2, hv=2)),
    lambda T, f: f(*(t.long() for t in _qkv(T))),
    lambda T, f: f(*_qkv(T), dropout_p=1.5),
    lambda T, f: f([1.0], *_qkv(T)[1:]),
    lambda T, f: f(*_qkv(T), attn_mask=[[True]]),
])
def test_errors_match_torch(call):
    _errors(call)


def test_dropout_scales_kept_weights():
    """dropout_p: each attention weight is dropped or scaled by 1/(1-p), so with value = ones the
    output averages 1 and takes only values of the kept weights' sums."""
    jitgrad.manual_seed(0)
    q = jitgrad.tensor(rng.standard_normal((64, 4, 4)))
    v = jitgrad.ones(64, 4, 1, dtype=jitgrad.float64)
    out = jitgrad.nn.functional.scaled_dot_product_attention(q, q, v, dropout_p=0.25).numpy()
    assert abs(out.mean() - 1.0) < 0.1 and out.std() > 0.05
    full = jitgrad.nn.functional.scaled_dot_product_attention(q, q, v, dropout_p=1.0)
    assert (full == 0).all()
    none = jitgrad.nn.functional.scaled_dot_product_attention(q, q, v, dropout_p=-0.5)   # torch: no dropout
    np.testing.assert_allclose(none.numpy(), 1.0)
