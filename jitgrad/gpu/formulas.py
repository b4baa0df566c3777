"""The formulas the device's elementwise kernels are generated from: numpy ufunc -> formula.

A formula is an expression in the op table's formula language (graph/spec.py's `fwd`,
compiled for the CPU by engine/codegen.py): Python arithmetic over the inputs' names
and the helper functions both targets define (codegen's header; gpu/kernels/generate.py
on the device). graph/spec.py's `elementwise()` registers every spec whose `forward` is
a ufunc taking exactly the spec's inputs, so the device computes what the CPU forward
formula says. The ufuncs no spec covers (comparisons, logic, bit operations, rounding,
and the integer forms numpy's loops compute differently) are written below.

An entry is {loop kind: (input names, formula)}: the kind of numpy's loop ("f" float,
"i" integer, "b" bool) picks the formula, "*" serves the kinds without their own (a
spec's formula is written for float data, but `self + other` adds integers just as well).

This module holds data only: it is imported by graph/spec.py at `import jitgrad`, long
before (and without) numba.cuda.
"""
import numpy as np

TABLE = {}   # ufunc -> {kind: (names, formula)}

_UNARY = ("self",)
_BINARY = ("self", "other")


def register_spec(forward, args, fwd):
    """An elementwise spec's forward formula, when its forward is a numpy ufunc over its
    inputs (a formula with float parameters, such as rsub's `p0 - self`, is not a ufunc's)."""
    if not isinstance(forward, np.ufunc) or not fwd or forward.nout != 1 or len(args) != forward.nin:
        return
    if "p0" in fwd or "p1" in fwd:
        return
    entry = TABLE.setdefault(forward, {})
    if entry.get("*", (tuple(args), fwd)) != (tuple(args), fwd):
        raise ValueError(f"two elementwise specs give numpy.{forward.__name__} different forward formulas: "
                         f"{entry['*'][1]!r} and {fwd!r}")
    entry["*"] = (tuple(args), fwd)


def _own(ufunc, names, **by_kind):
    """Formulas by loop kind (f=, i=, b=; any= is the "*" entry)."""
    TABLE.setdefault(ufunc, {}).update({k.replace("any", "*"): (names, f) for k, f in by_kind.items()})


# numpy's loops on integers: integer results, no exceptions (x // 0 is 0, as numpy)
_own(np.reciprocal, _UNARY, i="ireciprocal(self)")
_own(np.absolute, _UNARY, b="self")
_own(np.power, _BINARY, f="self ** other", i="ipow(self, other)")
_own(np.floor_divide, _BINARY, f="floordiv(self, other)", i="ifloordiv(self, other)")
_own(np.sign, _UNARY, any="npsign(self)")
_own(np.trunc, _UNARY, f="trunc(self)", any="self")
_own(np.floor, _UNARY, f="floor(self)", any="self")
_own(np.ceil, _UNARY, f="ceil(self)", any="self")

# numpy's clip function is this ufunc: minimum(maximum(x, lo), hi), NaN propagating
_own(np._core.umath.clip, ("self", "lo", "hi"), any="fmin(fmax(self, lo), hi)")

# comparisons: the loop's operands are already cast to one dtype
_own(np.equal, _BINARY, any="self == other")
_own(np.not_equal, _BINARY, any="self != other")
_own(np.less, _BINARY, any="self < other")
_own(np.less_equal, _BINARY, any="self <= other")
_own(np.greater, _BINARY, any="self > other")
_own(np.greater_equal, _BINARY, any="self >= other")
_own(np.isnan, _UNARY, any="self != self")
_own(np.isinf, _UNARY, f="isinf(self)", any="False")
_own(np.isfinite, _UNARY, f="isfinite(self)", any="True")

# logic: numpy's loops take bools, integers and floats alike (NaN is true)
_own(np.logical_and, _BINARY, any="self != 0 and other != 0")
_own(np.logical_or, _BINARY, any="self != 0 or other != 0")
_own(np.logical_xor, _BINARY, any="(self != 0) != (other != 0)")
_own(np.logical_not, _UNARY, any="self == 0")

# bit operations (integers and bools; ~ on a bool is logical not, as numpy)
_own(np.bitwise_and, _BINARY, any="self & other")
_own(np.bitwise_or, _BINARY, any="self | other")
_own(np.bitwise_xor, _BINARY, any="self ^ other")
_own(np.invert, _UNARY, any="~self", b="not self")


def lookup(ufunc, kind):
    """(names, formula) for numpy's loop of dtype kind `kind` ("f", "i", "u", "b"), or None."""
    entry = TABLE.get(ufunc)
    if entry is None:
        return None
    key = "i" if kind in "iu" else kind
    return entry.get(key) or entry.get("*")
