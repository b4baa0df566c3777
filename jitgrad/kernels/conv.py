"""Convolution and max pooling loops, shared by the forward ops (nn/conv.py) and the
engine's ConvolutionBackward0 kernel (k_conv, at the end).

A convolution runs one sample and one group at a time, as PyTorch's CPU slow_conv2d does:
im2col copies the sample's receptive fields into a (Cg*kh*kw, Ho*Wo) column matrix, and
one gemm against the weight does the rest. Working per sample keeps the columns small
(they are rebuilt in the backward rather than saved: memory counts as much as time).

`geom`, the layout every function here reads (an int64 array, also the row's int params):
  N, C, H, W, Cout, Cg, kh, kw, sh, sw, pt, pl, dh, dw, G, Ho, Wo
Positions that fall in the padding read as zero; nothing is ever padded in memory.

Under NUMBA_DISABLE_JIT the loops would run element by element in Python, so there the
same functions are numpy versions (strided views), and the CI pass without the JIT checks
them against PyTorch just as the compiled pass checks the loops.
"""
import numpy as np
from numba.core.config import DISABLE_JIT
from numpy.lib.stride_tricks import as_strided

from jitgrad._core.layout import H_E0, H_IP, H_KP, H_NIN, HW
from jitgrad.kernels.blas import gemm
from jitgrad.kernels.common import edge_target, gradient, jit, saved, target_buffer

U = np.uint64  # an index known to be in bounds: see _im2col_nb

GEOM = ("N", "C", "H", "W", "Cout", "Cg", "kh", "kw", "sh", "sw", "pt", "pl", "dh", "dw", "G", "Ho", "Wo")


# --- numpy forms (NUMBA_DISABLE_JIT) -------------------------------------------------------------
def _padded_zeros(geom, dtype):
    """A zero (Cg, Hp, Wp) array that every window of the geometry fits in."""
    _, _, h, w, _, cg, kh, kw, sh, sw, pt, pl, dh, dw, _, ho, wo = (int(v) for v in geom)
    hp = max(h + pt, (ho - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pl, (wo - 1) * sw + (kw - 1) * dw + 1)
    return np.zeros((cg, hp, wp), dtype)


def _im2col_np(x, base, geom, cols):
    _, _, h, w, _, cg, kh, kw, sh, sw, pt, pl, dh, dw, _, ho, wo = (int(v) for v in geom)
    xp = _padded_zeros(geom, x.dtype)
    xp[:, pt:pt + h, pl:pl + w] = x[base:base + cg * h * w].reshape(cg, h, w)
    s0, s1, s2 = xp.strides
    cols[...] = as_strided(xp, (cg, kh, kw, ho, wo), (s0, s1 * dh, s2 * dw, s1 * sh, s2 * sw),
                           writeable=False).reshape(cols.shape)


def _col2im_add_np(cols, dx, base, geom):
    _, _, h, w, _, cg, kh, kw, sh, sw, pt, pl, dh, dw, _, ho, wo = (int(v) for v in geom)
    gp = _padded_zeros(geom, dx.dtype)
    c6 = cols.reshape(cg, kh, kw, ho, wo)
    for i in range(kh):
        for j in range(kw):
            gp[:, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw] += c6[:, i, j]
    dx[base:base + cg * h * w] += gp[:, pt:pt + h, pl:pl + w].reshape(-1)


# --- loops (compiled) ----------------------------------------------------------------------------
@jit
def _valid_cols(j, geom):
    """The output columns [lo, hi) whose kernel column j lands inside the input, and the
    input column of output column 0 (iw = ow * sw + off)."""
    w, sw, pl, dw, wo = geom[3], geom[9], geom[11], geom[13], geom[16]
    off = j * dw - pl
    lo = 0 if off >= 0 else (-off + sw - 1) // sw
    hi = 0 if off >= w else min(wo, (w - 1 - off) // sw + 1)
    return lo, max(lo, hi), off


@jit
def _im2col_nb(x, base, geom, cols):
    """cols[(c, i, j), (oh, ow)] = x[base + c*H*W + ih*W + iw], zero where (ih, iw) is padding.
    The in-bounds stretch of each output row is found once, so the copy loop has no
    branch and indexes with unsigned ints (U): a signed index makes Numba check for
    negative wraparound on every access, which kept this loop from vectorising (5x)."""
    h, w, cg, kh, kw = geom[2], geom[3], geom[5], geom[6], geom[7]
    sh, sw, pt, dh, ho, wo = geom[8], geom[9], geom[10], geom[12], geom[15], geom[16]
    flat = cols.reshape(-1)  # plain loops over a flat view: slicing per row costs more than the copy
    L = ho * wo
    for c in range(cg):
        for i in range(kh):
            for j in range(kw):
                lo, hi, off = _valid_cols(j, geom)
                r = ((c * kh + i) * kw + j) * L
                for oh in range(ho):
                    ih = oh * sh - pt + i * dh
                    o = r + oh * wo
                    if ih < 0 or ih >= h:
                        for ow in range(wo):
                            flat[o + ow] = 0.0
                        continue
                    for ow in range(lo):
                        flat[o + ow] = 0.0
                    src = base + (c * h + ih) * w + off
                    for ow in range(lo, hi):
                        flat[U(o + ow)] = x[U(src + ow * sw)]
                    for ow in range(hi, wo):
                        flat[o + ow] = 0.0


@jit
def _col2im_add_nb(cols, dx, base, geom):
    """The adjoint of im2col: every column entry is added back to the input position it
    was read from (positions in the padding are dropped)."""
    h, w, cg, kh, kw = geom[2], geom[3], geom[5], geom[6], geom[7]
    sh, sw, pt, dh, ho, wo = geom[8], geom[9], geom[10], geom[12], geom[15], geom[16]
    flat = cols.reshape(-1)
    L = ho * wo
    for j in range(kw):
        lo, hi, off = _valid_cols(j, geom)
        for c in range(cg):
            for i in range(kh):
                r = ((c * kh + i) * kw + j) * L
                for oh in range(ho):
                    ih = oh * sh - pt + i * dh
                    if ih < 0 or ih >= h:
                        continue
                    dst = base + (c * h + ih) * w + off
                    o = r + oh * wo
                    for ow in range(lo, hi):
                        dx[U(dst + ow * sw)] += flat[U(o + ow)]


im2col = _im2col_np if DISABLE_JIT else _im2col_nb
col2im_add = _col2im_add_np if DISABLE_JIT else _col2im_add_nb


@jit
def conv_forward_into(x, wt, bias, has_bias, geom, out):
    """out (N, Cout, Ho, Wo), flat: per sample and group, W_g (M x K) @ cols (K x L)."""
    n, c, h, w, cout, cg, kh, kw = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], geom[6], geom[7]
    g, ho, wo = geom[14], geom[15], geom[16]
    m = cout // g
    k = cg * kh * kw
    L = ho * wo
    cols = np.empty((k, L), wt.dtype)
    for s in range(n):
        for grp in range(g):
            im2col(x, (s * c + grp * cg) * h * w, geom, cols)
            o = (s * cout + grp * m) * L
            gemm(wt[grp * m * k:(grp + 1) * m * k].reshape((m, k)), False, cols, False,
                 out[o:o + m * L].reshape((m, L)), 0.0)
        if has_bias:
            for co in range(cout):
                o = (s * cout + co) * L
                bc = bias[co]
                for q in range(o, o + L):
                    out[U(q)] += bc


@jit
def conv_forward(x, wt, bias, has_bias, geom):
    out = np.empty(geom[0] * geom[4] * geom[15] * geom[16], wt.dtype)
    conv_forward_into(x, wt, bias, has_bias, geom, out)
    return out


# --- max pooling ---------------------------------------------------------------------------------
# pgeom: N*C (planes), H, W, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo
def _pool_into_np(x, pgeom, out_, arg_):
    planes, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo = (int(v) for v in pgeom)
    hp = max(h + 2 * ph, (ho - 1) * sh + dh * (kh - 1) + 1)
    wp = max(w + 2 * pw, (wo - 1) * sw + dw * (kw - 1) + 1)
    xp = np.full((planes, hp, wp), -np.inf, x.dtype)
    xp[:, ph:ph + h, pw:pw + w] = x.reshape(planes, h, w)
    s0, s1, s2 = xp.strides
    win = np.ascontiguousarray(as_strided(xp, (kh, kw, planes, ho, wo), (s1 * dh, s2 * dw, s0, s1 * sh, s2 * sw),
                                          writeable=False)).reshape(kh * kw, planes, ho, wo)
    # a window position that is padding never wins: PyTorch starts from the first position
    # inside the input and takes a later one only when it is greater (or NaN)
    rows = np.arange(ho).reshape(-1, 1) * sh - ph
    cols = np.arange(wo) * sw - pw
    out = np.full((planes, ho, wo), -np.inf, x.dtype)
    arg = np.full((planes, ho, wo), -1, np.int64)
    for o in range(kh * kw):
        i, j = divmod(o, kw)
        r, c = rows + i * dh, cols + j * dw
        inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
        val = win[o]
        take = inside & ((arg < 0) | (val > out) | (val != val))
        out = np.where(take, val, out)
        arg = np.where(take, r * w + c, arg)
    out_[:] = out.reshape(-1)
    arg_[:] = arg.reshape(-1)


@jit
def _pool_into_nb(x, pgeom, out, arg):
    planes, h, w, kh, kw = pgeom[0], pgeom[1], pgeom[2], pgeom[3], pgeom[4]
    sh, sw, ph, pw, dh, dw, ho, wo = pgeom[5], pgeom[6], pgeom[7], pgeom[8], pgeom[9], pgeom[10], pgeom[11], pgeom[12]
    for p in range(planes):
        base = p * h * w
        for oh in range(ho):
            h0 = oh * sh - ph
            for ow in range(wo):
                w0 = ow * sw - pw
                best = -np.inf
                at = -1
                for i in range(kh):
                    ih = h0 + i * dh
                    if ih < 0 or ih >= h:
                        continue
                    for j in range(kw):
                        iw = w0 + j * dw
                        if iw < 0 or iw >= w:
                            continue
                        val = x[base + ih * w + iw]
                        # as PyTorch's CPU kernel: the first position inside, then any
                        # greater value or NaN (so the last NaN wins)
                        if at < 0 or val > best or val != val:
                            best = val
                            at = ih * w + iw
                q = (p * ho + oh) * wo + ow
                out[q] = best
                arg[q] = at


@jit
def _pool_nb(x, pgeom):
    """(values, argmax within each plane), both flat."""
    n = pgeom[0] * pgeom[11] * pgeom[12]
    out = np.empty(n, x.dtype)
    arg = np.empty(n, np.int64)
    _pool_into_nb(x, pgeom, out, arg)
    return out, arg


def _pool_np(x, pgeom):
    n = int(pgeom[0] * pgeom[11] * pgeom[12])
    out = np.empty(n, x.dtype)
    arg = np.empty(n, np.int64)
    _pool_into_np(x, pgeom, out, arg)
    return out, arg


# the same loops for the eager op and jitgrad.compile's replay (kernels/forward_nn.py)
max_pool_into = _pool_into_np if DISABLE_JIT else _pool_into_nb
max_pool_forward = _pool_np if DISABLE_JIT else _pool_nb


# --- the convolution backward kernel (standard kernel arguments, kernels/common.py) ---
@jit
def k_conv(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """ConvolutionBackward0 (inputs: input, weight[, bias]), per sample and group as the
    forward (kernels/conv.py): the columns are rebuilt from the saved input, then
    dW_g += G_g @ cols^T, dcols = W_g^T @ G_g scattered back by col2im, db = sum of G."""
    b = row * HW
    g = gradient(row, hdr, g1, gaddr, gown)
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
        db = target_buffer(tb, cout, g1, gaddr, gown)
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
        dw = target_buffer(tw, wt.size, g1, gaddr, gown)
        for s in range(n):
            for grp in range(groups):
                im2col(x, (s * c + grp * cg) * h * w, geom, cols)
                o = (s * cout + grp * m) * L
                gemm(g[o:o + m * L].reshape((m, L)), False, cols, True,
                     dw[grp * m * k:(grp + 1) * m * k].reshape((m, k)), 1.0)
    if tx >= 0:
        dx = target_buffer(tx, x.size, g1, gaddr, gown)
        for s in range(n):
            for grp in range(groups):
                o = (s * cout + grp * m) * L
                gemm(wt[grp * m * k:(grp + 1) * m * k].reshape((m, k)), True, g[o:o + m * L].reshape((m, L)), False,
                     cols, 0.0)
                col2im_add(cols, dx, (s * c + grp * cg) * h * w, geom)
