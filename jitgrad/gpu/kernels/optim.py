"""The optimizers' updates on the device: one launch updates every parameter of a group.

The same per-element arithmetic as kernels/optim.py (torch's order of operations, every
scalar computed in Python floats and given in the parameter's dtype in `sc`), so a CUDA
step matches the CPU one. The launch gets a table of device addresses, one row per
parameter (its size, then the addresses of param, grad and state arrays, which
`_view` reads), so a group of any number of parameters costs one launch,
two small uploads (the table and the scalars) and no per-parameter Python past filling
them. Threads stride over each parameter's elements in turn: the rows are few (one per
parameter), and a thread beyond a small parameter's size skips it.
"""
import math

import numpy as np
from numba import cuda, types
from numba.cuda.extending import intrinsic

from jitgrad.gpu import driver, pointers
from jitgrad.gpu.array import KERNELS


@intrinsic
def _device_ptr(typingctx, addr, n, like):
    """On the GPU, n elements of like's dtype at `addr` as a typed pointer: the kernels only
    index it, which reads and writes as an array would. (gpu/pointers.view wraps the pointer
    in an array through an overload, which compile_ptx cannot type without a GPU; this keeps
    the kernels checkable to PTX anywhere.)"""
    ptrty = types.CPointer(like.dtype)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptrty))
    return ptrty(addr, n, like), codegen


_view = pointers.host_view if driver.simulated() else _device_ptr

# the tables, flattened row by row (device buffers are 1-D): a row's int64 entries, its scalars
ADAM_ROW, ADAM_SCALARS = 6, 8
SGD_ROW, SGD_SCALARS = 4, 5
RMSPROP_ROW, RMSPROP_SCALARS = 6, 7


@cuda.jit
def _adam_all(rows, sc, like, decoupled, amsgrad, maximize):
    """Row p: size, then the param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq addresses;
    its scalars: 1 - beta1, beta2, 1 - beta2, eps, weight_decay, lr / bias_correction1,
    sqrt(bias_correction2), 1 - lr * wd."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for p in range(rows.size // ADAM_ROW):
        r, c = p * ADAM_ROW, p * ADAM_SCALARS
        n = rows[r]
        if start >= n:
            continue
        d = _view(rows[r + 1], n, like)
        g = _view(rows[r + 2], n, like)
        m = _view(rows[r + 3], n, like)
        v = _view(rows[r + 4], n, like)
        vmax = _view(rows[r + 5], n, like)
        one_b1, b2, one_b2, eps = sc[c], sc[c + 1], sc[c + 2], sc[c + 3]
        wd, step_size, bc2_sqrt, shrink = sc[c + 4], sc[c + 5], sc[c + 6], sc[c + 7]
        i = start
        while i < n:
            gi = g[i]
            if maximize:
                gi = -gi
            di = d[i]
            if wd != 0:
                if decoupled:
                    di = di * shrink
                else:
                    gi = gi + wd * di
            mi = m[i] + (gi - m[i]) * one_b1          # torch: exp_avg.lerp_(grad, 1 - beta1)
            m[i] = mi
            vi = v[i] * b2 + one_b2 * gi * gi
            v[i] = vi
            if amsgrad:
                vm = vmax[i]
                if vi > vm:
                    vm = vi
                    vmax[i] = vm
                denom = math.sqrt(vm) / bc2_sqrt + eps
            else:
                denom = math.sqrt(vi) / bc2_sqrt + eps
            d[i] = di - step_size * (mi / denom)
            i += stride


@cuda.jit
def _sgd_all(rows, sc, like, momentum, nesterov, maximize):
    """Row p: size, then the param, grad, momentum buffer (or the param again) addresses;
    its scalars: lr, weight_decay, momentum, 1 - dampening, and 1 where the buffer was just
    made (torch clones the grad)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for p in range(rows.size // SGD_ROW):
        r, c = p * SGD_ROW, p * SGD_SCALARS
        n = rows[r]
        if start >= n:
            continue
        d = _view(rows[r + 1], n, like)
        g = _view(rows[r + 2], n, like)
        buf = _view(rows[r + 3], n, like)
        lr, wd, mom, one_damp, first = sc[c], sc[c + 1], sc[c + 2], sc[c + 3], sc[c + 4] != 0
        i = start
        while i < n:
            gi = g[i]
            if maximize:
                gi = -gi
            if wd != 0:
                gi = gi + wd * d[i]
            if momentum:
                if first:
                    b = gi
                else:
                    b = buf[i] * mom + one_damp * gi
                buf[i] = b
                gi = gi + mom * b if nesterov else b
            d[i] = d[i] - lr * gi
            i += stride


@cuda.jit
def _rmsprop_all(rows, sc, like, centered, momentum, maximize):
    """Row p: size, then the param, grad, square_avg, grad_avg, momentum_buffer addresses (an
    unused state's is square_avg's); its scalars as kernels/optim.rmsprop_all's."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for p in range(rows.size // RMSPROP_ROW):
        r, c = p * RMSPROP_ROW, p * RMSPROP_SCALARS
        n = rows[r]
        if start >= n:
            continue
        d = _view(rows[r + 1], n, like)
        g = _view(rows[r + 2], n, like)
        sq = _view(rows[r + 3], n, like)
        gavg = _view(rows[r + 4], n, like)
        buf = _view(rows[r + 5], n, like)
        alpha, one_alpha, lerp_rest, eps = sc[c], sc[c + 1], sc[c + 2], sc[c + 3]
        wd, mom, neg_lr = sc[c + 4], sc[c + 5], sc[c + 6]
        i = start
        while i < n:
            gi = g[i]
            if maximize:
                gi = -gi
            if wd != 0:
                gi = gi + wd * d[i]
            s = sq[i] * alpha + one_alpha * gi * gi
            sq[i] = s
            if centered:                              # torch: grad_avg.lerp_(grad, 1 - alpha)
                a = gavg[i]
                if one_alpha < 0.5:
                    a = a + one_alpha * (gi - a)
                else:
                    a = gi - (gi - a) * lerp_rest
                gavg[i] = a
                avg = math.sqrt(s - a * a) + eps
            else:
                avg = math.sqrt(s) + eps
            if momentum:
                b = buf[i] * mom + gi / avg
                buf[i] = b
                d[i] = d[i] + neg_lr * b
            else:
                d[i] = d[i] + neg_lr * gi / avg
            i += stride


_LIKE = {}  # dtype -> a one-element device array: the kernels' pointers take its dtype


def _launch(kernel, rows, sc, dtype, flags):
    """One launch over the table (host numpy arrays, a row per parameter: rows int64, sc
    converted to the parameters' dtype)."""
    rows = np.ascontiguousarray(rows, np.int64)
    n = int(rows[:, 0].max()) if rows.size else 0
    if n == 0:
        return
    dtype = np.dtype(dtype)
    like = _LIKE.get(dtype)
    if like is None:
        like = _LIKE[dtype] = driver.alloc(1, dtype)
    blocks, threads = driver.grid(n)
    kernel[blocks, threads](driver.to_device(rows), driver.to_device(np.ascontiguousarray(sc, dtype)), like, *flags)


def adam(rows, sc, dtype, decoupled, amsgrad, maximize):
    _launch(_adam_all, rows, sc, dtype, (bool(decoupled), bool(amsgrad), bool(maximize)))


def sgd(rows, sc, dtype, momentum, nesterov, maximize):
    _launch(_sgd_all, rows, sc, dtype, (bool(momentum), bool(nesterov), bool(maximize)))


def rmsprop(rows, sc, dtype, centered, momentum, maximize):
    _launch(_rmsprop_all, rows, sc, dtype, (bool(centered), bool(momentum), bool(maximize)))


def _signatures(flags):
    # what _launch passes: the table, the scalars and `like` in each float dtype, then the flags
    return [(types.int64[::1], types.Array(t, 1, "C"), types.Array(t, 1, "C")) + (types.boolean,) * flags
            for t in (types.float32, types.float64)]


# checked by tests/cuda/test_ptx.py
PTX_SIGNATURES = {_adam_all: _signatures(3), _sgd_all: _signatures(3), _rmsprop_all: _signatures(3)}

KERNELS["adam"] = adam
KERNELS["sgd"] = sgd
KERNELS["rmsprop"] = rmsprop
