"""Average pooling's backward kernel (AvgPool2DBackward0 and AdaptiveAvgPool2DBackward0).

Both poolings average a window per output (oh, ow) that is a product of a row range
[hs, he) and a column range [ws, we), divided by dr[oh] * dc[ow] (or by one fixed
divisor, avg_pool2d's divisor_override). The row's int params hold the ranges
(ops/nn.py, _pool_windows):
  planes, H, W, Ho, Wo, divisor (0: none), then hs, he, dr (Ho each), ws, we, dc (Wo each)
"""
from jitgrad._core.layout import H_IP
from jitgrad.kernels.common import jit, one_input


@jit
def k_avg_pool(row, hdr, edges, xs, fp, slots, v, g1, bslot, bigs, st):
    """Each output's gradient, over its divisor, added to every input of its window."""
    b, g, t, pin, dx = one_input(row, hdr, edges, xs, g1, bslot, bigs, st)
    if t < 0:
        return
    ip = hdr[b + H_IP]
    planes, h, w, ho, wo, fixed = xs[ip + 1], xs[ip + 2], xs[ip + 3], xs[ip + 4], xs[ip + 5], xs[ip + 6]
    rw = ip + 7           # hs, he, dr
    cw = rw + 3 * ho      # ws, we, dc
    for p in range(planes):
        for oh in range(ho):
            hs, he, dr = xs[rw + oh], xs[rw + ho + oh], xs[rw + 2 * ho + oh]
            for ow in range(wo):
                ws, we, dc = xs[cw + ow], xs[cw + wo + ow], xs[cw + 2 * wo + ow]
                val = g[(p * ho + oh) * wo + ow] / (fixed if fixed > 0 else dr * dc)
                for ih in range(hs, he):
                    o = (p * h + ih) * w
                    for iw in range(ws, we):
                        dx[o + iw] += val
