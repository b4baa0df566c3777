"""jitgrad's compiled backward of the structural primitives against the slow, obvious
references in ``tests/naive.py`` (plain loops, independent of torch and of jitgrad's rules).

Each case builds random float64 inputs, runs the op forward with plain jitgrad, calls
``y.backward(g)`` with a random ``g`` (the default compiled engine), and compares every
input's ``.grad`` with the naive vector-Jacobian product to rtol 1e-10.  A float32 spot check
runs a few cases with float32 tensors against the float64 reference of the same values.

With ``JITGRAD_TESTS_USE_TORCH=1`` the same cases run on real torch, which checks the naive
references themselves.
"""
import naive as N
import numpy as np
import pytest
from conftest import ATOL64, RTOL64, USING_TORCH_AS_JITGRAD, assert_close, stable_seed

import jitgrad

CASES = {}


def case(name):
    """Register a case: make(r) -> (arrays, forward(J, F, *tensors), reference(*arrays, g) -> grads)."""
    def register(make):
        assert name not in CASES, name
        CASES[name] = make
        return make
    return register


def _F(J):
    return J.nn.functional


def _ties(r, shape, values=3):
    """Small integers as floats: many exact ties."""
    return r.integers(0, values, size=shape).astype(np.float64)


# ----------------------------------------------------------------------------- reductions

@case("sum-all")
def _(r):
    return [r.standard_normal((3, 4))], lambda J, F, x: J.sum(x), lambda x, g: [N.sum_backward(x, g)]


@case("sum-0d")
def _(r):
    return [r.standard_normal(())], lambda J, F, x: J.sum(x), lambda x, g: [N.sum_backward(x, g)]


@case("sum-dim1")
def _(r):
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: J.sum(x, 1),
            lambda x, g: [N.sum_backward(x, g, 1)])


@case("sum-dims02-keepdim")
def _(r):
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: J.sum(x, (0, 2), keepdim=True),
            lambda x, g: [N.sum_backward(x, g, (0, 2), True)])


@case("sum-neg-keepdim")
def _(r):
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: x.sum(-1, keepdim=True),
            lambda x, g: [N.sum_backward(x, g, -1, True)])


@case("mean-all")
def _(r):
    return [r.standard_normal((3, 4))], lambda J, F, x: J.mean(x), lambda x, g: [N.mean_backward(x, g)]


@case("mean-dims02")
def _(r):
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: J.mean(x, (0, 2)),
            lambda x, g: [N.mean_backward(x, g, (0, 2))])


@case("mean-dim1-keepdim")
def _(r):
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: x.mean(1, keepdim=True),
            lambda x, g: [N.mean_backward(x, g, 1, True)])


@case("amax-all-ties")
def _(r):
    return [_ties(r, (3, 4))], lambda J, F, x: J.amax(x), lambda x, g: [N.amax_backward(x, g)]


@case("amax-dim1-ties")
def _(r):
    return ([_ties(r, (4, 5))], lambda J, F, x: J.amax(x, 1),
            lambda x, g: [N.amax_backward(x, g, 1)])


@case("amax-dims02-keepdim-ties")
def _(r):
    return ([_ties(r, (2, 3, 4))], lambda J, F, x: J.amax(x, (0, 2), keepdim=True),
            lambda x, g: [N.amax_backward(x, g, (0, 2), True)])


@case("amin-dim0-ties")
def _(r):
    return ([_ties(r, (4, 3))], lambda J, F, x: J.amin(x, 0),
            lambda x, g: [N.amin_backward(x, g, 0)])


@case("amin-neg-keepdim")
def _(r):
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: J.amin(x, -1, keepdim=True),
            lambda x, g: [N.amin_backward(x, g, -1, True)])


@case("max-all-ties")
def _(r):
    return [_ties(r, (3, 4))], lambda J, F, x: J.max(x), lambda x, g: [N.amax_backward(x, g)]


@case("max-dim1")
def _(r):
    return ([r.standard_normal((3, 5))], lambda J, F, x: J.max(x, 1).values,
            lambda x, g: [N.max_dim_backward(x, g, 1)])


@case("max-dim0-keepdim")
def _(r):
    return ([r.standard_normal((4, 3, 2))], lambda J, F, x: J.max(x, 0, keepdim=True).values,
            lambda x, g: [N.max_dim_backward(x, g, 0, keepdim=True)])


@case("min-neg-dim")
def _(r):
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: J.min(x, -1).values,
            lambda x, g: [N.max_dim_backward(x, g, -1, mode="min")])


@case("max-dim1-ties-to-returned-index")
def _(r):
    seen = {}

    def fwd(J, F, x):
        m = J.max(x, 1)
        seen["indices"] = m.indices.detach().numpy().copy()
        return m.values

    return [_ties(r, (5, 4))], fwd, lambda x, g: [N.max_dim_backward(x, g, 1, indices=seen["indices"])]


@case("prod-all")
def _(r):
    return [r.uniform(0.5, 1.5, (2, 3))], lambda J, F, x: J.prod(x), lambda x, g: [N.prod_backward(x, g)]


@case("prod-all-one-zero")
def _(r):
    x = r.uniform(0.5, 1.5, (2, 3))
    x[1, 1] = 0.0
    return [x], lambda J, F, x: J.prod(x), lambda x, g: [N.prod_backward(x, g)]


@case("prod-all-two-zeros")
def _(r):
    x = r.uniform(0.5, 1.5, (2, 3))
    x[0, 2] = x[1, 0] = 0.0
    return [x], lambda J, F, x: J.prod(x), lambda x, g: [N.prod_backward(x, g)]


@case("prod-dim1-zeros")
def _(r):
    x = r.uniform(0.5, 1.5, (4, 3))
    x[1, 0] = 0.0                       # one zero in row 1
    x[2, 1] = x[2, 2] = 0.0             # two zeros in row 2
    return [x], lambda J, F, x: J.prod(x, 1), lambda x, g: [N.prod_backward(x, g, 1)]


@case("prod-dim0-keepdim-zero")
def _(r):
    x = r.uniform(-1.5, 1.5, (3, 4))
    x[2, 3] = 0.0
    return ([x], lambda J, F, x: J.prod(x, 0, keepdim=True),
            lambda x, g: [N.prod_backward(x, g, 0, True)])


@case("trace-square")
def _(r):
    return [r.standard_normal((4, 4))], lambda J, F, x: J.trace(x), lambda x, g: [N.trace_backward(x, g)]


@case("trace-wide")
def _(r):
    return [r.standard_normal((3, 5))], lambda J, F, x: J.trace(x), lambda x, g: [N.trace_backward(x, g)]


# ----------------------------------------------------------------------------- products

def _mat(name, fn, sa, sb):
    @case(name)
    def _(r):
        return ([r.standard_normal(sa), r.standard_normal(sb)], fn,
                lambda a, b, g: list(N.matmul_backward(a, b, g)))


_mat("mm", lambda J, F, a, b: J.mm(a, b), (3, 4), (4, 5))
_mat("mv", lambda J, F, a, b: J.mv(a, b), (3, 4), (4,))
_mat("dot", lambda J, F, a, b: J.dot(a, b), (5,), (5,))
_mat("bmm", lambda J, F, a, b: J.bmm(a, b), (2, 3, 4), (2, 4, 5))
_mat("matmul-2d", lambda J, F, a, b: J.matmul(a, b), (3, 4), (4, 2))
_mat("matmul-operator", lambda J, F, a, b: a @ b, (2, 3, 4), (4, 2))
_mat("matmul-broadcast-batch", lambda J, F, a, b: J.matmul(a, b), (2, 1, 3, 4), (5, 4, 2))
_mat("matmul-1d-3d", lambda J, F, a, b: J.matmul(a, b), (4,), (2, 4, 3))
_mat("matmul-3d-1d", lambda J, F, a, b: J.matmul(a, b), (2, 3, 4), (4,))
_mat("matmul-1d-1d", lambda J, F, a, b: J.matmul(a, b), (4,), (4,))


@case("addmm")
def _(r):
    return ([r.standard_normal((3, 5)), r.standard_normal((3, 4)), r.standard_normal((4, 5))],
            lambda J, F, i, a, b: J.addmm(i, a, b),
            lambda i, a, b, g: list(N.addmm_backward(i, a, b, g)))


@case("addmm-broadcast-beta-alpha")
def _(r):
    return ([r.standard_normal((5,)), r.standard_normal((3, 4)), r.standard_normal((4, 5))],
            lambda J, F, i, a, b: J.addmm(i, a, b, beta=0.5, alpha=-2.0),
            lambda i, a, b, g: list(N.addmm_backward(i, a, b, g, beta=0.5, alpha=-2.0)))


@case("addmm-broadcast-column")
def _(r):
    return ([r.standard_normal((3, 1)), r.standard_normal((3, 4)), r.standard_normal((4, 5))],
            lambda J, F, i, a, b: J.addmm(i, a, b, beta=2.0),
            lambda i, a, b, g: list(N.addmm_backward(i, a, b, g, beta=2.0)))


# ----------------------------------------------------------------------------- shape / views

@case("permute")
def _(r):
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: J.permute(x, (2, 0, 1)),
            lambda x, g: [N.permute_backward(x, g, (2, 0, 1))])


@case("permute-method-neg")
def _(r):
    return ([r.standard_normal((2, 3, 4, 2))], lambda J, F, x: x.permute(1, -1, 0, 2),
            lambda x, g: [N.permute_backward(x, g, (1, -1, 0, 2))])


@case("transpose")
def _(r):
    return ([r.standard_normal((3, 4))], lambda J, F, x: J.transpose(x, 0, 1),
            lambda x, g: [N.transpose_backward(x, g, 0, 1)])


@case("transpose-3d-then-mul")
def _(r):
    # a non-contiguous view consumed by another op
    return ([r.standard_normal((2, 3, 4))], lambda J, F, x: x.transpose(0, -1) * 2.0,
            lambda x, g: [2.0 * N.transpose_backward(x, g, 0, -1)])


@case("expand")
def _(r):
    return ([r.standard_normal((3, 1))], lambda J, F, x: x.expand(2, 3, 4),
            lambda x, g: [N.expand_backward(x, g)])


@case("expand-minus-one")
def _(r):
    return ([r.standard_normal((4,))], lambda J, F, x: x.expand(3, -1),
            lambda x, g: [N.expand_backward(x, g)])


@case("expand-then-mul")
def _(r):
    return ([r.standard_normal((1, 3, 1))], lambda J, F, x: x.expand(2, 3, 4) * 3.0,
            lambda x, g: [3.0 * N.expand_backward(x, g)])


@case("cat-dim0")
def _(r):
    shapes = [(2, 3), (1, 3), (4, 3)]
    return ([r.standard_normal(s) for s in shapes], lambda J, F, *xs: J.cat(xs, 0),
            lambda *a: N.cat_backward(a[:-1], a[-1], 0))


@case("cat-dim-neg")
def _(r):
    shapes = [(2, 3, 1), (2, 3, 4), (2, 3, 2)]
    return ([r.standard_normal(s) for s in shapes], lambda J, F, *xs: J.cat(xs, -1),
            lambda *a: N.cat_backward(a[:-1], a[-1], -1))


@case("stack-dim0")
def _(r):
    return ([r.standard_normal((2, 3)) for _ in range(3)], lambda J, F, *xs: J.stack(xs, 0),
            lambda *a: N.stack_backward(a[:-1], a[-1], 0))


@case("stack-dim-neg")
def _(r):
    return ([r.standard_normal((2, 3)) for _ in range(4)], lambda J, F, *xs: J.stack(xs, -1),
            lambda *a: N.stack_backward(a[:-1], a[-1], -1))


# ----------------------------------------------------------------------------- indexing

def _index_case(name, shape, make_key):
    """make_key(r) -> (key for jitgrad given the library J, key as numpy)."""
    @case(name)
    def _(r):
        jkey, nkey = make_key(r)
        return ([r.standard_normal(shape)], lambda J, F, x: x[jkey(J)],
                lambda x, g: [N.index_backward(x, g, nkey)])


def _int_rows(r):
    idx = np.array([3, 0, 3, 1, 3], dtype=np.int64)     # repeated rows add up
    return (lambda J: J.tensor(idx)), idx


def _int_cols(r):
    idx = np.array([2, 2, 0], dtype=np.int64)
    return (lambda J: (slice(None), J.tensor(idx))), (slice(None), idx)


def _int_pairs(r):
    rows = np.array([0, 2, 2, 1], dtype=np.int64)
    cols = np.array([1, 1, 1, 0], dtype=np.int64)
    return (lambda J: (J.tensor(rows), J.tensor(cols))), (rows, cols)


def _negative_ints(r):
    idx = np.array([-1, 0, -4, -1], dtype=np.int64)
    return (lambda J: J.tensor(idx)), idx


def _bool_full(r):
    mask = r.random((4, 3)) < 0.5
    return (lambda J: J.tensor(mask)), mask


def _bool_rows(r):
    mask = np.array([True, False, True, True])
    return (lambda J: J.tensor(mask)), mask


def _slice_and_int(r):
    return (lambda J: (slice(1, None), 2)), (slice(1, None), 2)


_index_case("index-int-rows-repeated", (4, 3), _int_rows)
_index_case("index-int-cols", (4, 3), _int_cols)
_index_case("index-int-pairs", (3, 2), _int_pairs)
_index_case("index-int-negative", (4, 3), _negative_ints)
_index_case("index-bool-full", (4, 3), _bool_full)
_index_case("index-bool-rows", (4, 3), _bool_rows)
_index_case("index-slice-int", (4, 3), _slice_and_int)


# ----------------------------------------------------------------------------- softmax

for _dim, _shape in [(1, (3, 4)), (-1, (2, 3, 4)), (0, (4, 3)), (1, (2, 3, 4))]:
    def _softmax_cases(dim=_dim, shape=_shape):
        @case(f"softmax-dim{dim}-{'x'.join(map(str, shape))}")
        def _(r):
            return ([r.standard_normal(shape) * 2], lambda J, F, x: J.softmax(x, dim),
                    lambda x, g: [N.softmax_backward(x, g, dim)])

        @case(f"log_softmax-dim{dim}-{'x'.join(map(str, shape))}")
        def _(r):
            return ([r.standard_normal(shape) * 2], lambda J, F, x: J.log_softmax(x, dim),
                    lambda x, g: [N.log_softmax_backward(x, g, dim)])
    _softmax_cases()


@case("softmax-F-large-values")
def _(r):
    return ([r.standard_normal((3, 5)) * 30], lambda J, F, x: F.softmax(x, dim=-1),
            lambda x, g: [N.softmax_backward(x, g, -1)])


@case("log_softmax-F-large-values")
def _(r):
    return ([r.standard_normal((3, 5)) * 30], lambda J, F, x: F.log_softmax(x, dim=-1),
            lambda x, g: [N.log_softmax_backward(x, g, -1)])


# ----------------------------------------------------------------------------- conv / pool

CONV = [
    # (x shape, out channels, kernel, stride, padding, dilation, groups, bias)
    ((2, 3, 6, 5), 4, (3, 3), 1, 0, 1, 1, True),
    ((1, 2, 7, 7), 3, (3, 3), 2, 1, 1, 1, True),
    ((2, 2, 8, 7), 2, (2, 3), (2, 1), (1, 2), 1, 1, False),
    ((1, 3, 9, 8), 2, (3, 2), 1, 2, (2, 3), 1, True),
    ((2, 4, 6, 6), 6, (3, 3), 1, 1, 1, 2, True),
    ((1, 4, 7, 6), 4, (3, 3), 2, 1, 1, 4, True),          # depthwise
    ((1, 6, 5, 5), 4, (1, 1), 1, 0, 1, 2, False),         # 1x1, grouped
    ((1, 2, 5, 6), 3, (5, 6), 1, 0, 1, 1, True),          # kernel = whole input
    ((1, 4, 9, 9), 4, (3, 3), 3, 2, 2, 2, True),          # everything at once
]


def _conv_case(i, cfg):
    shape, cout, k, s, p, d, groups, has_bias = cfg

    @case(f"conv2d-{i}")
    def _(r):
        x = r.standard_normal(shape)
        w = r.standard_normal((cout, shape[1] // groups) + k)
        arrays = [x, w] + ([r.standard_normal(cout)] if has_bias else [])

        def fwd(J, F, x, w, b=None):
            y = F.conv2d(x, w, b, stride=s, padding=p, dilation=d, groups=groups)
            # the forward, too, is the straight correlation
            expected = N.conv2d_forward(x.detach().numpy().astype(np.float64), w.detach().numpy().astype(np.float64),
                                        None if b is None else b.detach().numpy().astype(np.float64), s, p, d, groups)
            tol = dict(rtol=1e-5, atol=1e-5) if x.dtype == J.float32 else {}
            assert_close(y, expected, msg="conv2d forward", **tol)
            return y

        def ref(*a):
            return list(N.conv2d_backward(a[0], a[1], a[-1], s, p, d, groups, bias=has_bias))

        return arrays, fwd, ref


for _i, _cfg in enumerate(CONV):
    _conv_case(_i, _cfg)


POOL = [
    # (x shape, kernel, stride, padding, dilation)
    ((2, 2, 6, 6), 2, None, 0, 1),
    ((1, 2, 7, 6), 3, 1, 0, 1),           # overlapping windows
    ((1, 3, 7, 7), 3, 2, 1, 1),           # padding
    ((1, 2, 9, 8), (3, 2), (2, 1), (1, 0), (2, 3)),
    ((2, 1, 5, 5), 5, None, 2, 1),
]


def _pool_case(i, cfg):
    shape, k, s, p, d = cfg

    @case(f"max_pool2d-{i}")
    def _(r):
        return ([r.standard_normal(shape)],
                lambda J, F, x: F.max_pool2d(x, k, stride=s, padding=p, dilation=d),
                lambda x, g: [N.max_pool2d_backward(x, g, k, s, p, d)])


for _i, _cfg in enumerate(POOL):
    _pool_case(_i, _cfg)


# ----------------------------------------------------------------------------- nn

@case("layer_norm-last-dim")
def _(r):
    return ([r.standard_normal((4, 5)), r.standard_normal(5), r.standard_normal(5)],
            lambda J, F, x, w, b: F.layer_norm(x, (5,), w, b),
            lambda x, w, b, g: list(N.layer_norm_backward(x, (5,), w, g)))


@case("layer_norm-two-dims")
def _(r):
    return ([r.standard_normal((2, 3, 4)) * 3 + 1, r.standard_normal((3, 4)), r.standard_normal((3, 4))],
            lambda J, F, x, w, b: F.layer_norm(x, (3, 4), w, b, eps=1e-3),
            lambda x, w, b, g: list(N.layer_norm_backward(x, (3, 4), w, g, eps=1e-3)))


@case("layer_norm-no-affine")
def _(r):
    return ([r.standard_normal((3, 2, 6))], lambda J, F, x: F.layer_norm(x, (6,)),
            lambda x, g: [N.layer_norm_backward(x, (6,), None, g)[0]])


def _embedding_case(name, padding_idx):
    @case(name)
    def _(r):
        idx = np.array([[1, 4, 1], [0, 1, 5]], dtype=np.int64)   # repeats, and the padding row
        return ([r.standard_normal((6, 3))],
                lambda J, F, w: F.embedding(J.tensor(idx), w, padding_idx=padding_idx),
                lambda w, g: [N.embedding_backward(idx, w.shape, g, padding_idx)])


_embedding_case("embedding", None)
_embedding_case("embedding-padding_idx", 1)
_embedding_case("embedding-padding_idx-negative", -1)


def _nll_case(name, shape, weight, ignore_index, reduction):
    @case(name)
    def _(r):
        C = shape[1] if len(shape) > 1 else shape[0]
        tshape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
        target = r.integers(0, C, size=tshape).astype(np.int64)
        if ignore_index is not None and target.ndim:
            target.reshape(-1)[::3] = ignore_index       # every third sample ignored
        wt = None if not weight else r.uniform(0.5, 2.0, C)
        kw = {} if ignore_index is None else {"ignore_index": ignore_index}

        def fwd(J, F, x):
            return F.nll_loss(x, J.tensor(target), None if wt is None else J.tensor(wt, dtype=x.dtype),
                              reduction=reduction, **kw)

        return ([r.standard_normal(shape)], fwd,
                lambda x, g: [N.nll_loss_backward(x, target, g, wt, -100 if ignore_index is None else ignore_index,
                                                  reduction)])


for _red in ("mean", "sum", "none"):
    _nll_case(f"nll_loss-{_red}", (5, 4), False, None, _red)
    _nll_case(f"nll_loss-weight-{_red}", (5, 4), True, None, _red)
    _nll_case(f"nll_loss-weight-ignore-{_red}", (7, 4), True, 2, _red)
    _nll_case(f"nll_loss-ignore-default-{_red}", (7, 4), False, -100, _red)
_nll_case("nll_loss-spatial-weight-ignore-mean", (2, 3, 2, 3), True, 1, "mean")
_nll_case("nll_loss-unbatched-weight", (4,), True, None, "mean")
_nll_case("nll_loss-unbatched-sum", (4,), False, None, "sum")


# ----------------------------------------------------------------------------- the tests

# Cases jitgrad cannot run yet (torch can): strict, so they fail loudly once it can.
XFAIL = {}
if USING_TORCH_AS_JITGRAD:   # torch runs every case
    XFAIL = {}

def _run(name, dtype):
    J = jitgrad
    r = np.random.default_rng(stable_seed("naive", name))
    arrays, fwd, ref = CASES[name](r)
    jdt = getattr(J, dtype)
    xs = [J.tensor(np.asarray(a, dtype=dtype), dtype=jdt, requires_grad=True) for a in arrays]
    y = fwd(J, _F(J), *xs)
    g = r.standard_normal(tuple(y.shape)).astype(dtype)
    y.backward(J.tensor(g, dtype=jdt))
    # the reference sees exactly the values jitgrad saw, in float64
    expected = ref(*[np.asarray(a, dtype=dtype).astype(np.float64) for a in arrays], g.astype(np.float64))
    assert len(expected) == len(xs)
    return xs, expected


@pytest.mark.parametrize("name", [pytest.param(n, marks=XFAIL.get(n, ())) for n in sorted(CASES)])
def test_backward_matches_naive_float64(name):
    xs, expected = _run(name, "float64")
    for i, (x, e) in enumerate(zip(xs, expected)):
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.dtype == jitgrad.float64
        assert_close(x.grad, e, rtol=RTOL64, atol=ATOL64, msg=f"{name}: gradient of input {i}")


FLOAT32_SPOT = ["sum-dims02-keepdim", "mean-dim1-keepdim", "amax-dim1-ties", "max-dim1", "prod-dim1-zeros",
                "bmm", "matmul-broadcast-batch", "addmm-broadcast-beta-alpha", "permute", "expand-then-mul",
                "cat-dim-neg", "stack-dim0", "index-int-rows-repeated", "index-bool-full", "softmax-dim1-3x4",
                "log_softmax-dim-1-2x3x4", "conv2d-3", "conv2d-4", "max_pool2d-3", "layer_norm-two-dims",
                "embedding-padding_idx", "nll_loss-weight-ignore-mean", "trace-wide"]


@pytest.mark.parametrize("name", FLOAT32_SPOT)
def test_backward_matches_naive_float32(name):
    xs, expected = _run(name, "float32")
    for i, (x, e) in enumerate(zip(xs, expected)):
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.dtype == jitgrad.float32
        scale = max(1.0, float(np.max(np.abs(e))) if e.size else 1.0)
        assert_close(x.grad, e, rtol=1e-5, atol=1e-5 * scale, msg=f"{name}: gradient of input {i} (float32)")


def test_naive_matches_finite_differences():
    """The references themselves: a few against central differences of plain numpy forwards."""
    r = np.random.default_rng(5)

    def fd(f, x, g, eps=1e-6):
        out = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += eps
            xm[idx] -= eps
            out[idx] = np.sum((f(xp) - f(xm)) * g) / (2 * eps)
        return out

    x = r.standard_normal((2, 3, 4))
    g = r.standard_normal((2, 3, 4))
    np.testing.assert_allclose(N.softmax_backward(x, g, 1), fd(lambda v: N.softmax_forward(v, 1), x, g), atol=1e-7)
    g2 = r.standard_normal((2, 3))
    np.testing.assert_allclose(N.prod_backward(x, g2, 2), fd(lambda v: v.prod(2), x, g2), atol=1e-7)
    w = r.standard_normal((3, 4))
    mu = x.mean((1, 2), keepdims=True)
    var = x.var((1, 2), keepdims=True)

    def ln(v):
        return (v - v.mean((1, 2), keepdims=True)) / np.sqrt(v.var((1, 2), keepdims=True) + 1e-5) * w

    assert np.all(np.isfinite(mu)) and np.all(var > 0)
    np.testing.assert_allclose(N.layer_norm_backward(x, (3, 4), w, g)[0], fd(ln, x, g), atol=1e-6)
    xc = r.standard_normal((1, 2, 5, 5))
    wc = r.standard_normal((2, 1, 3, 2))
    gc = r.standard_normal((1, 2, 2, 5))
    gx, gw, _ = N.conv2d_backward(xc, wc, gc, stride=(2, 1), padding=(0, 1), dilation=(1, 2), groups=2)

    def conv_x(v):
        return N.conv2d_forward(v, wc, None, (2, 1), (0, 1), (1, 2), 2)

    def conv_w(v):
        return N.conv2d_forward(xc, v, None, (2, 1), (0, 1), (1, 2), 2)

    np.testing.assert_allclose(gx, fd(conv_x, xc, gc), atol=1e-6)
    np.testing.assert_allclose(gw, fd(conv_w, wc, gc), atol=1e-6)
