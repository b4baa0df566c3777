"""Kernels of the shape ops: views, permute, expand, cat / stack, indexing (gather and
scatter at flat indices), embedding.
Backward kernels (k_*) take the scheduler's standard arguments (kernels/common.py);
forward kernels (f_*) run an instruction of jitgrad.compile's replay (kernels/forward.py).
In a plan every value is its own C-contiguous array, so a view's forward is a copy in
the view's order."""
import numpy as np

from jitgrad._core.layout import F_NIN, FW, H_E0, H_IP, H_KP, H_NIN, H_NUMEL, H_SHP, HW
from jitgrad.kernels.common import (
    bcast_plan,
    bidx,
    edge_target,
    gradient,
    jit,
    one_input,
    saved,
    saved_index,
    target_buffer,
)
from jitgrad.kernels.forward import arg, ip, made, res, shp, val, val_i64


@jit
def k_expand(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    mode, m, mp = bcast_plan(xs, hdr[b + H_SHP], pin)
    for i in range(hdr[b + H_NUMEL]):
        d[bidx(mode, m, mp, i)] += g[i]


@jit
def k_scatter(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """Indexing and max(dim): out[j] = x.flat[idx[j]], so x's gradient gathers back."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    idx = saved_index(slots, hdr[b + H_KP], xs[0:0])
    for j in range(idx.size):
        d[idx[j]] += g[j]


@jit
def k_index_put(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    idx = saved_index(slots, hdr[b + H_KP], xs[0:0])
    for j in range(idx.size):
        d[j] += g[idx[j]]


@jit
def k_view(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """reshape/view/squeeze/unsqueeze: C-order data is unchanged, only the shape differs."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    for i in range(g.size):
        d[i] += g[i]


@jit
def k_permute(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    permute_walk(g, d, xs, pin, hdr[b + H_IP], True)


TILE = 32


@jit
def permute_walk(a, b, xs, pin, p, back):
    """a is b permuted (both C order, flat): b's shape at xs[pin] (count, dims), the
    permutation at xs[p + 1:]. Sets a from b, or with `back` adds a into b (the backward).
    When a's last dim is not b's, it runs in TILE x TILE tiles of those two dims, so that
    the strided side stays in cache."""
    nd = xs[pin]
    if a.size == 0:
        return
    if nd == 0:
        if back:
            b[0] += a[0]
        else:
            a[0] = b[0]
        return
    bstr = np.ones(nd, np.int64)
    for k in range(nd - 2, -1, -1):
        bstr[k] = bstr[k + 1] * xs[pin + 2 + k]
    st = np.empty(nd, np.int64)  # b's stride along each of a's dims
    n = np.empty(nd, np.int64)   # a's shape
    for k in range(nd):
        st[k] = bstr[xs[p + 1 + k]]
        n[k] = xs[pin + 1 + xs[p + 1 + k]]
    astr = np.ones(nd, np.int64)
    for k in range(nd - 2, -1, -1):
        astr[k] = astr[k + 1] * n[k + 1]
    u = nd - 1  # a's contiguous dim
    w = u       # b's contiguous dim, as a dim of a
    for k in range(nd):
        if xs[p + 1 + k] == nd - 1:
            w = k
    tiled = w != u and n[u] > 1 and n[w] > 1
    su = st[u]
    aw = astr[w]
    idx = np.zeros(nd, np.int64)
    aoff = 0
    boff = 0
    while True:
        if tiled:
            for w0 in range(0, n[w], TILE):
                w1 = min(w0 + TILE, n[w])
                for u0 in range(0, n[u], TILE):
                    u1 = min(u0 + TILE, n[u])
                    for q in range(w0, w1):
                        ao = aoff + q * aw
                        bo = boff + q
                        if back:
                            for r in range(u0, u1):
                                b[bo + r * su] += a[ao + r]
                        else:
                            for r in range(u0, u1):
                                a[ao + r] = b[bo + r * su]
        elif back:
            for r in range(n[u]):
                b[boff + r * su] += a[aoff + r]
        else:
            for r in range(n[u]):
                a[aoff + r] = b[boff + r * su]
        # the next position over a's other dims (w's too, unless tiled)
        k = nd - 2
        while k >= 0:
            if tiled and k == w:
                k -= 1
                continue
            idx[k] += 1
            aoff += astr[k]
            boff += st[k]
            if idx[k] < n[k]:
                break
            aoff -= astr[k] * idx[k]
            boff -= st[k] * idx[k]
            idx[k] = 0
            k -= 1
        if k < 0:
            return


@jit
def k_cat(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    b = row * HW
    g = gradient(row, hdr, g1, gaddr, gown)
    e0 = hdr[b + H_E0]
    ip = hdr[b + H_IP]
    outer, total, inner = xs[ip + 1], xs[ip + 2], xs[ip + 3]
    off = 0
    for j in range(hdr[b + H_NIN]):
        sj = xs[ip + 5 + j]  # ip: outer, total, inner, dim, sizes...
        t = edge_target(edges, e0 + j, st)
        if t >= 0:
            d = target_buffer(t, outer * sj * inner, g1, gaddr, gown)
            for o in range(outer):
                src = (o * total + off) * inner
                dst = o * sj * inner
                for i in range(sj * inner):
                    d[dst + i] += g[src + i]
        off += sj


@jit
def k_embedding(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """EmbeddingBackward0: row idx[j] of the weight gets coef[j] * (the gradient of output
    row j); coef is 0 for padding_idx, 1/count with scale_grad_by_freq, else 1."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
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


# --- forward kernels --------------------------------------------------------------------------
@jit
def f_view(i, prog, fin, vals, xs, fp, like):
    """view / reshape / squeeze / unsqueeze: the same elements in the same C order."""
    x = val(vals, arg(prog, fin, i, 0), like)
    out = val(vals, res(prog, fin, i, 0), like)
    for j in range(out.size):
        out[j] = x[j]


@jit
def f_expand(i, prog, fin, vals, xs, fp, like):
    """Each output element reads the input element it broadcasts from."""
    xid = arg(prog, fin, i, 0)
    x = val(vals, xid, like)
    oid = res(prog, fin, i, 0)
    out = val(vals, oid, like)
    mode, m, mp = bcast_plan(xs, shp(vals, oid), shp(vals, xid))
    for j in range(out.size):
        out[j] = x[bidx(mode, m, mp, j)]


@jit
def f_permute(i, prog, fin, vals, xs, fp, like):
    """permute / transpose / t (int params: the permutation)."""
    xid = arg(prog, fin, i, 0)
    permute_walk(val(vals, res(prog, fin, i, 0), like), val(vals, xid, like), xs, shp(vals, xid), ip(prog, i), False)


@jit
def f_gather(i, prog, fin, vals, xs, fp, like):
    """Indexing and the paddings: out[j] = x.flat[idx[j]], the positions (saved value 0) a
    constant of the plan or made before by a Python instruction, never by this kernel."""
    if made(prog, i, 0):
        raise ValueError("jitgrad.compile: a gather whose positions are data (max(dim), max_pool2d) needs a "
                         "forward kernel of its own")
    x = val(vals, arg(prog, fin, i, 0), like)
    out = val(vals, res(prog, fin, i, 0), like)
    idx = val_i64(vals, res(prog, fin, i, 1))
    for j in range(out.size):
        out[j] = x[idx[j]]


@jit
def f_index_put(i, prog, fin, vals, xs, fp, like):
    """The adjoint of the gather: zeros with g[j] accumulated at idx[j]."""
    g = val(vals, arg(prog, fin, i, 0), like)
    out = val(vals, res(prog, fin, i, 0), like)
    idx = val_i64(vals, res(prog, fin, i, 1))
    out[:] = 0.0
    for j in range(idx.size):
        out[idx[j]] += g[j]


@jit
def f_cat(i, prog, fin, vals, xs, fp, like):
    """cat / stack (int params: outer, total, inner, dim, then each input's size along the
    dim, 1 for stack): input j fills columns [off, off + size_j) of each outer block."""
    out = val(vals, res(prog, fin, i, 0), like)
    p = ip(prog, i)
    outer, total, inner = xs[p + 1], xs[p + 2], xs[p + 3]
    off = 0
    for j in range(prog[i * FW + F_NIN]):
        x = val(vals, arg(prog, fin, i, j), like)
        block = xs[p + 5 + j] * inner
        for o in range(outer):
            dst = (o * total + off) * inner
            src = o * block
            for q in range(block):
                out[dst + q] = x[src + q]
        off += xs[p + 5 + j]
