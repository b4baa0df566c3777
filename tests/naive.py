"""Slow, obvious reference implementations of backward (vector-Jacobian products).

Each ``*_backward`` function takes the forward's inputs (numpy arrays) and the gradient of
the output ``g`` and returns the gradient of every differentiable input, as numpy float64
arrays.  They are written to be read, not to be fast: plain Python loops over every element
(``np.ndindex``), each output element's contribution accumulated into the input positions it
came from.  Nothing here uses torch or jitgrad, nor any of jitgrad's rules: numpy serves only
as an n-dimensional container (plus ``math.exp``/``math.sqrt``), so a disagreement with
jitgrad is evidence about jitgrad.

Conventions: ``dim`` arguments accept negative values; ``None`` reduces over every dim.
Keep the inputs small: the loops are O(elements) in Python (conv2d is seven nested loops).
"""
import math

import numpy as np

# ----------------------------------------------------------------------------- helpers


def _dims(dim, ndim):
    """The reduced dims as a sorted tuple of non-negative ints (None: all of them)."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(sorted(d % ndim if ndim else 0 for d in dim))


def _reduced_index(idx, dims, keepdim):
    """The position in a reduction's output that input position idx contributes to."""
    if keepdim:
        return tuple(0 if d in dims else i for d, i in enumerate(idx))
    return tuple(i for d, i in enumerate(idx) if d not in dims)


def _zeros(shape):
    return np.zeros(tuple(shape), dtype=np.float64)


def _broadcast_source(out_idx, in_shape):
    """The input position read for output position out_idx when in_shape is broadcast to the
    output (numpy/torch broadcasting: dims aligned on the right, size-1 dims repeated)."""
    lead = len(out_idx) - len(in_shape)
    return tuple(0 if size == 1 else out_idx[lead + d] for d, size in enumerate(in_shape))


def sum_to_shape(g, shape):
    """The backward of broadcasting (or of expand) an array of ``shape`` to ``g.shape``:
    every output element is added into the input element it was copied from."""
    out = _zeros(shape)
    for idx in np.ndindex(*g.shape):
        out[_broadcast_source(idx, shape)] += g[idx]
    return out


def _slices_along(shape, dim):
    """For each position of the other dims, the list of full positions along ``dim``."""
    dim = dim % len(shape)
    rest_shape = shape[:dim] + shape[dim + 1:]
    for rest in np.ndindex(*rest_shape):
        yield [rest[:dim] + (k,) + rest[dim:] for k in range(shape[dim])]


# ----------------------------------------------------------------------------- reductions


def sum_backward(x, g, dim=None, keepdim=False):
    """y = x.sum(dim, keepdim): every input element receives the gradient of its output."""
    dims = _dims(dim, x.ndim)
    gx = _zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        gx[idx] = g[_reduced_index(idx, dims, keepdim)]
    return gx


def mean_backward(x, g, dim=None, keepdim=False):
    """y = x.mean(dim, keepdim): the gradient of the output, shared by the n averaged elements."""
    dims = _dims(dim, x.ndim)
    n = 1
    for d in dims:
        n *= x.shape[d]
    gx = _zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        gx[idx] = g[_reduced_index(idx, dims, keepdim)] / n
    return gx


def _extreme_backward(x, g, dim, keepdim, better):
    dims = _dims(dim, x.ndim)
    best = {}                       # output position -> extreme value
    for idx in np.ndindex(*x.shape):
        r = _reduced_index(idx, dims, keepdim)
        if r not in best or better(x[idx], best[r]):
            best[r] = x[idx]
    ties = {}                       # output position -> how many elements equal the extreme
    for idx in np.ndindex(*x.shape):
        r = _reduced_index(idx, dims, keepdim)
        if x[idx] == best[r]:
            ties[r] = ties.get(r, 0) + 1
    gx = _zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        r = _reduced_index(idx, dims, keepdim)
        if x[idx] == best[r]:
            gx[idx] = g[r] / ties[r]  # ties split the gradient evenly (torch's amax/amin rule)
    return gx


def amax_backward(x, g, dim=None, keepdim=False):
    """y = x.amax(dim, keepdim): the gradient goes to the maxima, split evenly among ties."""
    return _extreme_backward(x, g, dim, keepdim, lambda a, b: a > b)


def amin_backward(x, g, dim=None, keepdim=False):
    """y = x.amin(dim, keepdim): the gradient goes to the minima, split evenly among ties."""
    return _extreme_backward(x, g, dim, keepdim, lambda a, b: a < b)


def argmax_along(x, dim, better=lambda a, b: a > b):
    """For every slice along dim, the index of its first extreme element (a dict keyed by the
    position of the other dims)."""
    out = {}
    dim = dim % x.ndim
    for positions in _slices_along(x.shape, dim):
        best = 0
        for k, p in enumerate(positions):
            if better(x[p], x[positions[best]]):
                best = k
        rest = positions[0][:dim] + positions[0][dim + 1:]
        out[rest] = best
    return out


def max_dim_backward(x, g, dim, keepdim=False, indices=None, mode="max"):
    """values of x.max(dim, keepdim) (or .min): the whole gradient to the selected index.

    indices: the selected index per slice (an int array shaped like the output); by default
    the first maximum (minimum) of each slice."""
    dim = dim % x.ndim
    better = (lambda a, b: a > b) if mode == "max" else (lambda a, b: a < b)
    first = argmax_along(x, dim, better)
    gx = _zeros(x.shape)
    for positions in _slices_along(x.shape, dim):
        rest = positions[0][:dim] + positions[0][dim + 1:]
        out_pos = rest[:dim] + (0,) + rest[dim:] if keepdim else rest
        k = first[rest] if indices is None else int(indices[out_pos])
        gx[positions[k]] += g[out_pos]
    return gx


def prod_backward(x, g, dim=None, keepdim=False):
    """y = x.prod(dim, keepdim): d y / d x_i is the product of the *other* elements of x_i's
    group, computed as exactly that product (so zeros in x need no special case)."""
    dims = _dims(dim, x.ndim)
    gx = _zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        r = _reduced_index(idx, dims, keepdim)
        others = 1.0
        for jdx in np.ndindex(*x.shape):
            if jdx != idx and _reduced_index(jdx, dims, keepdim) == r:
                others *= x[jdx]
        gx[idx] = g[r] * others
    return gx


def trace_backward(x, g):
    """y = trace(x) of a 2-D x: the gradient lands on the diagonal."""
    gx = _zeros(x.shape)
    for i in range(min(x.shape)):
        gx[i, i] = g[()]
    return gx


# ----------------------------------------------------------------------------- products


def matmul_backward(a, b, g):
    """y = a @ b with torch.matmul's semantics (1-D operands get a dim of 1 prepended (a) or
    appended (b) that is removed from the result; batch dims broadcast):
    y[.., i, j] = sum_k a[.., i, k] * b[.., k, j].  Also mm, mv, dot and bmm."""
    a2 = a if a.ndim > 1 else a.reshape(1, -1)
    b2 = b if b.ndim > 1 else b.reshape(-1, 1)
    n, kdim = a2.shape[-2:]
    m = b2.shape[-1]
    batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    g2 = np.asarray(g, dtype=np.float64).reshape(batch + (n, m))
    ga, gb = _zeros(a2.shape), _zeros(b2.shape)
    for bi in np.ndindex(*batch):
        ai = _broadcast_source(bi, a2.shape[:-2])
        bj = _broadcast_source(bi, b2.shape[:-2])
        for i in range(n):
            for j in range(m):
                for k in range(kdim):
                    ga[ai + (i, k)] += g2[bi + (i, j)] * b2[bj + (k, j)]
                    gb[bj + (k, j)] += g2[bi + (i, j)] * a2[ai + (i, k)]
    return ga.reshape(a.shape), gb.reshape(b.shape)


mm_backward = mv_backward = dot_backward = bmm_backward = matmul_backward


def addmm_backward(inp, m1, m2, g, beta=1.0, alpha=1.0):
    """y = beta * inp + alpha * (m1 @ m2), inp broadcast to (n, m)."""
    g_inp = beta * sum_to_shape(g, inp.shape)
    g1, g2 = matmul_backward(m1, m2, g)
    return g_inp, alpha * g1, alpha * g2


# ----------------------------------------------------------------------------- shape


def permute_backward(x, g, dims):
    """y = x.permute(dims): y[j] = x[k] with k[dims[i]] = j[i]."""
    dims = [d % x.ndim for d in dims]
    gx = _zeros(x.shape)
    for j in np.ndindex(*g.shape):
        k = [0] * x.ndim
        for i, d in enumerate(dims):
            k[d] = j[i]
        gx[tuple(k)] += g[j]
    return gx


def transpose_backward(x, g, dim0, dim1):
    dims = list(range(x.ndim))
    d0, d1 = dim0 % x.ndim, dim1 % x.ndim
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute_backward(x, g, dims)


def expand_backward(x, g):
    """y = x.expand(g.shape): every copy sends its gradient back to the element it copies."""
    return sum_to_shape(g, x.shape)


def cat_backward(xs, g, dim=0):
    """y = cat(xs, dim): each output element belongs to exactly one input, at an offset."""
    dim = dim % g.ndim
    grads = [_zeros(x.shape) for x in xs]
    for idx in np.ndindex(*g.shape):
        pos = idx[dim]
        for x, gx in zip(xs, grads):
            if pos < x.shape[dim]:
                gx[idx[:dim] + (pos,) + idx[dim + 1:]] = g[idx]
                break
            pos -= x.shape[dim]
    return grads


def stack_backward(xs, g, dim=0):
    """y = stack(xs, dim): y[.., k, ..] is xs[k]."""
    dim = dim % g.ndim
    grads = [_zeros(x.shape) for x in xs]
    for idx in np.ndindex(*g.shape):
        k = idx[dim]
        grads[k][idx[:dim] + idx[dim + 1:]] = g[idx]
    return grads


def index_backward(x, g, key):
    """y = x[key] for any numpy-style key (integers, slices, integer arrays, boolean masks):
    the forward is replayed on an array of flat positions, so each output element names the
    input element it was read from; its gradient is added there (repeated indices add up)."""
    source = np.arange(x.size).reshape(x.shape)[key]
    gx = np.zeros(x.size, dtype=np.float64)
    for o in np.ndindex(*np.shape(source)):
        gx[source[o]] += g[o]
    return gx.reshape(x.shape)


# ----------------------------------------------------------------------------- softmax


def softmax_forward(x, dim):
    y = _zeros(x.shape)
    for positions in _slices_along(x.shape, dim):
        top = max(x[p] for p in positions)
        e = [math.exp(x[p] - top) for p in positions]
        total = sum(e)
        for p, v in zip(positions, e):
            y[p] = v / total
    return y


def softmax_backward(x, g, dim):
    """y = softmax(x, dim): d y_j / d x_i = y_j * (delta_ij - y_i), summed over j with g_j."""
    y = softmax_forward(x, dim)
    gx = _zeros(x.shape)
    for positions in _slices_along(x.shape, dim):
        for pi in positions:
            total = 0.0
            for pj in positions:
                delta = 1.0 if pi == pj else 0.0
                total += g[pj] * y[pj] * (delta - y[pi])
            gx[pi] = total
    return gx


def log_softmax_backward(x, g, dim):
    """y = log_softmax(x, dim): d y_j / d x_i = delta_ij - softmax_i, summed over j with g_j."""
    s = softmax_forward(x, dim)
    gx = _zeros(x.shape)
    for positions in _slices_along(x.shape, dim):
        for pi in positions:
            total = 0.0
            for pj in positions:
                delta = 1.0 if pi == pj else 0.0
                total += g[pj] * (delta - s[pi])
            gx[pi] = total
    return gx


# ----------------------------------------------------------------------------- conv / pool


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def conv2d_output_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def conv2d_forward(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Cross-correlation of x (N, C, H, W) with w (O, C/groups, KH, KW): seven nested loops."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    N, C, H, W = x.shape
    Cout, Cg, KH, KW = w.shape
    Og = Cout // groups
    OH, OW = conv2d_output_size(H, KH, sh, ph, dh), conv2d_output_size(W, KW, sw, pw, dw)
    y = _zeros((N, Cout, OH, OW))
    for n in range(N):
        for o in range(Cout):
            for oh in range(OH):
                for ow in range(OW):
                    acc = 0.0 if b is None else b[o]
                    for c in range(Cg):
                        for kh in range(KH):
                            for kw in range(KW):
                                ih, iw = oh * sh - ph + kh * dh, ow * sw - pw + kw * dw
                                if 0 <= ih < H and 0 <= iw < W:
                                    acc += x[n, (o // Og) * Cg + c, ih, iw] * w[o, c, kh, kw]
                    y[n, o, oh, ow] = acc
    return y


def conv2d_backward(x, w, g, stride=1, padding=0, dilation=1, groups=1, bias=True):
    """Gradients (x, w, bias) of conv2d: the same seven loops, each product
    x[n, c, ih, iw] * w[o, c', kh, kw] sending g[n, o, oh, ow] to both of its factors."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    N, C, H, W = x.shape
    Cout, Cg, KH, KW = w.shape
    Og = Cout // groups
    OH, OW = g.shape[2], g.shape[3]
    gx, gw, gb = _zeros(x.shape), _zeros(w.shape), _zeros((Cout,))
    for n in range(N):
        for o in range(Cout):
            for oh in range(OH):
                for ow in range(OW):
                    gb[o] += g[n, o, oh, ow]
                    for c in range(Cg):
                        for kh in range(KH):
                            for kw in range(KW):
                                ih, iw = oh * sh - ph + kh * dh, ow * sw - pw + kw * dw
                                if 0 <= ih < H and 0 <= iw < W:
                                    ci = (o // Og) * Cg + c
                                    gx[n, ci, ih, iw] += g[n, o, oh, ow] * w[o, c, kh, kw]
                                    gw[o, c, kh, kw] += g[n, o, oh, ow] * x[n, ci, ih, iw]
    return (gx, gw, gb) if bias else (gx, gw)


def max_pool2d_backward(x, g, kernel_size, stride=None, padding=0, dilation=1):
    """max_pool2d of x (N, C, H, W), floor mode: each window's gradient goes to the first
    (row-major) maximum inside the input (padding never wins); overlapping windows add up."""
    (KH, KW) = _pair(kernel_size)
    (sh, sw) = _pair(kernel_size if stride is None else stride)
    (ph, pw), (dh, dw) = _pair(padding), _pair(dilation)
    N, C, H, W = x.shape
    OH, OW = conv2d_output_size(H, KH, sh, ph, dh), conv2d_output_size(W, KW, sw, pw, dw)
    assert g.shape == (N, C, OH, OW), (g.shape, (N, C, OH, OW))
    gx = _zeros(x.shape)
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    best = None
                    for kh in range(KH):
                        for kw in range(KW):
                            ih, iw = oh * sh - ph + kh * dh, ow * sw - pw + kw * dw
                            if 0 <= ih < H and 0 <= iw < W:
                                if best is None or x[n, c, ih, iw] > x[n, c, best[0], best[1]]:
                                    best = (ih, iw)
                    gx[n, c, best[0], best[1]] += g[n, c, oh, ow]
    return gx


# ----------------------------------------------------------------------------- nn


def layer_norm_backward(x, normalized_shape, w, g, eps=1e-5):
    """y = (x - mean) / sqrt(var + eps) * w + b over the trailing normalized_shape (biased var).

    Per normalized group of M elements, with s = 1 / sqrt(var + eps) and xhat = (x - mean) * s:
    d y_i / d x_j = w_i * s * (delta_ij - 1/M - xhat_i * xhat_j / M).
    Returns (gx, gw, gb); w may be None (then gw, gb are None)."""
    inner = tuple(normalized_shape)
    outer = x.shape[:x.ndim - len(inner)]
    M = 1
    for s in inner:
        M *= s
    gx = _zeros(x.shape)
    gw, gb = _zeros(inner), _zeros(inner)
    for o in np.ndindex(*outer):
        pos = [o + i for i in np.ndindex(*inner)]
        mean = sum(x[p] for p in pos) / M
        var = sum((x[p] - mean) ** 2 for p in pos) / M
        s = 1.0 / math.sqrt(var + eps)
        xhat = [(x[p] - mean) * s for p in pos]
        wv = [1.0 if w is None else w[p[len(outer):]] for p in pos]
        for j, pj in enumerate(pos):
            total = 0.0
            for i, pi in enumerate(pos):
                delta = 1.0 if i == j else 0.0
                total += g[pi] * wv[i] * s * (delta - 1.0 / M - xhat[i] * xhat[j] / M)
            gx[pj] = total
        for i, pi in enumerate(pos):
            gw[pi[len(outer):]] += g[pi] * xhat[i]
            gb[pi[len(outer):]] += g[pi]
    return (gx, None, None) if w is None else (gx, gw, gb)


def embedding_backward(indices, weight_shape, g, padding_idx=None):
    """y = weight[indices]: each looked-up row's gradient added to its row, except the
    padding_idx row (negative padding_idx counts from the end), which gets none."""
    num = weight_shape[0]
    if padding_idx is not None and padding_idx < 0:
        padding_idx += num
    gw = _zeros(weight_shape)
    for pos in np.ndindex(*np.shape(indices)):
        row = int(indices[pos])
        if row == padding_idx:
            continue
        for k in range(weight_shape[1]):
            gw[row, k] += g[pos + (k,)]
    return gw


def nll_loss_backward(inp, target, g, weight=None, ignore_index=-100, reduction="mean"):
    """nll_loss of log-probabilities inp (C,), (N, C) or (N, C, d1, ...): each sample's loss is
    -weight[t] * inp[n, t, ...]; samples whose target is ignore_index contribute nothing.
    'mean' divides by the summed weights of the counted samples."""
    if inp.ndim == 1:                       # unbatched: one sample
        inp2, target2 = inp.reshape(1, -1), np.asarray(target).reshape(1)
        g2 = np.asarray(g).reshape(1) if reduction == "none" else g
        return nll_loss_backward(inp2, target2, g2, weight, ignore_index, reduction).reshape(inp.shape)
    C = inp.shape[1]
    wts = [1.0] * C if weight is None else [float(v) for v in weight]
    samples = [pos for pos in np.ndindex(*target.shape)]   # (n, d1, ...)
    total_weight = sum(wts[int(target[p])] for p in samples if int(target[p]) != ignore_index)
    gx = _zeros(inp.shape)
    for p in samples:
        t = int(target[p])
        if t == ignore_index:
            continue
        where = (p[0], t) + p[1:]
        if reduction == "none":
            gx[where] = -wts[t] * g[p]
        elif reduction == "sum":
            gx[where] = -wts[t] * g[()]
        else:
            gx[where] = -wts[t] * g[()] / total_weight
    return gx
