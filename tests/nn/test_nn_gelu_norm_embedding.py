"""nn.GELU / nn.LayerNorm / nn.Embedding and their functional forms against torch 2.13.

Each comparison test runs the same code with jitgrad and torch (``both``) from identical
numpy inputs and weights, comparing values, gradients (first and second order), reprs,
parameter names/shapes and errors.
"""

import numpy as np
import pytest
from conftest import F_, LIBS, both, err_of, nn_, set_param, ten, to_np

import jitgrad

torch = pytest.importorskip("torch")



def params(m):
    return [(n, tuple(p.shape), str(p.dtype).split(".")[-1], bool(p.requires_grad)) for n, p in m.named_parameters()]


# ============================================================================= GELU

GELU_POINTS = [0.0, -0.0, 1e-8, -1e-8, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 5.0, -5.0, 8.0, -8.0, 12.0, -12.0,
               30.0, -30.0, 100.0, -100.0]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 5), ()], ids=["1d", "2d", "3d", "0d"])
def test_gelu_values_and_grads(approximate, shape):
    r = np.random.default_rng(11)
    x = r.normal(scale=2.0, size=shape)
    g = r.normal(size=shape)

    def run(T):
        xt = ten(T, x, rg=True)
        y = F_(T).gelu(xt, approximate=approximate)
        (gx,) = T.autograd.grad((y * ten(T, g)).sum(), xt, create_graph=True)
        (ggx,) = T.autograd.grad((gx * gx).sum(), xt)
        return dict(y=y, gx=gx, ggx=ggx, node=y.grad_fn.name())

    both(run)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_erf_values_and_grads(dtype):
    x = np.concatenate([np.random.default_rng(15).normal(scale=2.0, size=40), [0.0, 6.0, -6.0, 30.0]])

    def run(T):
        xt = ten(T, x, rg=True).to(getattr(T, dtype))
        y = T.erf(xt)
        (gx,) = T.autograd.grad((y * y).sum(), xt, create_graph=True)
        (ggx,) = T.autograd.grad(gx.sum(), xt)
        return dict(y=y, m=xt.erf(), gx=gx, ggx=ggx, node=y.grad_fn.name())

    both(run, dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_special_points(approximate):
    """x = 0, tiny and large |x|: values, first and second derivatives."""
    def run(T):
        xt = ten(T, GELU_POINTS, rg=True)
        y = nn_(T).GELU(approximate)(xt)
        (gx,) = T.autograd.grad(y.sum(), xt, create_graph=True)
        (ggx,) = T.autograd.grad(gx.sum(), xt)
        return dict(y=y, gx=gx, ggx=ggx)

    both(run)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_float32(approximate):
    r = np.random.default_rng(12)
    x = (r.normal(scale=3.0, size=(4, 6))).astype(np.float32)

    def run(T):
        xt = ten(T, x, "float32", rg=True)
        y = F_(T).gelu(xt, approximate=approximate)
        y.pow(2).sum().backward()
        return dict(y=y, gx=xt.grad, dtype=str(y.dtype).split(".")[-1])

    both(run, dtype="float32")


def test_gelu_module_repr_params_errors():
    def run(T):
        nn, F = nn_(T), F_(T)
        x = ten(T, [1.0, -1.0])
        return dict(default=repr(nn.GELU()), tanh=str(nn.GELU("tanh")), kw=repr(nn.GELU(approximate="none")),
                    approx=nn.GELU("tanh").approximate, params=params(nn.GELU()),
                    bad_f=err_of(lambda: F.gelu(x, approximate="exact")),
                    bad_m=err_of(lambda: nn.GELU("bogus")(x)))

    j, t = both(run)
    assert t["default"] == "GELU(approximate='none')"
    assert t["bad_f"][0] == "RuntimeError"


def test_gelu_large_input():
    """A large input (the compiled erf path) matches torch too."""
    r = np.random.default_rng(14)
    x = r.normal(scale=3.0, size=(100, 200))

    def run(T):
        xt = ten(T, x, rg=True)
        y = F_(T).gelu(xt)
        y.sum().backward()
        return dict(y=y, gx=xt.grad)

    both(run)


def test_gelu_in_sequential_backward():
    r = np.random.default_rng(13)
    w, b, x = r.normal(size=(5, 3)), r.normal(size=(5,)), r.normal(size=(4, 3))

    def run(T):
        nn = nn_(T)
        m = nn.Sequential(nn.Linear(3, 5), nn.GELU()).to(T.float64)
        set_param(T, m[0].weight, w)
        set_param(T, m[0].bias, b)
        out = m(ten(T, x))
        out.sum().backward()
        return dict(out=out, gw=m[0].weight.grad, gb=m[0].bias.grad, s=str(m))

    both(run)


# ============================================================================= LayerNorm

LN_CASES = [
    ((4, 5), 5),
    ((4, 5), (5,)),
    ((2, 3, 4), [4]),
    ((2, 3, 4), (3, 4)),
    ((3, 2, 2, 3), (2, 2, 3)),
    ((6,), 6),
]


@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)],
                         ids=["affine", "nobias", "noaffine"])
@pytest.mark.parametrize("xshape,nshape", LN_CASES, ids=[f"{a}-{b}" for a, b in LN_CASES])
def test_layer_norm_module_values_and_grads(xshape, nshape, affine, bias):
    r = np.random.default_rng(21)
    ns = (nshape,) if isinstance(nshape, int) else tuple(nshape)
    x = r.normal(size=xshape) * 3 + 1
    w, b = r.normal(size=ns), r.normal(size=ns)
    g = r.normal(size=xshape)

    def run(T):
        m = nn_(T).LayerNorm(nshape, elementwise_affine=affine, bias=bias).to(T.float64)
        if m.weight is not None:
            set_param(T, m.weight, w)
        if m.bias is not None:
            set_param(T, m.bias, b)
        xt = ten(T, x, rg=True)
        y = m(xt)
        (y * ten(T, g)).sum().backward()
        return dict(y=y, gx=xt.grad, gw=None if m.weight is None else m.weight.grad,
                    gb=None if m.bias is None else m.bias.grad, params=params(m), s=repr(m))

    both(run)


@pytest.mark.parametrize("xshape,nshape", [((4, 5), (5,)), ((2, 3, 4), (3, 4))], ids=["last", "last2"])
def test_layer_norm_functional_double_backward(xshape, nshape):
    r = np.random.default_rng(22)
    x = r.normal(size=xshape)
    w, b = r.normal(size=nshape), r.normal(size=nshape)
    g = r.normal(size=xshape)

    def run(T):
        xt, wt, bt = ten(T, x, rg=True), ten(T, w, rg=True), ten(T, b, rg=True)
        y = F_(T).layer_norm(xt, nshape, wt, bt, eps=1e-3)
        gx, gw, gb = T.autograd.grad((y * ten(T, g)).sum(), (xt, wt, bt), create_graph=True)
        ggx, ggw = T.autograd.grad((gx * gx).sum() + (gw * gx.sum()).sum(), (xt, wt))
        return dict(y=y, gx=gx, gw=gw, gb=gb, ggx=ggx, ggw=ggw)

    both(run)


def test_layer_norm_functional_weight_only_and_default_eps():
    r = np.random.default_rng(23)
    x = r.normal(size=(3, 4)) * 1e-3          # small variance: eps matters
    w = r.normal(size=(4,))

    def run(T):
        F = F_(T)
        xt = ten(T, x, rg=True)
        y1 = F.layer_norm(xt, (4,), weight=ten(T, w))
        y2 = F.layer_norm(xt, [4])
        (y1.sum() + (y2 * y2).sum()).backward()
        return dict(y1=y1, y2=y2, gx=xt.grad)

    both(run)


def test_layer_norm_constant_rows():
    """A row with zero variance: output 0 (times weight, plus bias); gradients finite."""
    def run(T):
        xt = ten(T, [[2.0, 2.0, 2.0], [1.0, -1.0, 3.0]], rg=True)
        m = nn_(T).LayerNorm(3).to(T.float64)
        y = m(xt)
        (y * ten(T, [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])).sum().backward()
        return dict(y=y, gx=xt.grad, gw=m.weight.grad, gb=m.bias.grad)

    both(run)


def test_layer_norm_float32():
    r = np.random.default_rng(24)
    x = r.normal(size=(5, 6)).astype(np.float32)
    w, b = r.normal(size=(6,)).astype(np.float32), r.normal(size=(6,)).astype(np.float32)

    def run(T):
        m = nn_(T).LayerNorm(6)
        set_param(T, m.weight, w)
        set_param(T, m.bias, b)
        xt = ten(T, x, "float32", rg=True)
        y = m(xt)
        y.pow(2).sum().backward()
        return dict(y=y, gx=xt.grad, gw=m.weight.grad, gb=m.bias.grad, dtype=str(y.dtype).split(".")[-1])

    both(run, dtype="float32")


def test_layer_norm_init_repr_and_attributes():
    def run(T):
        nn = nn_(T)
        a, b, c, d = nn.LayerNorm(4), nn.LayerNorm((2, 3), eps=1e-6), nn.LayerNorm([4], bias=False), \
            nn.LayerNorm(4, elementwise_affine=False)
        return dict(reprs=[repr(m) for m in (a, b, c, d)], params=[params(m) for m in (a, b, c, d)],
                    w=a.weight.detach(), bias=a.bias.detach(), w2=b.weight.detach(),
                    ns=[m.normalized_shape for m in (a, b, c, d)], eps=[m.eps for m in (a, b)],
                    none=(c.bias is None, d.weight is None, d.bias is None),
                    sd=[list(m.state_dict().keys()) for m in (a, c, d)],
                    dbl=params(nn.LayerNorm(3, dtype=T.float64)))

    j, t = both(run)
    assert t["reprs"][0] == "LayerNorm((4,), eps=1e-05, elementwise_affine=True, bias=True)"


def test_layer_norm_errors():
    def run(T):
        F = F_(T)
        x = ten(T, np.ones((2, 4)))
        return dict(
            last=err_of(lambda: F.layer_norm(x, (3,))),
            two=err_of(lambda: F.layer_norm(x, [2, 3])),
            too_many=err_of(lambda: F.layer_norm(x, (1, 2, 4))),
            weight=err_of(lambda: F.layer_norm(x, (4,), weight=ten(T, np.ones(3)))),
            bias=err_of(lambda: F.layer_norm(x, (4,), bias=ten(T, np.ones(5)))),
            module=err_of(lambda: nn_(T).LayerNorm(5).to(T.float64)(x)),
        )

    j, t = both(run)
    assert t["last"][0] == "RuntimeError"


# ============================================================================= Embedding

@pytest.mark.parametrize("idx", [
    [3, 1, 3, 3, 0],                      # repeated indices accumulate
    [[1, 2, 1], [4, 4, 0]],               # 2-D index tensor
    [[[0, 1], [1, 0]], [[2, 2], [2, 2]]],  # 3-D
    2,                                    # 0-d
    np.zeros((0,), dtype=np.int64),       # empty
], ids=["repeat", "2d", "3d", "0d", "empty"])
@pytest.mark.parametrize("padding_idx", [None, 1, -1], ids=["nopad", "pad1", "pad-1"])
def test_embedding_values_and_grads(idx, padding_idx):
    r = np.random.default_rng(31)
    w = r.normal(size=(5, 3))
    idx = np.asarray(idx, dtype=np.int64)
    g = r.normal(size=idx.shape + (3,))

    def run(T):
        m = nn_(T).Embedding(5, 3, padding_idx=padding_idx).to(T.float64)
        pad_row_zero = bool((to_np(m.weight)[m.padding_idx] == 0).all()) if m.padding_idx is not None else None
        set_param(T, m.weight, w)
        out = m(T.tensor(idx))
        (out * ten(T, g)).sum().backward()
        return dict(out=out, gw=m.weight.grad, pad=m.padding_idx, pad_row_zero=pad_row_zero, s=repr(m),
                    params=params(m))

    both(run)


def test_embedding_functional_and_double_backward():
    r = np.random.default_rng(32)
    w = r.normal(size=(6, 4))
    idx = np.array([[5, 0, 0], [2, 5, 3]])
    g = r.normal(size=(2, 3, 4))

    def run(T):
        F = F_(T)
        wt = ten(T, w, rg=True)
        out = F.embedding(T.tensor(idx), wt, padding_idx=0)
        (gw,) = T.autograd.grad(((out * out) * ten(T, g)).sum(), wt, create_graph=True)
        (ggw,) = T.autograd.grad((gw * gw).sum(), wt)
        out2 = F.embedding(T.tensor(idx, dtype=T.int32), wt)
        return dict(out=out, gw=gw, ggw=ggw, out2=out2)

    both(run)


def test_embedding_float32_module():
    r = np.random.default_rng(33)
    w = r.normal(size=(7, 5)).astype(np.float32)
    idx = np.array([[6, 1], [1, 1], [0, 6]])

    def run(T):
        m = nn_(T).Embedding(7, 5, padding_idx=6)
        set_param(T, m.weight, w)
        out = m(T.tensor(idx))
        out.pow(2).sum().backward()
        return dict(out=out, gw=m.weight.grad, dtype=str(out.dtype).split(".")[-1])

    both(run, dtype="float32")


def test_embedding_from_pretrained():
    w = np.arange(12, dtype=np.float64).reshape(4, 3) - 5

    def run(T):
        nn = nn_(T)
        frozen = nn.Embedding.from_pretrained(ten(T, w))
        free = nn.Embedding.from_pretrained(ten(T, w), freeze=False, padding_idx=2)
        idx = T.tensor([[2, 3], [2, 0]])
        out = free(idx)
        out.sum().backward()
        fout = frozen(idx)
        return dict(frozen_rg=bool(frozen.weight.requires_grad), free_rg=bool(free.weight.requires_grad),
                    out=out, fout=fout, fout_rg=bool(fout.requires_grad), gw=free.weight.grad,
                    weight=free.weight.detach(),          # the padding row is kept, not zeroed
                    reprs=(repr(frozen), repr(free)), params=(params(frozen), params(free)),
                    bad=err_of(lambda: nn.Embedding.from_pretrained(ten(T, [1.0, 2.0]))))

    j, t = both(run)
    assert t["reprs"] == ("Embedding(4, 3)", "Embedding(4, 3, padding_idx=2)")


def test_embedding_init_repr_attributes():
    def run(T):
        nn = nn_(T)
        a, b, c = nn.Embedding(10, 4), nn.Embedding(10, 4, padding_idx=-3), nn.Embedding(3, 2, norm_type=1.0)
        return dict(reprs=[repr(m) for m in (a, b, c)], params=[params(m) for m in (a, b, c)],
                    attrs=[(m.num_embeddings, m.embedding_dim, m.padding_idx, m.max_norm, m.norm_type,
                            m.scale_grad_by_freq, m.sparse) for m in (a, b, c)],
                    pad_row=b.weight[7].detach(), sd=list(a.state_dict().keys()),
                    dbl=params(nn.Embedding(3, 2, dtype=T.float64)),
                    shape_mismatch=err_of(lambda: nn.Embedding(3, 3, _weight=T.ones(3, 2))))

    j, t = both(run)
    assert t["reprs"][1] == "Embedding(10, 4, padding_idx=7)"


@LIBS
def test_embedding_default_init_is_standard_normal(T):
    m = nn_(T).Embedding(400, 50, padding_idx=3)
    w = to_np(m.weight)
    assert w.dtype == np.float32
    assert np.all(w[3] == 0)
    rest = np.delete(w, 3, axis=0)
    assert abs(rest.mean()) < 0.02 and abs(rest.std() - 1) < 0.02
    assert not np.array_equal(to_np(nn_(T).Embedding(400, 50).weight), w)


def test_embedding_errors():
    def run(T):
        nn, F = nn_(T), F_(T)
        w = ten(T, np.ones((3, 2)), rg=True)
        return dict(
            high=err_of(lambda: F.embedding(T.tensor([0, 3]), w)),
            neg=err_of(lambda: F.embedding(T.tensor([-1]), w)),
            high2d=err_of(lambda: nn.Embedding(3, 2)(T.tensor([[0, 1], [7, 1]]))),
            float_idx=err_of(lambda: F.embedding(ten(T, [1.0]), w)),
            pad_high=err_of(lambda: nn.Embedding(3, 2, padding_idx=3)),
            pad_low=err_of(lambda: nn.Embedding(3, 2, padding_idx=-4)),
            f_pad=err_of(lambda: F.embedding(T.tensor([1]), w, padding_idx=5)),
        )

    j, t = both(run)
    assert t["high"] == ("IndexError", "index out of range in self")


@pytest.mark.parametrize("padding_idx", [None, 2], ids=["nopad", "pad"])
def test_embedding_scale_grad_by_freq(padding_idx):
    r = np.random.default_rng(34)
    w = r.normal(size=(5, 3))
    idx = np.array([[2, 1, 2], [2, 4, 1]])
    g = r.normal(size=(2, 3, 3))

    def run(T):
        m = nn_(T).Embedding(5, 3, padding_idx=padding_idx, scale_grad_by_freq=True).to(T.float64)
        set_param(T, m.weight, w)
        out = m(T.tensor(idx))
        (out * ten(T, g)).sum().backward()
        wt = ten(T, w, rg=True)
        out2 = F_(T).embedding(T.tensor(idx), wt, scale_grad_by_freq=True)
        (gw,) = T.autograd.grad((out2 * out2 * ten(T, g)).sum(), wt, create_graph=True)
        (ggw,) = T.autograd.grad((gw * gw).sum(), wt)
        # torch's second derivative applies the counts once (its double backward ignores
        # them), which the rule reproduces
        return dict(out=out, gw=m.weight.grad, gw2=gw, ggw=ggw, s=repr(m))

    both(run)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5], ids=["l2", "l1", "l3.5"])
def test_embedding_max_norm_renormalises_rows_in_place(norm_type):
    r = np.random.default_rng(35)
    w = r.normal(size=(6, 4)) * np.array([[0.1], [3.0], [0.2], [5.0], [4.0], [0.3]])
    idx = np.array([[1, 2, 1], [3, 0, 2]])  # row 4 is large but unused: it stays as it is

    def run(T):
        m = nn_(T).Embedding(6, 4, max_norm=1.5, norm_type=norm_type).to(T.float64)
        set_param(T, m.weight, w)
        v0 = m.weight._version
        out = m(T.tensor(idx))
        out.pow(2).sum().backward()
        return dict(out=out, weight=m.weight.detach(), gw=m.weight.grad, bumped=m.weight._version > v0, s=repr(m))

    j, t = both(run)
    assert t["bumped"]


def test_embedding_sparse_is_not_implemented():
    """A jitgrad limitation: there are no sparse tensors."""
    with pytest.raises(NotImplementedError):
        jitgrad.nn.Embedding(3, 2, sparse=True)
    with pytest.raises(NotImplementedError):
        jitgrad.nn.functional.embedding(jitgrad.tensor([0]), jitgrad.ones(3, 2), sparse=True)


def test_exports():
    for name in ("GELU", "LayerNorm", "Embedding"):
        assert hasattr(jitgrad.nn, name)
    for name in ("gelu", "layer_norm", "embedding"):
        assert hasattr(jitgrad.nn.functional, name)


@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
def test_layer_norm_is_one_node_like_torch(affine):
    """The output's grad_fn is torch's NativeLayerNormBackward0 with its three inputs
    (input, weight, bias; None where absent): one compiled node rather than a
    mean/sub/var/sqrt/div chain with a mul and an add after it."""
    x = np.random.default_rng(8).standard_normal((3, 5))

    def run(T):
        w = ten(T, np.ones(5), rg=True) if affine in ("weight", "both") else None
        b = ten(T, np.zeros(5), rg=True) if affine in ("bias", "both") else None
        y = T.nn.functional.layer_norm(ten(T, x, rg=True), (5,), w, b)
        return [y.grad_fn.name(), [None if f[0] is None else f[0].name() for f in y.grad_fn.next_functions]]

    j, t = both(run)
    assert t[0] == "NativeLayerNormBackward0" and j == t


def test_layer_norm_mixed_dtypes_raise_like_torch():
    def run(T):
        x = ten(T, np.ones((2, 3)))
        w32 = T.ones(3, dtype=T.float32)
        return dict(w=err_of(lambda: T.nn.functional.layer_norm(x, (3,), w32)),
                    b=err_of(lambda: T.nn.functional.layer_norm(x, (3,), None, w32)))

    both(run)


def test_layer_norm_integer_input_raises_like_torch():
    import torch

    import jitgrad
    for T in (jitgrad, torch):
        with pytest.raises(NotImplementedError, match="\"LayerNormKernelImpl\" not implemented for 'Long'"):
            T.nn.functional.layer_norm(T.ones(2, 3, dtype=T.long), (3,))
