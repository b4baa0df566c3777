"""Elementwise kernels generated from formula text: one `cuda.jit` kernel per formula and
operand layout, cached; numba specialises each one per dtype signature at its first launch.

A kernel computes out[...] = formula over its operands, each an array read through its
own strides (stride 0 on broadcast dimensions, any view) or a scalar kernel argument.
Before a launch the dimensions are coalesced as numpy's iterator does: size-1 dimensions
are dropped and neighbours contiguous in every operand merged, so the common case
(contiguous operands and scalars) indexes with one stride per operand instead of dividing
the flat position by every dimension.

The formula's helper functions are the ones engine/codegen.py defines for the CPU kernels,
with the same semantics (where, sign, pow, relu, clamp, fmax, fmin, exp, log, ...), plus
numpy's integer and rounding forms (formulas.py). On a GPU the math functions are
`math`'s, which numba lowers to libdevice: log(0) is -inf, sqrt(-1) NaN, exp(1000) inf,
as in numpy. The simulator runs the same source as Python, where `math` raises on those
instead, so there they are numpy's functions, which return what libdevice does.
"""
import collections
import math
import threading
import warnings

import numpy as np
from numba import cuda
from numba.cuda import libdevice

from jitgrad.gpu import driver
from jitgrad.gpu.array import DeviceArray

# The helpers a formula may call, beside the math functions bound per target below. The
# first eight are engine/codegen.py's: the same formula text means the same thing here.
_HELPERS = '''
def where(c, a, b):
    return a if c else b


def sign(x):
    # torch's sign: 0 at NaN
    return 1.0 if x > 0.0 else (-1.0 if x < 0.0 else 0.0)


def pow(x, e):
    # torch's pow(Tensor, Scalar): sqrt / rsqrt for 0.5 / -0.5
    if e == 0.5:
        return sqrt(x)
    if e == -0.5:
        return 1.0 / sqrt(x)
    return x ** e


def zeros_like(x):
    return 0.0


def relu(x):
    # np.maximum(x, 0): NaN passes through
    return x if (x > 0.0 or x != x) else 0.0 * x


def clamp(x, lo, hi):
    # np.clip(x, lo, hi), as torch.clamp: NaN passes through, lo > hi gives hi
    if x != x:
        return x
    return min(max(x, lo), hi)


def fmax(a, b):
    # np.maximum: NaN wins
    return a if (a > b or a != a) else b


def fmin(a, b):
    # np.minimum: NaN wins
    return a if (a < b or a != a) else b


def npsign(x):
    # np.sign: NaN stays NaN
    if x > 0:
        return 1
    if x < 0:
        return -1
    return x - x


def floordiv(a, b):
    # numpy's npy_floor_divide: a / b at b == 0, else floor((a - fmod(a, b)) / b) rounded
    if b == 0:
        return a / b
    mod = fmod(a, b)
    div = (a - mod) / b
    if mod != 0 and (b < 0) != (mod < 0):
        div -= 1.0
    if div == 0:
        return copysign(0.0, a / b)
    fl = floor(div)
    if div - fl > 0.5:
        fl += 1.0
    return fl


def ifloordiv(a, b):
    # numpy's integer floor_divide: 0 at b == 0 (Python's // raises; CUDA's is undefined)
    if b == 0:
        return a - a
    return a // b


def ipow(a, b):
    # numpy's integer power by squaring; numpy raises on a negative exponent, which a
    # kernel cannot: it gives C's truncated 1 / a ** -b (1, -1 or 0) instead
    one = a - a + 1
    if b < 0:
        if a == 1 or a == -1:
            return one if b % 2 == 0 else a
        return one - one
    r = one
    while b > 0:
        if b & 1:
            r *= a
        b >>= 1
        if b > 0:
            a *= a
    return r


def ireciprocal(x):
    # numpy's integer reciprocal is C's 1 / x: 1, -1 or 0 (and 0 at x == 0, where C is undefined)
    if x == 1 or x == -1:
        return x
    return x - x
'''

_MATH = ("exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tanh", "erf", "isinf", "isfinite", "fmod",
         "copysign", "asin", "acos", "atan", "atan2")
_ROUNDING = ("trunc", "floor", "ceil")   # libdevice's: math's return ints in numba, as in Python


def _target_functions():
    if driver.simulated():
        fns = {name: getattr(np, name) for name in _MATH + _ROUNDING if name != "erf"}
        fns["erf"] = math.erf   # total: it raises on nothing
        return fns
    fns = {name: getattr(math, name) for name in _MATH}
    fns.update({name: getattr(libdevice, name) for name in _ROUNDING})
    return fns


def _namespace():
    ns = {"cuda": cuda, "math": math, **_target_functions()}
    given = set(ns) | {"__builtins__"}
    exec(compile(_HELPERS, "<jitgrad.gpu elementwise helpers>", "exec"), ns)
    for name in set(ns) - given:
        ns[name] = cuda.jit(device=True)(ns[name])
    return ns


NAMESPACE = _namespace()
_KERNELS = {}   # (formula, names, kinds, casts, flat, nparams) -> the cuda.jit kernel
_lock = threading.Lock()


def source(formula, names, kinds, casts, flat, nparams):
    """The kernel's text. kinds: per operand, "a" (array: buffer, offset, strides) or "s"
    (scalar); casts: per operand, a numpy type to convert the value to, or None."""
    args = []
    for j, kind in enumerate(kinds):
        args += [f"x{j}", f"o{j}", f"s{j}"] if kind == "a" else [f"x{j}"]
    args += [f"p{j}" for j in range(nparams)]
    arrays = [j for j, kind in enumerate(kinds) if kind == "a"]
    lines = [f"def kernel(out, ooff, ost, shape, n, {', '.join(args)}):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < n:"]
    if flat:
        lines.append("        d = ooff + i * ost[0]")
        lines += [f"        a{j} = o{j} + i * s{j}[0]" for j in arrays]
    else:
        lines.append("        d = ooff")
        lines += [f"        a{j} = o{j}" for j in arrays]
        # the outermost index is what remains of i (i < n): no division for it
        lines += ["        r = i",
                  "        for k in range(len(shape) - 1, 0, -1):",
                  "            c = r % shape[k]",
                  "            r //= shape[k]",
                  "            d += c * ost[k]"]
        lines += [f"            a{j} += c * s{j}[k]" for j in arrays]
        lines += ["        d += r * ost[0]"]
        lines += [f"        a{j} += r * s{j}[0]" for j in arrays]
    for j, name in enumerate(names):
        value = f"x{j}[a{j}]" if kinds[j] == "a" else f"x{j}"
        lines.append(f"        {name} = {value if casts[j] is None else f'T{j}({value})'}")
    lines += [f"        out[d] = {formula}",
              "        i += step"]
    return "\n".join(lines) + "\n"


def kernel(formula, names, kinds, casts, flat, nparams):
    key = (formula, names, kinds, casts, flat, nparams)
    k = _KERNELS.get(key)
    if k is None:
        with _lock:  # made once: threads asking at once share one kernel (and one compile)
            k = _KERNELS.get(key)
            if k is None:
                ns = dict(NAMESPACE)
                ns.update({f"T{j}": c for j, c in enumerate(casts) if c is not None})
                exec(compile(source(*key), f"<jitgrad.gpu kernel: {formula}>", "exec"), ns)
                k = _KERNELS[key] = cuda.jit(ns["kernel"])
    return k


def coalesce(shape, strides):
    """(shape, [strides per array]) with size-1 dimensions dropped and dimensions that are
    contiguous in every array merged; at least one dimension."""
    dims = []
    for k, d in enumerate(shape):
        if d == 1:
            continue
        st = [s[k] for s in strides]
        if dims and all(ps == s * d for ps, s in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * d, st)
        else:
            dims.append((d, st))
    if not dims:
        return (1,), [(0,)] * len(strides)
    return tuple(d for d, _ in dims), [tuple(st[j] for _, st in dims) for j in range(len(strides))]


# A kernel with its coalesced geometry for operands of given shapes and strides: all a
# launch over arrays laid out that way needs besides their buffers and offsets
Plan = collections.namedtuple("Plan", "kernel shape strides n")


def plan(formula, names, out, operands, casts, nparams=0):
    """The Plan of out[...] = formula over operands: DeviceArrays of out's shape (views,
    broadcast with stride 0 included) or scalars, each read as names[j] after its cast (a
    numpy scalar type or None); nparams float parameters, read as p0, p1."""
    arrays = [x for x in operands if isinstance(x, DeviceArray)]
    shape, strides = coalesce(out.shape, [out.estrides] + [a.estrides for a in arrays])
    kinds = tuple("a" if isinstance(x, DeviceArray) else "s" for x in operands)
    return Plan(kernel(formula, tuple(names), kinds, tuple(casts), len(shape) == 1, nparams), shape, strides,
                out.size)


def run(p, out, operands, params=()):
    """Launch Plan p on out and operands laid out as the ones it was made for (only their
    buffers and offsets are read here)."""
    if p.n == 0:
        return
    args, j = [out.buf, out.offset, p.strides[0], p.shape, p.n], 1
    for x in operands:
        if isinstance(x, DeviceArray):
            args += (x.buf, x.offset, p.strides[j])
            j += 1
        else:
            args.append(x)
    args += map(np.float64, params)
    blocks, threads = driver.grid(p.n)
    if driver.simulated():
        # numpy's warnings for what the GPU does silently (x / 0, NaN compared...)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p.kernel[blocks, threads](*args)
    else:
        p.kernel[blocks, threads](*args)


def launch(formula, names, out, operands, casts, params=()):
    """out[...] = formula over operands (see plan): made and run at once."""
    run(plan(formula, names, out, operands, casts, len(params)), out, operands, params)
