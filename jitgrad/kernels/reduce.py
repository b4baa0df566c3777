"""Backward kernels of the reductions: sum / mean, amax / amin / max / min, prod.
The arguments are the scheduler's standard ones (kernels/common.py)."""
import numpy as np

from jitgrad._core.layout import H_FP, H_IP, H_KP
from jitgrad.kernels.common import bcast_plan, bidx, jit, one_input, saved


@jit
def k_sum(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """sum / mean: broadcast the gradient back over the reduced dims (mean scales by fp)."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    n = d.size
    scale = fp[hdr[b + H_FP]]
    mode, m, mp = bcast_plan(xs, pin, hdr[b + H_IP])
    for i in range(n):
        d[i] += g[bidx(mode, m, mp, i)] * scale


@jit
def k_amax(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, evenly):
    """amax/amin: torch's (grad / count) * mask with mask = (x == result), so a group whose
    result is NaN (nothing equals it) gets NaN everywhere, as does a masked-out element
    under an infinite grad. max()/min() (evenly): torch's evenly_distribute_backward,
    grad / count on the mask, exactly 0 elsewhere, and the mask of a NaN result is isnan(x)."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
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
def k_prod(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, full):
    """torch's prod_backward: grad * (result / x) when x has no zero anywhere; else, per
    slice, grad * (product of the elements before) * (product of those after), so NaN and
    inf among the others propagate as torch's (prod_safe_zeros_backward). The full
    reduction with more than one zero is zero (torch's no-grad shortcut)."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
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
def k_amax_dims(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    k_amax(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, False)


@jit
def k_max_all(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    k_amax(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, True)   # torch's evenly-distributed rule


@jit
def k_prod_dims(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    k_prod(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, False)


@jit
def k_prod_all(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    k_prod(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, True)
