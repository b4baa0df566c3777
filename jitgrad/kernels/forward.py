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
Every kernel also runs as plain Python under NUMBA_DISABLE_JIT=1. The kernels live beside
their backward twins in the family modules (reduce, linalg...); dtype casts, the one op
whose input may be of any dtype (V_DT), are here.
"""
import numpy as np

from jitgrad._core.layout import (
    F_ARGS,
    F_FP,
    F_IP,
    F_MADE,
    F_NIN,
    FW,
    V_ADDR,
    V_DT,
    V_NUMEL,
    V_SHP,
    VD_BOOL,
    VD_F32,
    VD_F64,
    VD_I32,
    VD_I64,
    VW,
)
from jitgrad.kernels.common import jit
from jitgrad.kernels.pointers import view

I64 = np.zeros(0, np.int64)
_F64 = np.zeros(0, np.float64)
_F32 = np.zeros(0, np.float32)
_I32 = np.zeros(0, np.int32)
_BOOL = np.zeros(0, np.bool_)


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
def nin(prog, i):
    """The number of inputs of instruction i."""
    return prog[i * FW + F_NIN]


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


# --- dtype casts ------------------------------------------------------------------------------
@jit
def _cast(src, out):
    for j in range(out.size):
        out[j] = src[j]


@jit
def f_to_copy(i, prog, fin, vals, xs, fp, like):
    """A cast to the plan's float dtype (ops record casts to other dtypes as Python
    instructions): the input is read at its own dtype, whatever it is."""
    x = arg(prog, fin, i, 0)
    out = val(vals, res(prog, fin, i, 0), like)
    addr = vals[x * VW + V_ADDR]
    n = out.size
    code = vals[x * VW + V_DT]
    if code == VD_F64:
        _cast(view(addr, n, _F64), out)
    elif code == VD_F32:
        _cast(view(addr, n, _F32), out)
    elif code == VD_I64:
        _cast(view(addr, n, I64), out)
    elif code == VD_I32:
        _cast(view(addr, n, _I32), out)
    elif code == VD_BOOL:
        _cast(view(addr, n, _BOOL), out)
