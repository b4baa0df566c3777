"""Table-driven comparison of every differentiable op against real PyTorch (float64).

For every (op, shapes) case we check
  * forward values, shape and dtype,
  * grad_fn naming (exactly torch's name for simple single-node ops),
  * gradients through ``jitgrad.autograd.grad`` with a random ``grad_outputs``,
  * gradients through ``.backward(gradient)`` accumulated into the leaves.
"""
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
from conftest import assert_close, gen_array, stable_seed, to_np

import jitgrad
import jitgrad.nn.functional as JF

torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402


@dataclass
class Op:
    name: str
    fn: object               # fn(T, F, *inputs) -> tensor
    shapes: list             # list of tuples of input shapes
    doms: tuple = ("any",)   # value domain per input
    gname: str = "exact"     # "exact": grad_fn name equals torch's; "suffix": only Backward\d+ suffix
    extra: dict = field(default_factory=dict)


U = [((),), ((5,),), ((3, 4),), ((2, 3, 4),)]
U_NO0 = [((5,),), ((3, 4),), ((2, 3, 4),)]
B = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3,)), ((3, 4), ()), ((5,), (1,))]
R3 = [((2, 3, 4),)]
R2 = [((3, 4),)]

_MASK4 = np.array([True, False, True, False])

OPS = [
    # ---------------- arithmetic ----------------
    Op("add", lambda T, F, x, y: x + y, B, ("any", "any")),
    Op("add_fn", lambda T, F, x, y: T.add(x, y), B[:3], ("any", "any")),
    Op("add_scalar", lambda T, F, x: x + 2.5, U),
    Op("radd_scalar", lambda T, F, x: 2.5 + x, U),
    Op("sub", lambda T, F, x, y: x - y, B, ("any", "any")),
    Op("sub_fn", lambda T, F, x, y: T.sub(x, y), B[:3], ("any", "any")),
    Op("sub_scalar", lambda T, F, x: x - 2.0, U),
    Op("rsub_scalar", lambda T, F, x: 2.0 - x, U),
    Op("mul", lambda T, F, x, y: x * y, B, ("any", "any")),
    Op("mul_fn", lambda T, F, x, y: T.mul(x, y), B[:3], ("any", "any")),
    Op("mul_scalar", lambda T, F, x: x * 3.0, U),
    Op("rmul_scalar", lambda T, F, x: 3.0 * x, U),
    Op("mul_self", lambda T, F, x: x * x, U),
    Op("div", lambda T, F, x, y: x / y, B, ("any", "any")),
    Op("div_fn", lambda T, F, x, y: T.div(x, y), B[:3], ("any", "any")),
    Op("div_scalar", lambda T, F, x: x / 4.0, U),
    Op("rdiv_scalar", lambda T, F, x: 2.0 / x, U, gname="suffix"),
    Op("pow_tensor", lambda T, F, x, y: x ** y, B, ("pos", "any")),
    Op("pow_fn", lambda T, F, x, y: T.pow(x, y), B[:3], ("pos", "any")),
    Op("pow_scalar", lambda T, F, x: x ** 3, U),
    Op("pow_scalar_frac", lambda T, F, x: x ** 2.5, U, ("pos",)),
    Op("pow_method", lambda T, F, x: x.pow(2), U),
    Op("rpow_scalar", lambda T, F, x: 2.0 ** x, U),
    Op("neg", lambda T, F, x: -x, U),
    Op("neg_fn", lambda T, F, x: T.neg(x), U[1:3]),
    Op("neg_method", lambda T, F, x: x.neg(), U[1:3]),
    # ---------------- elementwise ----------------
    Op("exp", lambda T, F, x: x.exp(), U),
    Op("exp_fn", lambda T, F, x: T.exp(x), U[1:3]),
    Op("log", lambda T, F, x: x.log(), U, ("pos",)),
    Op("log_fn", lambda T, F, x: T.log(x), U[1:3], ("pos",)),
    Op("sqrt", lambda T, F, x: x.sqrt(), U, ("pos",)),
    Op("sqrt_fn", lambda T, F, x: T.sqrt(x), U[1:3], ("pos",)),
    Op("sin", lambda T, F, x: x.sin(), U),
    Op("sin_fn", lambda T, F, x: T.sin(x), U[1:3]),
    Op("cos", lambda T, F, x: x.cos(), U),
    Op("cos_fn", lambda T, F, x: T.cos(x), U[1:3]),
    Op("tanh", lambda T, F, x: x.tanh(), U),
    Op("tanh_fn", lambda T, F, x: T.tanh(x), U[1:3]),
    Op("tanh_F", lambda T, F, x: F.tanh(x), U[1:3]),
    Op("sigmoid", lambda T, F, x: x.sigmoid(), U),
    Op("sigmoid_fn", lambda T, F, x: T.sigmoid(x), U[1:3]),
    Op("sigmoid_F", lambda T, F, x: F.sigmoid(x), U[1:3]),
    Op("relu", lambda T, F, x: x.relu(), U),
    Op("relu_fn", lambda T, F, x: T.relu(x), U[1:3]),
    Op("relu_F", lambda T, F, x: F.relu(x), U[1:3]),
    Op("abs", lambda T, F, x: x.abs(), U),
    Op("abs_fn", lambda T, F, x: T.abs(x), U[1:3]),
    Op("abs_builtin", lambda T, F, x: abs(x), U[1:3]),
    Op("clamp", lambda T, F, x: x.clamp(-0.8, 0.7), U),
    Op("clamp_kw", lambda T, F, x: x.clamp(min=-0.8, max=0.7), U[1:3]),
    Op("clamp_min", lambda T, F, x: x.clamp(min=0.2), U[1:3]),
    Op("clamp_max", lambda T, F, x: x.clamp(max=-0.2), U[1:3]),
    Op("clamp_fn", lambda T, F, x: T.clamp(x, -0.8, 0.7), U[1:3]),
    # ---------------- binary elementwise ----------------
    Op("maximum", lambda T, F, x, y: T.maximum(x, y), B, ("any", "any")),
    Op("minimum", lambda T, F, x, y: T.minimum(x, y), B, ("any", "any")),
    Op("maximum_method", lambda T, F, x, y: x.maximum(y), B[:2], ("any", "any")),
    Op("where_mask", lambda T, F, x, y: T.where(T.tensor(_MASK4), x, y),
       [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 3, 4), (1,))], ("any", "any")),
    Op("where_cmp", lambda T, F, x, y: T.where(x > 0, x, y), B[:3], ("any", "any")),
    # ---------------- reductions ----------------
    Op("sum", lambda T, F, x: x.sum(), U),
    Op("sum_fn", lambda T, F, x: T.sum(x), U[1:3]),
    Op("sum_dim0", lambda T, F, x: x.sum(0), U_NO0),
    Op("sum_dim_neg", lambda T, F, x: x.sum(-1), U_NO0),
    Op("sum_dim_kw", lambda T, F, x: x.sum(dim=1), R3),
    Op("sum_dim_tuple", lambda T, F, x: x.sum((0, 2)), R3),
    Op("sum_keepdim", lambda T, F, x: x.sum(1, keepdim=True), R3 + R2),
    Op("sum_tuple_keepdim", lambda T, F, x: x.sum(dim=(0, -1), keepdim=True), R3),
    Op("sum_fn_dim", lambda T, F, x: T.sum(x, 1), R3),
    Op("mean", lambda T, F, x: x.mean(), U),
    Op("mean_fn", lambda T, F, x: T.mean(x), U[1:3]),
    Op("mean_dim", lambda T, F, x: x.mean(1), R3 + R2),
    Op("mean_dim_tuple", lambda T, F, x: x.mean((0, 1)), R3),
    Op("mean_keepdim", lambda T, F, x: x.mean(-1, keepdim=True), R3 + R2),
    Op("mean_fn_dim", lambda T, F, x: T.mean(x, dim=0, keepdim=True), R3),
    Op("max_all", lambda T, F, x: x.max(), U),
    Op("max_fn_all", lambda T, F, x: T.max(x), U[1:3]),
    Op("max_dim_values", lambda T, F, x: x.max(1).values, R3 + R2),
    Op("max_dim_index0", lambda T, F, x: x.max(dim=-1)[0], R3 + R2),
    Op("max_dim_keepdim", lambda T, F, x: x.max(0, keepdim=True).values, R3 + R2),
    Op("max_fn_dim", lambda T, F, x: T.max(x, 1).values, R3),
    Op("min_all", lambda T, F, x: x.min(), U),
    Op("min_dim_values", lambda T, F, x: x.min(1).values, R3 + R2),
    Op("min_dim_keepdim", lambda T, F, x: x.min(dim=2, keepdim=True)[0], R3),
    Op("min_fn_dim", lambda T, F, x: T.min(x, 0).values, R2),
    Op("amax_all", lambda T, F, x: x.amax(), U[1:]),
    Op("amax_dim", lambda T, F, x: x.amax(1), R3 + R2),
    Op("amax_tuple", lambda T, F, x: x.amax(dim=(0, 2)), R3),
    Op("amax_keepdim", lambda T, F, x: T.amax(x, dim=-1, keepdim=True), R3),
    Op("amin_dim", lambda T, F, x: x.amin(0), R3 + R2),
    Op("amin_tuple_keepdim", lambda T, F, x: T.amin(x, dim=(1, 2), keepdim=True), R3),
    Op("prod_all", lambda T, F, x: x.prod(), U),
    Op("prod_fn", lambda T, F, x: T.prod(x), U[1:3]),
    Op("prod_dim", lambda T, F, x: x.prod(1), R3 + R2),
    Op("prod_keepdim", lambda T, F, x: x.prod(-1, keepdim=True), R3),
    # ---------------- linear algebra ----------------
    Op("matmul_2d", lambda T, F, a, b: a @ b, [((3, 4), (4, 5)), ((1, 4), (4, 1))], ("any", "any")),
    Op("matmul_fn_2d", lambda T, F, a, b: T.matmul(a, b), [((3, 4), (4, 5))], ("any", "any")),
    Op("matmul_method", lambda T, F, a, b: a.matmul(b), [((3, 4), (4, 5))], ("any", "any")),
    Op("matmul_1d1d", lambda T, F, a, b: a @ b, [((4,), (4,))], ("any", "any")),
    Op("matmul_2d1d", lambda T, F, a, b: a @ b, [((3, 4), (4,))], ("any", "any")),
    Op("matmul_1d2d", lambda T, F, a, b: a @ b, [((4,), (4, 5))], ("any", "any"), gname="suffix"),
    Op("matmul_batched", lambda T, F, a, b: a @ b,
       [((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (3, 4, 5)), ((4,), (2, 4, 5)), ((2, 3, 4), (4,))],
       ("any", "any"), gname="suffix"),
    Op("mm", lambda T, F, a, b: T.mm(a, b), [((3, 4), (4, 5))], ("any", "any")),
    Op("mm_method", lambda T, F, a, b: a.mm(b), [((2, 3), (3, 2))], ("any", "any")),
    Op("dot", lambda T, F, a, b: T.dot(a, b), [((5,), (5,))], ("any", "any")),
    Op("dot_method", lambda T, F, a, b: a.dot(b), [((3,), (3,))], ("any", "any")),
    Op("trace", lambda T, F, x: x.trace(), [((4, 4),), ((3, 5),), ((5, 2),)]),
    Op("trace_fn", lambda T, F, x: T.trace(x), [((3, 3),)]),
    # ---------------- shape ops ----------------
    Op("t", lambda T, F, x: x.t(), [((3, 4),), ((5,),)]),
    Op("t_fn", lambda T, F, x: T.t(x), R2),
    Op("T_attr", lambda T, F, x: x.T, R2, gname="suffix"),
    Op("transpose", lambda T, F, x: x.transpose(0, 1), R3 + R2),
    Op("transpose_neg", lambda T, F, x: x.transpose(-1, 0), R3),
    Op("transpose_fn", lambda T, F, x: T.transpose(x, 1, 2), R3),
    Op("permute", lambda T, F, x: x.permute(2, 0, 1), R3),
    Op("permute_tuple", lambda T, F, x: x.permute((1, 2, 0)), R3),
    Op("permute_fn", lambda T, F, x: T.permute(x, (2, 1, 0)), R3),
    Op("reshape", lambda T, F, x: x.reshape(4, 6), R3, gname="suffix"),
    Op("reshape_tuple_neg", lambda T, F, x: x.reshape((-1, 2)), R3, gname="suffix"),
    Op("reshape_fn", lambda T, F, x: T.reshape(x, (6, 4)), R3, gname="suffix"),
    Op("reshape_after_t", lambda T, F, x: x.t().reshape(12), R2, gname="suffix"),
    Op("view", lambda T, F, x: x.view(6, 4), R3),
    Op("view_neg", lambda T, F, x: x.view(-1), R3),
    Op("flatten", lambda T, F, x: x.flatten(), R3, gname="suffix"),
    Op("flatten_dims", lambda T, F, x: x.flatten(1), R3, gname="suffix"),
    Op("flatten_fn", lambda T, F, x: T.flatten(x, 0, 1), R3, gname="suffix"),
    Op("squeeze", lambda T, F, x: x.squeeze(), [((3, 1, 4, 1),), ((1,),)]),
    Op("squeeze_dim", lambda T, F, x: x.squeeze(1), [((3, 1, 4),)]),
    Op("squeeze_fn", lambda T, F, x: T.squeeze(x, 0), [((1, 4),)]),
    Op("unsqueeze", lambda T, F, x: x.unsqueeze(1), R3 + R2),
    Op("unsqueeze_neg", lambda T, F, x: x.unsqueeze(-1), [((5,),), ((),)]),
    Op("unsqueeze_fn", lambda T, F, x: T.unsqueeze(x, 0), R2),
    Op("expand", lambda T, F, x: x.expand(2, 3, 4), [((3, 1),), ((1, 4),), ((4,),)]),
    Op("expand_neg1", lambda T, F, x: x.expand(-1, 5), [((3, 1),)]),
    Op("clone", lambda T, F, x: x.clone(), U[1:]),
    # ---------------- indexing ----------------
    Op("getitem_int", lambda T, F, x: x[1], R3 + R2),
    Op("getitem_negint", lambda T, F, x: x[-1], R2, gname="suffix"),
    Op("getitem_slice", lambda T, F, x: x[1:3], [((5,),), ((4, 3),)]),
    Op("getitem_slice_step", lambda T, F, x: x[::2], [((5,),)], gname="suffix"),
    Op("getitem_2slices", lambda T, F, x: x[1:, :2], R2, gname="suffix"),
    Op("getitem_int_slice", lambda T, F, x: x[0, 1:3], R2, gname="suffix"),
    Op("getitem_ints", lambda T, F, x: x[1, 2], R2, gname="suffix"),
    Op("getitem_none", lambda T, F, x: x[None], R2, gname="suffix"),
    Op("getitem_none_mid", lambda T, F, x: x[:, None, 1:], R2, gname="suffix"),
    Op("getitem_ellipsis", lambda T, F, x: x[..., 1], R3, gname="suffix"),
    Op("getitem_ellipsis_none", lambda T, F, x: x[0, ..., None], R3, gname="suffix"),
    Op("getitem_longtensor", lambda T, F, x: x[T.tensor([0, 2, 0])], [((4,),), ((3, 4),)]),
    Op("getitem_list", lambda T, F, x: x[[2, 1, 2]], [((3, 4),)], gname="suffix"),
    Op("getitem_longtensor_col", lambda T, F, x: x[:, T.tensor([3, 1, 1])], R2, gname="suffix"),
    Op("getitem_two_arrays", lambda T, F, x: x[T.tensor([0, 2, 2]), T.tensor([1, 0, 1])], R2, gname="suffix"),
    Op("getitem_2d_index", lambda T, F, x: x[T.tensor([[0, 1], [1, 1]])], R2, gname="suffix"),
    # ---------------- joining ----------------
    Op("cat0", lambda T, F, a, b: T.cat([a, b]), [((2, 3), (4, 3)), ((3,), (2,))], ("any", "any")),
    Op("cat1", lambda T, F, a, b: T.cat((a, b), dim=1), [((2, 3), (2, 1))], ("any", "any")),
    Op("cat_neg", lambda T, F, a, b, c: T.cat([a, b, c], -1),
       [((2, 2, 1), (2, 2, 3), (2, 2, 2))], ("any", "any", "any")),
    Op("stack0", lambda T, F, a, b: T.stack([a, b]), [((2, 3), (2, 3)), ((), ())], ("any", "any")),
    Op("stack_dim", lambda T, F, a, b, c: T.stack((a, b, c), dim=1),
       [((2, 3), (2, 3), (2, 3))], ("any", "any", "any")),
    Op("stack_neg", lambda T, F, a, b: T.stack([a, b], dim=-1), [((4,), (4,))], ("any", "any")),
    # ---------------- softmax ----------------
    Op("softmax", lambda T, F, x: x.softmax(1), R3 + R2),
    Op("softmax_neg", lambda T, F, x: x.softmax(dim=-1), [((5,),), ((2, 3, 4),)]),
    Op("softmax_fn", lambda T, F, x: T.softmax(x, 0), R2),
    Op("softmax_F", lambda T, F, x: F.softmax(x, dim=1), R2),
    Op("log_softmax", lambda T, F, x: x.log_softmax(1), R3 + R2),
    Op("log_softmax_neg", lambda T, F, x: x.log_softmax(dim=-1), [((5,),)]),
    Op("log_softmax_fn", lambda T, F, x: T.log_softmax(x, 0), R2),
    Op("log_softmax_F", lambda T, F, x: F.log_softmax(x, dim=-1), R3),
    # ---------------- small composites (check chaining / accumulation) ----------------
    Op("reuse_input", lambda T, F, x: x * x.exp() + x.sin() * x, U[1:3], gname="suffix"),
    Op("chain_mixed", lambda T, F, a, b: ((a @ b).tanh() * 2.0 - 1.0).sum(1).softmax(0),
       [((3, 4), (4, 5))], ("any", "any"), gname="suffix"),
]

CASES = []
for _op in OPS:
    for _i, _shapes in enumerate(_op.shapes):
        assert len(_shapes) == len(_op.doms), _op.name
        CASES.append(pytest.param(_op, _shapes, id=f"{_op.name}-{'x'.join(str(list(s)) for s in _shapes)}"))


def _make_inputs(T, arrays):
    if T is jitgrad:
        return [jitgrad.tensor(a, dtype=jitgrad.float64, requires_grad=True) for a in arrays]
    return [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]


@pytest.mark.parametrize("op,shapes", CASES)
def test_op_matches_torch(op, shapes):
    rng = np.random.default_rng(stable_seed(op.name, shapes))
    arrays = [gen_array(rng, s, d) for s, d in zip(shapes, op.doms)]

    tx = _make_inputs(torch, arrays)
    tout = op.fn(torch, TF, *tx)
    jx = _make_inputs(jitgrad, arrays)
    jout = op.fn(jitgrad, JF, *jx)

    # ---- forward ----
    assert tuple(jout.shape) == tuple(tout.shape), f"shape {tuple(jout.shape)} != torch {tuple(tout.shape)}"
    assert jout.dtype == jitgrad.float64
    assert_close(jout, tout, msg="forward")
    assert jout.requires_grad is True
    assert jout.is_leaf is False
    assert jout.grad_fn is not None

    # ---- grad_fn naming ----
    tname = type(tout.grad_fn).__name__
    jname = type(jout.grad_fn).__name__
    if op.gname == "exact":
        assert jname == tname, f"grad_fn class {jname} != torch {tname}"
        assert jout.grad_fn.name() == tout.grad_fn.name()
    else:
        assert re.search(r"Backward\d+$", jname), jname
        assert re.search(r"Backward\d+$", jout.grad_fn.name()), jout.grad_fn.name()

    # ---- gradients via autograd.grad ----
    g = np.asarray(rng.standard_normal(tuple(tout.shape)), dtype=np.float64)
    tgrads = torch.autograd.grad(tout, tx, grad_outputs=torch.tensor(g))
    jgrads = jitgrad.autograd.grad(jout, jx, grad_outputs=jitgrad.tensor(g, dtype=jitgrad.float64))
    assert isinstance(jgrads, tuple) and len(jgrads) == len(tx)
    for i, (jg, tg) in enumerate(zip(jgrads, tgrads)):
        assert_close(jg, tg, msg=f"autograd.grad input {i}")
        assert jg.dtype == jitgrad.float64
        assert jg.requires_grad is False
    for leaf in jx:
        assert leaf.grad is None, "autograd.grad must not touch .grad"

    # ---- gradients via backward(gradient) ----
    jout2 = op.fn(jitgrad, JF, *jx)
    jout2.backward(jitgrad.tensor(g, dtype=jitgrad.float64))
    for i, (leaf, tg) in enumerate(zip(jx, tgrads)):
        assert_close(leaf.grad, tg, msg=f"backward input {i}")
        assert leaf.grad.requires_grad is False

    # ---- a scalar loss through the op (implicit gradient) ----
    for leaf in jx:
        leaf.grad = None
    for leaf in tx:
        leaf.grad = None
    (op.fn(torch, TF, *tx) * torch.tensor(g)).sum().backward()
    (op.fn(jitgrad, JF, *jx) * jitgrad.tensor(g, dtype=jitgrad.float64)).sum().backward()
    for i, (jl, tl) in enumerate(zip(jx, tx)):
        assert_close(jl.grad, tl.grad, msg=f"sum-backward input {i}")


# --------------------------------------------------------------------------
# Non-table op tests
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_min_dim_namedtuple(kind):
    rng = np.random.default_rng(1)
    a = gen_array(rng, (3, 5))
    t = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    j = jitgrad.tensor(a, dtype=jitgrad.float64, requires_grad=True)
    tr = getattr(t, kind)(1)
    jr = getattr(j, kind)(1)
    assert_close(jr.values, tr.values)
    assert_close(jr[0], tr.values)
    assert jr.indices.dtype == jitgrad.int64
    np.testing.assert_array_equal(to_np(jr.indices), to_np(tr.indices))
    np.testing.assert_array_equal(to_np(jr[1]), to_np(tr.indices))
    vals, idx = jr  # tuple unpacking
    np.testing.assert_array_equal(to_np(idx), to_np(tr.indices))
    assert len(jr) == 2
    assert idx.requires_grad is False
    # keepdim keeps the reduced dim for both members
    jk = getattr(jitgrad, kind)(j, dim=0, keepdim=True)
    tk = getattr(torch, kind)(t, dim=0, keepdim=True)
    assert tuple(jk.values.shape) == tuple(tk.values.shape) == (1, 5)
    assert tuple(jk.indices.shape) == (1, 5)
    np.testing.assert_array_equal(to_np(jk.indices), to_np(tk.indices))


def test_ties_split_evenly_like_torch():
    cases = [
        ("maximum", lambda T, a, b: T.maximum(a, b), [1.0, 2.0, 3.0], [1.0, 1.0, 3.0]),
        ("minimum", lambda T, a, b: T.minimum(a, b), [1.0, 2.0, -3.0], [1.0, 1.0, -3.0]),
    ]
    for name, fn, av, bv in cases:
        ta = torch.tensor(av, dtype=torch.float64, requires_grad=True)
        tb = torch.tensor(bv, dtype=torch.float64, requires_grad=True)
        ja = jitgrad.tensor(av, dtype=jitgrad.float64, requires_grad=True)
        jb = jitgrad.tensor(bv, dtype=jitgrad.float64, requires_grad=True)
        fn(torch, ta, tb).sum().backward()
        fn(jitgrad, ja, jb).sum().backward()
        assert_close(ja.grad, ta.grad, msg=name + " a")
        assert_close(jb.grad, tb.grad, msg=name + " b")
    # reductions with ties: max()/amax/amin distribute the gradient evenly
    v = [[1.0, 4.0, 4.0], [2.0, 2.0, 0.5]]
    for name, fn in [("max_all", lambda x: x.max()), ("amax_all", lambda x: x.amax()),
                     ("amax_dim", lambda x: x.amax(1).sum()), ("amin_dim", lambda x: x.amin(0).sum()),
                     ("min_all", lambda x: x.min())]:
        t = torch.tensor(v, dtype=torch.float64, requires_grad=True)
        j = jitgrad.tensor(v, dtype=jitgrad.float64, requires_grad=True)
        fn(t).backward()
        fn(j).backward()
        assert_close(j.grad, t.grad, msg=name)


def test_nondifferentiable_points_match_torch():
    v = [0.0, 1.0, -1.0, 0.5, -0.5]
    for name, fn in [("abs", lambda x: x.abs()), ("relu", lambda x: x.relu()),
                     ("clamp", lambda x: x.clamp(-0.5, 0.5)), ("clamp_min0", lambda x: x.clamp(min=0.0))]:
        t = torch.tensor(v, dtype=torch.float64, requires_grad=True)
        j = jitgrad.tensor(v, dtype=jitgrad.float64, requires_grad=True)
        fn(t).sum().backward()
        fn(j).sum().backward()
        assert_close(j.grad, t.grad, msg=name)


def test_comparison_produces_bool_without_grad():
    j = jitgrad.tensor([1.0, -2.0, 3.0], requires_grad=True)
    m = j > 0
    assert m.dtype == jitgrad.bool
    assert m.requires_grad is False
    assert m.tolist() == [True, False, True]


def test_getitem_setup_does_not_modify_source():
    a = np.arange(12.0).reshape(3, 4)
    j = jitgrad.tensor(a, dtype=jitgrad.float64, requires_grad=True)
    y = j[jitgrad.tensor([0, 0, 2])]
    (y * 2).sum().backward()
    expected = np.zeros((3, 4))
    expected[0] = 4.0
    expected[2] = 2.0
    assert_close(j.grad, expected)
    assert_close(j, a)


@pytest.mark.parametrize("name", ["add", "mul", "div", "exp", "tanh", "matmul", "sum", "mean",
                                  "softmax", "log_softmax", "sigmoid", "pow", "max_dim", "getitem"])
def test_float32_matches_torch(name):
    fns = {
        "add": lambda T, x, y: x + y,
        "mul": lambda T, x, y: x * y * 3.0,
        "div": lambda T, x, y: x / (y * y + 1.0),
        "exp": lambda T, x, y: x.exp() + y,
        "tanh": lambda T, x, y: T.tanh(x) * y,
        "matmul": lambda T, x, y: x @ y.t(),
        "sum": lambda T, x, y: (x * y).sum(1),
        "mean": lambda T, x, y: (x - y).mean(0, keepdim=True),
        "softmax": lambda T, x, y: x.softmax(1) * y,
        "log_softmax": lambda T, x, y: x.log_softmax(-1) * y,
        "sigmoid": lambda T, x, y: x.sigmoid() - y.sigmoid(),
        "pow": lambda T, x, y: (x * x + 0.5) ** 1.5 + y ** 2,
        "max_dim": lambda T, x, y: x.max(1).values + y.amax(1),
        "getitem": lambda T, x, y: x[1:, ::2] * y[0, 1:3],
    }
    fn = fns[name]
    rng = np.random.default_rng(stable_seed("f32", name))
    a = gen_array(rng, (3, 4)).astype(np.float32)
    b = gen_array(rng, (3, 4)).astype(np.float32)
    tx = torch.tensor(a, requires_grad=True)
    ty = torch.tensor(b, requires_grad=True)
    jx = jitgrad.tensor(a, requires_grad=True)
    jy = jitgrad.tensor(b, requires_grad=True)
    assert jx.dtype == jitgrad.float32
    tout = fn(torch, tx, ty)
    jout = fn(jitgrad, jx, jy)
    assert jout.dtype == jitgrad.float32
    assert_close(jout, tout, rtol=RTOL32_, atol=ATOL32_, msg="forward f32")
    g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    tout.backward(torch.tensor(g))
    jout.backward(jitgrad.tensor(g))
    assert jx.grad.dtype == jitgrad.float32
    assert jy.grad.dtype == jitgrad.float32
    assert_close(jx.grad, tx.grad, rtol=RTOL32_, atol=ATOL32_, msg="grad x f32")
    assert_close(jy.grad, ty.grad, rtol=RTOL32_, atol=ATOL32_, msg="grad y f32")


RTOL32_ = 2e-5
ATOL32_ = 2e-6


def test_dtype_promotion_like_torch():
    f32 = jitgrad.ones(3)
    f64 = jitgrad.ones(3, dtype=jitgrad.float64)
    i64 = jitgrad.tensor([1, 2, 3])
    assert (f32 + f64).dtype == jitgrad.float64
    assert (f32 * 2.5).dtype == jitgrad.float32
    assert (2.5 * f32).dtype == jitgrad.float32
    assert (f64 * 2).dtype == jitgrad.float64
    assert (i64 * 2).dtype == jitgrad.int64
    assert (i64 * 2.5).dtype == jitgrad.float32
    assert (i64 + f64).dtype == jitgrad.float64
    assert (i64 / 2).dtype == jitgrad.float32  # true division promotes to default float
    assert (f32.exp()).dtype == jitgrad.float32
    assert (f32 @ f32).dtype == jitgrad.float32
    assert (f32.sum()).dtype == jitgrad.float32
