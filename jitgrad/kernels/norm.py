"""The layer_norm forward, compiled: one pass per row for the mean, one for the variance,
one for the output (numpy needed about six full passes and as many temporaries). Under
NUMBA_DISABLE_JIT the numpy form below runs instead (the CI pass without the JIT checks it
against torch just as the compiled pass checks the loops)."""
import numpy as np
from numba import njit
from numba.core.config import DISABLE_JIT

from jitgrad.kernels.conv import U


# reassoc: the row sums may be reordered, so they vectorise (2x); no other fast-math flag,
# so NaN and inf still propagate as in torch
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _layer_norm_nb(x, w, b, has_w, has_b, eps):
    """x (rows, k) -> out (rows, k), mean (rows,), rstd (rows,), statistics accumulated in
    float64; variance with correction 0, as torch. Indices are unsigned (U) so that the
    row loops vectorise (see kernels/conv.py)."""
    rows, k = x.shape
    xf = x.reshape(-1)
    out = np.empty(x.size, x.dtype)
    mean = np.empty(rows, x.dtype)
    rstd = np.empty(rows, x.dtype)
    for r in range(rows):
        o = r * k
        s = 0.0
        for i in range(o, o + k):
            s += xf[U(i)]
        mu = s / k
        ss = 0.0
        for i in range(o, o + k):
            c = xf[U(i)] - mu
            ss += c * c
        rs = 1.0 / np.sqrt(ss / k + eps)
        mean[r] = mu
        rstd[r] = rs
        if has_w and has_b:
            for i in range(k):
                out[U(o + i)] = (xf[U(o + i)] - mu) * rs * w[U(i)] + b[U(i)]
        elif has_w:
            for i in range(k):
                out[U(o + i)] = (xf[U(o + i)] - mu) * rs * w[U(i)]
        elif has_b:
            for i in range(k):
                out[U(o + i)] = (xf[U(o + i)] - mu) * rs + b[U(i)]
        else:
            for i in range(o, o + k):
                out[U(i)] = (xf[U(i)] - mu) * rs
    return out.reshape(x.shape), mean, rstd


def _layer_norm_np(x, w, b, has_w, has_b, eps):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    c = x64 - mean
    rstd = 1.0 / np.sqrt((c * c).mean(axis=1, keepdims=True) + eps)
    out = c * rstd
    if has_w:
        out *= w
    if has_b:
        out += b
    return out.astype(x.dtype), mean.reshape(-1).astype(x.dtype), rstd.reshape(-1).astype(x.dtype)


layer_norm_forward = _layer_norm_np if DISABLE_JIT else _layer_norm_nb
