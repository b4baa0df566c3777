"""Kernels of the reductions: sum / mean, amax / amin / max / min, prod.
The backward kernels (k_*) take the scheduler's standard arguments (kernels/common.py);
the forward kernels (f_*) jitgrad.compile's replay runs take an instruction of a plan
(kernels/forward.py)."""
import numpy as np

from jitgrad._core.layout import H_FP, H_IP, H_KP
from jitgrad.kernels.common import bcast_plan, bidx, jit, one_input, saved
from jitgrad.kernels.forward import arg, fpp, ip, made, res, shp, val, val_i64


@jit
def k_sum(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """sum / mean: broadcast the gradient back over the reduced dims (mean scales by fp)."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    n = d.size
    scale = fp[hdr[b + H_FP]]
    mode, m, mp = bcast_plan(xs, pin, hdr[b + H_IP])
    for i in range(n):
        d[i] += g[bidx(mode, m, mp, i)] * scale


@jit
def k_amax(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, evenly):
    """amax/amin: torch's (grad / count) * mask with mask = (x == result), so a group whose
    result is NaN (nothing equals it) gets NaN everywhere, as does a masked-out element
    under an infinite grad. max()/min() (evenly): torch's evenly_distribute_backward,
    grad / count on the mask, exactly 0 elsewhere, and the mask of a NaN result is isnan(x)."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    n = d.size
    kp = hdr[b + H_KP]
    x = saved(slots, v, kp)
    r = saved(slots, v, kp + 1)
    mode, m, mp = bcast_plan(xs, pin, hdr[b + H_IP])
    cnt = np.zeros(r.size, np.float64)
    for i in range(n):
        s = bidx(mode, m, mp, i)
        if x[i] == r[s] or (evenly and np.isnan(x[i]) and np.isnan(r[s])):
            cnt[s] += 1.0
    q = np.empty(r.size, np.float64)
    for s in range(r.size):
        q[s] = g[s] / cnt[s] if cnt[s] > 0.0 else np.nan  # torch: (grad / 0) * 0
    for i in range(n):
        s = bidx(mode, m, mp, i)
        if x[i] == r[s] or (evenly and np.isnan(x[i]) and np.isnan(r[s])):
            d[i] += q[s]
        elif not evenly:
            d[i] += q[s] * 0.0


@jit
def k_prod(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, full):
    """torch's prod_backward: grad * (result / x) when x has no zero anywhere; else, per
    slice, grad * (product of the elements before) * (product of those after), so NaN and
    inf among the others propagate as torch's (prod_safe_zeros_backward). The full
    reduction with more than one zero is zero (torch's no-grad shortcut)."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    n = d.size
    kp = hdr[b + H_KP]
    x = saved(slots, v, kp)
    r = saved(slots, v, kp + 1)
    mode, m, mp = bcast_plan(xs, pin, hdr[b + H_IP])
    zeros = 0
    for i in range(n):
        if x[i] == 0:
            zeros += 1
    if zeros == 0:
        for i in range(n):
            s = bidx(mode, m, mp, i)
            d[i] += g[s] * (r[s] / x[i])
        return
    if full and zeros > 1:
        return
    before = np.empty(n, np.float64)
    run = np.ones(r.size, np.float64)
    for i in range(n):
        s = bidx(mode, m, mp, i)
        before[i] = run[s]
        run[s] *= x[i]
    run[:] = 1.0
    for i in range(n - 1, -1, -1):
        s = bidx(mode, m, mp, i)
        d[i] += g[s] * (before[i] * run[s])
        run[s] *= x[i]


# the kernels with a flag, one entry point per primitive: the scheduler calls every node
# kernel with the same arguments
@jit
def k_amax_dims(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    k_amax(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, False)


@jit
def k_max_all(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    k_amax(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, True)   # torch's evenly-distributed rule


@jit
def k_prod_dims(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    k_prod(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, False)


@jit
def k_prod_all(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    k_prod(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, True)


# --- forward kernels --------------------------------------------------------------------------
# A reduction's int params are the input's shape with the reduced dims kept as 1: the
# broadcast plan from the input to that shape maps each input element to its output one.
@jit
def f_sum(i, prog, fin, vals, xs, fp, like):
    """sum / mean (all, or over dims): the result at the keepdim shape (the int params),
    times the scale (fp: 1 for sum, 1 / count for mean)."""
    x = arg(prog, fin, i, 0)
    xv = val(vals, x, like)
    out = val(vals, res(prog, fin, i, 0), like)
    scale = fp[fpp(prog, i)]
    mode, m, mp = bcast_plan(xs, shp(vals, x), ip(prog, i))
    out[:] = 0.0
    if mode == 1:
        acc = 0.0
        for j in range(xv.size):
            acc += xv[j]
        out[0] = acc * scale
        return
    for j in range(xv.size):
        out[bidx(mode, m, mp, j)] += xv[j]
    for j in range(out.size):
        out[j] *= scale


@jit
def _extreme(i, prog, fin, vals, xs, like, is_max):
    """amax / amin / max() / min(): a NaN wins, as in numpy and torch."""
    x = arg(prog, fin, i, 0)
    xv = val(vals, x, like)
    out = val(vals, res(prog, fin, i, 0), like)
    mode, m, mp = bcast_plan(xs, shp(vals, x), ip(prog, i))
    out[:] = -np.inf if is_max else np.inf
    for j in range(xv.size):
        s = bidx(mode, m, mp, j)
        v = xv[j]
        if (v > out[s] if is_max else v < out[s]) or np.isnan(v):
            out[s] = v


@jit
def f_amax(i, prog, fin, vals, xs, fp, like):
    _extreme(i, prog, fin, vals, xs, like, True)


@jit
def f_amin(i, prog, fin, vals, xs, fp, like):
    _extreme(i, prog, fin, vals, xs, like, False)


@jit
def f_prod(i, prog, fin, vals, xs, fp, like):
    x = arg(prog, fin, i, 0)
    xv = val(vals, x, like)
    out = val(vals, res(prog, fin, i, 0), like)
    mode, m, mp = bcast_plan(xs, shp(vals, x), ip(prog, i))
    out[:] = 1.0
    for j in range(xv.size):
        out[bidx(mode, m, mp, j)] *= xv[j]


@jit
def _extreme_dim(i, prog, fin, vals, xs, like, is_max):
    """max / min along a dim (int params: the sizes before it, its own, after it): the
    values, the saved flat index of each (the backward scatters through it) and the
    indices along the dim (the extra output); the first extreme wins, a NaN first of all."""
    p = ip(prog, i)
    pre, n, post = xs[p + 1], xs[p + 2], xs[p + 3]
    xv = val(vals, arg(prog, fin, i, 0), like)
    out = val(vals, res(prog, fin, i, 0), like)
    flat = val_i64(vals, res(prog, fin, i, 1))
    keep_flat = made(prog, i, 0)
    idx = val_i64(vals, res(prog, fin, i, 2))
    for a in range(pre):
        for c in range(post):
            base = a * n * post + c
            best = xv[base]
            at = 0
            for j in range(1, n):
                if np.isnan(best):
                    break
                v = xv[base + j * post]
                if (v > best if is_max else v < best) or np.isnan(v):
                    best = v
                    at = j
            o = a * post + c
            out[o] = best
            idx[o] = at
            if keep_flat:
                flat[o] = base + at * post


@jit
def f_max_dim(i, prog, fin, vals, xs, fp, like):
    _extreme_dim(i, prog, fin, vals, xs, like, True)


@jit
def f_min_dim(i, prog, fin, vals, xs, fp, like):
    _extreme_dim(i, prog, fin, vals, xs, like, False)
