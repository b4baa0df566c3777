"""What every forward kernel shares: reading jitgrad.compile's replay program.

A forward kernel runs one instruction of a plan (compiler/plan.py; the layout is
_core/layout.py's FW / VW) and is called by the generated dispatch as

    k(i, prog, fin, vals, xs, fp, like)

- its inputs are values arg(prog, fin, i, j); its outputs res(prog, fin, i, k): k = 0 the
  result, k = 1 + s the op's saved value s (spec.saves order), then any extra output
  (e.g. max's indices). A saved value that is an input or the result has that value's
  id; the kernel writes saved value s only when made(prog, i, s) (layer_norm's mean...);
- every value is C-contiguous, read flat: val(vals, vid, like) at the plan's float
  dtype, val_i64 for int64 ones; its shape is at xs[shp(vals, vid)] (count, dims...);
- the op's int params are at xs[ip(prog, i)] (count, then values) and its float params at
  fp[fpp(prog, i)], exactly as the backward row of the same op has them: a forward kernel
  reads what its backward kernel reads (spec.ioff gives the offsets).
Every kernel also runs as plain Python under NUMBA_DISABLE_JIT=1.
"""
import numpy as np

from jitgrad._core.layout import F_ARGS, F_FP, F_IP, F_MADE, F_NIN, FW, V_ADDR, V_NUMEL, V_SHP, VW
from jitgrad.kernels.common import bcast_plan, bidx, jit
from jitgrad.kernels.pointers import view

I64 = np.zeros(0, np.int64)


@jit
def arg(prog, fin, i, j):
    """Value id of instruction i's input j."""
    return fin[prog[i * FW + F_ARGS] + j]


@jit
def res(prog, fin, i, k):
    """Value id of instruction i's output k (0: the result, 1 + s: saved value s, then extras)."""
    b = i * FW
    return fin[prog[b + F_ARGS] + prog[b + F_NIN] + k]


@jit
def made(prog, i, s):
    """Whether the kernel writes saved value s (it is neither an input nor the result)."""
    return (prog[i * FW + F_MADE] >> s) & 1 == 1


@jit
def val(vals, vid, like):
    """Value vid, flat, at like's dtype."""
    return view(vals[vid * VW + V_ADDR], vals[vid * VW + V_NUMEL], like)


@jit
def val_i64(vals, vid):
    return view(vals[vid * VW + V_ADDR], vals[vid * VW + V_NUMEL], I64)


@jit
def shp(vals, vid):
    """Pointer into xs of value vid's shape."""
    return vals[vid * VW + V_SHP]


@jit
def ip(prog, i):
    return prog[i * FW + F_IP]


@jit
def fpp(prog, i):
    return prog[i * FW + F_FP]


# --- reductions -------------------------------------------------------------------------------
@jit
def f_sum(i, prog, fin, vals, xs, fp, like):
    """sum / mean (all, or over dims): the result at the keepdim shape (the int params),
    times the scale (fp: 1 for sum, 1 / count for mean)."""
    x = arg(prog, fin, i, 0)
    xv = val(vals, x, like)
    out = val(vals, res(prog, fin, i, 0), like)
    scale = fp[fpp(prog, i)]
    mode, m, mp = bcast_plan(xs, shp(vals, x), ip(prog, i))
    out[:] = 0.0
    if mode == 1:
        acc = 0.0
        for j in range(xv.size):
            acc += xv[j]
        out[0] = acc * scale
        return
    for j in range(xv.size):
        out[bidx(mode, m, mp, j)] += xv[j]
    for j in range(out.size):
        out[j] *= scale
