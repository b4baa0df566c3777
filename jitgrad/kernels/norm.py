"""The layer_norm and softmax / log_softmax forwards, compiled, for the eager ops and
jitgrad.compile's replay alike (kernels/forward_nn.py), and their backward kernels. Layer
norm is one pass per row for the mean, one for the variance, one for the output (numpy
needed about six full passes and as many temporaries). Under NUMBA_DISABLE_JIT the numpy
forms below run instead (the CI pass without the JIT checks them against torch just as
the compiled pass checks the loops)."""
import numpy as np
from numba import njit
from numba.core.config import DISABLE_JIT

from jitgrad._core.layout import H_E0, H_IP, H_KP, HW
from jitgrad.kernels.common import edge_target, gradient, jit, one_input, saved, target_buffer
from jitgrad.kernels.conv import U


# reassoc: the row sums may be reordered, so they vectorise (2x); no other fast-math flag,
# so NaN and inf still propagate as in torch
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _layer_norm_into_nb(xf, k, w, b, has_w, has_b, eps, out, mean, rstd):
    """xf: rows of k, flat -> out (flat), mean and rstd (per row), statistics accumulated in
    float64; variance with correction 0, as torch. Indices are unsigned (U) so that the
    row loops vectorise (see kernels/conv.py)."""
    for r in range(mean.size):
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


def _layer_norm_into_np(xf, k, w, b, has_w, has_b, eps, out, mean, rstd):
    x64 = xf.reshape(-1, k).astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    c = x64 - mu
    rs = 1.0 / np.sqrt((c * c).mean(axis=1, keepdims=True) + eps)
    y = c * rs
    if has_w:
        y *= w
    if has_b:
        y += b
    out[:] = y.reshape(-1)
    mean[:] = mu.reshape(-1)
    rstd[:] = rs.reshape(-1)


# the same arithmetic for the eager op and jitgrad.compile's replay (kernels/forward_nn.py)
layer_norm_into = _layer_norm_into_np if DISABLE_JIT else _layer_norm_into_nb


@njit(cache=True, nogil=True, error_model="numpy")
def _layer_norm_nb(x, w, b, has_w, has_b, eps):
    """x (rows, k) -> out (rows, k), mean (rows,), rstd (rows,)."""
    rows, k = x.shape
    out = np.empty(x.size, x.dtype)
    mean = np.empty(rows, x.dtype)
    rstd = np.empty(rows, x.dtype)
    _layer_norm_into_nb(x.reshape(-1), k, w, b, has_w, has_b, eps, out, mean, rstd)
    return out.reshape(x.shape), mean, rstd


def _layer_norm_np(x, w, b, has_w, has_b, eps):
    rows, k = x.shape
    out = np.empty(x.shape, x.dtype)
    mean = np.empty(rows, x.dtype)
    rstd = np.empty(rows, x.dtype)
    _layer_norm_into_np(x.reshape(-1), k, w, b, has_w, has_b, eps, out.reshape(-1), mean, rstd)
    return out, mean, rstd


layer_norm_forward = _layer_norm_np if DISABLE_JIT else _layer_norm_nb


# --- softmax / log_softmax forward (the eager op and jitgrad.compile's replay) ---
@jit
def _softmax_into_nb(x, outer, n, inner, out, log):
    """Per group of n (stride inner): exp(x - max) / sum, or its log, x - max - log(sum)
    (a NaN in the group makes all of it NaN, as numpy's max would)."""
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            m = x[base]
            for j in range(1, n):
                v = x[base + j * inner]
                if v > m or v != v:
                    m = v
                    if v != v:
                        break
            s = 0.0
            if log:
                for j in range(n):
                    s += np.exp(x[base + j * inner] - m)
                ls = np.log(s)
                for j in range(n):
                    q = base + j * inner
                    out[q] = x[q] - m - ls
            else:
                for j in range(n):
                    q = base + j * inner
                    e = np.exp(x[q] - m)
                    out[q] = e
                    s += e
                for j in range(n):
                    out[base + j * inner] /= s


def _softmax_into_np(x, outer, n, inner, out, log):
    d = x.reshape(outer, n, inner)
    s = d - d.max(axis=1, keepdims=True)
    if log:
        r = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    else:
        e = np.exp(s)
        r = e / e.sum(axis=1, keepdims=True)
    out[:] = r.reshape(-1)


softmax_into = _softmax_into_np if DISABLE_JIT else _softmax_into_nb


# --- softmax / log_softmax and layer norm backward kernels (standard kernel arguments, kernels/common.py) ---
@jit
def k_softmax(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, log):
    """softmax: d = y * (g - sum(g * y)); log_softmax: d = g - exp(y) * sum(g), per group."""
    b, g, t, pin, d = one_input(row, hdr, edges, xs, g1, gaddr, gown, st)
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
def k_layer_norm(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """NativeLayerNormBackward0 (input, weight, bias) over rows of k, with y = (x - mean) * rstd
    rebuilt from the saved input, mean and rstd (as torch saves): db = sum of g,
    dw = sum of g * y, dx = rstd * (gy - mean(gy) - y * mean(gy * y)) with gy = g * w."""
    b = row * HW
    g = gradient(row, hdr, g1, gaddr, gown)
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
    dx = target_buffer(tx, x.size, g1, gaddr, gown) if tx >= 0 else x[0:0]
    dw = target_buffer(tw, k, g1, gaddr, gown) if tw >= 0 else x[0:0]
    db = target_buffer(tb, k, g1, gaddr, gown) if tb >= 0 else x[0:0]
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


@jit
def k_softmax_grad(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    k_softmax(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, False)


@jit
def k_log_softmax_grad(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    k_softmax(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st, True)


# --- batch norm and group norm backward (one kernel: they differ only in what a statistic covers) ---
@njit(cache=True, nogil=True, error_model="numpy")
def k_batch_norm(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """NativeBatchNormBackward0 / NativeGroupNormBackward0 (input, weight, bias) over input
    (n, c, s), s the spatial size. The channels fall in `groups` of c // groups; a statistic
    (saved mean and rstd) covers one group of one sample (per_sample: group norm) or one
    group over all samples (batch norm: groups = c). With y = (x - mean) * rstd and
    gy = g * weight[c]: db = sum of g, dw = sum of g * y per channel, and
    dx = rstd * (gy - mean(gy) - y * mean(gy * y)) per statistic when the statistics came
    from the input (train), dx = rstd * gy when they are constants (batch norm's eval)."""
    b = row * HW
    g = gradient(row, hdr, g1, gaddr, gown)
    e0 = hdr[b + H_E0]
    ip = hdr[b + H_IP]
    n, c, s, groups = xs[ip + 1], xs[ip + 2], xs[ip + 3], xs[ip + 4]
    per_sample, train, has_w, has_b = xs[ip + 5], xs[ip + 6], xs[ip + 7], xs[ip + 8]
    tx = edge_target(edges, e0, st)
    tw = edge_target(edges, e0 + 1, st) if has_w else -1
    tb = edge_target(edges, e0 + 2, st) if has_b else -1
    kp = hdr[b + H_KP]
    x = saved(slots, v, kp)
    mean = saved(slots, v, kp + 1)
    rstd = saved(slots, v, kp + 2)
    w = saved(slots, v, kp + 3) if has_w else np.ones(c, g.dtype)
    cg = c // groups
    count = (1 if per_sample else n) * cg * s
    sg = np.zeros(mean.size)
    sgy = np.zeros(mean.size)
    dw = target_buffer(tw, c, g1, gaddr, gown) if tw >= 0 else x[0:0]
    db = target_buffer(tb, c, g1, gaddr, gown) if tb >= 0 else x[0:0]
    for i in range(n):
        for ch in range(c):
            k = (i * groups if per_sample else 0) + ch // cg
            mu, r, wc = mean[k], rstd[k], w[ch]
            o = (i * c + ch) * s
            acc_g = 0.0
            acc_gy = 0.0
            for q in range(o, o + s):
                acc_g += g[q]
                acc_gy += g[q] * (x[q] - mu) * r
            if tb >= 0:
                db[ch] += acc_g
            if tw >= 0:
                dw[ch] += acc_gy
            sg[k] += acc_g * wc
            sgy[k] += acc_gy * wc
    if tx < 0:
        return
    dx = target_buffer(tx, x.size, g1, gaddr, gown)
    for i in range(n):
        for ch in range(c):
            k = (i * groups if per_sample else 0) + ch // cg
            mu, r, wc = mean[k], rstd[k], w[ch]
            m1, m2 = sg[k] / count, sgy[k] / count
            o = (i * c + ch) * s
            for q in range(o, o + s):
                if train:
                    dx[q] += r * (g[q] * wc - m1 - (x[q] - mu) * r * m2)
                else:
                    dx[q] += r * g[q] * wc


# --- batch norm / group norm forward (the eager op on the host and jitgrad.compile's replay) ---
@njit(cache=True, nogil=True, error_model="numpy")
def _norm_into_nb(x, n, c, s, groups, per_sample, train, w, b, has_w, has_b, rm, rv, eps, out, mean, rstd, var):
    """x (n, c, s), flat -> out, and per statistic (see k_batch_norm) mean, rstd (at x's dtype)
    and the biased variance (float64, for batch norm's running statistics). train: the
    statistics from x, accumulated in float64; else mean = rm and rstd = 1 / sqrt(rv + eps)."""
    cg = c // groups
    count = (1 if per_sample else n) * cg * s
    if train:
        acc = np.zeros(mean.size)
        for i in range(n):
            for ch in range(c):
                o = (i * c + ch) * s
                t = 0.0
                for q in range(o, o + s):
                    t += x[q]
                acc[(i * groups if per_sample else 0) + ch // cg] += t
        mu = acc / count
        sq = np.zeros(mean.size)
        for i in range(n):
            for ch in range(c):
                k = (i * groups if per_sample else 0) + ch // cg
                o = (i * c + ch) * s
                t = 0.0
                for q in range(o, o + s):
                    d = x[q] - mu[k]
                    t += d * d
                sq[k] += t
        for k in range(mean.size):
            var[k] = sq[k] / count
            mean[k] = mu[k]
            rstd[k] = 1.0 / np.sqrt(var[k] + eps)
    else:
        for k in range(mean.size):
            mean[k] = rm[k]
            rstd[k] = 1.0 / np.sqrt(np.float64(rv[k]) + eps)
    for i in range(n):
        for ch in range(c):
            k = (i * groups if per_sample else 0) + ch // cg
            mu_k, r = mean[k], rstd[k]
            wc = w[ch] if has_w else 1.0
            bc = b[ch] if has_b else 0.0
            o = (i * c + ch) * s
            for q in range(o, o + s):
                out[q] = (x[q] - mu_k) * r * wc + bc


def _norm_into_np(x, n, c, s, groups, per_sample, train, w, b, has_w, has_b, rm, rv, eps, out, mean, rstd, var):
    cg = c // groups
    x4 = x.reshape(n, groups, cg, s)
    if train:
        x64 = x4.astype(np.float64)
        axes = (2, 3) if per_sample else (0, 2, 3)
        mu = x64.mean(axis=axes, keepdims=True)
        d = x64 - mu
        v = (d * d).mean(axis=axes, keepdims=True)
        var[:] = v.reshape(-1)
        mean[:] = mu.reshape(-1)
        rstd[:] = (1.0 / np.sqrt(v + eps)).reshape(-1)
    else:
        mean[:] = rm
        rstd[:] = 1.0 / np.sqrt(rv.astype(np.float64) + eps)
    shape = (n, groups, 1, 1) if per_sample else (1, groups, 1, 1)
    y = (x4 - mean.reshape(shape)) * rstd.reshape(shape)
    if has_w:
        y = y * w.reshape(1, groups, cg, 1)
    if has_b:
        y = y + b.reshape(1, groups, cg, 1)
    out[:] = y.reshape(-1)


norm_into = _norm_into_np if DISABLE_JIT else _norm_into_nb
