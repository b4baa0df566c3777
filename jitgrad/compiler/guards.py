"""What a replay must still see as it was recorded, beyond the call's signature.

A plan (compiler/plan.py) bakes in which objects the step reached: the tensors it read,
the modules it called, the optimizer it stepped, Python numbers. Eager code finds them
again at every call, through names. So a plan is valid only while:

- every global, closure cell and attribute of a plain object that the step's code reads
  by name still holds the object it held (identity). The names are those of the code
  objects of the step and of the user functions it reaches (the methods of the objects
  and modules it reaches included), as torch.compile guards the globals and closures it
  traced through; the code is read once, at recording. A name the step's code assigns
  (a counter it increments) is its own state, not guarded;
- every module reached (called, or found through those names, and all of their
  submodules) holds the same attributes, parameters, buffers, submodules and forward
  hooks. Looking at them all is a walk over the model, so it happens only when the
  global generation (_core/capture.generation) moved: nn/module.py bumps it at every
  such change. A call pays one integer compare for the modules;
- the lists and dicts the step reads by name hold the same items.

A step that leaves a tensor it made in such a place (state carried across calls), or that
reads there a tensor it was also given as an argument, is not replayed (collect's str).

What is not seen (README, jitgrad.compile): attributes of classes and of library modules
and objects, objects reached other than by names, lists and dicts (a function's result);
the contents of numpy arrays and of mutable objects that are not lists or dicts, and
lists or dicts in a step that calls a mutating method (.append: its own side effect);
module state changed around Module.__setattr__ (object.__setattr__, __dict__). The
optimizer's parameter groups are checked by its replayed step (optim/_replay.py).
"""
import dis
import functools
import operator
import os
import sys
import sysconfig
import types

from jitgrad._core.capture import generation
from jitgrad.graph.tensor import Tensor
from jitgrad.nn.module import Module
from jitgrad.optim.optimizer import Optimizer

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES = os.path.join(_PACKAGE, "examples")
# libraries whose code is not user code (its names are not guarded), and those whose objects'
# attributes are not (the standard library's are: a types.SimpleNamespace, an argparse.Namespace)
_OPAQUE = frozenset({"jitgrad", "numpy", "numba", "torch", "scipy", "pytest", "_pytest"})
_LIBRARIES = frozenset(sys.stdlib_module_names) | _OPAQUE
_INSTALLED = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
_MISSING = object()
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_DEPTH = 6  # how far from the step's own names: function -> global -> attribute -> ...


class Guards:
    __slots__ = ("gen", "names", "cells", "items", "modules")

    def __init__(self, gen, names, cells, items, modules):
        self.gen = gen           # generation[0] when the modules were last seen as recorded
        self.names = names       # (namespace dict, name, value)
        self.cells = cells       # (closure cell, value)
        self.items = items       # (list or dict, (its keys, its values) then)
        self.modules = modules   # (module, _state(module) then)


def holds(g):
    """Whether a call may replay: what the step reaches is what it reached when recorded."""
    gen = generation[0]
    if g.gen != gen:
        # (read before looking: a change made while looking bumps it again, after itself)
        for m, state in g.modules:
            if not _same(_state(m), state):
                return False
        g.gen = gen
    for d, name, v in g.names:
        if d.get(name, _MISSING) is not v:
            return False
    for cell, v in g.cells:
        try:
            if cell.cell_contents is not v:
                return False
        except ValueError:  # emptied (del of a closure variable)
            return False
    for obj, items in g.items:  # (identity at C speed first; numbers and strings by value)
        cur = obj.values() if type(obj) is dict else obj
        if len(obj) != len(items[1]) or (type(obj) is dict and tuple(obj) != items[0]) or not (
                all(map(operator.is_, cur, items[1])) or _same(tuple(cur), items[1])):
            return False
    return True


def collect(fn, args, called, made, given, compiled_type):
    """The guards of a plan recorded from fn(*args) (`called`: the modules the step called),
    or a str: why the step cannot be replayed. made: ids of the tensors the step made or
    was given, given: those of the arguments. compiled_type: api's CompiledFunction (passed
    in: api imports this module), whose instances called in the step are walked into."""
    c = _Collector(compiled_type, made, given)
    f = getattr(fn, "__func__", fn)
    if not isinstance(f, types.FunctionType):
        f = getattr(type(fn), "__call__", None)  # a callable object: its __call__ runs
    if not isinstance(f, types.FunctionType) or _library_code(f.__code__):
        f = None  # (compile(module): Module.__call__; its forward is one of the methods walked)
    if f is not None:
        c.runs(f.__code__)
    names = _info(f.__code__).reads if f is not None else frozenset()
    c.value(fn, names, 0)
    for a in args:  # another argument (a module, an object) is keyed by identity; what it holds is guarded
        c.value(a, names, 1)
    for m in called:
        c.value(m, names, 1)
    modules = {}
    for root in c.roots:
        for m in root.modules():
            modules.setdefault(id(m), m)
    for m in modules.values():  # the user code of every module's class reads names too
        c.methods(type(m))
        for k, v in (*m.__dict__.items(), *m._parameters.items(), *m._buffers.items()):
            c.kept(v, f"{type(m).__name__}.{k}")
    if c.why is not None:
        return c.why
    # a name the step's code assigns is its own state, as a counter it increments (its Python
    # runs only while recording): not guarded, or every recording of another signature would
    # fail the others' guards (kept() made sure it holds no tensor of the step's); nor are the
    # lists of a step that changes lists itself (.append: the same)
    return Guards(generation[0], [(d, n, v) for d, n, v in c.names if n not in c.stores],
                  [(cell, v) for n, cell, v in c.cells if n not in c.stores], [] if c.mutates else c.items,
                  [(m, _state(m)) for m in modules.values()])


class _Code:
    """What a code object (with the functions nested in it) does with names: the global and
    attribute names it reads, those it assigns, whether it calls a list's or a dict's
    mutating method."""
    __slots__ = ("reads", "stores", "mutates")

    def __init__(self, reads, stores, mutates):
        self.reads, self.stores, self.mutates = reads, stores, mutates


_STORES = frozenset({"STORE_ATTR", "STORE_GLOBAL", "STORE_DEREF", "STORE_NAME", "DELETE_ATTR", "DELETE_GLOBAL",
                     "DELETE_DEREF", "DELETE_NAME"})
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem",
                       "sort", "reverse", "__setitem__", "__delitem__"})


@functools.lru_cache(maxsize=1024)
def _info(code):
    reads, stores = set(code.co_names), set()
    for ins in dis.get_instructions(code):
        if ins.opname in _STORES:
            stores.add(ins.argval)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            inner = _info(c)
            reads |= inner.reads
            stores |= inner.stores
    return _Code(frozenset(reads), frozenset(stores), not _MUTATORS.isdisjoint(reads))


class _Collector:
    """Walks from the step's function to what it reaches by name (value()), noting the guards.
    `names` in each call: the names the code that reached the value reads (an object's
    attributes are guarded for those)."""

    def __init__(self, compiled, made, given):
        self.compiled = compiled
        self.made, self.given = made, given
        self.why = None    # why the step cannot be replayed (kept()), if it cannot
        self.names, self.cells, self.items = [], [], []
        self.roots = []
        self.seen = set()
        self.named = set()
        self.stores = set()     # names the step's code assigns (runs())
        self.mutates = False    # whether it calls a list's or dict's mutating method

    def runs(self, code):
        """`code` runs in the step (the step's function, the functions it calls by name)."""
        info = _info(code)
        self.stores |= info.stores
        self.mutates |= info.mutates

    def value(self, v, names, depth):
        """What reaching v (from code reading `names`) adds to the guards."""
        if depth > _DEPTH or isinstance(v, _SCALARS) or (id(v), names) in self.seen:
            return
        self.seen.add((id(v), names))
        if isinstance(v, Module):
            self.roots.append(v)
        elif isinstance(v, (Tensor, Optimizer, type)):
            return  # tensors: plan.ext; optimizers: their replayed step; classes: not guarded
        elif isinstance(v, types.FunctionType):
            self.function(v, depth)
        elif isinstance(v, types.MethodType):  # its function reads attributes of its self
            f = v.__func__
            own = _info(f.__code__).reads if isinstance(f, types.FunctionType) else frozenset()
            self.value(v.__self__, names | own, depth + 1)
            self.value(f, names, depth + 1)
        elif isinstance(v, (staticmethod, classmethod)):
            self.value(v.__func__, names, depth)
        elif isinstance(v, property):
            for f in (v.fget, v.fset):
                self.value(f, names, depth)
        elif isinstance(v, functools.partial):
            for x in (v.func, *v.args, *v.keywords.values()):
                self.value(x, names, depth + 1)
        elif isinstance(v, types.ModuleType):
            if not _library(v.__name__):
                self.namespace(v.__dict__, names, depth)
        elif isinstance(v, (list, dict)):
            if type(v) in (list, dict):  # (its keys, its values)
                self.items.append((v, (tuple(v), tuple(v.values())) if type(v) is dict else (None, tuple(v))))
            for x in (v.values() if isinstance(v, dict) else v):
                self.kept(x, "a list or dict")
                self.value(x, names, depth + 1)
        elif isinstance(v, tuple):
            for x in v:
                self.value(x, names, depth + 1)
        elif isinstance(v, self.compiled):  # a compiled function the step calls
            self.value(v.fn, names, depth + 1)
        else:
            d = getattr(v, "__dict__", None)
            if type(d) is dict and (type(v).__module__ or "").partition(".")[0] not in _OPAQUE:
                self.namespace(d, names | _class_reads(type(v)), depth)  # (its methods read self's attributes)
                self.methods(type(v))

    def methods(self, klass):
        """The user code of klass and its bases: the functions its methods call read names too
        (what they assign is not the step's own state: __init__ assigns what the step reads,
        a setter what the user changes between calls)."""
        for k in klass.__mro__:
            if not _library(k.__module__) and k not in self.seen:
                self.seen.add(k)
                for attr in vars(k).values():
                    if isinstance(attr, types.FunctionType):
                        self.function(attr, 1, runs=False)
                    else:
                        self.value(attr, frozenset(), 1)

    def function(self, f, depth, runs=True):
        code = f.__code__
        if _library_code(code):
            return
        if runs:
            self.runs(code)
        names = _info(code).reads
        self.namespace(f.__globals__, names, depth)
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:
                continue  # not yet bound: reading it raises in eager too
            self.kept(v, name)
            self.cells.append((name, cell, v))
            self.value(v, names, depth + 1)
        for x in (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()):
            self.value(x, names, depth + 1)

    def namespace(self, d, names, depth):
        """Guard the entries of d (globals, an object's __dict__) that the code reads (but
        library modules and functions, and classes: not rebound)."""
        for name in names:
            v = d.get(name, _MISSING)
            if v is _MISSING:
                continue
            self.kept(v, name)
            if (id(d), name) not in self.named and not (
                    isinstance(v, (types.ModuleType, type, types.BuiltinFunctionType))
                    or (isinstance(v, types.FunctionType) and _library_code(v.__code__))):
                self.named.add((id(d), name))
                self.names.append((d, name, v))
            self.value(v, names, depth + 1)

    def kept(self, v, where):
        """v, found in `where`, must not be a tensor the step made or was given as an argument.
        One it made and left there (state carried across calls): eager's next call reads it,
        a replay would neither make it again nor store it. One it was given: the recording
        took what the step read there for the argument, so a replay would read each call's
        argument there."""
        if self.why is None and id(v) in self.made:
            self.why = (f"has in {where} a tensor given to it as an argument (the recording cannot tell the "
                        "two apart: a replay would neither read nor leave a later call's argument there)"
                        if id(v) in self.given else
                        f"keeps a tensor it made in {where} (a replay would not update it): return it instead")


def _class_reads(klass):
    """The names the user code of klass's methods reads."""
    names = set()
    for k in klass.__mro__:
        if not _library(k.__module__):
            for attr in vars(k).values():
                f = getattr(attr, "__func__", attr)
                if isinstance(f, types.FunctionType):
                    names |= _info(f.__code__).reads
    return frozenset(names)


def _library(module_name):
    return (module_name or "").partition(".")[0] in _LIBRARIES


def _library_code(code):
    name = code.co_filename
    return (name.startswith(_PACKAGE) and not name.startswith(_EXAMPLES)) or name.startswith(_INSTALLED) \
        or name.startswith("<frozen")


def _state(m):
    """What module m holds, as the plan's guards compare it."""
    return (tuple(m.__dict__.items()), tuple(m._parameters.items()), tuple(m._buffers.items()),
            tuple(m._modules.items()), _hooks(m._forward_hooks), _hooks(m._forward_pre_hooks))


def _hooks(registry):
    return tuple((k, tuple(v.items())) for k, v in registry.items())


def _same(a, b):
    """a and b hold the same objects: tuples item by item, numbers and strings by value."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(map(_same, a, b))
    return isinstance(a, _SCALARS) and a == b
