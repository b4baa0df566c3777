"""The nn primitives' forwards on the device, registered in KERNELS as "nn.<name>" for
ops/nn.py to call when its input is a DeviceArray: softmax / log_softmax (and their
gradients), layer_norm, conv2d (with the gather index its backward rule reads),
max_pool2d, embedding and nll_loss. Each returns what the host path of the op computes,
with the same arithmetic (statistics and sums accumulated in float64).

Every kernel loops grid-stride over its items (driver.grid), one thread per item: a
softmax group, a layer_norm row, an output element. The two reductions that must see all
items (nll_loss's sums) run in one block. (gelu, an elementwise op, runs the kernel
generated from its spec's forward formula: KERNELS["ew"].) Errors the host path finds by looking at the
indices (an embedding index or a target out of range) are flagged by the kernels and read
back once, after the launch, to raise PyTorch's error.
"""
import math

import numba
import numpy as np
from numba import cuda

from jitgrad.gpu import driver
from jitgrad.gpu.array import KERNELS, DeviceArray
from jitgrad.gpu.kernels.blas import signature

_I64 = np.dtype(np.int64)


def _contiguous(x):
    return x if x.is_c_contiguous() else x.copy()


def _launch(kernel, n, *args):
    if n:
        blocks, threads = driver.grid(n)
        kernel[blocks, threads](*args)


# --- softmax / log_softmax -----------------------------------------------------------------
@cuda.jit
def _softmax(x, xo, outer, n, inner, out, log):
    """Per group of n (stride inner) of contiguous x: exp(x - max) / sum, or x - max - log(sum)
    (a NaN in the group makes all of it NaN, as on the host)."""
    g = cuda.grid(1)
    while g < outer * inner:
        base = (g // inner) * n * inner + g % inner
        m = x[xo + base]
        for j in range(1, n):
            v = x[xo + base + j * inner]
            if v > m or v != v:
                m = v
                if v != v:
                    break
        s = 0.0
        for j in range(n):
            s += math.exp(x[xo + base + j * inner] - m)
        ls = math.log(s)
        for j in range(n):
            q = base + j * inner
            out[q] = x[xo + q] - m - ls if log else math.exp(x[xo + q] - m) / s
        g += cuda.gridsize(1)


@cuda.jit
def _softmax_grad(g, go, y, yo, outer, n, inner, out, log):
    """softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g), per group."""
    t = cuda.grid(1)
    while t < outer * inner:
        base = (t // inner) * n * inner + t % inner
        s = 0.0
        for j in range(n):
            q = base + j * inner
            s += g[go + q] if log else g[go + q] * y[yo + q]
        for j in range(n):
            q = base + j * inner
            out[q] = g[go + q] - math.exp(y[yo + q]) * s if log else y[yo + q] * (g[go + q] - s)
        t += cuda.gridsize(1)


def softmax(x, groups, log):
    """softmax (log: log_softmax) of x over groups = (outer, n, inner) around the dim."""
    x = _contiguous(x)
    out = DeviceArray.empty(x.shape, x.dtype)
    outer, n, inner = groups
    if n:
        _launch(_softmax, outer * inner, x.buf, x.offset, outer, n, inner, out.buf, log)
    return out


def softmax_grad(grad, y, groups, log):
    """The input's gradient of softmax (log: log_softmax) from the output's, y the result."""
    grad, y = _contiguous(grad), _contiguous(y)
    out = DeviceArray.empty(y.shape, y.dtype)
    outer, n, inner = groups
    if n:
        _launch(_softmax_grad, outer * inner, grad.buf, grad.offset, y.buf, y.offset, outer, n, inner, out.buf, log)
    return out


# --- layer_norm ------------------------------------------------------------------------------
@cuda.jit
def _layer_norm(x, xo, rows, k, w, wo, b, bo, has_w, has_b, eps, out, mean, rstd):
    """Per row of k: mean, variance with correction 0, out = (x - mean) * rstd * w + b."""
    r = cuda.grid(1)
    while r < rows:
        o = xo + r * k
        s = 0.0
        for i in range(k):
            s += x[o + i]
        mu = s / k
        ss = 0.0
        for i in range(k):
            c = x[o + i] - mu
            ss += c * c
        rs = 1.0 / math.sqrt(ss / k + eps)
        mean[r] = mu
        rstd[r] = rs
        for i in range(k):
            v = (x[o + i] - mu) * rs
            if has_w:
                v *= w[wo + i]
            if has_b:
                v += b[bo + i]
            out[r * k + i] = v
        r += cuda.gridsize(1)


def layer_norm(x, k, weight, bias, eps):
    """(out at x's shape, mean (rows,), rstd (rows,)) over trailing groups of k elements;
    weight / bias: DeviceArrays of k elements, or None."""
    x = _contiguous(x)
    rows = x.size // k if k else 0
    out = DeviceArray.empty(x.shape, x.dtype)
    mean = DeviceArray.empty((rows,), x.dtype)
    rstd = DeviceArray.empty((rows,), x.dtype)
    w = x if weight is None else _contiguous(weight)  # x stands in for an absent one: never read
    b = x if bias is None else _contiguous(bias)
    _launch(_layer_norm, rows, x.buf, x.offset, rows, k, w.buf, w.offset, b.buf, b.offset, weight is not None,
            bias is not None, float(eps), out.buf, mean.buf, rstd.buf)
    return out, mean, rstd


# --- conv2d: im2col + one batched gemm ----------------------------------------------------------
# geom, the 17 numbers ops/nn.py and kernels/conv.py share:
#   N, C, H, W, Cout, Cg, kh, kw, sh, sw, pt, pl, dh, dw, G, Ho, Wo
@cuda.jit
def _im2col(x, xo, xst, geom, cols, total, index):
    """cols (G, N, K, L) with K = (c, i, j) of the group's receptive field and L = (oh, ow):
    the input value, 0 in the padding. index: write the flat input position instead (the
    gather index conv's backward rule reads, laid out (G, K, N, L)), N*C*H*W in the padding."""
    n, c, h, w, cg, kh, kw = geom[0], geom[1], geom[2], geom[3], geom[5], geom[6], geom[7]
    sh, sw, pt, pl, dh, dw, ho, wo = geom[8], geom[9], geom[10], geom[11], geom[12], geom[13], geom[15], geom[16]
    big_l = ho * wo
    big_k = cg * kh * kw
    q = cuda.grid(1)
    while q < total:
        ll = q % big_l
        r = q // big_l
        if index:
            s = r % n
            r //= n
            kk = r % big_k
            g = r // big_k
        else:
            kk = r % big_k
            r //= big_k
            s = r % n
            g = r // n
        j = kk % kw
        i = (kk // kw) % kh
        ch = g * cg + kk // (kw * kh)
        ih = (ll // wo) * sh - pt + i * dh
        iw = (ll % wo) * sw - pl + j * dw
        inside = ih >= 0 and ih < h and iw >= 0 and iw < w
        if index:
            cols[q] = ((s * c + ch) * h + ih) * w + iw if inside else n * c * h * w
        else:
            cols[q] = x[xo + s * xst[0] + ch * xst[1] + ih * xst[2] + iw * xst[3]] if inside else 0
        q += cuda.gridsize(1)


def conv2d(x, w, bias, geom):
    """out (N, Cout, Ho, Wo) = bias + per group W_g (M x K) @ cols_g (K x N*L), as one gemm
    batched over (group, sample): the weight broadcasts over the samples and the product is
    written through a strided view straight into out's (N, Cout, Ho, Wo) layout."""
    n, _, _, _, cout, cg, kh, kw, _, _, _, _, _, _, groups, ho, wo = (int(v) for v in geom)
    m, k, big_l = cout // groups, cg * kh * kw, ho * wo
    cols = DeviceArray.empty((groups, n, k, big_l), x.dtype)
    _launch(_im2col, cols.size, x.buf, x.offset, tuple(x.estrides), tuple(int(v) for v in geom), cols.buf,
            cols.size, False)
    out = DeviceArray.empty((n, cout, ho, wo), x.dtype)
    if bias is not None:
        out[...] = bias.reshape(cout, 1, 1)
    weights = _contiguous(w).reshape(groups, 1, m, k)
    KERNELS["gemm"](weights, cols, out.reshape(n, groups, m, big_l).transpose(1, 0, 2, 3), 1.0,
                    0.0 if bias is None else 1.0)
    return out


def conv_gather_index(geom):
    """ops/nn.py's conv_gather_index on the device: (G, K, N*L) int64."""
    n, _, _, _, _, cg, kh, kw, _, _, _, _, _, _, groups, ho, wo = (int(v) for v in geom)
    idx = DeviceArray.empty((groups, cg * kh * kw, n * ho * wo), _I64)
    _launch(_im2col, idx.size, idx.buf, 0, (0, 0, 0, 0), tuple(int(v) for v in geom), idx.buf, idx.size, True)
    return idx


# --- max_pool2d ------------------------------------------------------------------------------
@cuda.jit
def _max_pool(x, xo, pg, out, arg, flat, total):
    """Per output: the max over the window's positions inside the plane, the first one,
    then any greater value or NaN (PyTorch's CPU rule, as the host loop); arg within the
    plane, flat within the whole input."""
    h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo = pg[1], pg[2], pg[3], pg[4], pg[5], pg[6], pg[7], pg[8], pg[9], \
        pg[10], pg[11], pg[12]
    q = cuda.grid(1)
    while q < total:
        p = q // (ho * wo)
        h0 = ((q // wo) % ho) * sh - ph
        w0 = (q % wo) * sw - pw
        best = -math.inf
        at = -1
        for i in range(kh):
            ih = h0 + i * dh
            if ih >= 0 and ih < h:
                for j in range(kw):
                    iw = w0 + j * dw
                    if iw >= 0 and iw < w:
                        v = x[xo + (p * h + ih) * w + iw]
                        if at < 0 or v > best or v != v:
                            best = v
                            at = ih * w + iw
        out[q] = best
        arg[q] = at
        flat[q] = p * h * w + at
        q += cuda.gridsize(1)


def max_pool2d(x, pgeom):
    """(values, argmax within each plane, argmax within the input), flat; pgeom as ops/nn.py's
    (planes, H, W, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo)."""
    x = _contiguous(x)
    pg = tuple(int(v) for v in pgeom)
    total = pg[0] * pg[11] * pg[12]
    out = DeviceArray.empty((total,), x.dtype)
    arg = DeviceArray.empty((total,), _I64)
    flat = DeviceArray.empty((total,), _I64)
    _launch(_max_pool, total, x.buf, x.offset, pg, out.buf, arg.buf, flat.buf, total)
    return out, arg, flat


# --- embedding -------------------------------------------------------------------------------
@cuda.jit
def _embedding(w, wo, ws0, ws1, idx, io, num, dim, out, total, bad):
    """out (n, dim) flat = w[idx]; bad[0] = 1 if an index is out of range. total is
    n * max(dim, 1): with dim 0 each index is still checked."""
    step = max(dim, 1)
    q = cuda.grid(1)
    while q < total:
        j = idx[io + q // step]
        if j < 0 or j >= num:
            bad[0] = 1
        elif dim:
            out[q] = w[wo + j * ws0 + (q % dim) * ws1]
        q += cuda.gridsize(1)


@cuda.jit
def _count(idx, io, n, counts):
    q = cuda.grid(1)
    while q < n:
        cuda.atomic.add(counts, idx[io + q], 1)
        q += cuda.gridsize(1)


@cuda.jit
def _embedding_coef(idx, io, n, padding_idx, counts, freq, coef):
    """Per index: 0 at padding_idx, else 1 / its count (scale_grad_by_freq) or 1."""
    q = cuda.grid(1)
    while q < n:
        j = idx[io + q]
        coef[q] = 0.0 if j == padding_idx else (1.0 / counts[j] if freq else 1.0)
        q += cuda.gridsize(1)


def _flag(n):
    f = DeviceArray.empty((n,), _I64)
    KERNELS["fill"](f, 0)
    return f


def embedding(w, idx, padding_idx, freq, coef_dtype):
    """(rows of w picked by idx, flat (n, dim); idx flat int64 (n,); per index its gradient's
    coefficient, or None for coef_dtype None). An index out of range raises PyTorch's
    IndexError."""
    idx = _contiguous(idx.reshape(-1)).astype(_I64, copy=False)
    n = idx.size
    num, dim = w.shape
    out = DeviceArray.empty((n, dim), w.dtype)
    bad = _flag(1)
    total = n * max(dim, 1)
    _launch(_embedding, total, w.buf, w.offset, w.estrides[0], w.estrides[1], idx.buf, idx.offset, num, dim,
            out.buf, total, bad.buf)
    if bad.get()[0]:
        raise IndexError("index out of range in self")
    if coef_dtype is None:
        return out, idx, None
    counts = _flag(num)
    if freq:
        _launch(_count, n, idx.buf, idx.offset, n, counts.buf)
    coef = DeviceArray.empty((n,), coef_dtype)
    _launch(_embedding_coef, n, idx.buf, idx.offset, n, -1 if padding_idx is None else padding_idx, counts.buf,
            bool(freq), coef.buf)
    return out, idx, coef


@cuda.jit
def _row_norms(w, wo, ws0, ws1, dim, idx, n, p, norms):
    """norms[j] = the p-norm of row idx[j] of w, in float64 (p: inf, -inf, 0 as numpy's)."""
    j = cuda.grid(1)
    while j < n:
        base = wo + idx[j] * ws0
        s = 0.0
        if p == -math.inf:
            s = math.inf
        for c in range(dim):
            v = abs(float(w[base + c * ws1]))
            if p == math.inf:
                s = max(s, v)
            elif p == -math.inf:
                s = min(s, v)
            elif p == 0:
                s += 1.0 if v != 0 else 0.0
            else:
                s += v ** p
        norms[j] = s if p == math.inf or p == -math.inf or p == 0 else s ** (1.0 / p)
        j += cuda.gridsize(1)


@cuda.jit
def _renorm_rows(w, wo, ws0, ws1, dim, idx, n, norms, max_norm, claimed):
    """Rows whose norm exceeds max_norm scaled to max_norm / (norm + 1e-7), each row once
    (the first of its indices to claim it does it)."""
    j = cuda.grid(1)
    while j < n:
        r = idx[j]
        if cuda.atomic.cas(claimed, r, 0, 1) == 0 and norms[j] > max_norm:
            scale = max_norm / (norms[j] + 1e-7)
            for c in range(dim):
                q = wo + r * ws0 + c * ws1
                w[q] = w[q] * scale
        j += cuda.gridsize(1)


def embedding_renorm_(w, idx, max_norm, norm_type):
    """torch.embedding_renorm_ of DeviceArray w (num, dim) in place, for the rows idx uses."""
    idx = _contiguous(idx.reshape(-1)).astype(_I64, copy=False)
    n, (num, dim) = idx.size, w.shape
    norms = DeviceArray.empty((n,), np.float64)
    _launch(_row_norms, n, w.buf, w.offset, w.estrides[0], w.estrides[1], dim, idx.buf[idx.offset:], n,
            float(norm_type), norms.buf)
    _launch(_renorm_rows, n, w.buf, w.offset, w.estrides[0], w.estrides[1], dim, idx.buf[idx.offset:], n, norms.buf,
            float(max_norm), _flag(num).buf)


# --- nll_loss --------------------------------------------------------------------------------
@cuda.jit
def _nll(x, xo, xs0, xs1, t, to, n, ncls, cw, cwo, has_w, ignore, losses, w, safe, bounds):
    """Per sample: the target (0 where ignored) and its weight (class weight, 0 where
    ignored), loss -x[i, t] * w; bounds gets the least and greatest target that counts."""
    i = cuda.grid(1)
    while i < n:
        tt = t[to + i]
        valid = tt != ignore
        s = tt if valid else 0
        if valid:
            cuda.atomic.min(bounds, 0, s)
            cuda.atomic.max(bounds, 1, s)
        if s < 0 or s >= ncls:
            s = 0  # out of range: raised once the kernel is done
        wi = (cw[cwo + s] if has_w else 1.0) if valid else 0.0
        safe[i] = s
        w[i] = wi
        losses[i] = -(x[xo + i * xs0 + s * xs1] * wi)
        i += cuda.gridsize(1)


# the most threads the one-block reduction uses (its shared memory is sized for them)
_REDUCE_THREADS = 256


@cuda.jit
def _nll_reduce(losses, w, n, mean, out, coef):
    """One block: out = sum(losses) (/ sum(w) for the mean), coef = w (/ sum(w)). With
    every target ignored the mean's total is 0: NaN, as the host's 0 / 0."""
    part = cuda.shared.array((2, _REDUCE_THREADS), numba.float64)
    tid = cuda.threadIdx.x
    sl = 0.0
    sw = 0.0
    i = tid
    while i < n:
        sl += losses[i]
        sw += w[i]
        i += cuda.blockDim.x
    part[0, tid] = sl
    part[1, tid] = sw
    cuda.syncthreads()
    if tid == 0:
        for k in range(1, cuda.blockDim.x):
            sl += part[0, k]
            sw += part[1, k]
        part[0, 0] = sl
        part[1, 0] = sw
    cuda.syncthreads()
    total = part[1, 0]
    if tid == 0:
        out[0] = (part[0, 0] / total if total != 0 else math.nan) if mean else part[0, 0]
    i = tid
    while i < n:
        coef[i] = (w[i] / total if total != 0 else math.nan) if mean else w[i]
        i += cuda.blockDim.x


def nll_loss(x, target, weight, ignore_index, reduction):
    """(loss, per-sample gradient coefficient, targets with the ignored ones as 0) of x (N, C),
    as the host path of ops/nn.py's nll_loss; a target out of range raises its IndexError."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    n, ncls = x.shape
    t = _contiguous(target.reshape(-1))
    cw = x if weight is None else _contiguous(weight.astype(x.dtype, copy=False))
    losses = DeviceArray.empty((n,), x.dtype)
    w = DeviceArray.empty((n,), x.dtype)
    safe = DeviceArray.empty((n,), _I64)
    bounds = DeviceArray.from_host(np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min]))
    _launch(_nll, n, x.buf, x.offset, x.estrides[0], x.estrides[1], t.buf, t.offset, n, ncls, cw.buf, cw.offset,
            weight is not None, int(ignore_index), losses.buf, w.buf, safe.buf, bounds.buf)
    lo, hi = (int(v) for v in bounds.get())
    if hi >= ncls or (lo <= hi and lo < 0):
        raise IndexError(f"Target {hi if hi >= ncls else lo} is out of bounds.")
    if reduction == "none":
        return losses, w, safe
    out = DeviceArray.empty((), x.dtype)
    coef = DeviceArray.empty((n,), x.dtype)
    _nll_reduce[1, min(_REDUCE_THREADS, driver.grid(max(n, 1))[1])](losses.buf, w.buf, n, reduction == "mean",
                                                                    out.buf, coef.buf)
    return out, coef, safe


KERNELS.update({"nn.softmax": softmax, "nn.softmax_grad": softmax_grad,
                "nn.layer_norm": layer_norm, "nn.conv2d": conv2d, "nn.conv_gather_index": conv_gather_index,
                "nn.max_pool2d": max_pool2d, "nn.embedding": embedding, "nn.embedding_renorm_": embedding_renorm_, "nn.nll_loss": nll_loss})

_F = (np.float32, np.float64)
_B = ("s", np.bool_)
_F8 = ("s", np.float64)
# the argument types each kernel is launched with (gpu/ptx.py compiles them): floats, int64
# indices; shape tuples at the ranks the launchers pass
PTX_SIGNATURES = {
    _softmax: [signature(f, "i", "i", "i", "i", f, _B) for f in _F],
    _softmax_grad: [signature(f, "i", f, "i", "i", "i", "i", f, _B) for f in _F],
    _layer_norm: [signature(f, "i", "i", "i", f, "i", f, "i", _B, _B, _F8, f, f, f) for f in _F],
    _im2col: [signature(d, "i", 4, 17, d, "i", _B) for d in _F + (np.int64,)],
    _max_pool: [signature(f, "i", 13, f, _I64, _I64, "i") for f in _F],
    _embedding: [signature(d, "i", "i", "i", _I64, "i", "i", "i", d, "i", _I64)
                 for d in _F + (np.int64, np.int32)],
    _count: [signature(_I64, "i", "i", _I64)],
    _row_norms: [signature(d, "i", "i", "i", "i", _I64, "i", _F8, np.float64) for d in _F],
    _renorm_rows: [signature(d, "i", "i", "i", "i", _I64, "i", np.float64, _F8, _I64) for d in _F],
    _embedding_coef: [signature(_I64, "i", "i", "i", _I64, _B, f) for f in _F],
    _nll: [signature(f, "i", "i", "i", _I64, "i", "i", "i", f, "i", _B, "i", f, f, _I64, _I64) for f in _F],
    _nll_reduce: [signature(f, f, "i", _B, f, f) for f in _F],
}
