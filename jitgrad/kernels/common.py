"""What every backward kernel shares: reading saved values by address, the gradient
buffers, and the broadcast index maps. The kernels themselves are in the family modules
(reduce, shape, linalg, norm, loss, conv); the scheduler (engine/scheduler.py) calls
each by its address in the kernel table (kernels/table.py).

Conventions (the scheduler calls every node kernel the same way):
  node kernel  k(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st)
  - row's own gradient: gradient(row, ...) (already complete: rows run in descending order)
  - a contribution to input j goes into target_buffer(...) of the edge's target row,
    which the kernel accumulates into at the *input's* shape: broadcasting is undone
    right here, through index maps, never in a rule.
  - v: inline one-element saved values in the graph's dtype; larger saved values are
    read in place through the address stored in `slots`.
Every kernel also runs as plain Python under NUMBA_DISABLE_JIT=1 (numpy bounds-checks
every index the compiled code reads unchecked).
"""
import numpy as np
from numba import njit

from jitgrad._core.layout import E_SHP, E_TGT, EW, H_E0, H_NUMEL, HAS, HW, RECV, S_NUMEL, S_REF, SW
from jitgrad.kernels.blas import gemm
from jitgrad.kernels.pointers import disown, own, view

# error_model="numpy": float division by zero gives inf/nan as in PyTorch (no raising path)
jit = njit(cache=True, nogil=True, error_model="numpy")
# the helpers below are called from compiled code only: no wrappers for calls from Python,
# which are code each first compile would build and never use
helper = njit(cache=True, nogil=True, error_model="numpy", no_cpython_wrapper=True, no_cfunc_wrapper=True)



@helper
def saved(slots, v, k):
    """Saved value k as a 1-D array of the graph's dtype."""
    ref = slots[SW * k + S_REF]
    if ref < 0:
        j = -ref - 1
        return v[j:j + 1]
    return view(ref, slots[SW * k + S_NUMEL], v)


@helper
def saved_index(slots, k, like_i64):
    return view(slots[SW * k + S_REF], slots[SW * k + S_NUMEL], like_i64)


@helper
def gradient(row, hdr, g1, gaddr, gown):
    """The (complete) gradient of row's output, flat."""
    n = hdr[row * HW + H_NUMEL]
    if n == 1:
        return g1[row:row + 1]
    if gaddr[row] == 0:  # only reachable for an empty tensor
        return g1[0:0]
    return view(gaddr[row], n, g1)


@helper
def target_buffer(tgt, n, g1, gaddr, gown):
    """Where contributions for row `tgt`'s output accumulate (created zeroed on first use)."""
    if n == 1:
        return g1[tgt:tgt + 1]
    if n == 0:
        return g1[0:0]
    if gaddr[tgt] == 0:
        return new_buffer(tgt, np.zeros(n, g1.dtype), gaddr, gown)
    return view(gaddr[tgt], n, g1)


@helper
def new_buffer(row, buf, gaddr, gown):
    """Make `buf` row's gradient buffer: the backward owns it until it frees it (free_buffer).
    gown's last element counts the buffers owned, so that release() has nothing to scan
    in the usual case, where every one was freed as its row ran."""
    gown[row] = own(buf)
    gown[-1] += 1
    gaddr[row] = buf.ctypes.data
    return buf


@helper
def free_buffer(row, gaddr, gown):
    """Free row's gradient buffer if the backward owns it (a sink's is part of `out`)."""
    if gown[row] != 0:
        disown(gown[row])
        gown[row] = 0
        gaddr[row] = 0
        gown[-1] -= 1


@helper
def dot_into(tgt, fresh, x, tx, y, ty, rows, cols, g1, gaddr, gown):
    """Contribute op(x) @ op(y) (rows x cols) to row `tgt`'s gradient with one gemm:
    written straight into place when nothing has contributed yet (into the output array
    for a leaf, or into a new buffer), added by the BLAS call (beta = 1) otherwise."""
    if gaddr[tgt] == 0:
        buf = new_buffer(tgt, np.empty(rows * cols, g1.dtype), gaddr, gown)
        gemm(x, tx, y, ty, buf.reshape((rows, cols)), 0.0)
    else:
        buf = view(gaddr[tgt], rows * cols, g1)
        gemm(x, tx, y, ty, buf.reshape((rows, cols)), 0.0 if fresh else 1.0)


@helper
def edge_target(edges, e, st):
    """Target row of edge e, or -1 when it gets no gradient (no grad, or not needed);
    marks the target as reached, since the caller is about to contribute to it."""
    t = edges[EW * e + E_TGT]
    if t >= 0:
        if not (st[t] & RECV):
            return -1
        st[t] |= HAS
    return t


@helper
def one_input(row, hdr, edges, xs, g1, gaddr, gown, st):
    """The common start of a one-input kernel: (header base, the row's gradient, the
    input's target row or -1, the input's shape pointer, the input's buffer)."""
    b = row * HW
    g = gradient(row, hdr, g1, gaddr, gown)
    e0 = hdr[b + H_E0]
    t = edge_target(edges, e0, st)
    pin = edges[EW * e0 + E_SHP]
    d = g
    if t >= 0:
        d = target_buffer(t, shape_numel(xs, pin), g1, gaddr, gown)
    return b, g, t, pin, d


@helper
def shape_numel(xs, p):
    n = 1
    for k in range(xs[p]):
        n *= xs[p + 1 + k]
    return n


# mode 0: same shape (i), 1: small is one element (0), 2: small is a suffix of big (i % m),
# 3: small keeps a prefix and is 1 after it (i // m), 4: general (map[i]).
@helper
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


@helper
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
