"""Average pooling's loops: the backward kernel of AvgPool2DBackward0 and
AdaptiveAvgPool2DBackward0, and the host forward (the eager op's and jitgrad.compile's replay).

Both poolings average a window per output (oh, ow) that is a product of a row range
[hs, he) and a column range [ws, we), divided by dr[oh] * dc[ow] (or by one fixed
divisor, avg_pool2d's divisor_override). The row's int params hold the ranges
(ops/nn.py, _pool_ints):
  planes, H, W, Ho, Wo, divisor (0: none), then hs, he, dr (Ho each), ws, we, dc (Wo each)
"""
import numpy as np
from numba.core.config import DISABLE_JIT

from jitgrad._core.layout import H_IP
from jitgrad.kernels.common import jit, one_input


@jit
def k_avg_pool(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """Each output's gradient, over its divisor, added to every input of its window."""
    b, g, t, pin, dx = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
    if t < 0:
        return
    ip = hdr[b + H_IP]
    planes, h, w, ho, wo, divisor = xs[ip + 1], xs[ip + 2], xs[ip + 3], xs[ip + 4], xs[ip + 5], xs[ip + 6]
    for p in range(planes):
        for oh in range(ho):
            hs, he, dr = xs[ip + 7 + oh], xs[ip + 7 + ho + oh], xs[ip + 7 + 2 * ho + oh]
            for ow in range(wo):
                c0 = 3 * ho + ow  # the column ranges follow the row ones
                ws, we, dc = xs[ip + 7 + c0], xs[ip + 7 + c0 + wo], xs[ip + 7 + c0 + 2 * wo]
                val = g[(p * ho + oh) * wo + ow] / (divisor if divisor > 0 else dr * dc)
                for ih in range(hs, he):
                    o = (p * h + ih) * w
                    for iw in range(ws, we):
                        dx[o + iw] += val


# --- the forward (the eager op on the host and jitgrad.compile's replay) ---
@jit
def _avg_pool_into_nb(x, geom, out):
    """out (planes, Ho, Wo), flat: each window's sum over its divisor; geom: the int params."""
    planes, h, w, ho, wo, fixed = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5]
    rw = 6
    cw = rw + 3 * ho
    for p in range(planes):
        for oh in range(ho):
            hs, he, dr = geom[rw + oh], geom[rw + ho + oh], geom[rw + 2 * ho + oh]
            for ow in range(wo):
                ws, we, dc = geom[cw + ow], geom[cw + wo + ow], geom[cw + 2 * wo + ow]
                acc = 0.0
                for ih in range(hs, he):
                    o = (p * h + ih) * w
                    for iw in range(ws, we):
                        acc += x[o + iw]
                out[(p * ho + oh) * wo + ow] = acc / (fixed if fixed > 0 else dr * dc)


def _avg_pool_into_np(x, geom, out):
    planes, h, w, ho, wo, fixed = (int(v) for v in geom[:6])
    g = np.asarray(geom[6:], np.int64)
    rows, cols = g[:3 * ho].reshape(3, ho), g[3 * ho:].reshape(3, wo)
    summed = np.zeros((planes, ho, wo))
    x3 = x.reshape(planes, h, w)
    for oh in range(ho):
        for ow in range(wo):
            summed[:, oh, ow] = x3[:, rows[0, oh]:rows[1, oh], cols[0, ow]:cols[1, ow]].sum(axis=(1, 2))
    div = fixed if fixed > 0 else rows[2][:, None] * cols[2][None, :]
    out[:] = (summed / div).reshape(-1)


avg_pool_into = _avg_pool_into_np if DISABLE_JIT else _avg_pool_into_nb
