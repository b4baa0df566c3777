"""Forward mode through the shape and reduce primitives against PyTorch (float64).

Each case runs the same program on jitgrad (autograd.forward_ad) and on torch
(torch.func.jvp) through the public functions and methods a user calls (x.sum(1), x[1:3],
torch.cat...), over dims (negative, tuples), keepdim, 0-d and broadcast shapes,
non-contiguous primals and tangents, and tangents on only some inputs. Then: a view's
tangent is the view of its input's tangent, ties and zeros follow torch's formulas, and
tangents compose with reverse mode both ways (reverse-over-forward, forward-over-reverse).
"""
import numpy as np
import pytest
import torch

import jitgrad as J
import jitgrad.autograd.forward_ad as fwAD

TOL = dict(rtol=1e-12, atol=1e-12)


def _jit_jvp(fn, primals, tangents):
    with fwAD.dual_level():
        ins = [p if t is None else fwAD.make_dual(p, t) for p, t in zip(primals, tangents)]
        out, tangent = fwAD.unpack_dual(fn(J, *ins))
    return out, tangent


def _torch_jvp(fn, primals, tangents):
    """torch.func.jvp over the inputs that have a tangent (the others are constants)."""
    dual = [j for j, t in enumerate(tangents) if t is not None]

    def f(*xs):
        args = list(primals)
        for j, x in zip(dual, xs):
            args[j] = x
        return fn(torch, *args)

    return torch.func.jvp(f, tuple(primals[j] for j in dual), tuple(tangents[j] for j in dual))


def _inputs(lib, arrays, layout):
    """Tensors of the arrays; layout "t" makes each a transposed (non-contiguous) view."""
    out = []
    for a in arrays:
        if a is None:
            out.append(None)
        elif layout == "t" and a.ndim >= 2:
            out.append(lib.tensor(np.ascontiguousarray(np.swapaxes(a, 0, -1)), dtype=lib.float64).transpose(0, -1))
        else:
            out.append(lib.tensor(a, dtype=lib.float64))
    return out


def check(fn, shapes, has_tangent=None, layout="c", seed=0, arrays=None):
    rng = np.random.default_rng(seed)
    arrays = arrays if arrays is not None else [rng.standard_normal(s) for s in shapes]
    has_tangent = has_tangent or [True] * len(arrays)
    tarrays = [rng.standard_normal(np.shape(a)) if h else None for a, h in zip(arrays, has_tangent)]
    jout, jt = _jit_jvp(fn, _inputs(J, arrays, layout), _inputs(J, tarrays, layout))
    tout, tt = _torch_jvp(fn, _inputs(torch, arrays, layout), _inputs(torch, tarrays, layout))
    assert jt is not None, "no tangent came out"
    assert tuple(jt.shape) == tuple(tt.shape) == tuple(tout.shape) and jt.dtype == jout.dtype
    np.testing.assert_allclose(jout.numpy(), tout.numpy(), **TOL)
    np.testing.assert_allclose(jt.numpy(), tt.numpy(), **TOL)


CASES = {
    # reductions
    "sum_dim": (lambda L, x: x.sum(1), [(3, 4, 2)]),
    "sum_neg_keepdim": (lambda L, x: x.sum(-1, keepdim=True), [(3, 4, 2)]),
    "sum_dims": (lambda L, x: x.sum((0, -1)), [(3, 4, 2)]),
    "sum_all": (lambda L, x: x.sum(), [(3, 4)]),
    "sum_0d": (lambda L, x: x.sum(), [()]),
    "sum_0d_dim": (lambda L, x: x.sum(0, keepdim=True), [()]),
    "sum_fn": (lambda L, x: L.sum(x, dim=(1,)), [(2, 5)]),
    "sum_broadcast": (lambda L, x, y: (x + y).sum(0), [(3, 1), (4,)]),
    "sum_size1_dim": (lambda L, x: x.sum(1), [(3, 1, 2)]),
    "mean_dim": (lambda L, x: x.mean(0), [(3, 4)]),
    "mean_keepdim_neg": (lambda L, x: x.mean(-2, keepdim=True), [(2, 3, 4)]),
    "mean_all": (lambda L, x: x.mean(), [(3, 4)]),
    "mean_dims": (lambda L, x: L.mean(x, (0, 2)), [(2, 3, 4)]),
    "amax": (lambda L, x: x.amax(0), [(3, 4)]),
    "amax_dims_keepdim": (lambda L, x: x.amax((0, -1), keepdim=True), [(2, 3, 4)]),
    "amin": (lambda L, x: L.amin(x, -1), [(3, 4)]),
    "amax_all": (lambda L, x: x.amax(), [(3, 4)]),
    "max_all": (lambda L, x: x.max(), [(3, 4)]),
    "min_all": (lambda L, x: L.min(x), [(2, 3, 2)]),
    "max_dim": (lambda L, x: x.max(1).values, [(3, 4)]),
    "max_dim_keepdim": (lambda L, x: x.max(-1, keepdim=True)[0], [(2, 3, 4)]),
    "min_dim": (lambda L, x: L.min(x, 0).values, [(3, 4)]),
    "max_0d": (lambda L, x: x.max(0).values, [()]),
    "prod_dim": (lambda L, x: x.prod(1), [(3, 4)]),
    "prod_keepdim": (lambda L, x: x.prod(-1, keepdim=True), [(2, 3)]),
    "prod_all": (lambda L, x: x.prod(), [(3, 4)]),
    # views
    "view": (lambda L, x: x.reshape(4, -1), [(2, 6)]),
    "view_method": (lambda L, x: x.view(3, 2, 2), [(2, 6)]),
    "flatten": (lambda L, x: x.flatten(1), [(2, 3, 4)]),
    "view_0d": (lambda L, x: x.reshape(1, 1), [()]),
    "squeeze": (lambda L, x: x.squeeze(), [(2, 1, 3, 1)]),
    "squeeze_dim": (lambda L, x: x.squeeze(1), [(2, 1, 3)]),
    "squeeze_neg": (lambda L, x: L.squeeze(x, -1), [(2, 3, 1)]),
    "unsqueeze": (lambda L, x: x.unsqueeze(-1), [(2, 3)]),
    "unsqueeze_0d": (lambda L, x: x.unsqueeze(0), [()]),
    "none_index": (lambda L, x: x[None], [(2, 3)]),
    "permute": (lambda L, x: x.permute(2, 0, 1), [(2, 3, 4)]),
    "permute_neg": (lambda L, x: L.permute(x, (-1, 0, 1)), [(2, 3, 4)]),
    "transpose": (lambda L, x: x.transpose(0, -1), [(2, 3, 4)]),
    "t": (lambda L, x: x.t(), [(2, 3)]),
    "t_1d": (lambda L, x: x.t(), [(3,)]),
    "T": (lambda L, x: x.T, [(2, 3)]),
    "expand": (lambda L, x: x.expand(2, 3, 4), [(3, 1)]),
    "expand_keep": (lambda L, x: x.expand(-1, 5), [(3, 1)]),
    "expand_as": (lambda L, x, y: x.expand_as(y), [(1, 4), (3, 4)], [True, False]),
    "expand_0d": (lambda L, x: x.expand(3), [()]),
    # indexing
    "select": (lambda L, x: x[1], [(5, 3)]),
    "select_neg": (lambda L, x: x[-1, 2], [(5, 3)]),
    "select_last": (lambda L, x: x[..., 1], [(2, 3, 4)]),
    "slice": (lambda L, x: x[1:4, ::2], [(5, 3)]),
    "slice_mixed": (lambda L, x: x[1, None, 1:], [(3, 4, 5)]),
    "index_tensor": (lambda L, x: x[L.tensor([0, 2, 2, 4])], [(5, 3)]),
    "index_pairs": (lambda L, x: x[[0, 2, 1], [1, 1, 0]], [(3, 4)]),
    "index_mask": (lambda L, x: x[x > 0], [(4, 3)]),
    # joining
    "cat": (lambda L, x, y: L.cat([x, y], 0), [(2, 3), (4, 3)]),
    "cat_neg": (lambda L, x, y, z: L.cat([x, y, z], -1), [(2, 3), (2, 1), (2, 2)]),
    "cat_some": (lambda L, x, y, z: L.cat([x, y, z], 1), [(2, 3), (2, 1), (2, 2)], [False, True, False]),
    "stack": (lambda L, x, y: L.stack([x, y], 1), [(2, 3), (2, 3)]),
    "stack_neg_some": (lambda L, x, y: L.stack([x, y], -1), [(2, 3), (2, 3)], [True, False]),
    "stack_0d": (lambda L, x, y: L.stack([x, y]), [(), ()]),
    # a program mixing them
    "mixed": (lambda L, x, y: (L.cat([x, y.t()], 0)[1:].amax(0) * x.sum(0)).prod(), [(2, 3), (3, 2)]),
}


def _case(name):
    fn, shapes, *has = CASES[name]
    return fn, shapes, (has[0] if has else None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_jvp_matches_torch(name):
    fn, shapes, has = _case(name)
    check(fn, shapes, has)


@pytest.mark.parametrize("name", ["sum_dims", "mean_dim", "amax", "max_dim", "prod_dim", "permute", "t",
                                  "slice", "select_last", "index_tensor", "cat_neg", "stack", "expand", "view",
                                  "mixed"])
def test_jvp_of_non_contiguous_inputs(name):
    fn, shapes, has = _case(name)
    check(fn, shapes, has, layout="t", seed=1)


def test_index_put_primitive():
    """index_put's primitive (the scatter that is indexing's adjoint) against torch's index_add."""
    idx = np.array([0, 2, 2, 5])
    rng = np.random.default_rng(3)
    p, t = rng.standard_normal(4), rng.standard_normal(4)
    with fwAD.dual_level():
        x = fwAD.make_dual(J.tensor(p), J.tensor(t))
        jt = fwAD.unpack_dual(J.ops.functional.index_put_flat(x, idx, (6,))).tangent
    _, tt = torch.func.jvp(lambda x: torch.zeros(6, dtype=torch.float64).index_add(0, torch.tensor(idx), x),
                           (torch.tensor(p),), (torch.tensor(t),))
    np.testing.assert_allclose(jt.numpy(), tt.numpy(), **TOL)


# --- ties, zeros, NaN: torch's formulas, not just any subgradient --------------------------------
@pytest.mark.parametrize("name,fn", [
    ("amax", lambda L, x: x.amax(1)),
    ("amin_keepdim", lambda L, x: x.amin(0, keepdim=True)),
    ("max_all", lambda L, x: x.max()),
    ("min_all", lambda L, x: x.min()),
])
def test_extremum_ties_share_the_tangent(name, fn):
    a = np.array([[1.0, 3.0, 3.0, -2.0], [5.0, 5.0, 5.0, 0.0], [-2.0, 0.0, -2.0, 5.0]])
    check(fn, None, arrays=[a])


def test_extremum_with_nan_gives_nan_like_torch():
    a = np.array([[1.0, np.nan, 3.0], [0.5, 2.0, 2.0]])
    for fn in (lambda L, x: x.amax(1), lambda L, x: x.max()):
        with fwAD.dual_level():
            jt = fwAD.unpack_dual(fn(J, fwAD.make_dual(J.tensor(a), J.ones(2, 3, dtype=J.float64)))).tangent
        _, tt = torch.func.jvp(lambda x: fn(torch, x), (torch.tensor(a),), (torch.ones(2, 3, dtype=torch.float64),))
        np.testing.assert_array_equal(np.isnan(jt.numpy()), np.isnan(tt.numpy()))
        np.testing.assert_allclose(jt.numpy(), tt.numpy(), **TOL)


@pytest.mark.parametrize("zeros", [[(1, 2)], [(0, 0), (2, 3)], [(1, 0), (1, 3)]])
@pytest.mark.parametrize("name,fn", [
    ("prod_dim", lambda L, x: x.prod(1)),
    ("prod_dim0", lambda L, x: x.prod(0, keepdim=True)),
    ("prod_all", lambda L, x: x.prod()),
])
def test_prod_with_zeros(zeros, name, fn):
    a = np.random.default_rng(5).standard_normal((3, 4))
    for z in zeros:
        a[z] = 0.0
    check(fn, None, arrays=[a])


# --- a view's tangent is the view of the input's tangent -------------------------------------
VIEWS = [
    lambda x: x.t(), lambda x: x.unsqueeze(0), lambda x: x[1], lambda x: x[:, 1:3], lambda x: x[1:, ::2],
    lambda x: x[..., -1], lambda x: x.expand(2, 4, 3)[0], lambda x: x.t()[1:, None, 0], lambda x: x[2, 1],
]


# layout "t": a tangent laid out unlike its primal (transposed); reshape(3, 4) is left out
# there, as make_dual keeps such a tangent as it is where torch copies it into the primal's
# layout, so that reshaping it cannot be a view
@pytest.mark.parametrize("view,layout", [(v, "c") for v in VIEWS + [lambda x: x.reshape(3, 4)]]
                         + [(v, "t") for v in VIEWS])
def test_view_tangent_is_view_of_tangent(view, layout):
    rng = np.random.default_rng(2)
    p = J.tensor(rng.standard_normal((4, 3)))
    t = J.tensor(rng.standard_normal((3, 4))).t() if layout == "t" else J.tensor(rng.standard_normal((4, 3)))
    with fwAD.dual_level():
        x = fwAD.make_dual(p, t)
        xt = fwAD.unpack_dual(x).tangent
        yt = fwAD.unpack_dual(view(x)).tangent
        np.testing.assert_array_equal(yt.numpy(), view(xt).numpy())
        assert np.shares_memory(yt.numpy(), xt.numpy())


def test_int_results_have_no_tangent():
    with fwAD.dual_level():
        x = fwAD.make_dual(J.tensor([1.5, -2.0, 3.0]), J.tensor([1.0, 2.0, 3.0]))
        assert fwAD.unpack_dual(x.long()).tangent is None
        assert fwAD.unpack_dual(x.argmax()).tangent is None
        assert fwAD.unpack_dual(x.max(0).indices).tangent is None


def test_to_dtype_tangent():
    """to(float32) and back: the tangent is cast like the primal."""
    a, t = np.array([1.25, -2.5, 3.0]), np.array([0.5, 1.0, -1.5])
    out = []
    for lib, fw in ((J, fwAD), (torch, torch.autograd.forward_ad)):
        with fw.dual_level():
            x = fw.make_dual(lib.tensor(a, dtype=lib.float64), lib.tensor(t, dtype=lib.float64))
            y = x.to(lib.float32) * 2.0
            yt = fw.unpack_dual(y).tangent
            zt = fw.unpack_dual(y.double()).tangent
            out.append((yt.dtype == lib.float32, zt.dtype == lib.float64, yt.numpy(), zt.numpy()))
    assert out[0][:2] == out[1][:2] == (True, True)
    np.testing.assert_array_equal(out[0][2], out[1][2])
    np.testing.assert_array_equal(out[0][3], out[1][3])


# --- composition with reverse mode -------------------------------------------------------------
PROGRAMS = {
    "prod": lambda L, x: x.prod(1).sum(),
    "prod_all": lambda L, x: x.prod(),
    "index_cat": lambda L, x: (L.cat([x[1:] * x[:-1], x.t().reshape(4, 3)], 0) ** 2).mean(),
    "amax": lambda L, x: (x.amax(0) * x.sum(0)).sum(),
    "stack_max": lambda L, x: L.stack([x.max(1).values, x.min(1).values], -1).prod(),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_reverse_over_forward(name):
    """d/dx of (J(x) t): the tangent formulas record when the primal requires grad."""
    fn = PROGRAMS[name]
    rng = np.random.default_rng(7)
    a, t = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    grads = []
    for lib, fw in ((J, fwAD), (torch, torch.autograd.forward_ad)):
        x = lib.tensor(a, requires_grad=True)
        with fw.dual_level():
            jt = fw.unpack_dual(fn(lib, fw.make_dual(x, lib.tensor(t)))).tangent
            (g,) = lib.autograd.grad(jt, x)
        grads.append((jt.detach().numpy(), g.numpy()))
    np.testing.assert_allclose(grads[0][0], grads[1][0], **TOL)
    np.testing.assert_allclose(grads[0][1], grads[1][1], **TOL)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_forward_over_reverse_hvp(name):
    """The tangent of grad(f)(x) (create_graph) is the Hessian-vector product H t."""
    fn = PROGRAMS[name]
    rng = np.random.default_rng(8)
    a, t = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    with fwAD.dual_level():
        x = fwAD.make_dual(J.tensor(a, requires_grad=True), J.tensor(t))
        (g,) = J.autograd.grad(fn(J, x), x, create_graph=True)
        hv = fwAD.unpack_dual(g).tangent
    _, thv = torch.func.jvp(torch.func.grad(lambda x: fn(torch, x)), (torch.tensor(a),), (torch.tensor(t),))
    assert hv is not None
    np.testing.assert_allclose(hv.detach().numpy(), thv.numpy(), **TOL)
