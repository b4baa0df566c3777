"""Kernels of the matrix products (matmul, mm, mv, dot, bmm, addmm, linear) and trace;
the products go to BLAS (kernels/blas.py), forward and backward alike.
The backward kernels (k_*) take the scheduler's standard arguments (kernels/common.py);
the forward kernels (f_*) jitgrad.compile's replay runs take an instruction of a plan
(kernels/forward.py)."""
import numpy as np

from jitgrad._core.layout import E_SHP, E_TGT, EW, H_E0, H_FP, H_IP, H_KP, H_NIN, H_NUMEL, H_SHP, HAS, HW
from jitgrad.kernels.blas import gemm
from jitgrad.kernels.common import (
    bcast_plan,
    bidx,
    dot_into,
    edge_target,
    gradient,
    jit,
    one_input,
    saved,
    shape_numel,
    target_buffer,
)
from jitgrad.kernels.forward import arg, fpp, ip, made, nin, res, shp, val


@jit
def _mat_dims(xs, p, is_left):
    """(batch numel, rows, cols) of a matmul operand, 1-D promoted the way matmul does."""
    nd = xs[p]
    if nd == 1:
        k = xs[p + 1]
        return (1, 1, k) if is_left else (1, k, 1)
    r = xs[p + nd - 1]
    c = xs[p + nd]
    return shape_numel(xs, p) // (r * c), r, c


@jit
def k_matmul(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    b = row * HW
    g = gradient(row, hdr, g1, gaddr, gown)
    e0 = hdr[b + H_E0]
    # fresh: nothing has contributed to the target yet (read before edge_target marks it)
    fresh_a = edges[EW * e0 + E_TGT] >= 0 and not (st[edges[EW * e0 + E_TGT]] & HAS)
    fresh_b = edges[EW * (e0 + 1) + E_TGT] >= 0 and not (st[edges[EW * (e0 + 1) + E_TGT]] & HAS)
    ta = edge_target(edges, e0, st)
    tb = edge_target(edges, e0 + 1, st)
    pa = edges[EW * e0 + E_SHP]
    pb = edges[EW * (e0 + 1) + E_SHP]
    kp = hdr[b + H_KP]
    a = saved(slots, v, kp)
    bm = saved(slots, v, kp + 1)
    ba, n, k = _mat_dims(xs, pa, True)
    bb, k2, m = _mat_dims(xs, pb, False)
    bo = hdr[b + H_NUMEL] // (n * m) if n * m else 0
    mapa, mapb = _batch_maps(xs, pa, pb, bo)
    if bo == 1 and a.size > 1 and bm.size > 1:
        # dA (n x k) = G @ B^T, dB (k x m) = A^T @ G
        g2 = g.reshape((n, m))
        if ta >= 0:
            dot_into(ta, fresh_a, g2, False, bm.reshape((k, m)), True, n, k, g1, gaddr, gown)
        if tb >= 0:
            dot_into(tb, fresh_b and ta != tb, a.reshape((n, k)), True, g2, False, k, m, g1, gaddr, gown)
        return
    # batched, broadcast batch dims, or a 1-D operand: accumulate batch by batch
    if ta >= 0:
        da = target_buffer(ta, a.size, g1, gaddr, gown)
        for i in range(bo):
            gemm(g[i * n * m:(i + 1) * n * m].reshape((n, m)), False,
                 bm[mapb[i] * k * m:(mapb[i] + 1) * k * m].reshape((k, m)), True,
                 da[mapa[i] * n * k:(mapa[i] + 1) * n * k].reshape((n, k)), 1.0)
    if tb >= 0:
        db = target_buffer(tb, bm.size, g1, gaddr, gown)
        for i in range(bo):
            gemm(a[mapa[i] * n * k:(mapa[i] + 1) * n * k].reshape((n, k)), True,
                 g[i * n * m:(i + 1) * n * m].reshape((n, m)), False,
                 db[mapb[i] * k * m:(mapb[i] + 1) * k * m].reshape((k, m)), 1.0)


@jit
def k_addmm(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """addmm (and linear without bias, which has no first input): out = beta * input +
    alpha * (A @ B), A (n x k), B (k x m). An operand that is the transpose of a contiguous
    array (x @ W.t()) is saved as that array, flagged ta / tb, so the forward copies nothing;
    the gemm then reads it with the transposition flipped."""
    b = row * HW
    g = gradient(row, hdr, g1, gaddr, gown)
    e0 = hdr[b + H_E0]
    nin = hdr[b + H_NIN]
    ip = hdr[b + H_IP]
    n, k, m, ta, tb = xs[ip + 1], xs[ip + 2], xs[ip + 3], xs[ip + 4], xs[ip + 5]
    beta, alpha = fp[hdr[b + H_FP]], fp[hdr[b + H_FP] + 1]
    if nin == 3:
        ti = edge_target(edges, e0, st)
        if ti >= 0:  # beta * grad, summed back to the input's (broadcast) shape
            pin = edges[EW * e0 + E_SHP]
            d = target_buffer(ti, shape_numel(xs, pin), g1, gaddr, gown)
            mode, mm, mp = bcast_plan(xs, hdr[b + H_SHP], pin)
            for i in range(n * m):
                d[bidx(mode, mm, mp, i)] += beta * g[i]
    ea = e0 + nin - 2
    fresh_a = edges[EW * ea + E_TGT] >= 0 and not (st[edges[EW * ea + E_TGT]] & HAS)
    fresh_b = edges[EW * (ea + 1) + E_TGT] >= 0 and not (st[edges[EW * (ea + 1) + E_TGT]] & HAS)
    t_a = edge_target(edges, ea, st)
    t_b = edge_target(edges, ea + 1, st)
    kp = hdr[b + H_KP]
    g2 = (g if alpha == 1.0 else (g * alpha).astype(g.dtype)).reshape((n, m))
    if t_a >= 0:  # dA = G @ B^T
        bm = saved(slots, v, kp + 1)
        if tb:
            dot_into(t_a, fresh_a, g2, False, bm.reshape((m, k)), False, n, k, g1, gaddr, gown)
        else:
            dot_into(t_a, fresh_a, g2, False, bm.reshape((k, m)), True, n, k, g1, gaddr, gown)
    if t_b >= 0:  # dB = A^T @ G
        a = saved(slots, v, kp)
        fresh = fresh_b and t_a != t_b
        if ta:
            dot_into(t_b, fresh, a.reshape((k, n)), False, g2, False, k, m, g1, gaddr, gown)
        else:
            dot_into(t_b, fresh, a.reshape((n, k)), True, g2, False, k, m, g1, gaddr, gown)


@jit
def _batch_maps(xs, pa, pb, bo):
    """For each output batch index, the batch index of each operand (broadcast batch dims)."""
    na = max(xs[pa] - 2, 0)
    nb = max(xs[pb] - 2, 0)
    nd = max(na, nb)
    sa = np.ones(nd, np.int64)
    sb = np.ones(nd, np.int64)
    for i in range(na):
        sa[nd - na + i] = xs[pa + 1 + i]
    for i in range(nb):
        sb[nd - nb + i] = xs[pb + 1 + i]
    so = np.maximum(sa, sb)
    mapa = np.zeros(bo, np.int64)
    mapb = np.zeros(bo, np.int64)
    for i in range(bo):
        rem = i
        ia = 0
        ib = 0
        stra = 1
        strb = 1
        for dpos in range(nd - 1, -1, -1):
            c = rem % so[dpos]
            rem //= so[dpos]
            if sa[dpos] != 1:
                ia += c * stra
            if sb[dpos] != 1:
                ib += c * strb
            stra *= sa[dpos]
            strb *= sb[dpos]
        mapa[i] = ia
        mapb[i] = ib
    return mapa, mapb


@jit
def k_trace(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    rows, cols = xs[pin + 1], xs[pin + 2]
    for i in range(min(rows, cols)):
        d[i * cols + i] += g[0]


# --- forward kernels --------------------------------------------------------------------------
@jit
def f_matmul(i, prog, fin, vals, xs, fp, like):
    """matmul (mm, dot, mv, bmm and broadcast batches): one gemm per output batch."""
    va = arg(prog, fin, i, 0)
    vb = arg(prog, fin, i, 1)
    a = val(vals, va, like)
    bm = val(vals, vb, like)
    out = val(vals, res(prog, fin, i, 0), like)
    pa = shp(vals, va)
    pb = shp(vals, vb)
    _, n, k = _mat_dims(xs, pa, True)
    _, _, m = _mat_dims(xs, pb, False)
    if n * m == 0:
        return
    bo = out.size // (n * m)
    if bo == 1:
        gemm(a.reshape((n, k)), False, bm.reshape((k, m)), False, out.reshape((n, m)), 0.0)
        return
    mapa, mapb = _batch_maps(xs, pa, pb, bo)
    for j in range(bo):
        gemm(a[mapa[j] * n * k:(mapa[j] + 1) * n * k].reshape((n, k)), False,
             bm[mapb[j] * k * m:(mapb[j] + 1) * k * m].reshape((k, m)), False,
             out[j * n * m:(j + 1) * n * m].reshape((n, m)), 0.0)


@jit
def f_addmm(i, prog, fin, vals, xs, fp, like):
    """addmm / linear: out = alpha * (A @ B), plus beta * input (broadcast) when there is
    one, in eager's order. An operand flagged transposed (ta / tb) is saved as the
    contiguous base of its transpose, which the backward reads: when that is the input
    itself (linear's weight), the gemm reads it transposed; otherwise the kernel makes it."""
    p = ip(prog, i)
    n, k, m, ta, tb = xs[p + 1], xs[p + 2], xs[p + 3], xs[p + 4], xs[p + 5]
    q = fpp(prog, i)
    beta, alpha = fp[q], fp[q + 1]
    nins = nin(prog, i)
    a = val(vals, arg(prog, fin, i, nins - 2), like)
    bm = val(vals, arg(prog, fin, i, nins - 1), like)
    a_base = ta and not made(prog, i, 0)
    b_base = tb and not made(prog, i, 1)
    o = res(prog, fin, i, 0)
    out = val(vals, o, like)
    gemm(a.reshape((k, n)) if a_base else a.reshape((n, k)), a_base,
         bm.reshape((m, k)) if b_base else bm.reshape((k, m)), b_base, out.reshape((n, m)), 0.0)
    if alpha != 1.0:
        for j in range(out.size):
            out[j] *= alpha
    if nins == 3 and beta != 0.0:
        x = arg(prog, fin, i, 0)
        xv = val(vals, x, like)
        mode, mm, mp = bcast_plan(xs, shp(vals, o), shp(vals, x))
        if mode == 2 and beta == 1.0:  # a bias row (linear): a plain inner loop, which vectorises
            for r in range(out.size // mm):
                for c in range(mm):
                    out[r * mm + c] += xv[c]
        else:
            for j in range(out.size):
                out[j] += xv[bidx(mode, mm, mp, j)] * beta if beta != 1.0 else xv[bidx(mode, mm, mp, j)]
    if ta and not a_base:
        val(vals, res(prog, fin, i, 1), like).reshape((k, n))[:] = a.reshape((n, k)).T
    if tb and not b_base:
        val(vals, res(prog, fin, i, 2), like).reshape((m, k))[:] = bm.reshape((k, m)).T


@jit
def f_trace(i, prog, fin, vals, xs, fp, like):
    x = arg(prog, fin, i, 0)
    xv = val(vals, x, like)
    out = val(vals, res(prog, fin, i, 0), like)
    p = shp(vals, x)
    cols = xs[p + 2]
    out[0] = 0.0
    for j in range(min(xs[p + 1], cols)):
        out[0] += xv[j * cols + j]
