"""Compiled optimizer updates: one pass over a parameter's elements, no temporaries.

The numpy form of Adam makes about ten full-size temporaries per parameter; this loop
reads each element of param, grad, exp_avg and exp_avg_sq once and writes three of
them. The arithmetic is in the same order as torch's single-tensor Adam, with every
scalar computed in Python floats (1 - beta1, 1 - lr * wd, ...) and only then cast to the
parameter's dtype (`sc` is an array of that dtype), as numpy and torch do for float32:
computing 1 - beta1 in float32 would give a different rounding.
"""
import math

import numba
import numpy as np
from numba import njit

_jit = njit(cache=True, nogil=True, error_model="numpy")


@_jit
def _adam(d, g, m, v, vmax, sc, decoupled, amsgrad):
    one_b1, b2, one_b2, eps, wd, step_size, bc2_sqrt, shrink = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7]
    for i in range(d.shape[0]):
        gi = g[i]
        if wd != 0:
            if decoupled:
                d[i] = d[i] * shrink
            else:
                gi = gi + wd * d[i]
        m[i] = m[i] + (gi - m[i]) * one_b1          # torch: exp_avg.lerp_(grad, 1 - beta1)
        v[i] = v[i] * b2 + one_b2 * gi * gi
        if amsgrad:
            if v[i] > vmax[i]:
                vmax[i] = v[i]
            denom = math.sqrt(vmax[i]) / bc2_sqrt + eps
        else:
            denom = math.sqrt(v[i]) / bc2_sqrt + eps
        d[i] = d[i] - step_size * (m[i] / denom)


def available(*arrays):
    """The kernel works on flat views it can write through; anything else (and the
    NUMBA_DISABLE_JIT test pass, where the loop would run in Python) takes numpy."""
    return not numba.config.DISABLE_JIT and all(a.flags.c_contiguous for a in arrays)


def adam_step(d, g, m, v, vmax, lr, b1, b2, eps, wd, step_size, bc2_sqrt, decoupled, amsgrad):
    sc = np.array([1 - b1, b2, 1 - b2, eps, wd, step_size, bc2_sqrt, 1 - lr * wd], dtype=d.dtype)
    g = np.ascontiguousarray(g, dtype=d.dtype)
    _adam(d.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), (vmax if vmax is not None else m).reshape(-1),
          sc, decoupled, amsgrad)


@_jit
def _sgd(d, g, buf, sc, first, momentum, nesterov):
    lr, wd, mom, one_damp = sc[0], sc[1], sc[2], sc[3]
    for i in range(d.shape[0]):
        gi = g[i]
        if wd != 0:
            gi = gi + wd * d[i]
        if momentum:
            if first:                                   # torch: buf = clone(grad)
                buf[i] = gi
            else:
                buf[i] = buf[i] * mom + one_damp * gi
            gi = gi + mom * buf[i] if nesterov else buf[i]
        d[i] = d[i] - lr * gi


def sgd_step(d, g, buf, lr, wd, mom, damp, first, nesterov):
    sc = np.array([lr, wd, mom, 1 - damp], dtype=d.dtype)
    g = np.ascontiguousarray(g, dtype=d.dtype)
    _sgd(d.reshape(-1), g.reshape(-1), (buf if buf is not None else d).reshape(-1), sc, first, buf is not None,
         nesterov)
