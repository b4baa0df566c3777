"""Backward kernel of nll_loss (cross-entropy is log_softmax + nll_loss, as in PyTorch).
The arguments are the scheduler's standard ones (kernels/common.py)."""

from jitgrad._core.layout import H_IP, H_KP
from jitgrad.kernels.common import jit, one_input, saved, saved_index


@jit
def k_nll(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """nll_loss: d[n, target[n]] -= g * weight[n]; g is one value (mean, sum) or one per
    row ('none'). weight holds class weight x ignore mask (x 1/total for the mean)."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
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
