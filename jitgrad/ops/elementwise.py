"""Elementwise primitives: each is one entry, its forward right below it.

An entry (graph/spec.py documents every key) names the PyTorch node, the gradient formula
per input and the saved values the formulas read, under PyTorch's names. From it come the
compiled backward kernel (engine/codegen.py turns the formulas into an @njit branch), the
Python engine's rule (the same text evaluated on Tensors, so create_graph works) and,
for ops declared with `defop`, the `jitgrad.<name>` function and the Tensor method.

Adding a unary op is one call:

    log1p = defop("log1p", "Log1PBackward0", np.log1p, "grad / (self + 1.0)", saves=("self",))
"""
import math
import operator

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core import modes as _grad_mode
from jitgrad._core.capture import state as _cap
from jitgrad._core.forward import state as _fw
from jitgrad._core.messages import c_name, scalar_name
from jitgrad.gpu import formulas as _gpu_formulas
from jitgrad.graph.record import record, record_ew
from jitgrad.graph.spec import alias, elementwise, structural
from jitgrad.graph.tensor import _ARRAYLIKE, Tensor, in_inference_mode
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.kernels.forward import f_to_copy
from jitgrad.ops import _forward
from jitgrad.ops._common import (
    _NUMBER,
    _broadcast_error,
    _gm_state,
    _needs,
    _new,
    _operand,
    _operand_error,
    _scalar_dtype,
    asarray,
    copy_array,
    publish,
    traced,
)

# A 0-d result stays the numpy scalar numpy returns (np.float64 ...): it has the array API the
# code reads (shape, dtype, size, item, reshape) and scalar arithmetic is ~7x cheaper than on
# 0-d arrays, which is most of the forward cost of scalar graphs. In-place writes convert it.


def _ew(spec, out, a, b=None, p0=0.0, p1=0.0, aux=None, dual=True):
    """Wrap `out` and, if needed, record elementwise `spec` on Tensor a and b (a Tensor, a
    Python float standing for a constant, or None for a unary op). In forward mode,
    ops/_forward.ew calls back here with dual=False, then computes the tangent."""
    if _cap.on and dual is not _NOT_TRACED:
        return _captured_ew(spec, out, a, b, p0, p1, aux, dual)
    if dual and _fw.live:
        return _forward.ew(_ew, spec, out, a, b, p0, p1, aux)
    if not isinstance(out, _ARRAYLIKE):
        out = np.asarray(out)
    res = _new(Tensor)
    res._data = out
    res._x = None
    if _gm_state.enabled and (a._requires_grad or (b is not None and type(b) is not float and b._requires_grad)):
        return record_ew(spec, res, a, b, p0, p1, aux)  # links res to its row
    res._requires_grad = False
    res._tape = None
    if _grad_mode._inference_on[0]:
        in_inference_mode(res)
    return res


class _NotTraced:
    """A true `dual` that also says: do not report to jitgrad.compile's recorder."""


_NOT_TRACED = _NotTraced()


def _captured_ew(spec, out, a, b, p0, p1, aux, dual):
    """_ew while jitgrad.compile records (_core/capture.py): the op runs as usual, with
    tracing off for whatever it calls, then reports itself."""
    if not _cap.mine():  # another thread's op: not this recording's (and not recorded)
        return _ew(spec, out, a, b, p0, p1, aux, _NOT_TRACED if dual else False)
    _cap.on = False
    try:
        res = _ew(spec, out, a, b, p0, p1, aux, dual)
    finally:
        _cap.on = True
    _cap.rec.ew(spec, res, a, b, p0, p1, aux)
    return res


# On numpy float scalars (0-d results, see above) the arithmetic operators give what the
# ufuncs give, bit for bit and with the same dtype (NEP 50), ~15x faster than a ufunc call.
_FLOAT_SCALARS = {np.float64, np.float32}
_SCALAR_FN = {np.add: operator.add, np.subtract: operator.sub, np.multiply: operator.mul,
              np.true_divide: operator.truediv}


def _binary(spec, npfn, a, b):
    """a (op) b where at least one is a Tensor. Callers with a Python number first are
    commutative (others have their own reflected ops: rsub, rpow, 2 / x)."""
    if not isinstance(a, Tensor):
        a, b = b, a
        if not isinstance(a, Tensor):
            raise _operand_error(spec.name, b, 1)
    ad = a._data
    if type(b) in _NUMBER:
        if type(ad) in _FLOAT_SCALARS:
            out = _SCALAR_FN.get(npfn, npfn)(ad, b)
        elif ad.dtype.kind == "f":
            # NEP 50: a Python scalar takes the array's dtype, as in PyTorch
            out = _SCALAR_FN.get(npfn, npfn)(ad[()], b) if ad.ndim == 0 else npfn(ad, b)
        else:
            out = asarray(npfn(ad, b)).astype(_scalar_dtype(a, b), copy=False)
        b = float(b)
    else:
        if not isinstance(b, Tensor):
            if not isinstance(b, _ARRAYLIKE):  # None, str...: numpy would make nan or raise its own error
                raise _operand_error(spec.name, b)
            b = _wrap(np.asarray(b, dtype=ad.dtype))
            if _cap.on and _cap.mine():  # jitgrad.compile: array data given as an operand is a constant
                _cap.rec.alias(b, b._data)
        bd = b._data
        if type(ad) in _FLOAT_SCALARS and type(bd) is type(ad):
            return _ew(spec, _SCALAR_FN.get(npfn, npfn)(ad, bd), a, b)
        if bd.dtype != ad.dtype:
            # compute at torch's result dtype, not numpy's (recording casts the saved copies)
            dt = _dtype.result_type(ad, bd)
            ad = ad if ad.dtype == dt else ad.astype(dt)
            bd = bd if bd.dtype == dt else bd.astype(dt)
        try:
            out = npfn(ad, bd)
        except ValueError:
            raise _broadcast_error(ad.shape, bd.shape) from None
    return _ew(spec, out, a, b)



def _unary(spec, npfn, ints="float", bools=None):
    """The function of a unary elementwise op. `ints` says what an int or bool tensor gives, as
    torch: "float" computed in the default float dtype (exp, sin), "keep" its own dtype (neg,
    clone), "refuse" torch's NotImplementedError (no int kernel). `bools`: a function making
    the error a bool tensor raises where torch refuses bool alone (neg, abs, relu)."""
    def op(x):
        if not isinstance(x, Tensor):
            if not isinstance(x, _NUMBER + _ARRAYLIKE):
                raise _operand_error(spec.name, x, 1)
            return npfn(x)  # a number, e.g. inside a gradient formula such as log(p0)
        d = x._data.dtype
        if d.kind != "f":
            if bools is not None and d.kind == "b":
                raise bools()
            if ints == "float":
                x = _as_float(x)
            elif ints == "refuse":
                raise _dtype.not_implemented(spec.name, d)
        out = npfn(x._data)
        return _ew(spec, out, x)

    op.__name__ = op.__qualname__ = spec.name
    return op


def defop(name, node_name, forward, *grads, saves=(), fparams=(), method=True, ints="float", bools=None,
          numbers=True, **later):
    """Declare an elementwise primitive and make its function: one entry.

    forward: numpy function (one argument per input); grads: the gradient formula of each
    input (see graph/spec.py); saves: the names the formulas read (PyTorch's: self, other,
    result); ints, bools: what a unary op does with int and bool tensors (_unary); numbers=False:
    a binary op whose torch signature takes tensors only (maximum): a number is a TypeError. The function is returned and published: jitgrad.<name> (the table binds it)
    and, with method=True, Tensor.<name>. The compiled kernel comes from the formulas."""
    spec = elementwise(name, node_name, *grads, saves=saves, fparams=fparams, forward=forward, **later)
    if len(grads) == 1:
        fn = _unary(spec, forward, ints, bools)
    elif numbers:
        def fn(a, b):
            return _binary(spec, forward, a, b)
    else:
        def fn(a, b):
            for pos, v in ((1, a), (2, b)):
                if not isinstance(v, Tensor):
                    raise _operand_error(name, v, pos)
            return _binary(spec, forward, a, b)
        fn.__name__ = fn.__qualname__ = name
    fn.spec = spec
    publish(name, fn, method)
    return fn


# --- arithmetic ------------------------------------------------------------------------------
ADD = elementwise("add", "AddBackward0", "grad", "grad", forward=np.add, fwd="self + other")


def add(a, b, alpha=1):
    if alpha != 1:
        b = mul(b, alpha)
    return _binary(ADD, np.add, a, b)


SUB = elementwise("sub", "SubBackward0", "grad", "-grad", forward=np.subtract, fwd="self - other")
RSUB = elementwise("rsub", "RsubBackward1", "-grad", forward=np.subtract, fwd="p0 - self")   # p0 - self (p0 unread: not recorded)

_BOOL_SUB = ("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a "
             "mask, use the `~` or `logical_not()` operator instead.")


def _no_bool_sub(*operands):
    for x in operands:
        if type(x) is bool or isinstance(x, Tensor) and x._data.dtype.kind == "b":
            raise RuntimeError(_BOOL_SUB)

def sub(a, b, alpha=1):
    _no_bool_sub(a, b)
    if alpha != 1:
        b = mul(b, alpha)
    if not isinstance(a, Tensor):
        return rsub(b, a)
    return _binary(SUB, np.subtract, a, b)


def rsub(t, s):
    """s - t for a Python number s (PyTorch's RsubBackward1)."""
    if not isinstance(s, _NUMBER + _ARRAYLIKE):
        raise _operand_error("sub", s, 1)
    _no_bool_sub(t, s)
    out = asarray(np.subtract(s, t._data))
    out = out.astype(_scalar_dtype(t, s), copy=False)
    return _ew(RSUB, out, t, p0=float(s))


MUL = elementwise("mul", "MulBackward0", "grad * other", "grad * self", saves=("self", "other"), forward=np.multiply,
                   fwd="self * other")


def mul(a, b):
    return _binary(MUL, np.multiply, a, b)


# other: torch's -grad * ((self / other) / other); self / (other * other) underflows to inf for small other
DIV = elementwise("div", "DivBackward0", "grad / other", "-grad * ((self / other) / other)",
                  saves=("self", "other"), forward=np.true_divide, fwd="self / other")


def div(a, b, rounding_mode=None):
    if rounding_mode is not None:
        with _grad_mode.no_grad():
            fn = np.floor_divide if rounding_mode == "floor" else lambda x, y: np.trunc(x / y)
            return _binary(DIV, fn, a, b)
    if not isinstance(a, Tensor):
        return mul(reciprocal(b), a)  # PyTorch: 2 / x is reciprocal then MulBackward0
    if a._data.dtype.kind != "f" and not (isinstance(b, Tensor) and b._data.dtype.kind == "f"):
        # true division of integers gives the default dtype; with a float operand, promotion does
        a, b = _as_float(a), _as_float(b)
    return _binary(DIV, np.true_divide, a, b)


def promote_float(kernel, *operands):
    """The operands of an op torch computes in floats only (hypot, mse_loss...), cast to their
    torch.result_type; an int or bool result type is torch's NotImplementedError."""
    dt = _dtype.result_type(*operands)
    if dt.kind != "f":
        raise _dtype.not_implemented(kernel, dt)
    d = _dtype.from_numpy_dtype(dt)
    out = []
    for x in operands:
        if isinstance(x, Tensor):
            x = x if x._data.dtype == dt else to_dtype(x, d)
        elif getattr(x, "dtype", None) is not None and x.dtype is not d:  # vmap's BatchedTensor
            x = x.to(d)
        out.append(x)
    return tuple(out)


def _as_float(t):
    if isinstance(t, Tensor) and t._data.dtype.kind != "f":
        return to_dtype(t, _dtype.get_default_dtype())
    return t


RECIPROCAL = elementwise("reciprocal", "ReciprocalBackward0", "-grad * result * result", saves=("result",),
                         forward=np.reciprocal, fwd="1.0 / self")


def reciprocal(x):
    x = _as_float(x)
    return _ew(RECIPROCAL, np.reciprocal(x._data), x)

# The pow rules are torch's pow_backward, pow_backward_self and pow_backward_exponent: the
# where()s give 0, not 0 * inf = NaN, at a zero exponent and at a zero base with exponent >= 0;
# pow() is torch's pow(Tensor, Scalar) (sqrt / rsqrt for 0.5 / -0.5, which differ from C pow at -0, -inf)
POW = elementwise("pow", "PowBackward0",                                    # self ** p0
                  "grad * p0 * pow(self, p0 - 1.0) if p0 != 0.0 else zeros_like(grad)",
                  saves=("self",), fparams=("exponent",), args=("self",), fwd="pow(self, p0)")
POW_TT = elementwise("pow_tt", "PowBackward1",                              # self ** exponent
                     "where(exponent == 0.0, 0.0, grad * exponent * self ** (exponent - 1.0))",
                     "where((self == 0.0) & (exponent >= 0.0), grad * 0.0, grad * result * log(self))",
                     saves=("self", "exponent", "result"), args=("self", "exponent"), fwd="self ** exponent")
RPOW = elementwise("rpow", "PowBackward2",                                  # p0 ** exponent
                   "grad * where(exponent >= 0.0, 0.0, result * log(p0)) if p0 == 0.0 else grad * result * log(p0)",
                   saves=("exponent", "result"), fparams=("self",), args=("exponent",), fwd="p0 ** exponent")


_POW_OPERAND = (Tensor,) + _NUMBER + _ARRAYLIKE
_POW_DTYPED = (Tensor,) + _NUMBER  # the operands whose torch dtype is known
_NEGATIVE_POWER = "Integers to negative integer powers are not allowed."


def pow(a, b):  # noqa: A001
    if (type(b) is int or type(b) is float) and isinstance(a, Tensor):
        ad = a._data
        if ad.dtype.kind == "f":  # a float tensor to a number's power (x ** 2): its dtype, none of the checks below
            out = _pow_scalar(ad, b)
            return _ew(POW, out if out.dtype == ad.dtype else out.astype(ad.dtype), a, p0=float(b))
    for pos, x in ((1, a), (2, b)):
        if not isinstance(x, _POW_OPERAND):
            raise _operand_error("pow", x, pos)
    dt = _dtype.result_type(a, b) if isinstance(a, _POW_DTYPED) and isinstance(b, _POW_DTYPED) else None
    if dt is not None and dt.kind == "b" and isinstance(b, Tensor):  # no bool pow in torch (numpy: int8)
        raise _dtype.not_implemented("pow", dt)
    if not isinstance(a, Tensor):
        dt = dt if dt is not None else b._data.dtype
        out = np.power(np.asarray(a, dtype=dt), b._data)
        return _ew(RPOW, asarray(out, dtype=dt), b, p0=float(a))
    if isinstance(b, Tensor):
        if a._data.dtype.kind in "iu" and b._data.dtype.kind in "iu":
            return _binary(POW_TT, _int_power, a, b)
        return _binary(POW_TT, np.power, a, b)
    if dt is not None and dt != a._data.dtype:  # an int or bool tensor to a float power; a bool one to an int
        a = to_dtype(a, _dtype.from_numpy_dtype(dt))
    ad = a._data
    if ad.dtype.kind in "iu" and isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b < 0:
        raise RuntimeError(_NEGATIVE_POWER)  # numpy's is a ValueError
    out = _pow_scalar(ad, b)
    if out.dtype != ad.dtype:
        out = out.astype(ad.dtype)
    return _ew(POW, out, a, p0=float(b))


def _int_power(a, b):
    """torch's integer tensor ** integer tensor: a negative exponent gives the truncated
    1 / a ** -b (0 unless the base is 1 or -1), where numpy refuses the whole array."""
    neg = b < 0
    if not neg.any():
        return np.power(a, b)
    out = np.power(a, np.where(neg, 0, b))
    return np.where(neg, np.where(a == 1, 1, np.where(a == -1, 1 - 2 * (b & 1), 0)), out).astype(out.dtype)


def _pow_scalar(ad, e):
    """torch's pow(Tensor, Scalar) computes x ** 0.5 and x ** -0.5 as sqrt and rsqrt, which differ
    from C pow at -0 and -inf (rsqrt(-0) = -inf, sqrt(-inf) = NaN); PowBackward0 reads it too."""
    if e == 0.5:
        return np.sqrt(ad)
    if e == -0.5:
        with np.errstate(divide="ignore"):
            return np.reciprocal(np.sqrt(ad))
    return np.power(ad, e)



def _erf_array(x):
    from scipy.special import erf as _erf  # imported on first use: scipy.special is slow to import
    return asarray(_erf(x)).astype(x.dtype if x.dtype.kind == "f" else np.float32, copy=False)


# relu's 0 as a 0-d array of the input's dtype: a Python 0.0 costs numpy a weak-scalar
# promotion per call (a third of the op on small inputs)
_ZEROS = {np.dtype(t): np.zeros((), t) for t in (np.float64, np.float32)}


def _relu(x):
    zero = _ZEROS.get(x.dtype)
    return np.maximum(x, zero) if zero is not None else np.maximum(x, 0.0).astype(x.dtype, copy=False)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# --- unary: one entry each, function and Tensor method included ------------------------------
_BOOL_NEG = ("Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, "
             "use the `~` or `logical_not()` operator instead.")
neg = defop("neg", "NegBackward0", np.negative, "-grad", ints="keep", bools=lambda: RuntimeError(_BOOL_NEG),
            fwd="-self")
exp = defop("exp", "ExpBackward0", np.exp, "grad * result", saves=("result",), fwd="exp(self)")
log = defop("log", "LogBackward0", np.log, "grad / self", saves=("self",), fwd="log(self)")
log1p = defop("log1p", "Log1PBackward0", np.log1p, "grad / (self + 1.0)", saves=("self",), fwd="log1p(self)")
expm1 = defop("expm1", "Expm1Backward0", np.expm1, "grad * (result + 1.0)", saves=("result",), fwd="expm1(self)")
sqrt = defop("sqrt", "SqrtBackward0", np.sqrt, "grad / (2.0 * result)", saves=("result",), fwd="sqrt(self)")
sin = defop("sin", "SinBackward0", np.sin, "grad * cos(self)", saves=("self",), fwd="sin(self)")
cos = defop("cos", "CosBackward0", np.cos, "grad * -sin(self)", saves=("self",), fwd="cos(self)")
tanh = defop("tanh", "TanhBackward0", np.tanh, "grad * (1.0 - result * result)", saves=("result",),
            fwd="tanh(self)")
erf = defop("erf", "ErfBackward0", _erf_array,
            "grad * 1.1283791670955126 * exp(-(self * self))", saves=("self",), fwd="erf(self)")  # 2/sqrt(pi)
sigmoid = defop("sigmoid", "SigmoidBackward0", lambda x: _sigmoid(x).astype(x.dtype, copy=False),
                "grad * (1.0 - result) * result", saves=("result",), fwd="1.0 / (1.0 + exp(-self))")
# threshold_backward: a NaN result passes the gradient; sign() is torch's (0 at NaN)
relu = defop("relu", "ReluBackward0", _relu, "where(result <= 0.0, 0.0, grad)", saves=("result",), ints="keep",
             bools=lambda: RuntimeError("Boolean inputs not supported for relu"), fwd="relu(self)")
abs = defop("abs", "AbsBackward0", np.abs, "grad * sign(self)", saves=("self",), ints="keep",  # noqa: A001
            bools=lambda: _dtype.not_implemented("abs_cpu", np.bool_), fwd="abs(self)")
clone = defop("clone", "CloneBackward0", np.copy, "grad", ints="keep", fwd="self")

def _nan_outside_domain(ufunc):
    """ufunc without numpy's warning where it gives NaN (asin(2.0)): PyTorch gives NaN silently.
    The device computes the spec's formula for the ufunc itself (registered below)."""
    def fn(x):
        with np.errstate(invalid="ignore"):
            return ufunc(x)
    fn.__name__ = ufunc.__name__
    return fn


# the inverse trigonometric functions: torch's AsinBackward0... (1 / sqrt(1 - x^2) is inf at +-1, as torch's rsqrt)
asin = defop("asin", "AsinBackward0", _nan_outside_domain(np.arcsin), "grad / sqrt(1.0 - self * self)",
             saves=("self",), fwd="asin(self)")
acos = defop("acos", "AcosBackward0", _nan_outside_domain(np.arccos), "-grad / sqrt(1.0 - self * self)",
             saves=("self",), fwd="acos(self)")
atan = defop("atan", "AtanBackward0", np.arctan, "grad / (self * self + 1.0)", saves=("self",), fwd="atan(self)")
for _ufunc, _spec in ((np.arcsin, asin.spec), (np.arccos, acos.spec)):
    _gpu_formulas.register_spec(_ufunc, _spec.args, _spec.fwd)
ATAN2 = elementwise("atan2", "Atan2Backward0", "grad * other / (self * self + other * other)",
                    "grad * -self / (self * self + other * other)", saves=("self", "other"), forward=np.arctan2,
                    fwd="atan2(self, other)")


def atan2(input, other):
    """torch.atan2: two tensors (a number is a TypeError, as in torch); integers are computed in
    the default float dtype, then the usual promotion of a binary op (torch.result_type)."""
    for pos, x in ((1, input), (2, other)):
        if not isinstance(x, Tensor):
            raise _operand_error("atan2", x, pos)
    if _dtype.result_type(input, other).kind != "f":  # both integral: computed in the default float dtype
        input, other = _as_float(input), _as_float(other)
    return _binary(ATAN2, np.arctan2, input, other)


# torch.nextafter: the gradient flows to self unchanged where self != other (zero where the result is other
# itself), and is zero for other (torch's NextafterBackward0)
NEXTAFTER = elementwise("nextafter", "NextafterBackward0", "where(self == other, 0.0, grad)", "zeros_like(grad)",
                        saves=("self", "other"), forward=np.nextafter)


def nextafter(input, other):
    """The next float after input towards other, elementwise: two tensors of floating dtype (torch's
    promotion between them), integers refused as torch's kernel does."""
    for pos, x in ((1, input), (2, other)):
        if not isinstance(x, Tensor):
            raise TypeError(f"nextafter(): argument '{('input', 'other')[pos - 1]}' (position {pos}) must be Tensor, "
                            f"not {type(x).__name__}")
    dt = _dtype.result_type(input, other)
    if dt.kind != "f":
        raise _dtype.not_implemented("nextafter_cpu", dt)
    return _binary(NEXTAFTER, np.nextafter, input, other)


for _name, _fn in (("arcsin", asin), ("arccos", acos), ("arctan", atan), ("atan2", atan2), ("arctan2", atan2),
                   ("nextafter", nextafter)):
    publish(_name, _fn)


SIGN = elementwise("sign", "SignBackward0", "zeros_like(grad)", fwd="sign(self)")            # zeros, even for a NaN grad


def sign(x):
    """torch's sign: 0 at NaN, where np.sign gives NaN (AbsBackward0 is grad * sign(self))."""
    d = x._data if isinstance(x, Tensor) else np.asarray(x)
    if d.dtype.kind == "b":  # a bool's sign is itself (numpy has no sign for bool)
        return _ew(SIGN, copy_array(d), x) if isinstance(x, Tensor) else d.copy()
    out = np.sign(d)
    if d.dtype.kind == "f":
        out = np.where(np.isnan(d), out.dtype.type(0), out)
    return _ew(SIGN, out, x) if isinstance(x, Tensor) else out


def zeros_like(x):
    """Zeros at x's shape and dtype, with no graph (torch's zeros_like in a gradient formula)."""
    return _wrap(np.zeros_like(x._data))




CLAMP = elementwise("clamp", "ClampBackward1", "where((self >= p0) & (self <= p1), grad, 0.0)",
                    saves=("self",), fparams=("min", "max"), args=("self",), fwd="clamp(self, p0, p1)")


def _operand_check(fn, *operands):
    """torch's signature takes Tensors only here: a number is its TypeError."""
    for pos, v in enumerate(operands, 1):
        if not isinstance(v, Tensor):
            raise _operand_error(fn, v, pos)


def clamp(x, min=None, max=None):  # noqa: A002
    _operand_check("clamp", x)
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        return _clamp_tensor(x, min, max)
    if x._data.dtype.kind != "f":  # (a float tensor keeps its dtype whatever the numbers)
        # the bounds take part in the promotion: an int tensor clamped at 1.5 gives floats, as torch
        dt = _dtype.result_type(x, *[v for v in (min, max) if v is not None])
        if dt.kind == "b":
            raise _dtype.not_implemented("clamp_scalar_cpu", dt)
        if dt != x._data.dtype:
            x = to_dtype(x, _dtype.from_numpy_dtype(dt))
    lo = -math.inf if min is None else float(min)
    hi = math.inf if max is None else float(max)
    out = np.clip(x._data, lo, hi).astype(x._data.dtype, copy=False)
    return _ew(CLAMP, asarray(out), x, p0=lo, p1=hi)


def _clamp_tensor(x, lo, hi):
    """clamp with tensor bounds (torch's clamp.Tensor), elementwise and broadcast: a where()
    per bound, so each bound gets the gradient where it is the result."""
    for v in (lo, hi):
        if v is not None and not isinstance(v, Tensor):
            raise TypeError("clamp() received an invalid combination of arguments - got (Tensor, "
                            f"{type(lo).__name__}, {type(hi).__name__})")
    dt = _dtype.from_numpy_dtype(_dtype.result_type(*[v for v in (x, lo, hi) if v is not None]))
    out = x if x._data.dtype == dt.np else to_dtype(x, dt)
    if lo is not None:
        lo = lo if lo._data.dtype == dt.np else to_dtype(lo, dt)
        out = where(lt(out, lo), lo, out)
    if hi is not None:
        hi = hi if hi._data.dtype == dt.np else to_dtype(hi, dt)
        out = where(gt(out, hi), hi, out)
    return out


clip = clamp


# torch's masked_fill form: where a NaN meets a number neither side is smaller, so both get grad
maximum = defop("maximum", "MaximumBackward0", np.maximum,
                "where(self == other, grad / 2.0, where(self < other, 0.0, grad))",
                "where(self == other, grad / 2.0, where(self > other, 0.0, grad))", saves=("self", "other"),
                numbers=False, fwd="fmax(self, other)")
minimum = defop("minimum", "MinimumBackward0", np.minimum,
                "where(self == other, grad / 2.0, where(self > other, 0.0, grad))",
                "where(self == other, grad / 2.0, where(self < other, 0.0, grad))", saves=("self", "other"),
                numbers=False, fwd="fmin(self, other)")


def _condition(ri, k):
    """where's saved condition, as torch's _saved_condition: a bool tensor."""
    return _wrap(asarray(ri.saved(k, ri.out_shape())) != 0)


WHERE = elementwise("where", "WhereBackward0", "where(condition, grad, 0.0)", "where(condition, 0.0, grad)",
                    saves=("condition",), saved_as={"condition": _condition},
                    fwd="where(condition != 0.0, self, other)")


def where(cond, a, b):
    return _where(WHERE, cond, a, b)


def _where(spec, cond, a, b):
    c = cond._data if isinstance(cond, Tensor) else np.asarray(cond)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return _wrap(np.where(c, a, b))
    like = a if isinstance(a, Tensor) else b
    ta, ad = _operand(a, like)
    tb, bd = _operand(b, like)
    try:
        out = asarray(np.where(c, ad, bd))
    except ValueError:
        raise _broadcast_error(ad.shape, bd.shape) from None
    dt = _dtype.result_type(ad, bd)  # a Python number was made a 0-d array of its torch dtype
    if out.dtype != dt:
        out = out.astype(dt)
    ta = ta if ta is not None else _wrap(np.asarray(ad, dtype=out.dtype))
    tb = tb if tb is not None else _wrap(np.asarray(bd, dtype=out.dtype))
    aux = _wrap(np.broadcast_to(c, out.shape))
    if _cap.on and _cap.mine():  # jitgrad.compile: the mask is the condition's value, not a new tensor
        _cap.rec.alias(aux, cond)
    if _cap.on and _cap.mine() and (ta is not a or tb is not b):  # a number operand was made a tensor here
        for made, given in ((ta, a), (tb, b)):
            if made is not given:
                _cap.rec.alias(made, np.asarray(made._data))
    return _ew(spec, out, ta, tb, aux=aux)


# masked_fill(x, mask, v) is where(~mask, x, v) under PyTorch's node names (a number v:
# MaskedFillBackward0; a 0-d tensor v, which gets the sum of the gradient where the mask is
# set: MaskedFillBackward1). _saved_condition is the inverted mask (torch saves the mask).
MASKED_FILL = alias("masked_fill", WHERE, "MaskedFillBackward0")
MASKED_FILL_TENSOR = alias("masked_fill_tensor", WHERE, "MaskedFillBackward1")


def masked_fill(x, mask, value):
    _operand_check("masked_fill", x)
    if not isinstance(mask, Tensor):
        raise TypeError(f"masked_fill(): argument 'mask' (position 1) must be Tensor, not {type(mask).__name__}")
    if mask._data.dtype.kind != "b":
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{c_name(mask._data.dtype)}")
    if isinstance(value, Tensor):
        if value._data.ndim:
            raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                               f"{value._data.ndim} dimension(s).")
        if value._data.dtype != x._data.dtype:
            value = to_dtype(value, _dtype.from_numpy_dtype(x._data.dtype))
        spec = MASKED_FILL_TENSOR
    else:
        value = np.asarray(value).astype(x._data.dtype).item()  # x's dtype, as in torch: a number of its kind
        spec = MASKED_FILL
    keep = logical_not(mask)  # a traced op in a jitgrad.compile recording: the mask is data
    return _where(spec, keep, x, value)


# --- comparisons and logic (never differentiable) -------------------------------------
# jitgrad.compile replays them as Python instructions (bool results; numpy is exact and
# cheap at that), operands that are not tensors being constants of the plan
def _cmp(npfn, name, numbers=True, bitwise=False):
    """A comparison or logical op: a tensor first (torch refuses a number there: the operators
    reflect instead), a number second only where torch takes one (numbers=False: logical_and).
    bitwise: the result has torch's promoted dtype, and float operands are refused as torch."""
    def op(a, b):
        if not isinstance(a, Tensor):
            raise TypeError(f"{name}() received an invalid combination of arguments - got "
                            f"({type(a).__name__}, {type(b).__name__})")
        if not numbers and not isinstance(b, Tensor):
            raise _operand_error(name, b)
        ad = a._data
        bd = b._data if isinstance(b, Tensor) else b
        if bitwise:
            dt = _dtype.result_type(ad, bd)
            if dt.kind == "f":
                raise _dtype.not_implemented(name + "_cpu", dt)
        try:
            out = asarray(npfn(ad, bd))
        except ValueError:
            raise _broadcast_error(np.shape(ad), np.shape(bd)) from None
        if bitwise and out.dtype != dt:
            out = out.astype(dt)
        res = _wrap(out)
        if _cap.on and _cap.mine():
            _trace_numpy(npfn, (a, b), res)
        return res
    op.__name__ = op.__qualname__ = name
    return op


def _unary_logic(npfn, name):
    def op(x):
        res = _wrap(npfn(x._data))
        if _cap.on and _cap.mine():
            _trace_numpy(npfn, (x,), res)
        return res
    op.__name__ = op.__qualname__ = name
    return op


def _trace_numpy(npfn, operands, res):
    """Report res = npfn(*operands) to jitgrad.compile's recorder as a Python instruction."""
    tensors = tuple(x for x in operands if isinstance(x, Tensor))
    fixed = [None if isinstance(x, Tensor) else np.array(x, copy=True) for x in operands]

    def again(*arrays):
        it = iter(arrays)
        return (np.asarray(npfn(*[next(it) if c is None else c for c in fixed])),)
    _cap.rec.python(again, tensors, (res,), npfn.__name__)


eq = _cmp(np.equal, "eq")
ne = _cmp(np.not_equal, "ne")
lt = _cmp(np.less, "lt")
le = _cmp(np.less_equal, "le")
gt = _cmp(np.greater, "gt")
ge = _cmp(np.greater_equal, "ge")
logical_and = _cmp(np.logical_and, "logical_and", numbers=False)
logical_or = _cmp(np.logical_or, "logical_or", numbers=False)
bitwise_and = _cmp(np.bitwise_and, "bitwise_and", bitwise=True)
bitwise_or = _cmp(np.bitwise_or, "bitwise_or", bitwise=True)
bitwise_xor = _cmp(np.bitwise_xor, "bitwise_xor", bitwise=True)


logical_not = _unary_logic(np.logical_not, "logical_not")
bitwise_not = _unary_logic(np.invert, "bitwise_not")
isnan = _unary_logic(np.isnan, "isnan")
isfinite = _unary_logic(np.isfinite, "isfinite")


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    _operand_check("allclose", a, b)
    if a._data.dtype != b._data.dtype:  # torch compares like dtypes only
        raise RuntimeError(f"{scalar_name(a._data.dtype)} did not match {scalar_name(b._data.dtype)}")
    if _cap.on and _cap.mine():
        _cap.rec.stop("allclose() (a Python bool computed from tensor data)")
    return bool(np.allclose(a._data, b._data, rtol=rtol, atol=atol, equal_nan=equal_nan))


def equal(a, b):
    _operand_check("equal", a, b)
    if _cap.on and _cap.mine():
        _cap.rec.stop("equal() (a Python bool computed from tensor data)")
    return a._data.shape == b._data.shape and bool((a._data == b._data).all())


def to_dtype(x, dtype):
    if dtype.is_complex:
        raise _dtype.complex_unsupported(dtype)
    if x._data.dtype == dtype.np:
        return x
    res = _wrap(x._data.astype(dtype.np))
    ints = [x._data.dtype.num]
    if dtype.is_floating_point and _needs(x):
        return record(TO_COPY, res, (x,), (), (), ints)
    if _cap.on and _cap.mine():  # jitgrad.compile: a cast to a float dtype is compiled; to an int or bool, numpy
        if dtype.is_floating_point:
            traced(TO_COPY, res, (x,), (), (), ints)
        else:
            _cap.rec.python(lambda d: (d.astype(dtype.np),), (x,), (res,), f"cast to {dtype.np}")
    return res




def to_copy_rule(grad, ri):
    (num,) = ri.iparams()
    return (to_dtype(grad, _dtype.from_numpy_dtype(_np_from_num(num))),)


def _np_from_num(num):
    for d in (np.float64, np.float32, np.int64, np.int32, np.bool_):
        if np.dtype(d).num == num:
            return np.dtype(d)
    raise ValueError(num)


def to_copy_jvp(ci, tangents):
    return to_dtype(tangents[0], ci.result.dtype)


TO_COPY = structural("to_copy", "ToCopyBackward0", rule=to_copy_rule, iparams=("dtype_num",), forward=to_dtype,
                     jvp=to_copy_jvp, fwd_kernel=f_to_copy)

# --- in-place overwrites: where(False, old, value) under torch's node names -------------
# the value lands everywhere and the old values (NaN and inf included) get an exact zero
# (they keep where's saved name: the formula text reads it; torch saves nothing for these)
FILL = alias("fill", WHERE, "FillBackward2")              # fill_(number)
FILL_TENSOR = alias("fill_tensor", WHERE, "FillBackward3")  # fill_(0-d tensor)
ZERO = alias("zero", WHERE, "ZeroBackward0")
COPY = alias("copy", WHERE, "CopyBackwards")
