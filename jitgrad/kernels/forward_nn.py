"""Forward kernels of the nn family for jitgrad.compile's replay (conventions: kernels/forward.py).

Each reads the int / float params its op's backward row has and runs the arithmetic the
eager op runs (layer norm, convolution and max pooling share their loops with it:
kernels/norm.py, kernels/conv.py). What the eager op finds out from the data it is
given (nll_loss's targets, embedding's indices out of range) is checked here again at
every replay, with the eager op's error.
"""
import numpy as np

from jitgrad._core.layout import F_NIN, FW, V_ADDR, V_DT, VD_I64, VW
from jitgrad.kernels.common import jit
from jitgrad.kernels.conv import conv_forward_into, max_pool_into
from jitgrad.kernels.forward import arg, fpp, ip, made, res, shp, val, val_i64
from jitgrad.kernels.norm import layer_norm_into, norm_into, softmax_into
from jitgrad.kernels.pointers import view
from jitgrad.kernels.pool import avg_pool_into

I32 = np.zeros(0, np.int32)


@jit
def index_into(vals, vid, out):
    """Copy integer value vid (int64 or int32) into the int64 array out."""
    n = out.size
    if vals[vid * VW + V_DT] == VD_I64:
        src = val_i64(vals, vid)
        for j in range(n):
            out[j] = src[j]
    else:
        src32 = view(vals[vid * VW + V_ADDR], n, I32)
        for j in range(n):
            out[j] = src32[j]


# --- softmax / log_softmax: iparams (outer, n, inner, dim); saves the result -----------------
@jit
def _normalise(i, prog, fin, vals, xs, fp, like, log):
    p = ip(prog, i)
    outer, n, inner = xs[p + 1], xs[p + 2], xs[p + 3]
    x = val(vals, arg(prog, fin, i, 0), like)
    if x.size:
        softmax_into(x, outer, n, inner, val(vals, res(prog, fin, i, 0), like), log)


@jit
def f_softmax(i, prog, fin, vals, xs, fp, like):
    _normalise(i, prog, fin, vals, xs, fp, like, False)


@jit
def f_log_softmax(i, prog, fin, vals, xs, fp, like):
    _normalise(i, prog, fin, vals, xs, fp, like, True)


# --- layer_norm: inputs (input, weight, bias), iparams (k, has_w, has_b), fp eps ----------------
@jit
def f_layer_norm(i, prog, fin, vals, xs, fp, like):
    """The output and the saved mean and rstd (torch's result1 / result2)."""
    p = ip(prog, i)
    k, has_w, has_b = xs[p + 1], xs[p + 2], xs[p + 3]
    x = val(vals, arg(prog, fin, i, 0), like)
    w = val(vals, arg(prog, fin, i, 1), like)
    b = val(vals, arg(prog, fin, i, 2), like)
    rows = x.size // k if k else 0
    mean = val(vals, res(prog, fin, i, 2), like) if made(prog, i, 1) else np.empty(rows, x.dtype)
    rstd = val(vals, res(prog, fin, i, 3), like) if made(prog, i, 2) else np.empty(rows, x.dtype)
    layer_norm_into(x, k, w, b, has_w == 1, has_b == 1, fp[fpp(prog, i)], val(vals, res(prog, fin, i, 0), like),
                    mean, rstd)


# --- embedding: inputs (weight, indices), iparams (dim, padding_idx, freq) ----------------------
@jit
def f_embedding(i, prog, fin, vals, xs, fp, like):
    """Rows of the weight picked by the indices; saves the indices (flat, int64) and each
    one's gradient coefficient (0 at padding_idx, 1/count with scale_grad_by_freq)."""
    p = ip(prog, i)
    dim, pad, freq = xs[p + 1], xs[p + 2], xs[p + 3]
    wid = arg(prog, fin, i, 0)
    num = xs[shp(vals, wid) + 1]
    w = val(vals, wid, like)
    flat_id = res(prog, fin, i, 1)
    if made(prog, i, 0):
        index_into(vals, arg(prog, fin, i, 1), val_i64(vals, flat_id))
    flat = val_i64(vals, flat_id)
    n = flat.size
    for j in range(n):
        if flat[j] < 0 or flat[j] >= num:
            raise IndexError("index out of range in self")
    out = val(vals, res(prog, fin, i, 0), like)
    for j in range(n):
        o = flat[j] * dim
        s = j * dim
        for q in range(dim):
            out[s + q] = w[o + q]
    if not made(prog, i, 1):
        return
    coef = val(vals, res(prog, fin, i, 2), like)
    if freq:
        count = np.zeros(num, np.int64)
        for j in range(n):
            count[flat[j]] += 1
        for j in range(n):
            coef[j] = 1.0 / count[flat[j]]
    else:
        coef[:] = 1.0
    if pad >= 0:
        for j in range(n):
            if flat[j] == pad:
                coef[j] = 0.0


# --- nll_loss: inputs (input, target[, weight]), iparams (ncls, per_row, mean, ignore_index) ----
@jit
def f_nll(i, prog, fin, vals, xs, fp, like):
    """-weight[t] * input[n, t] per sample (t = target[n]; weight 0 where t is ignore_index),
    summed, or over the total weight (mean), or per sample ('none'); saves the targets
    with ignored ones as 0 and each sample's gradient coefficient (the weight, over the
    total for the mean), in the eager op's order of operations."""
    p = ip(prog, i)
    ncls, per_row, mean, ignore = xs[p + 1], xs[p + 2], xs[p + 3], xs[p + 4]
    x = val(vals, arg(prog, fin, i, 0), like)
    has_weight = prog[i * FW + F_NIN] == 3
    weight = val(vals, arg(prog, fin, i, 2), like) if has_weight else x[0:0]
    safe = val_i64(vals, res(prog, fin, i, 1))
    index_into(vals, arg(prog, fin, i, 1), safe)
    n = safe.size
    lo = 0
    hi = 0
    valid = False
    for j in range(n):
        if safe[j] != ignore:
            valid = True
            lo = min(lo, safe[j])
            hi = max(hi, safe[j])
    if valid and (lo < 0 or hi >= ncls):
        raise IndexError("Target " + str(hi if hi >= ncls else lo) + " is out of bounds.")
    coef = val(vals, res(prog, fin, i, 2), like)
    out = val(vals, res(prog, fin, i, 0), like)
    total = np.float64(0.0)  # numpy's division (0 / 0 is NaN) without the JIT too
    acc = np.float64(0.0)
    for j in range(n):
        c = 1.0
        if safe[j] == ignore:
            safe[j] = 0
            c = 0.0
        t = safe[j]
        coef[j] = c * weight[t] if has_weight else c
        loss = -(x[j * ncls + t] * coef[j])
        total += coef[j]
        acc += loss
        if per_row:
            out[j] = loss
    if per_row:
        return
    if mean:
        out[0] = acc / total
        for j in range(n):
            coef[j] = coef[j] / total
    else:
        out[0] = acc


# --- convolution: inputs (input, weight[, bias]), iparams the geometry (kernels/conv.py) --------
@jit
def f_conv(i, prog, fin, vals, xs, fp, like):
    p = ip(prog, i)
    geom = xs[p + 1:p + 18]
    x = val(vals, arg(prog, fin, i, 0), like)
    w = val(vals, arg(prog, fin, i, 1), like)
    has_bias = prog[i * FW + F_NIN] == 3
    b = val(vals, arg(prog, fin, i, 2), like) if has_bias else x[0:0]
    conv_forward_into(x, w, b, has_bias, geom, val(vals, res(prog, fin, i, 0), like))


# --- max_pool2d: iparams the pooling geometry (kernels/conv.py's pgeom) ---------------------------
@jit
def f_max_pool2d(i, prog, fin, vals, xs, fp, like):
    """The maxima; saves the argmax as an index into the whole input, and writes the
    argmax within each plane (the indices max_pool2d returns) as the extra output."""
    p = ip(prog, i)
    pgeom = xs[p + 1:p + 14]
    planes, h, w, ho, wo = pgeom[0], pgeom[1], pgeom[2], pgeom[11], pgeom[12]
    at = val_i64(vals, res(prog, fin, i, 2))
    max_pool_into(val(vals, arg(prog, fin, i, 0), like), pgeom, val(vals, res(prog, fin, i, 0), like), at)
    if made(prog, i, 0):
        flat = val_i64(vals, res(prog, fin, i, 1))
        per = ho * wo
        for q in range(planes * per):
            flat[q] = at[q] + (q // per) * (h * w)


# --- batch_norm / group_norm: inputs (input, weight, bias[, running_mean, running_var]), -------
# iparams (n, c, s, groups, per_sample, train, has_w, has_b), fp eps
@jit
def f_batch_norm(i, prog, fin, vals, xs, fp, like):
    """The output and the saved mean and rstd (result1 / result2); in eval (train 0) the
    statistics come from the running ones, the instruction's inputs 3 and 4."""
    p = ip(prog, i)
    n, c, s, groups = xs[p + 1], xs[p + 2], xs[p + 3], xs[p + 4]
    per_sample, train, has_w, has_b = xs[p + 5], xs[p + 6], xs[p + 7], xs[p + 8]
    x = val(vals, arg(prog, fin, i, 0), like)
    w = val(vals, arg(prog, fin, i, 1), like)
    b = val(vals, arg(prog, fin, i, 2), like)
    nstat = groups * (n if per_sample else 1)
    rm = val(vals, arg(prog, fin, i, 3), like) if train == 0 else x[0:0]
    rv = val(vals, arg(prog, fin, i, 4), like) if train == 0 else x[0:0]
    mean = val(vals, res(prog, fin, i, 2), like) if made(prog, i, 1) else np.empty(nstat, x.dtype)
    rstd = val(vals, res(prog, fin, i, 3), like) if made(prog, i, 2) else np.empty(nstat, x.dtype)
    norm_into(x, n, c, s, groups, per_sample, train == 1, w, b, has_w == 1, has_b == 1, rm, rv,
              fp[fpp(prog, i)], val(vals, res(prog, fin, i, 0), like), mean, rstd, np.empty(nstat))


# --- avg_pool2d / adaptive_avg_pool2d: iparams the windows (kernels/pool.py) ---------------------
@jit
def f_avg_pool(i, prog, fin, vals, xs, fp, like):
    p = ip(prog, i)
    avg_pool_into(val(vals, arg(prog, fin, i, 0), like), xs[p + 1:p + 1 + xs[p]], val(vals, res(prog, fin, i, 0), like))
