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
def k_expand(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    mode, m, mp = bcast_plan(xs, hdr[b + H_SHP], pin)
    for i in range(hdr[b + H_NUMEL]):
        d[bidx(mode, m, mp, i)] += g[i]


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
    """permute / transpose / t (int params: the permutation): walk the output in C order,
    stepping through the input by its stride along each output dim."""
    xid = arg(prog, fin, i, 0)
    x = val(vals, xid, like)
    out = val(vals, res(prog, fin, i, 0), like)
    pin = shp(vals, xid)
    p = ip(prog, i)
    nd = xs[pin]
    instr = np.ones(nd, np.int64)
    for k in range(nd - 2, -1, -1):
        instr[k] = instr[k + 1] * xs[pin + 2 + k]
    ostr = np.empty(nd, np.int64)
    oshape = np.empty(nd, np.int64)
    for k in range(nd):
        ostr[k] = instr[xs[p + 1 + k]]
        oshape[k] = xs[pin + 1 + xs[p + 1 + k]]
    idx = np.zeros(nd, np.int64)
    cur = 0
    for j in range(out.size):
        out[j] = x[cur]
        for k in range(nd - 1, -1, -1):
            idx[k] += 1
            cur += ostr[k]
            if idx[k] < oshape[k]:
                break
            cur -= ostr[k] * idx[k]
            idx[k] = 0


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
