"""Every batching rule against torch.func.vmap: the same function on the same float64 data,
values and the gradients of a weighted sum of the output with respect to every input; and
the op table: every primitive has a batching rule or the explicit fallback marker."""
import numpy as np
import pytest
import torch
from conftest import assert_close, stable_seed

import jitgrad
from jitgrad.func import _rules
from jitgrad.graph import spec

B = 3


def _arg(T, rng, a):
    """An argument from its description: a shape (float64, requires grad), ("pos", shape),
    ("idx", shape, high), ("bool", shape), ("f", shape) (no grad), or a value as is."""
    if isinstance(a, tuple) and all(isinstance(s, int) for s in a):
        a = ("any", a)
    if not (isinstance(a, tuple) and a and a[0] in ("any", "pos", "idx", "perm", "bool", "f")):
        return a
    kind, shape = a[0], a[1]
    if kind == "perm":      # distinct indices along the last dim
        rows = [rng.permutation(a[2])[:shape[-1]] for _ in range(int(np.prod(shape[:-1])))]
        return T.tensor(np.array(rows).reshape(shape), dtype=T.int64)
    if kind == "idx":
        return T.tensor(rng.integers(0, a[2], size=shape), dtype=T.int64)
    if kind == "bool":
        return T.tensor(rng.random(size=shape) < 0.5)
    lo, hi = (0.5, 2.0) if kind == "pos" else (-1.5, 1.5)
    return T.tensor(rng.uniform(lo, hi, size=shape), dtype=T.float64, requires_grad=kind != "f")


def _outputs(out):
    return [o for x in out for o in _outputs(x)] if isinstance(out, (tuple, list)) else [out]


def run_case(T, f, args, in_dims, seed, **vmap_kw):
    rng = np.random.default_rng(seed)
    inputs = [_arg(T, rng, a) for a in args]
    out = _outputs(T.func.vmap(f(T), in_dims=in_dims, **vmap_kw)(*inputs))
    floats = [o for o in out if o.dtype == T.float64]
    grads = []
    diff = [x for x in inputs if isinstance(x, T.Tensor) and x.requires_grad]
    if floats and diff and any(o.requires_grad for o in floats):
        wrng = np.random.default_rng(seed + 1)
        loss = sum((o * T.tensor(wrng.uniform(-1, 1, size=tuple(o.shape)), dtype=T.float64)).sum() for o in floats)
        grads = list(T.autograd.grad(loss, diff, allow_unused=True))
    return [o.detach() for o in out], grads


def check(f, args, in_dims=0, **vmap_kw):
    seed = stable_seed(repr(args), repr(in_dims))
    jo, jg = run_case(jitgrad, f, args, in_dims, seed, **vmap_kw)
    to, tg = run_case(torch, f, args, in_dims, seed, **vmap_kw)
    assert len(jo) == len(to)
    for j, t in zip(jo, to):
        assert str(j.dtype).split(".")[-1] == str(t.dtype).split(".")[-1], (j.dtype, t.dtype)
        assert_close(j, t, msg="value")
    assert len(jg) == len(tg)
    for j, t in zip(jg, tg):
        assert (j is None) == (t is None)
        if t is not None:
            assert_close(j, t, msg="grad")


def F(T):
    return T.nn.functional


# (id, f(T) -> function, args, in_dims)
CASES = [
    # elementwise: broadcasting of logical shapes, batched and plain operands
    ("add", lambda T: lambda a, b: a + b, [(B, 4), (B, 4)], 0),
    ("add_plain", lambda T: lambda a, b: T.add(a, b, alpha=2), [(B, 4), (4,)], (0, None)),
    ("mul_ranks", lambda T: lambda a, b: a * b, [(B, 2, 1), (B, 4)], 0),
    ("mul_plain_rank", lambda T: lambda a, b: b * a, [(B, 4), (2, 4)], (0, None)),
    ("sub_div", lambda T: lambda a, b: (a - b) / (b * b + 1), [(4, B), (B, 4)], (1, 0)),
    ("rsub_rdiv", lambda T: lambda a: (1 - a) + 2 / (a * a + 1), [(B, 4)], 0),
    ("pow", lambda T: lambda a, b: a ** 2 + b ** a + a.pow(3), [("pos", (B, 4)), ("pos", (B, 4))], 0),
    ("rpow", lambda T: lambda a: 2 ** a, [(B, 4)], 0),
    ("unary", lambda T: lambda a: (a.exp() + a.sin() * a.cos() - a.tanh() + a.sigmoid() + a.relu() + a.abs()
                                    - a.neg() + T.erf(a) + T.expm1(a) + a.sign()), [(B, 5)], 0),
    ("unary_pos", lambda T: lambda a: a.log() + a.sqrt() + T.log1p(a) + a.reciprocal(), [("pos", (B, 5))], 0),
    ("gelu", lambda T: lambda a: F(T).gelu(a) + F(T).gelu(a, approximate="tanh"), [(B, 5)], 0),
    ("clamp", lambda T: lambda a: a.clamp(-0.5, 0.7) + T.clamp(a, min=0.1), [(B, 6)], 0),
    ("maximum", lambda T: lambda a, b: T.maximum(a, b) - T.minimum(a, b), [(B, 4), (4,)], (0, None)),
    ("where", lambda T: lambda a, b: T.where(a > b, a, b * 2), [(B, 4), (B, 4)], 0),
    ("compare", lambda T: lambda a, b: (a > b, a <= 0.5, a == a, (a > 0) & (b > 0), ~(a > 0)),
     [(B, 4), (4,)], (0, None)),
    ("to_dtype", lambda T: lambda a: a.to(T.float32).double() * a, [(B, 3)], 0),
    ("like", lambda T: lambda a: T.zeros_like(a) + T.ones_like(a) * a + T.full_like(a, 2.0), [(B, 3)], 0),
    ("clone", lambda T: lambda a: a.clone() * a.detach(), [(B, 3)], 0),
    # reductions
    ("sum_all", lambda T: lambda a: a.sum(), [(B, 3, 4)], 0),
    ("sum_dims", lambda T: lambda a: a.sum(0) + a.sum(-1, keepdim=True).sum(0) + T.sum(a, (0, 1)),
     [(B, 3, 4)], 0),
    ("sum_scalar", lambda T: lambda a: a.sum() + a.mean() + a.sum(0, keepdim=True) + a.amax(-1), [(B,)], 0),
    ("reduce_scalar_dim", lambda T: lambda a: (a.prod(0, keepdim=True), a.max(0, keepdim=True), a.argmax(0),
                                               a.softmax(0), a.log_softmax(-1)), [(B,)], 0),
    ("mean", lambda T: lambda a: a.mean(1) + a.mean(), [(3, B, 4)], 1),
    ("amax", lambda T: lambda a: a.amax(0) + a.amin(-1).sum() + a.amax(), [(B, 3, 4)], 0),
    ("max_dim", lambda T: lambda a: (a.max(0).values, a.max(0).indices, a.min(1, keepdim=True).values),
     [(B, 3, 4)], 0),
    ("max_all", lambda T: lambda a: a.max() + a.min(), [(B, 3, 4)], 0),
    ("max_binary", lambda T: lambda a, b: T.max(a, b), [(B, 4), (B, 4)], 0),
    ("argmax", lambda T: lambda a: (a.argmax(), a.argmax(0), a.argmin(1, keepdim=True), a.argmin()),
     [(B, 3, 4)], 0),
    ("prod", lambda T: lambda a: a.prod() + a.prod(1).sum(), [(B, 3, 4)], 0),
    ("softmax", lambda T: lambda a: a.softmax(-1) + T.log_softmax(a, 0) + F(T).softmax(a, dim=1),
     [(B, 3, 4)], 0),
    ("trace", lambda T: lambda a: a.trace(), [(B, 3, 4)], 0),
    ("sum_to_size", lambda T: lambda a: a.sum_to_size(1, 4), [(B, 3, 4)], 0),
    # views and shapes
    ("reshape", lambda T: lambda a: a.reshape(2, -1) + a.view(12).view(2, 6) + T.reshape(a, (2, 6)),
     [(3, 4, B)], 2),
    ("flatten", lambda T: lambda a: (a.flatten(), a.flatten(1), T.flatten(a, 0, 1)), [(B, 2, 3, 2)], 0),
    ("flatten_scalar", lambda T: lambda a: a.flatten() * 2, [(B,)], 0),
    ("squeeze", lambda T: lambda a: (a.squeeze(), a.squeeze(1), a.squeeze(0)), [(B, 2, 1, 3)], 0),
    ("unsqueeze", lambda T: lambda a: (a.unsqueeze(0), a.unsqueeze(-1), T.unsqueeze(a, 1)), [(B, 2, 3)], 0),
    ("expand", lambda T: lambda a: (a.expand(2, 3, 4), a.expand(-1, 4)), [(B, 3, 1)], 0),
    ("expand_as", lambda T: lambda a, b: a.expand_as(b) * b, [(B, 1, 4), (B, 3, 4)], 0),
    ("permute", lambda T: lambda a: (a.permute(2, 0, 1), a.transpose(0, 2), T.transpose(a, -1, -2)),
     [(B, 2, 3, 4)], 0),
    ("t", lambda T: lambda a, v: (a.t(), a.T, a.mT, v.t()), [(B, 2, 3), (B, 4)], 0),
    ("view_as", lambda T: lambda a, b: a.view_as(b) + a.reshape_as(b), [(B, 6), (B, 2, 3)], 0),
    ("narrow_select", lambda T: lambda a: (a.narrow(1, 1, 2), T.narrow(a, -1, 0, 3), a.select(0, 2),
                                           T.select(a, -1, 1)), [(3, 4, B)], 2),
    ("split_chunk", lambda T: lambda a: (*a.split(2, 1), *T.split(a, [1, 3], dim=-1), *a.chunk(3, 0)),
     [(B, 3, 4)], 0),
    ("unbind", lambda T: lambda a: (*a.unbind(1), *T.unbind(a)), [(B, 3, 2)], 0),
    ("masked_fill", lambda T: lambda a, m: (a.masked_fill(m, 0.5), T.masked_fill(a, a > 0, -1.0),
                                            a.masked_fill(m[0], 2.0)), [(B, 3, 4), ("bool", (B, 3, 4))], 0),
    ("masked_fill_plain_mask", lambda T: lambda a, m: a.masked_fill(m, 0.5), [(B, 3, 4), ("bool", (4,))],
     (0, None)),
    ("diagonal", lambda T: lambda a: (a.diagonal(), T.diagonal(a, 1, 2, 0), a.diagonal(-1, -1, -2)),
     [(3, B, 4, 5)], 1),
    ("repeat", lambda T: lambda a: (a.repeat(2, 1), a.repeat(2, 3, 1)), [(B, 3, 2)], 0),
    # indexing
    ("getitem_basic", lambda T: lambda a: (a[0], a[:, 1], a[1:3], a[..., None], a[0, 2], a[:, ::2]),
     [(B, 4, 5)], 0),
    ("getitem_index", lambda T: lambda a, i: (a[i], a[:, i], a[i, 1:]), [(B, 4, 5), ("idx", (2, 3), 4)],
     (0, None)),
    ("getitem_nonadjacent", lambda T: lambda a, i: a[i, :, i], [(B, 4, 5, 4), ("idx", (3,), 4)], (0, None)),
    ("getitem_mask", lambda T: lambda a, m: a[m], [(B, 4, 5), ("bool", (4, 5))], (0, None)),
    ("getitem_batched_index", lambda T: lambda a, i: (a[i], a[i, 2]), [(B, 4, 5), ("idx", (B, 3), 4)], 0),
    ("getitem_plain_tensor", lambda T: lambda a, i: a[i], [(4, 5), ("idx", (B, 2), 4)], (None, 0)),
    ("setitem", lambda T: lambda a, b: _set(a, b), [(B, 4, 5), (B, 5)], 0),
    ("setitem_plain_value", lambda T: lambda a, b: _set(a, b), [(B, 4, 5), (5,)], (0, None)),
    ("setitem_index", lambda T: lambda a, i, b: _set_idx(a, i, b), [(B, 4, 5), ("perm", (B, 2), 4), (B, 2, 5)],
     0),
    # joining
    ("cat", lambda T: lambda a, b: (T.cat([a, b], 0), T.cat([a, b], -1)), [(B, 2, 3), (2, 3)], (0, None)),
    ("stack", lambda T: lambda a, b: (T.stack([a, b], 0), T.stack([a, b], -1)), [(B, 2, 3), (B, 2, 3)], 0),
    # linear algebra
    ("matmul_plain", lambda T: lambda a, w: a @ w, [(B, 4), (4, 5)], (0, None)),
    ("matmul_both", lambda T: lambda a, w: T.matmul(a, w), [(B, 3, 4), (B, 4, 5)], 0),
    ("matmul_vecs", lambda T: lambda a, b: (a @ b, T.dot(a, b)), [(B, 4), (B, 4)], 0),
    ("matmul_vec_mat", lambda T: lambda a, w: (a @ w, w.t() @ a), [(B, 4), (B, 4, 5)], 0),
    ("matmul_broadcast", lambda T: lambda a, w: a @ w, [(B, 4, 5), (2, 5, 3)], (0, None)),
    ("matmul_broadcast_both", lambda T: lambda a, w: w @ a, [(B, 5, 3), (B, 2, 4, 5)], 0),
    ("rmatmul", lambda T: lambda a, w: w @ a, [(B, 4, 3), (2, 4)], (0, None)),
    ("mm_bmm_mv", lambda T: lambda a, b, v: (a.mm(b), T.bmm(a.unsqueeze(0), b.unsqueeze(0)), T.mv(a, v)),
     [(B, 3, 4), (4, 2), (B, 4)], (0, None, 0)),
    ("addmm", lambda T: lambda c, a, b: T.addmm(c, a, b, beta=0.5, alpha=2.0), [(B, 3, 2), (B, 3, 4), (4, 2)],
     (0, 0, None)),
    ("linear", lambda T: lambda x, w, b: F(T).linear(x, w, b) + F(T).linear(x, w), [(B, 4), (5, 4), (5,)],
     (0, None, None)),
    ("linear_nd", lambda T: lambda x, w, b: F(T).linear(x, w, b), [(B, 2, 4), (5, 4), (5,)], (0, None, None)),
    ("linear_batched_weight", lambda T: lambda x, w, b: F(T).linear(x, w, b), [(B, 2, 4), (B, 5, 4), (B, 5)], 0),
    # nn
    ("conv2d", lambda T: lambda x, w, b: F(T).conv2d(x, w, b, stride=1, padding=1),
     [(B, 2, 3, 5, 5), (4, 3, 3, 3), (4,)], (0, None, None)),
    ("conv2d_unbatched_input", lambda T: lambda x, w: F(T).conv2d(x, w, stride=2, groups=2),
     [(B, 4, 6, 6), (6, 2, 2, 2)], (0, None)),
    ("conv2d_batched_weight", lambda T: lambda x, w, b: F(T).conv2d(x, w, b, padding=1, groups=2),
     [(B, 2, 4, 5, 5), (B, 6, 2, 3, 3), (B, 6)], 0),
    ("conv2d_weight_only", lambda T: lambda x, w: F(T).conv2d(x, w, dilation=2), [(3, 6, 6), (B, 2, 3, 2, 2)],
     (None, 0)),
    ("max_pool2d", lambda T: lambda x: (F(T).max_pool2d(x, 2), F(T).max_pool2d(x, 3, 2, 1, return_indices=True)),
     [(B, 2, 3, 6, 6)], 0),
    ("max_pool2d_3d", lambda T: lambda x: F(T).max_pool2d(x, 2), [(B, 3, 4, 4)], 0),
    ("avg_pool2d", lambda T: lambda x: F(T).avg_pool2d(x, 3, 2, 1, ceil_mode=True), [(B, 2, 3, 5, 5)], 0),
    ("adaptive_avg_pool2d", lambda T: lambda x: F(T).adaptive_avg_pool2d(x, (2, 3)), [(B, 3, 5, 4)], 0),
    ("group_norm", lambda T: lambda x, w, b: F(T).group_norm(x, 2, w, b), [(B, 2, 4, 3), (4,), (4,)],
     (0, None, None)),
    ("batch_norm", lambda T: lambda x: F(T).batch_norm(x, None, None, training=True), [(B, 3, 2, 2)], 0),
    ("layer_norm", lambda T: lambda x, w, b: F(T).layer_norm(x, (4,), w, b), [(B, 3, 4), (4,), (4,)],
     (0, None, None)),
    ("layer_norm_batched_weight", lambda T: lambda x, w, b: F(T).layer_norm(x, (3, 4), w, b, eps=1e-3),
     [(B, 2, 3, 4), (B, 3, 4), (3, 4)], (0, 0, None)),
    ("embedding", lambda T: lambda i, w: F(T).embedding(i, w, padding_idx=1), [("idx", (B, 2, 3), 5), (5, 4)],
     (0, None)),
    ("embedding_batched_weight", lambda T: lambda i, w: F(T).embedding(i, w), [("idx", (B, 2, 3), 5), (B, 5, 4)],
     0),
    ("nll_loss", lambda T: lambda x, t, w: (F(T).nll_loss(x, t), F(T).nll_loss(x, t, reduction="sum"),
                                            F(T).nll_loss(x, t, w, ignore_index=2, reduction="none"),
                                            F(T).nll_loss(x, t, w, ignore_index=1)),
     [(B, 4, 3), ("idx", (B, 4), 3), ("f", (3,))], (0, 0, None)),
    ("nll_loss_single", lambda T: lambda x, t: (F(T).nll_loss(x, t), F(T).nll_loss(x, t, reduction="none")),
     [(B, 5), ("idx", (B,), 5)], 0),
    ("nll_loss_plain_target", lambda T: lambda x, t: F(T).nll_loss(x, t), [(B, 4, 3), ("idx", (4,), 3)],
     (0, None)),
    ("cross_entropy", lambda T: lambda x, t: F(T).cross_entropy(x, t) + F(T).cross_entropy(x, t, reduction="sum"),
     [(B, 4, 3), ("idx", (B, 4), 3)], 0),
    ("mse_loss", lambda T: lambda x, y: F(T).mse_loss(x, y), [(B, 4), (B, 4)], 0),
    ("bce_with_logits", lambda T: lambda x, y, w: (F(T).binary_cross_entropy_with_logits(x, y),
                                                   F(T).binary_cross_entropy_with_logits(x, y, w, reduction="none")),
     [(B, 4), ("f", (4,)), ("f", (4,))], (0, None, None)),
    # in place
    ("inplace", lambda T: lambda a, b: _inplace(a, b), [(B, 4), (4,)], (0, None)),
    ("inplace_batched_other", lambda T: lambda a, b: _inplace(a, b), [(B, 2, 4), (B, 4)], 0),
]


def _set(a, b):
    y = a * 1
    y[0] = b
    y[1, 1:3] = 5.0
    return y


def _set_idx(a, i, b):
    y = a * 1
    y[i] = b
    return y


def _inplace(a, b):
    y = a * 1
    y.add_(b)
    y.mul_(b)
    y += b
    y.clamp_(-1.0, 1.0)
    z = a * 1
    z.zero_()
    z.copy_(b * 3)
    w = a * 1
    w.fill_(2.0)
    return y, z, w


@pytest.mark.parametrize("f,args,in_dims", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_vs_torch(f, args, in_dims):
    check(f, args, in_dims)


@pytest.mark.parametrize("f,args,in_dims", [c[1:] for c in CASES[::4]], ids=[c[0] for c in CASES[::4]])
def test_rule_nested_vs_torch(f, args, in_dims):
    """The same functions under two levels: the outer batch dim in front of every batched input."""
    def nested(T):
        return T.func.vmap(f(T), in_dims=in_dims)
    dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
    outer = [((2,) + a if d is not None and isinstance(a, tuple) and all(isinstance(s, int) for s in a) else
              (a[0], (2,) + a[1]) + a[2:] if d is not None else a) for a, d in zip(args, dims)]
    outer_dims = tuple(0 if d is not None else None for d in dims)
    check(nested, outer, outer_dims)


def test_every_primitive_has_a_rule():
    """A primitive added to the table must come with a batching rule or the FALLBACK marker."""
    missing = [s.name for s in spec.BY_OP if s.kind != "sink" and s.batch is None]
    assert missing == [], f"primitives without a batching rule: {missing}"
    for s in spec.BY_OP:
        if s.kind != "sink":
            assert callable(s.batch) or s.batch is _rules.FALLBACK


def test_fallback_warns_and_loops():
    """label smoothing has no rule: the loop over the batch gives torch's values, with its warning."""
    def f(T):
        return lambda x, t: T.nn.functional.cross_entropy(x, t, label_smoothing=0.1)
    with pytest.warns(UserWarning, match="There is a performance drop because we have not yet implemented the "
                                         "batching rule for cross_entropy"):
        check(f, [(B, 4, 3), ("idx", (B, 4), 3)], 0)


def test_batched_mask_raises_as_torch():
    """A boolean mask batched over the level: the result's shape depends on the values, so
    torch refuses it (even where every sample selects as many), and so do we."""
    for T in (jitgrad, torch):
        with pytest.raises(RuntimeError, match="vmap: We do not support batching operators that can support dynamic "
                                               "shape. Attempting to batch over indexing with a boolean mask."):
            T.func.vmap(lambda a, m: a[m].sum())(T.ones(3, 4), T.tensor([[True, False, True, True]] * 3))


def test_module_inside_vmap():
    """nn modules call F.<name> and nn.conv's names: they run on BatchedTensors."""
    def run(T):
        T.manual_seed(0)
        rng = np.random.default_rng(0)
        conv = T.nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect").double()
        lin = T.nn.Linear(3 * 2 * 2, 4).double()
        ln = T.nn.LayerNorm(4).double()
        with T.no_grad():
            for p, v in zip(list(conv.parameters()) + list(lin.parameters()),
                            [rng.uniform(-1, 1, size=tuple(p.shape)) for p in list(conv.parameters()) +
                             list(lin.parameters())]):
                p.copy_(T.tensor(v, dtype=T.float64))
        net = T.nn.Sequential(conv, T.nn.ReLU(), T.nn.MaxPool2d(2), T.nn.Flatten(0), lin, ln, T.nn.Tanh())
        x = T.tensor(rng.uniform(-1, 1, size=(B, 2, 4, 4)), dtype=T.float64, requires_grad=True)
        out = T.func.vmap(net)(x)
        g = T.autograd.grad(out.sum(), [x, conv.weight, lin.weight])
        return out.detach(), g
    jo, jg = run(jitgrad)
    to, tg = run(torch)
    assert_close(jo, to)
    for a, b in zip(jg, tg):
        assert_close(a, b)


def test_embedding_batched_weight_padding_idx_is_per_sample():
    """A weight per sample with padding_idx: each sample's padding row gets no gradient, as
    embedding on that sample alone (torch's vmap differs here: its rule lets it through)."""
    rng = np.random.default_rng(0)
    w = jitgrad.tensor(rng.uniform(-1, 1, size=(B, 5, 4)), requires_grad=True)
    idx = jitgrad.tensor(rng.integers(0, 5, size=(B, 6)))
    idx[:, 0] = 0
    out = jitgrad.func.vmap(lambda i, v: jitgrad.nn.functional.embedding(i, v, padding_idx=0))(idx, w)
    (gw,) = jitgrad.autograd.grad((out * out).sum(), [w])
    for b in range(B):
        wb = jitgrad.tensor(w.detach().numpy()[b], requires_grad=True)
        ob = jitgrad.nn.functional.embedding(idx[b], wb, padding_idx=0)
        assert_close(out[b], ob)
        (gb,) = jitgrad.autograd.grad((ob * ob).sum(), [wb])
        assert_close(gw[b], gb)
        assert float(gw[b, 0].abs().sum()) == 0.0
