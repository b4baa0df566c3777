"""Backward kernels of the shape ops: views, permute, expand, cat / stack, indexing
(gather and scatter at flat indices), embedding.
The arguments are the scheduler's standard ones (kernels/common.py)."""
import numpy as np

from jitgrad._core.layout import H_E0, H_IP, H_KP, H_NIN, H_NUMEL, H_SHP, HW
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
