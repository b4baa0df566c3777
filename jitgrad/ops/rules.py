"""Tensor-level gradient rules of the structural primitives.

The Python engine runs these when `create_graph=True` (so the backward is itself
recorded) and for graphs the compiled path does not take. Each has a compiled twin in
kernels/structural.py; tests/test_kernels_vs_rules.py holds the two together.
Signature: rule(node, grad, saved) -> one gradient (or None) per input, at the input's
shape. `saved` is what the forward function stored for this node.
"""
import numpy as np

from . import functional as F


def sum_rule(node, grad, saved):
    in_shape, kd_shape, scale = saved
    g = F.expand(F.reshape(grad, kd_shape), in_shape)
    return (g * scale if scale != 1.0 else g,)


def extremum_rule(node, grad, saved):
    self, result, kd_shape, dims = saved
    r = F.reshape(F._wrap(result), kd_shape)
    mask = F.to_dtype(F.eq(self, r), self.dtype)
    count = F.sum(mask, dims, keepdim=True)
    return (F.reshape(grad, kd_shape) * mask / count,)


def scatter_rule(node, grad, saved):
    idx, in_shape = saved
    return (F.index_put_flat(grad, idx, in_shape),)


def gather_rule(node, grad, saved):
    idx, out_shape = saved
    return (F.index_flat(grad, idx, out_shape, F.D.INDEX),)


def prod_rule(node, grad, saved):
    self, result, kd_shape, dims = saved
    g = F.reshape(grad, kd_shape)
    x = self._data
    if not (x == 0).any():
        return (g * F.reshape(F._wrap(result), kd_shape) / self,)
    # With zeros, result/self is undefined: use the product of the other elements,
    # computed without a graph (its second derivative is not tracked here).
    others = _prod_others(x, dims)
    return (g * F._wrap(others),)


def _prod_others(x, dims):
    out = np.empty_like(x)
    moved = np.moveaxis(x, dims, tuple(range(len(dims))))
    flat = moved.reshape(-1, *moved.shape[len(dims):])
    res = np.empty_like(flat)
    for i in range(flat.shape[0]):
        mask = np.ones(flat.shape[0], bool)
        mask[i] = False
        res[i] = flat[mask].prod(axis=0)
    out_moved = res.reshape(moved.shape)
    return np.moveaxis(out_moved, tuple(range(len(dims))), dims).reshape(x.shape)


def matmul_rule(node, grad, saved):
    a, b = saved
    a2 = F.unsqueeze(a, 0) if a.ndim == 1 else a
    b2 = F.unsqueeze(b, 1) if b.ndim == 1 else b
    out_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1])
    g = F.reshape(grad, out_shape)
    ga = F.sum_to(F.matmul(g, F.transpose(b2, -1, -2)), a2.shape)
    gb = F.sum_to(F.matmul(F.transpose(a2, -1, -2), g), b2.shape)
    return (F.reshape(ga, a.shape), F.reshape(gb, b.shape))


def trace_rule(node, grad, saved):
    (shape,) = saved
    eye = F._wrap(np.eye(shape[0], shape[1], dtype=grad._data.dtype))
    return (grad * eye,)


def permute_rule(node, grad, saved):
    (perm,) = saved
    return (F.permute(grad, tuple(int(i) for i in np.argsort(perm))),)


def view_rule(node, grad, saved):
    (in_shape,) = saved
    return (F.reshape(grad, in_shape),)


def expand_rule(node, grad, saved):
    (in_shape,) = saved
    return (F.sum_to(grad, in_shape),)


def cat_rule(node, grad, saved):
    dim, sizes, stacked = saved
    out = []
    off = 0
    for n in sizes:
        idx = [slice(None)] * grad.ndim
        idx[dim] = off if stacked else slice(off, off + n)
        out.append(grad[tuple(idx)])
        off += n
    return tuple(out)


def softmax_rule(node, grad, saved):
    result, dim = saved
    y = F._result(result, node)
    return (y * (grad - F.sum(grad * y, dim, keepdim=True)),)


def log_softmax_rule(node, grad, saved):
    result, dim = saved
    y = F._result(result, node)
    return (grad - F.exp(y) * F.sum(grad, dim, keepdim=True),)


def to_copy_rule(node, grad, saved):
    (dtype,) = saved
    return (F.to_dtype(grad, dtype),)
