"""Tensor-level gradient rules of the structural primitives.

The Python engine runs these when `create_graph=True` (so the backward is itself
recorded) and for graphs the compiled path does not take. Each has a compiled twin in
kernels/structural.py; tests/ops/test_kernels_vs_rules.py holds the two together.
Signature: rule(grad, ri) -> one gradient (or None) per input, at the input's shape,
where `ri` (graph/rowinfo.py) reads the node's shapes, parameters and saved values
back from its tape row.
"""
import numpy as np

from jitgrad._core import dtype as _dtype, modes as _grad_mode
from jitgrad.ops import functional as F


def sum_rule(grad, ri):
    (scale,) = ri.floats(1)
    g = F.expand(F.reshape(grad, ri.ints()), ri.in_shape(0))
    return (g * scale if scale != 1.0 else g,)


def _dims_of(in_shape, kd):
    return tuple(i for i, (a, b) in enumerate(zip(in_shape, kd)) if b == 1)


def extremum_rule(grad, ri):
    kd = ri.ints()
    self = ri.saved_input(0, 0)
    r = F._wrap(ri.saved(1, ri.out_shape())).reshape(kd)
    mask = F.to_dtype(F.eq(self, r), self.dtype)
    count = F.sum(mask, _dims_of(ri.in_shape(0), kd), keepdim=True)
    return (F.reshape(grad, kd) * mask / count,)


def evenly_rule(grad, ri):
    """max()/min(): torch's evenly_distribute_backward, grad / count where self equals the
    result (where self is NaN when the result is NaN), exactly 0 elsewhere."""
    self = ri.saved_input(0, 0)
    x = np.asarray(self._data)
    r = np.asarray(ri.saved(1, ri.out_shape()))
    mask = np.isnan(x) if np.isnan(r).all() else x == r
    g = F.reshape(grad, ()) / float(mask.sum())
    return (F.where(F._wrap(mask), g, 0.0),)


def scatter_rule(grad, ri):
    idx = ri.saved(0, None)
    return (F.index_put_flat(grad, idx, ri.in_shape(0)),)


def gather_rule(grad, ri):
    idx = ri.saved(0, None)
    return (F.index_flat(grad, idx, ri.in_shape(0), F.D.INDEX),)


def prod_all_rule(grad, ri):
    """torch's prod_backward without a dim: with more than one zero and grad mode off, zeros."""
    zeros = int((np.asarray(ri.saved_input(0, 0)._data) == 0).sum())
    if zeros > 1 and not _grad_mode.is_grad_enabled():
        return (F.zeros_like(F._wrap(np.empty(ri.in_shape(0), grad._data.dtype))),)
    return prod_rule(grad, ri)


def prod_rule(grad, ri):
    kd = ri.ints()
    self = ri.saved_input(0, 0)
    g = F.reshape(grad, kd)
    x = np.asarray(self._data)
    if not (x == 0).any():
        return (g * (F.reshape(ri.result(1), kd) / self),)
    # With zeros, result/self is undefined: use the product of the other elements,
    # computed without a graph (its second derivative is not tracked here).
    return (g * F._wrap(_prod_others(x, _dims_of(x.shape, kd))),)


def _prod_others(x, dims):
    moved = np.moveaxis(x, dims, tuple(range(len(dims))))
    lead = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
    flat = moved.reshape(lead, -1)
    res = np.empty_like(flat)
    for i in range(lead):
        mask = np.ones(lead, bool)
        mask[i] = False
        res[i] = flat[mask].prod(axis=0)
    return np.moveaxis(res.reshape(moved.shape), tuple(range(len(dims))), dims)


def matmul_rule(grad, ri):
    a = ri.saved_input(0, 0)
    b = ri.saved_input(1, 1)
    a2 = F.unsqueeze(a, 0) if a.ndim == 1 else a
    b2 = F.unsqueeze(b, 1) if b.ndim == 1 else b
    out_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1])
    g = F.reshape(grad, out_shape)
    ga = F.sum_to(F.matmul(g, F.transpose(b2, -1, -2)), a2.shape)
    gb = F.sum_to(F.matmul(F.transpose(a2, -1, -2), g), b2.shape)
    return (F.reshape(ga, a.shape), F.reshape(gb, b.shape))


def addmm_rule(grad, ri):
    """beta * input + alpha * A @ B: input gets beta * grad summed to its shape, A gets
    alpha * grad @ B^T, B gets alpha * A^T @ grad (no input when the row has two inputs)."""
    n, k, m, ta, tb = ri.ints()
    beta, alpha = ri.floats(2)
    nin = ri.n_inputs()
    a = _mat_operand(ri, 0, nin - 2, (n, k), ta)
    b = _mat_operand(ri, 1, nin - 1, (k, m), tb)
    g = grad * alpha if alpha != 1.0 else grad
    ga = F.matmul(g, F.transpose(b, 0, 1))
    gb = F.matmul(F.transpose(a, 0, 1), g)
    if nin == 2:
        return (ga, gb)
    gi = F.sum_to(grad, ri.in_shape(0))
    return (gi * beta if beta != 1.0 else gi, ga, gb)


def _mat_operand(ri, k, j, shape, transposed):
    """Saved operand k (input j) of an addmm row; a transposed one was saved as its base."""
    if not transposed or ri.tape.packed.get(ri.row) is not None:
        return ri.saved_input(k, j)
    return ri.input(j, np.asarray(ri.saved(k, shape[::-1])).reshape(shape[::-1]).T)


def trace_rule(grad, ri):
    rows, cols = ri.in_shape(0)
    return (grad * F._wrap(np.eye(rows, cols, dtype=grad._data.dtype)),)


def permute_rule(grad, ri):
    return (F.permute(grad, tuple(int(i) for i in np.argsort(ri.ints()))),)


def view_rule(grad, ri):
    return (F.reshape(grad, ri.in_shape(0)),)


def expand_rule(grad, ri):
    return (F.sum_to(grad, ri.in_shape(0)),)


def cat_rule(grad, ri):
    outer, total, inner, dim, *sizes = ri.ints()
    stacked = ri.op() == F.D.STACK.op
    out = []
    off = 0
    for n in sizes:
        idx = [slice(None)] * grad.ndim
        idx[dim] = off if stacked else slice(off, off + n)
        out.append(grad[tuple(idx)])
        off += n
    return tuple(out)


def softmax_rule(grad, ri):
    dim = ri.ints()[3]
    y = ri.result(0)
    return (y * (grad - F.sum(grad * y, dim, keepdim=True)),)


def log_softmax_rule(grad, ri):
    dim = ri.ints()[3]
    y = ri.result(0)
    return (grad - F.exp(y) * F.sum(grad, dim, keepdim=True),)


def layer_norm_rule(grad, ri):
    """dx = rstd * (gy - mean(gy) - y * mean(gy * y)) per group of k with gy = grad * weight,
    dw = sum of grad * y, db = sum of grad; y and rstd are rebuilt from the saved input
    with Tensor ops, so that under create_graph the second derivative sees how they depend
    on x (the compiled kernel reads the saved values)."""
    k, has_w, has_b = ri.ints()
    (eps,) = ri.floats(1)
    shape = ri.in_shape(0)
    rows = int(np.prod(shape, dtype=np.int64)) // k
    x = F.reshape(ri.saved_input(0, 0), (rows, k))
    c = x - F.mean(x, 1, keepdim=True)
    rstd = F.reciprocal(F.sqrt(F.mean(c * c, 1, keepdim=True) + eps))
    y = c * rstd
    g = F.reshape(grad, (rows, k))
    gy = g * F.reshape(ri.saved_input(3, 1), (k,)) if has_w else g
    dx = (gy - F.mean(gy, 1, keepdim=True) - y * F.mean(gy * y, 1, keepdim=True)) * rstd
    dw = F.reshape(F.sum(g * y, 0), ri.in_shape(1)) if has_w else None
    db = F.reshape(F.sum(g, 0), ri.in_shape(2)) if has_b else None
    return (F.reshape(dx, shape), dw, db)


def conv_rule(grad, ri):
    """ConvolutionBackward0 from Tensor ops, so that create_graph records a differentiable
    backward: im2col is a gather (an IndexBackward0 node) from the flattened input with
    one zero appended, which every padding position reads; the rest is matmuls."""
    geom = ri.ints()
    n, c, h, w, cout, cg, kh, kw, _, _, _, _, _, _, groups, ho, wo = geom
    x = ri.saved_input(0, 0)
    wt = ri.saved_input(1, 1)
    idx = conv_gather_index(geom)                                  # (G, K, N*L)
    xz = F.cat([F.reshape(x, (-1,)), F._wrap(np.zeros(1, x._data.dtype))], 0)
    cols = F.index_flat(xz, idx.reshape(-1), idx.shape, F.D.INDEX)
    m = cout // groups
    # grad (N, Cout, Ho, Wo) -> (G, M, N*L), the columns' layout
    gmat = F.reshape(F.permute(F.reshape(grad, (n, groups, m, ho * wo)), (1, 2, 0, 3)), (groups, m, n * ho * wo))
    wmat = F.reshape(wt, (groups, m, cg * kh * kw))
    gw = F.reshape(F.matmul(gmat, F.transpose(cols, -1, -2)), tuple(wt.shape))
    gcols = F.matmul(F.transpose(wmat, -1, -2), gmat)
    gxz = F.index_put_flat(F.reshape(gcols, (-1,)), idx.reshape(-1), (n * c * h * w + 1,))
    gx = F.reshape(F.getitem(gxz, slice(0, n * c * h * w)), (n, c, h, w))
    gb = F.sum(grad, (0, 2, 3)) if ri.n_inputs() == 3 else None
    return (gx, gw) if gb is None else (gx, gw, gb)


def conv_gather_index(geom):
    """For each column entry (group, (c, i, j), (sample, oh, ow)), the flat input index it
    reads, or N*C*H*W (the appended zero) where it falls in the padding."""
    n, c, h, w, _, cg, kh, kw, sh, sw, pt, pl, dh, dw, groups, ho, wo = (int(v) for v in geom)
    grp, ch, i, j, s, oh, ow = np.ix_(*(np.arange(d) for d in (groups, cg, kh, kw, n, ho, wo)))
    ih = oh * sh - pt + i * dh
    iw = ow * sw - pl + j * dw
    flat = ((s * c + grp * cg + ch) * h + ih) * w + iw
    inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)
    return np.where(inside, flat, n * c * h * w).reshape(groups, cg * kh * kw, n * ho * wo)


def embedding_rule(grad, ri):
    """d weight[idx[j]] += coef[j] * grad[j] (coef: 0 on padding_idx, 1/count of the index
    with scale_grad_by_freq, else 1), as a scatter-add Tensor op.
    As in torch, the counts are not part of the derivative of this backward (torch's
    embedding_dense_double_backward masks the padding row only), so they are applied as
    a constant offset rather than as a recorded multiply."""
    (dim,) = ri.ints()
    idx = np.asarray(ri.saved(0, None)).reshape(-1)
    n = idx.size
    coef = np.asarray(ri.saved(1, (n,))).reshape(n)
    used = coef != 0
    mask = F._wrap(used.astype(coef.dtype).reshape(n, 1))
    g = F.reshape(F.reshape(grad, (n, dim)) * mask, (-1,))
    flat = (idx[:, None] * dim + np.arange(dim, dtype=np.int64)).reshape(-1)
    gw = F.index_put_flat(g, flat, ri.in_shape(0))
    if np.all(coef[used] == 1):
        return (gw,)
    scale = np.ones((ri.in_shape(0)[0], 1), coef.dtype)
    scale[idx[used], 0] = coef[used]  # 1/count of each row used
    return (gw + F._wrap(gw._data * scale - gw._data),)


def nll_rule(grad, ri):
    """d input[n, target[n]] = -grad * weight[n] (grad is one value unless reduction='none';
    the saved weight already holds the class weight, the ignore mask and the 1/total)."""
    ncls, per_row = ri.ints()
    shape = ri.in_shape(0)
    n = shape[0]
    target = np.asarray(ri.saved(0, None)).reshape(n)
    coef = F._wrap(np.asarray(ri.saved(1, (n,))).reshape(n))
    g = grad if per_row else F.expand(F.reshape(grad, (1,)), (n,))
    return (F.index_put_flat(-(g * coef), np.arange(n, dtype=np.int64) * ncls + target, shape),)


def to_copy_rule(grad, ri):
    (num,) = ri.ints()
    return (F.to_dtype(grad, _dtype.from_numpy_dtype(_np_from_num(num))),)


def _np_from_num(num):
    for d in (np.float64, np.float32, np.int64, np.int32, np.bool_):
        if np.dtype(d).num == num:
            return np.dtype(d)
    raise ValueError(num)
