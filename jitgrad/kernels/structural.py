"""Hand-written @njit kernels for the structural primitives, and the helpers every
kernel shares (saved-value access, gradient buffers, broadcast index maps).

Conventions (the scheduler, engine/scheduler.py, calls every node kernel the same way):
  node kernel  k(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st)
  - row's own gradient: gradient(row, ...) (already complete: rows run in descending order)
  - a contribution to input j goes into target_buffer(...) of the edge's target row,
    which the kernel accumulates into at the *input's* shape: broadcasting is undone
    right here, through index maps, never in a rule.
  - v: inline one-element saved values in the graph's dtype; larger saved values are
    read in place through the address stored in `slots`.
Every kernel also runs as plain Python under NUMBA_DISABLE_JIT=1.
"""
import numpy as np
from numba import njit

from jitgrad.kernels.blas import gemm
from jitgrad.kernels.conv import U, col2im_add, im2col
from jitgrad.kernels.pointers import view
from jitgrad._core.layout import (E_SHP, E_TGT, EW, H_E0, H_FP, H_IP, H_KP, H_NIN, H_NUMEL,
                                  H_SHP, HAS, HW, RECV, S_NUMEL, S_REF, SW)


# error_model="numpy": float division by zero gives inf/nan as in PyTorch (no raising path)
jit = njit(cache=True, nogil=True, error_model="numpy")


# --- reading saved values by address -------------------------------------------------------
@jit
def saved(slots, v, k):
    """Saved value k as a 1-D array of the graph's dtype."""
    ref = slots[SW * k + S_REF]
    if ref < 0:
        j = -ref - 1
        return v[j:j + 1]
    return view(ref, slots[SW * k + S_NUMEL], v)


@jit
def saved_index(slots, k, like_i64):
    return view(slots[SW * k + S_REF], slots[SW * k + S_NUMEL], like_i64)


# --- gradient buffers ------------------------------------------------------------------------
@jit
def gradient(row, hdr, g1, bslot, bigs):
    """The (complete) gradient of row's output, flat."""
    if hdr[row * HW + H_NUMEL] == 1:
        return g1[row:row + 1]
    s = bslot[row]
    if s < 0:  # only reachable for an empty tensor
        return g1[0:0]
    return bigs[s]


@jit
def target_buffer(tgt, n, g1, bslot, bigs):
    """Where contributions for row `tgt`'s output accumulate (created zeroed on first use)."""
    if n == 1:
        return g1[tgt:tgt + 1]
    s = bslot[tgt]
    if s < 0:
        s = len(bigs)
        bigs.append(np.zeros(n, g1.dtype))
        bslot[tgt] = s
    return bigs[s]


@jit
def dot_into(tgt, fresh, x, tx, y, ty, rows, cols, g1, bslot, bigs):
    """Contribute op(x) @ op(y) (rows x cols) to row `tgt`'s gradient with one gemm:
    written straight into place when nothing has contributed yet (into the output array
    for a leaf, or into a new buffer), added by the BLAS call (beta = 1) otherwise."""
    s = bslot[tgt]
    if s < 0:
        bslot[tgt] = len(bigs)
        bigs.append(np.empty(rows * cols, g1.dtype))
        gemm(x, tx, y, ty, bigs[-1].reshape((rows, cols)), 0.0)
    else:
        gemm(x, tx, y, ty, bigs[s].reshape((rows, cols)), 0.0 if fresh else 1.0)


@jit
def edge_target(edges, e, st):
    """Target row of edge e, or -1 when it gets no gradient (no grad, or not needed);
    marks the target as reached, since the caller is about to contribute to it."""
    t = edges[EW * e + E_TGT]
    if t >= 0:
        if not (st[t] & RECV):
            return -1
        st[t] |= HAS
    return t


@jit
def one_input(row, hdr, edges, xs, g1, bslot, bigs, st):
    """The common start of a one-input kernel: (header base, the row's gradient, the
    input's target row or -1, the input's shape pointer, the input's buffer)."""
    b = row * HW
    g = gradient(row, hdr, g1, bslot, bigs)
    e0 = hdr[b + H_E0]
    t = edge_target(edges, e0, st)
    pin = edges[EW * e0 + E_SHP]
    d = g
    if t >= 0:
        d = target_buffer(t, shape_numel(xs, pin), g1, bslot, bigs)
    return b, g, t, pin, d


@jit
def shape_numel(xs, p):
    n = 1
    for k in range(xs[p]):
        n *= xs[p + 1 + k]
    return n


# --- broadcast index maps --------------------------------------------------------------------
# mode 0: same shape (i), 1: small is one element (0), 2: small is a suffix of big (i % m),
# 3: small keeps a prefix and is 1 after it (i // m), 4: general (map[i]).
@jit
def bcast_plan(xs, pbig, psmall):
    nb = xs[pbig]
    ns = xs[psmall]
    nbig = shape_numel(xs, pbig)
    nsmall = shape_numel(xs, psmall)
    empty = xs[0:0]  # typed like a map, allocates nothing
    if nsmall == nbig:
        return 0, 0, empty
    if nsmall == 1:
        return 1, 0, empty
    # strip leading ones of small; is what remains a suffix of big?
    lead = 0
    while lead < ns and xs[psmall + 1 + lead] == 1:
        lead += 1
    rem = ns - lead
    suffix = rem <= nb
    if suffix:
        for k in range(rem):
            if xs[psmall + 1 + ns - 1 - k] != xs[pbig + 1 + nb - 1 - k]:
                suffix = False
                break
    if suffix:
        return 2, nsmall, empty
    # prefix pattern: small == big on dims [0, c) (aligned right) and 1 after
    off = nb - ns
    c = 0
    while c < ns and xs[psmall + 1 + c] == xs[pbig + 1 + off + c]:
        c += 1
    tail_ones = True
    for k in range(c, ns):
        if xs[psmall + 1 + k] != 1:
            tail_ones = False
    if off == 0 and tail_ones:
        return 3, nbig // nsmall, empty
    # general: walk big in C order, carrying a multi-index
    sstr = np.zeros(nb, np.int64)
    acc = 1
    for k in range(ns - 1, -1, -1):
        d = xs[psmall + 1 + k]
        if d != 1:
            sstr[off + k] = acc
        acc *= d
    m = np.empty(nbig, np.int64)
    idx = np.zeros(nb, np.int64)
    cur = 0
    for i in range(nbig):
        m[i] = cur
        for k in range(nb - 1, -1, -1):
            idx[k] += 1
            cur += sstr[k]
            if idx[k] < xs[pbig + 1 + k]:
                break
            cur -= sstr[k] * idx[k]
            idx[k] = 0
    return 4, 0, m


@jit
def bidx(mode, m, mp, i):
    if mode == 0:
        return i
    if mode == 1:
        return 0
    if mode == 2:
        return i % m
    if mode == 3:
        return i // m
    return mp[i]


# --- reductions -------------------------------------------------------------------------------
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
def k_expand(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    mode, m, mp = bcast_plan(xs, hdr[b + H_SHP], pin)
    for i in range(hdr[b + H_NUMEL]):
        d[bidx(mode, m, mp, i)] += g[i]


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


@jit
def k_scatter(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """Indexing and max(dim): out[j] = x.flat[idx[j]], so x's gradient gathers back."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    idx = saved_index(slots, hdr[b + H_KP], xs[0:0])
    for j in range(idx.size):
        d[idx[j]] += g[j]


@jit
def k_index_put(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    idx = saved_index(slots, hdr[b + H_KP], xs[0:0])
    for j in range(idx.size):
        d[j] += g[idx[j]]


# --- linear algebra ------------------------------------------------------------------------------
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
def k_matmul(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    b = row * HW
    g = gradient(row, hdr, g1, bslot, bigs)
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
            dot_into(ta, fresh_a, g2, False, bm.reshape((k, m)), True, n, k, g1, bslot, bigs)
        if tb >= 0:
            dot_into(tb, fresh_b and ta != tb, a.reshape((n, k)), True, g2, False, k, m, g1, bslot, bigs)
        return
    # batched, broadcast batch dims, or a 1-D operand: accumulate batch by batch
    if ta >= 0:
        da = target_buffer(ta, a.size, g1, bslot, bigs)
        for i in range(bo):
            gemm(g[i * n * m:(i + 1) * n * m].reshape((n, m)), False,
                 bm[mapb[i] * k * m:(mapb[i] + 1) * k * m].reshape((k, m)), True,
                 da[mapa[i] * n * k:(mapa[i] + 1) * n * k].reshape((n, k)), 1.0)
    if tb >= 0:
        db = target_buffer(tb, bm.size, g1, bslot, bigs)
        for i in range(bo):
            gemm(a[mapa[i] * n * k:(mapa[i] + 1) * n * k].reshape((n, k)), True,
                 g[i * n * m:(i + 1) * n * m].reshape((n, m)), False,
                 db[mapb[i] * k * m:(mapb[i] + 1) * k * m].reshape((k, m)), 1.0)


@jit
def k_addmm(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """addmm (and linear without bias, which has no first input): out = beta * input +
    alpha * (A @ B), A (n x k), B (k x m). An operand that is the transpose of a contiguous
    array (x @ W.t()) is saved as that array, flagged ta / tb, so the forward copies nothing;
    the gemm then reads it with the transposition flipped."""
    b = row * HW
    g = gradient(row, hdr, g1, bslot, bigs)
    e0 = hdr[b + H_E0]
    nin = hdr[b + H_NIN]
    ip = hdr[b + H_IP]
    n, k, m, ta, tb = xs[ip + 1], xs[ip + 2], xs[ip + 3], xs[ip + 4], xs[ip + 5]
    beta, alpha = fp[hdr[b + H_FP]], fp[hdr[b + H_FP] + 1]
    if nin == 3:
        ti = edge_target(edges, e0, st)
        if ti >= 0:  # beta * grad, summed back to the input's (broadcast) shape
            pin = edges[EW * e0 + E_SHP]
            d = target_buffer(ti, shape_numel(xs, pin), g1, bslot, bigs)
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
            dot_into(t_a, fresh_a, g2, False, bm.reshape((m, k)), False, n, k, g1, bslot, bigs)
        else:
            dot_into(t_a, fresh_a, g2, False, bm.reshape((k, m)), True, n, k, g1, bslot, bigs)
    if t_b >= 0:  # dB = A^T @ G
        a = saved(slots, v, kp)
        fresh = fresh_b and t_a != t_b
        if ta:
            dot_into(t_b, fresh, a.reshape((k, n)), False, g2, False, k, m, g1, bslot, bigs)
        else:
            dot_into(t_b, fresh, a.reshape((n, k)), True, g2, False, k, m, g1, bslot, bigs)


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
def k_trace(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    rows, cols = xs[pin + 1], xs[pin + 2]
    for i in range(min(rows, cols)):
        d[i * cols + i] += g[0]


# --- views and joins -----------------------------------------------------------------------------
@jit
def k_view(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """reshape/view/squeeze/unsqueeze: C-order data is unchanged, only the shape differs."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    for i in range(g.size):
        d[i] += g[i]


@jit
def k_permute(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    nd = xs[pin]
    ip = hdr[b + H_IP]
    instr = np.ones(nd, np.int64)
    for k in range(nd - 2, -1, -1):
        instr[k] = instr[k + 1] * xs[pin + 2 + k]
    ostr = np.empty(nd, np.int64)   # stride in the input for each output dim
    oshape = np.empty(nd, np.int64)
    for k in range(nd):
        ostr[k] = instr[xs[ip + 1 + k]]
        oshape[k] = xs[pin + 1 + xs[ip + 1 + k]]
    idx = np.zeros(nd, np.int64)
    cur = 0
    for i in range(g.size):
        d[cur] += g[i]
        for k in range(nd - 1, -1, -1):
            idx[k] += 1
            cur += ostr[k]
            if idx[k] < oshape[k]:
                break
            cur -= ostr[k] * idx[k]
            idx[k] = 0


@jit
def k_cat(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    b = row * HW
    g = gradient(row, hdr, g1, bslot, bigs)
    e0 = hdr[b + H_E0]
    ip = hdr[b + H_IP]
    outer, total, inner = xs[ip + 1], xs[ip + 2], xs[ip + 3]
    off = 0
    for j in range(hdr[b + H_NIN]):
        sj = xs[ip + 5 + j]  # ip: outer, total, inner, dim, sizes...
        t = edge_target(edges, e0 + j, st)
        if t >= 0:
            d = target_buffer(t, outer * sj * inner, g1, bslot, bigs)
            for o in range(outer):
                src = (o * total + off) * inner
                dst = o * sj * inner
                for i in range(sj * inner):
                    d[dst + i] += g[src + i]
        off += sj


# --- normalisation ---------------------------------------------------------------------------------
@jit
def k_softmax(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, log):
    """softmax: d = y * (g - sum(g * y)); log_softmax: d = g - exp(y) * sum(g), per group."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    ip = hdr[b + H_IP]
    outer, n, inner = xs[ip + 1], xs[ip + 2], xs[ip + 3]
    y = saved(slots, v, hdr[b + H_KP])
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            s = 0.0
            for j in range(n):
                q = base + j * inner
                s += g[q] if log else g[q] * y[q]
            for j in range(n):
                q = base + j * inner
                d[q] += g[q] - np.exp(y[q]) * s if log else y[q] * (g[q] - s)


# reassoc lets the row sums vectorise (see kernels/norm.py); NaN and inf still propagate
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def k_layer_norm(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """NativeLayerNormBackward0 (input, weight, bias) over rows of k, with y = (x - mean) * rstd
    rebuilt from the saved input, mean and rstd (as torch saves): db = sum of g,
    dw = sum of g * y, dx = rstd * (gy - mean(gy) - y * mean(gy * y)) with gy = g * w."""
    b = row * HW
    g = gradient(row, hdr, g1, bslot, bigs)
    e0 = hdr[b + H_E0]
    ip = hdr[b + H_IP]
    k, has_w, has_b = xs[ip + 1], xs[ip + 2], xs[ip + 3]
    tx = edge_target(edges, e0, st)
    tw = edge_target(edges, e0 + 1, st) if has_w else -1
    tb = edge_target(edges, e0 + 2, st) if has_b else -1
    kp = hdr[b + H_KP]
    x = saved(slots, v, kp)
    mean = saved(slots, v, kp + 1)
    rstd = saved(slots, v, kp + 2)
    w = saved(slots, v, kp + 3) if has_w else np.ones(k, g.dtype)
    dx = target_buffer(tx, x.size, g1, bslot, bigs) if tx >= 0 else x[0:0]
    dw = target_buffer(tw, k, g1, bslot, bigs) if tw >= 0 else x[0:0]
    db = target_buffer(tb, k, g1, bslot, bigs) if tb >= 0 else x[0:0]
    for r in range(mean.size):
        o = r * k
        mu, s = mean[r], rstd[r]
        if tb >= 0:
            for i in range(k):
                db[U(i)] += g[U(o + i)]
        if tw >= 0:
            for i in range(k):
                dw[U(i)] += g[U(o + i)] * (x[U(o + i)] - mu) * s
        if tx < 0:
            continue
        sg = 0.0
        sgy = 0.0
        for i in range(k):
            gy = g[U(o + i)] * w[U(i)]
            sg += gy
            sgy += gy * (x[U(o + i)] - mu) * s
        mg, mgy = sg / k, sgy / k
        for i in range(k):
            dx[U(o + i)] += s * (g[U(o + i)] * w[U(i)] - mg - (x[U(o + i)] - mu) * s * mgy)


# --- embedding -------------------------------------------------------------------------------------
@jit
def k_embedding(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """EmbeddingBackward0: row idx[j] of the weight gets coef[j] * (the gradient of output
    row j); coef is 0 for padding_idx, 1/count with scale_grad_by_freq, else 1."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    kp = hdr[b + H_KP]
    idx = saved_index(slots, kp, xs[0:0])
    coef = saved(slots, v, kp + 1)
    dim = xs[hdr[b + H_IP] + 1]
    for j in range(idx.size):
        c = coef[j]
        if c != 0:
            o = idx[j] * dim
            s = j * dim
            for q in range(dim):
                d[o + q] += c * g[s + q]


# --- convolution ---------------------------------------------------------------------------------
@jit
def k_conv(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """ConvolutionBackward0 (inputs: input, weight[, bias]), per sample and group as the
    forward (kernels/conv.py): the columns are rebuilt from the saved input, then
    dW_g += G_g @ cols^T, dcols = W_g^T @ G_g scattered back by col2im, db = sum of G."""
    b = row * HW
    g = gradient(row, hdr, g1, bslot, bigs)
    e0 = hdr[b + H_E0]
    tx = edge_target(edges, e0, st)
    tw = edge_target(edges, e0 + 1, st)
    tb = edge_target(edges, e0 + 2, st) if hdr[b + H_NIN] == 3 else -1
    kp = hdr[b + H_KP]
    ip = hdr[b + H_IP]
    geom = xs[ip + 1:ip + 18]
    n, c, h, w, cout, cg, kh, kw = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], geom[6], geom[7]
    groups, L = geom[14], geom[15] * geom[16]
    m = cout // groups
    k = cg * kh * kw
    if tb >= 0:
        db = target_buffer(tb, cout, g1, bslot, bigs)
        for s in range(n):
            for co in range(cout):
                o = (s * cout + co) * L
                acc = 0.0
                for q in range(o, o + L):
                    acc += g[U(q)]
                db[co] += acc
    if tw < 0 and tx < 0:
        return
    x = saved(slots, v, kp)
    wt = saved(slots, v, kp + 1)
    cols = np.empty((k, L), g.dtype)
    if tw >= 0:
        dw = target_buffer(tw, wt.size, g1, bslot, bigs)
        for s in range(n):
            for grp in range(groups):
                im2col(x, (s * c + grp * cg) * h * w, geom, cols)
                o = (s * cout + grp * m) * L
                gemm(g[o:o + m * L].reshape((m, L)), False, cols, True,
                     dw[grp * m * k:(grp + 1) * m * k].reshape((m, k)), 1.0)
    if tx >= 0:
        dx = target_buffer(tx, x.size, g1, bslot, bigs)
        for s in range(n):
            for grp in range(groups):
                o = (s * cout + grp * m) * L
                gemm(wt[grp * m * k:(grp + 1) * m * k].reshape((m, k)), True, g[o:o + m * L].reshape((m, L)), False,
                     cols, 0.0)
                col2im_add(cols, dx, (s * c + grp * cg) * h * w, geom)


# --- losses ----------------------------------------------------------------------------------------
@jit
def k_nll(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """nll_loss: d[n, target[n]] -= g * weight[n]; g is one value (mean, sum) or one per
    row ('none'). weight holds class weight x ignore mask (x 1/total for the mean)."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    kp = hdr[b + H_KP]
    target = saved_index(slots, kp, xs[0:0])
    coef = saved(slots, v, kp + 1)
    ip = hdr[b + H_IP]
    ncls, per_row = xs[ip + 1], xs[ip + 2]
    for j in range(target.size):
        c = coef[j]
        if c != 0:
            d[j * ncls + target[j]] -= (g[j] if per_row else g[0]) * c


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


@jit
def k_softmax_grad(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    k_softmax(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, False)


@jit
def k_log_softmax_grad(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    k_softmax(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st, True)
