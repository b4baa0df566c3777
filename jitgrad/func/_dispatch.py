"""Where BatchedTensors meet the ops: BatchedTensor's methods, and the public entry points
swapped for dispatchers while a vmap level is active.

Ops are Python functions that read `._data`, so a BatchedTensor must not reach them. Its
methods and operators (generated here from Tensor's, the op table's bindings) hand every
call to its batching rule (_rules.call). A BatchedTensor can also be an argument of a
plain call: `torch.sin(x)`, `F.linear(x, w)`, `w @ x`, `y.add_(x)`; for those, while a
level is active (and only then: nothing changes outside vmap), `jitgrad.<name>`,
`jitgrad.nn.functional.<name>`, the names nn's modules call (nn.conv) and Tensor's
methods are dispatchers: with no BatchedTensor among the arguments a dispatcher calls the
original, else the rule. `install` / `uninstall` swap them in and out (vmap does, around
its outermost level).
"""
import functools
import sys
import types

from jitgrad.func import _rules
from jitgrad.func._batched import BatchedTensor
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import FUNCTIONS
from jitgrad.ops import _common as _ops_common

# Tensor methods that only read metadata or convert: BatchedTensor has its own
_OWN = {"size", "dim", "ndimension", "numel", "nelement", "is_floating_point", "is_complex", "is_contiguous", "item", "tolist", "numpy",
        "_make", "_array", "_bump"}
_OPERATORS = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__pow__", "__rpow__", "__neg__", "__abs__", "__matmul__", "__rmatmul__", "__getitem__",
              "__setitem__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__", "__or__",
              "__xor__", "__invert__", "__iadd__", "__isub__", "__imul__", "__itruediv__")
_RANDOM = {"rand": _rules.random_factory, "randn": _rules.random_factory, "rand_like": _rules.random_like,
           "randn_like": _rules.random_like}


def _original(f):
    return getattr(f, "_vmap_original", f)


def tensor_methods():
    """{name: original function}: Tensor's methods and operators that run ops."""
    out = {}
    for name, f in vars(Tensor).items():
        if callable(f) and not isinstance(f, type) and (not name.startswith("_") or name in _OPERATORS) \
                and name not in _OWN:
            out[name] = _original(f)
    return out


def _has_batched(args, kwargs):
    for a in args:
        t = type(a)
        if t is BatchedTensor:
            return True
        if t is tuple or t is list:
            for b in a:
                if type(b) is BatchedTensor:
                    return True
    if kwargs:
        return _has_batched(kwargs.values(), None)
    return False


def _function_dispatcher(name, fn):
    call = _rules.call

    def dispatch(*args, **kwargs):
        if not _has_batched(args, kwargs):
            return fn(*args, **kwargs)
        return call(name, fn, args, kwargs)
    dispatch._vmap_original = fn
    dispatch.__name__ = getattr(fn, "__name__", name)
    return dispatch


def _method(name, fn):
    """BatchedTensor.<name>: always the rule."""
    call = _rules.call

    def method(self, *args, **kwargs):
        return call(name, fn, (self,) + args, kwargs)
    method.__name__ = name
    return method


# --- BatchedTensor's methods, from Tensor's ----------------------------------------------------
for _name, _fn in tensor_methods().items():
    setattr(BatchedTensor, _name, _method(_name, _fn))
BatchedTensor.T = property(_rules.logical_T)
BatchedTensor.mT = property(_rules.logical_mT)
BatchedTensor.__array_ufunc__ = None      # numpy defers to the reflected operators


_TENSOR_INTERNALS = frozenset(Tensor.__slots__) - {"__weakref__", "__dict__"}


def _late_method(self, name):
    """A method bound to Tensor after import (an op declared with defop later)."""
    f = getattr(Tensor, name, None)
    if name in _TENSOR_INTERNALS:
        # an op's internals read a BatchedTensor: the op was reached without its dispatcher,
        # through a reference taken before vmap started (`from jitgrad import sin`)
        raise AttributeError(f"'BatchedTensor' object has no attribute '{name}': a jitgrad op received a vmap "
                             "BatchedTensor without being dispatched. vmap swaps the ops of jitgrad, jitgrad.linalg, "
                             "jitgrad.nn.functional and Tensor while it runs; an op bound to another name before "
                             "vmap started (`from jitgrad import sin`) bypasses that: call it as jitgrad.sin(x) "
                             "inside the function")
    if f is None or name.startswith("_") or not callable(f):
        raise AttributeError(f"'BatchedTensor' object has no attribute '{name}'")
    return _method(name, _original(f)).__get__(self)


BatchedTensor.__getattr__ = _late_method


# --- the swap -------------------------------------------------------------------------------------
_SWAPPED = []   # (owner, name, original)


def _public_functions(module):
    """{attr: function} of a namespace's public functions (not classes or modules). jitgrad's
    lazily loaded names (compile, save, load, vmap ...) are entry points, not ops, even once
    their first use has put them in the namespace."""
    lazy = vars(module).get("_LAZY", ())
    return {attr: f for attr, f in list(vars(module).items())
            if callable(f) and not attr.startswith("_") and not isinstance(f, type) and attr not in lazy
            and getattr(f, "__module__", "").startswith("jitgrad")}


def _maker(name):
    """The dispatcher maker of a random op (vmap's randomness flag), None for the others."""
    if name in _RANDOM:
        return _RANDOM[name]
    if name in _rules.RANDOM_OPS:
        return _random_dispatcher
    return None


def _targets():
    """(owner, attribute, rule name, maker) of every entry point that is swapped: every public
    function of jitgrad, jitgrad.linalg and jitgrad.nn.functional, and Tensor's methods. The
    rule name is the op's (an alias shares it); an op without a rule loops over the batch."""
    top = sys.modules["jitgrad"]
    names = {id(f): n for n, f in FUNCTIONS.items()}
    names.update({id(f): n for n, f in _ops_common.PUBLIC.items()})
    out = []
    for attr, f in _public_functions(top).items():
        name = names.get(id(_original(f)), attr)
        out.append((top, attr, name, _maker(attr)))
    linalg = sys.modules["jitgrad.linalg"]
    for attr in _public_functions(linalg):
        out.append((linalg, attr, "linalg." + attr, None))      # torch.linalg's own ops, not jitgrad.<attr>
    nnf = sys.modules["jitgrad.nn.functional"]
    for attr in _public_functions(nnf):
        out.append((nnf, attr, attr, _rules.random_dropout if attr == "dropout" else None))
    fwad = sys.modules["jitgrad.autograd.forward_ad"]
    out += [(fwad, "make_dual", "make_dual", None), (fwad, "unpack_dual", "unpack_dual", None)]
    conv = sys.modules["jitgrad.nn.conv"]
    out += [(conv, "conv2d", "conv2d", None), (conv, "max_pool2d", "max_pool2d", None),
            (conv, "_pad2d", "_pad2d", None)]
    for attr in tensor_methods():
        out.append((Tensor, attr, attr, _maker(attr)))
    return out


def _random_dispatcher(fn, name):
    """A random op: through the rule even without a BatchedTensor argument, which checks the
    randomness flag and draws per sample of the 'different' levels."""
    call = _rules.call

    def dispatch(*args, **kwargs):
        return call(name, fn, args, kwargs)
    dispatch.__name__ = getattr(fn, "__name__", name)
    return dispatch


_PLAN = {}      # (owner, attribute) -> (rule name, maker, original, dispatcher): made once per original
_PLAN_KEY = [None]
_BY_ORIGINAL = {}   # id(original) -> (owner, attribute): what vmap(torch.sin) dispatches to


def _plan():
    """The swaps to make, cached: building dispatchers costs far more than setting them. It
    is remade when the table or a namespace grows (an op declared later)."""
    key = (len(_ops_common.PUBLIC), len(vars(Tensor)), len(vars(sys.modules["jitgrad"])))
    if _PLAN_KEY[0] != key:
        _rules.register_elementwise(_ops_common.PUBLIC)
        _PLAN.clear()
        _BY_ORIGINAL.clear()
        for owner, attr, name, maker in _targets():
            _PLAN[owner, attr] = (name, maker, None, None)
            _BY_ORIGINAL.setdefault(id(_original(getattr(owner, attr))), (owner, attr))
        _PLAN_KEY[0] = key
    return _PLAN


def install():
    """Swap the public entry points for dispatchers (vmap's outermost level enters)."""
    plan = _plan()
    for (owner, attr), (name, maker, orig, new) in plan.items():
        current = _original(getattr(owner, attr))
        if current is not orig:         # first use, or the attribute was replaced since
            orig = current
            new = maker(orig, name) if maker is not None else _function_dispatcher(name, orig)
            new._vmap_original = orig
            plan[owner, attr] = (name, maker, orig, new)
        _SWAPPED.append((owner, attr, orig))
        setattr(owner, attr, new)


def uninstall():
    """Put the originals back (the outermost level exits, also on an exception)."""
    while _SWAPPED:
        owner, attr, orig = _SWAPPED.pop()
        setattr(owner, attr, orig)


def dispatched(func):
    """func, or its dispatcher when it is a swapped entry point captured before vmap started
    (vmap(torch.sin), vmap(F.relu), a partial of one, a bound method): else BatchedTensors
    would reach the op itself. Call while installed."""
    if isinstance(func, functools.partial):
        inner = dispatched(func.func)
        return func if inner is func.func else functools.partial(inner, *func.args, **func.keywords)
    if isinstance(func, types.MethodType):
        inner = dispatched(func.__func__)
        return func if inner is func.__func__ else types.MethodType(inner, func.__self__)
    where = _BY_ORIGINAL.get(id(func))
    return func if where is None else getattr(*where)
