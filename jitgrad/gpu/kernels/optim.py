"""The optimizers' updates on the device: one launch updates every parameter of a group.

The same per-element arithmetic as kernels/optim.py (torch's order of operations, every
scalar computed in Python floats and given in the parameter's dtype in `sc`), so a CUDA
step matches the CPU one. The launch gets a table of device addresses, one row per
parameter (its size, then the addresses of param, grad and state arrays, which
optim_pointers.as_ptr reads), so a group of any number of parameters costs one launch,
two small uploads (the table and the scalars) and no per-parameter Python past filling
them. Threads stride over each parameter's elements in turn: the rows are few (one per
parameter), and a thread beyond a small parameter's size skips it.
"""
import math

import numpy as np
from numba import cuda

from jitgrad.gpu import driver
from jitgrad.gpu.array import KERNELS
from jitgrad.gpu.kernels.optim_pointers import as_ptr


@cuda.jit
def _adam_all(rows, sc, like, decoupled, amsgrad, maximize):
    """rows[p]: size, then param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq addresses; sc[p]: 1 - beta1, beta2,
    1 - beta2, eps, weight_decay, lr / bias_correction1, sqrt(bias_correction2), 1 - lr * wd."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for p in range(rows.shape[0]):
        n = rows[p, 0]
        if start >= n:
            continue
        d = as_ptr(rows[p, 1], like)
        g = as_ptr(rows[p, 2], like)
        m = as_ptr(rows[p, 3], like)
        v = as_ptr(rows[p, 4], like)
        vmax = as_ptr(rows[p, 5], like)
        one_b1, b2, one_b2, eps = sc[p, 0], sc[p, 1], sc[p, 2], sc[p, 3]
        wd, step_size, bc2_sqrt, shrink = sc[p, 4], sc[p, 5], sc[p, 6], sc[p, 7]
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
    """rows[p]: size, then param, grad, momentum buffer (or the param again) addresses; sc[p]: lr, weight_decay,
    momentum, 1 - dampening, and 1 where the buffer was just made (torch clones the grad)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for p in range(rows.shape[0]):
        n = rows[p, 0]
        if start >= n:
            continue
        d = as_ptr(rows[p, 1], like)
        g = as_ptr(rows[p, 2], like)
        buf = as_ptr(rows[p, 3], like)
        lr, wd, mom, one_damp, first = sc[p, 0], sc[p, 1], sc[p, 2], sc[p, 3], sc[p, 4] != 0
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


_LIKE = {}  # dtype -> a one-element device array: the kernels' pointers take its dtype


def _launch(kernel, rows, sc, dtype, flags):
    """One launch over the table (host numpy arrays: rows int64, sc of the parameters' dtype)."""
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


KERNELS["adam"] = adam
KERNELS["sgd"] = sgd
