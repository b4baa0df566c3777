"""What every op family shares: grad-mode checks, operand handling, error messages, and
the registry of public ops the table (ops/__init__.py) binds as `jitgrad.xxx` functions
and Tensor methods."""
import builtins
import sys

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core import modes as _grad_mode
from jitgrad._core.capture import state as _cap  # noqa: F401  (families import it from here)
from jitgrad._core.forward import state as _fw
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.tensor import _ARRAYLIKE, Tensor  # noqa: F401  (families import them from here)

_gm_state = _grad_mode._state
_new = object.__new__

_f64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_NUMBER = (float, int, bool)

# name -> function: ops declared public by their entry (elementwise `defop`), bound by the
# table as jitgrad.<name> and, where METHODS says so, Tensor.<name>
PUBLIC = {}
METHODS = {}
_bound = [False]  # the table has bound everything: later declarations bind at once


def publish(name, fn, method=True):
    PUBLIC[name] = fn
    if method:
        METHODS[name] = fn
    if _bound[0]:
        if method:
            setattr(Tensor, name, fn)
        ops_pkg = sys.modules.get("jitgrad.ops")
        if ops_pkg is not None:
            setattr(ops_pkg, name, fn)


def traced(spec, res, inputs, saved=(), fparams=(), iparams=None, extra=()):
    """Report structural op `spec` to jitgrad.compile's recorder when it is not recorded
    for grad (record() reports those): pass what record() would get (the saved values
    included, which the forward kernel makes again) and any extra output tensors."""
    if _cap.on and _cap.mine():
        _cap.rec.struct(spec, res, inputs, saved, fparams, iparams, extra)
    return res


def _needs(*ts):
    """The op must record its row (grad mode and an input requiring grad) or, in forward
    mode, compute its output's tangent (an input has one): go on to `record`."""
    if _gm_state.enabled:
        for t in ts:
            if t._requires_grad:
                return True
    if _fw.live:
        for t in ts:
            x = t._x
            if x is not None and x.fw is not None:
                return True
    return False


# --- arrays on the device of the data beside them (a CUDA tensor's data is a DeviceArray)

def like(d):
    """numpy's `like=` for an array made to meet array d: d when d is on the device (numpy
    then dispatches the creation to it), else None (the host)."""
    return d if type(d) is DeviceArray else None


def asarray(x, dtype=None):
    """np.asarray(x, dtype) for a result that may be device data, which stays where it is
    (np.asarray would refuse it: it must not reach the host)."""
    if type(x) is DeviceArray:
        return x if dtype is None or x.dtype == dtype else x.astype(dtype)
    return np.asarray(x, dtype=dtype)


def storage(t):
    """Tensor t's array, to write into in place: its ndarray (a 0-d result held as a numpy
    scalar becomes one) or its device array. An expand() view is a read-only numpy array
    (so that nothing writes one location twice by accident); a write that the in-place op
    checked not to overlap (inplace._check_writable) goes through a writable alias of it."""
    if type(t._data) is DeviceArray:
        return t._data
    a = t._array()
    return a if a.flags.writeable else _writable_alias(a)


def _writable_alias(a):
    root = a
    while True:
        b = root.base
        if not isinstance(b, np.ndarray):  # as_strided's view (a gather's, of a tangent) keeps its base behind a
            b = getattr(b, "base", None)   # numpy DummyArray
            if not isinstance(b, np.ndarray):
                break
        root = b
    if not root.flags.writeable:  # the memory itself is read-only: numpy's own error follows
        return a
    offset = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return np.ndarray(a.shape, a.dtype, buffer=root, offset=offset, strides=a.strides)


def copy_array(d):
    """A copy of a tensor's data, on its device (a 0-d result held as a numpy scalar gives
    a 0-d array)."""
    return d.copy() if type(d) is DeviceArray else np.array(d, copy=True)


def _broadcast_error(sa, sb):
    n = builtins.max(len(sa), len(sb))  # this module defines its own max
    for i in range(1, n + 1):
        x = sa[-i] if i <= len(sa) else 1
        y = sb[-i] if i <= len(sb) else 1
        if x != y and x != 1 and y != 1:
            return RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b ({y}) "
                                f"at non-singleton dimension {n - i}")
    return RuntimeError(f"shapes {tuple(sa)} and {tuple(sb)} cannot be broadcast")


def _scalar_dtype(t, s):
    """The result dtype of tensor t with Python number s, as torch: a number only decides the
    category (float beside an int tensor gives the default dtype, int beside bool int64)."""
    return _dtype.result_type(t._data, s)


def _operand(x, like):
    """Tensor -> (tensor, array); Python number -> (None, 0-d array of the promoted dtype)."""
    if isinstance(x, Tensor):
        return x, x._data
    if isinstance(x, np.ndarray):
        return None, x
    return None, np.asarray(x, dtype=_scalar_dtype(like, x))



def refuse(kernel, *operands, ints=False):
    """torch has no kernel for bool (ints=True: nor int) tensors in this op: its
    NotImplementedError, '"kernel" not implemented for 'Bool''. One dtype check per operand."""
    for t in operands:
        if isinstance(t, Tensor):
            k = t._data.dtype.kind
            if k == "b" or ints and k in "iu":
                raise _dtype.not_implemented(kernel, t._data.dtype)


def need_tensor(fn, x, pos=2):
    """torch's signature takes only a Tensor here (maximum, atan2...): a number is a TypeError."""
    if not isinstance(x, Tensor):
        raise _operand_error(fn, x, pos)


class OperandTypeError(TypeError):
    """An operand that is neither a Tensor nor a number. Tensor's operators turn it into
    NotImplemented, so Python raises its own "unsupported operand type(s)" TypeError, as torch does."""


def _operand_error(fn, x, pos=2):
    name = "other" if pos == 2 else "input"
    return OperandTypeError(f"{fn}(): argument '{name}' (position {pos}) must be Tensor, not {type(x).__name__}")
