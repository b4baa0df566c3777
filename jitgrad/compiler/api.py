"""jitgrad.compile: PyTorch's torch.compile API over record-once, replay-many plans.

A compiled function keeps a plan per call signature (the arguments' shapes, dtypes,
devices, requires_grad and aliasing, the values of Python-number arguments, grad mode).
The first call of a signature runs the function eagerly while recording
(compiler/recorder.py) and builds a plan (compiler/plan.py); later calls replay it
(compiler/replay.py) as long as the guards hold (replay.check: the outside tensors;
compiler/guards.py: what the step reaches by name). A recording that cannot be replayed
(a graph break: .item(), an in-place op, a custom Function, ...) leaves that signature
to run eagerly every call; under fullgraph=True it raises instead. `explain` says what
broke and where.

As under jax.jit, Python that touches no tensor (print, appending to a list) runs only
while recording, and Python numbers the step computes with are constants of the plan:
pass a number that changes as an argument (a new value gives a new signature) or as a
tensor.
"""
import functools
import gc
import threading
import warnings

import numpy as np

from jitgrad._core import modes
from jitgrad._core.capture import state as _cap
from jitgrad._core.forward import state as _fw
from jitgrad.compiler import guards, replay
from jitgrad.compiler.plan import Plan, Unsupported
from jitgrad.compiler.recorder import GraphBreak, Recorder
from jitgrad.func._pytree import LeafSpec, tree_flatten, tree_unflatten
from jitgrad.graph import tape as _tape
from jitgrad.graph.tensor import Tensor
from jitgrad.nn.module import Module


class _Config:
    cache_size_limit = 8    # plans per compiled function, as torch._dynamo.config.cache_size_limit
    verbose = False


config = _Config()


class _Eager:
    """A signature whose recording broke: it runs eagerly from now on."""
    __slots__ = ("breaks",)

    def __init__(self, breaks):
        self.breaks = breaks


class _Entry:
    __slots__ = ("plan", "outputs", "vids", "out_spec", "single", "guards")

    def __init__(self, plan, outputs, out_spec, guards):
        self.plan = plan
        self.guards = guards        # compiler/guards.py: what the step reached by name
        self.outputs = outputs      # per leaf of the result: ("value", value id) or ("const", x)
        self.vids = list(dict.fromkeys(k for kind, k in outputs if kind == "value"))
        self.single = isinstance(out_spec, LeafSpec) and len(self.vids) == 1
        self.out_spec = out_spec


def _signature(flat):
    sig = []
    first = {}  # id -> position of the tensor's first occurrence: f(x, x) and f(x, y) are two signatures
    for i, x in enumerate(flat):
        if isinstance(x, Tensor):
            at = first.setdefault(id(x), i)
            if at != i:
                sig.append(("same as", at))
                continue
            d = x._data
            sig.append((type(d), d.shape, d.dtype, x._requires_grad))
        elif x is None or isinstance(x, (bool, int, float, str, np.generic)):
            sig.append((type(x), x))
        elif isinstance(x, np.ndarray):  # its values are constants of the plan: keyed by them
            sig.append((np.ndarray, x.dtype.str, x.shape, x.tobytes()))
        else:
            sig.append(_Same(x))
    return tuple(sig)


class _Same:
    """Another argument, by identity; held, so that its id is not reused while keyed."""
    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __hash__(self):
        return id(self.x)

    def __eq__(self, other):
        return type(other) is _Same and other.x is self.x


class CompiledFunction:
    def __init__(self, fn, fullgraph=False, dynamic=False, mode=None):
        self.fn = fn
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.mode = mode
        self.cache = {}
        self.warned = False
        self.lock = threading.Lock()  # a plan's arena holds one call's values: one replay at a time
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        if _cap.on or _fw.live or modes._anomaly[0]:
            # inside another recording (it traces this call's ops itself), in forward mode or
            # anomaly mode (neither is replayed): eager
            return self.fn(*args, **kwargs)
        if not kwargs and all(type(a) is Tensor for a in args):  # the common call: tensors only
            flat = args
            # (the array's type is the device: a CUDA tensor's is a DeviceArray; one tensor
            # passed twice makes another signature: the plan reads it as one value)
            key = (modes.is_grad_enabled(), len(args),
                   tuple((type(d), d.shape, d.dtype, a._requires_grad) for a in args for d in (a._data,)),
                   len(args) > 1 and len(set(map(id, args))) < len(args) and _signature(args))
        else:
            flat, spec = tree_flatten((args, kwargs))
            key = (modes.is_grad_enabled(), spec, _signature(flat))
        entry = self.cache.get(key)
        if entry is None:
            if len(self.cache) >= config.cache_size_limit:
                if not self.warned:
                    warnings.warn(f"jitgrad.compile: {getattr(self.fn, '__name__', 'function')} reached "
                                  f"cache_size_limit ({config.cache_size_limit}) plans; new signatures run "
                                  "eagerly", stacklevel=2)
                    self.warned = True
                return self.fn(*args, **kwargs)
            return self._record(key, flat, args, kwargs)
        if type(entry) is _Eager:
            return self.fn(*args, **kwargs)
        tensors = flat if flat is args else [x for x in flat if isinstance(x, Tensor)]
        plan = entry.plan
        ok = guards.holds(entry.guards) and replay.check(plan, tensors)
        if ok is replay.HOOKED:
            return self.fn(*args, **kwargs)
        if not ok:
            del self.cache[key]
            return self._record(key, flat, args, kwargs)
        with self.lock:
            replay.run(plan, tensors)
            made = replay.outputs(plan, entry.vids, tensors)
        if entry.single:
            return made[entry.vids[0]]
        leaves = [made[x] if kind == "value" else x for kind, x in entry.outputs]
        return tree_unflatten(leaves, entry.out_spec)

    def _record(self, key, flat, args, kwargs):
        tensors = [x for x in flat if isinstance(x, Tensor)]
        rec = Recorder(tensors)
        rec.fullgraph = self.fullgraph
        _tape.close_current_tape()  # the step's graph starts on a tape of its own
        floor = next(_tape._tape_ids)  # every tape the step makes has a larger id
        # the recording makes several objects per op and keeps them: the cyclic GC, run
        # every 700 allocations over an ever larger heap, would cost more than recording
        gc_was = gc.isenabled()
        gc.disable()
        try:
            return self._record_and_plan(rec, floor, key, args, kwargs)
        finally:
            if gc_was:
                gc.enable()

    def _record_and_plan(self, rec, floor, key, args, kwargs):
        _cap.rec = rec
        _cap.on = True
        try:
            result = self.fn(*args, **kwargs)
        finally:
            _cap.on = False
            _cap.rec = None
        rec.finish()
        out_flat, out_spec = tree_flatten(result)
        outputs = []
        outside = [v.tensor._data for v in rec.values if v.kind in ("arg", "ext") and v.tensor is not None]
        for x in out_flat:
            if isinstance(x, Tensor):
                k = rec.vid.get(id(x))
                if k is None:
                    rec.stop("returns a tensor the step did not make with traced ops")
                    break
                if any(np.may_share_memory(x._data, d) for d in outside):
                    # eager's is a view: it shows what the step (an optimizer) or the caller
                    # later does to that tensor; a replay's would be a copy
                    rec.stop("returns a view of an argument or of a tensor from outside the step (a parameter)")
                    break
                outputs.append(("value", k))
            else:
                outputs.append(("const", x))
        plan = None
        if not rec.breaks:
            try:
                plan = Plan(rec, floor, [k for kind, k in outputs if kind == "value"])
            except Unsupported as e:
                rec.breaks.append((str(e), e.where))
        if rec.breaks:
            if self.fullgraph:
                reason, where = rec.breaks[0]
                raise GraphBreak(f"jitgrad.compile(fullgraph=True): {reason} at {where}")
            self.cache[key] = _Eager(rec.breaks)
            return result

        # (rec.vid: the tensors the step made or was given, held while the recorder lives)
        g = guards.collect(self.fn, args + tuple(kwargs.values()), [m for m, _, _ in plan.modules], rec.vid,
                           {id(v.tensor) for v in rec.values if v.kind == "arg"}, CompiledFunction)
        if isinstance(g, str):
            rec.stop(g)  # (raises under fullgraph=True)
            self.cache[key] = _Eager(rec.breaks)
        else:
            self.cache[key] = _Entry(plan, outputs, out_spec, g)
        return result


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None,  # noqa: A001
            disable=False):
    """Compile `model` (a function, or an nn.Module whose forward is compiled) as
    torch.compile does: usable as `compile(fn)`, `@compile` and `@compile(fullgraph=True)`.
    backend and options are accepted for PyTorch code and ignored (there is one backend)."""
    if model is None:
        def wrap_fn(m):
            return compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options,
                           disable=disable)
        return wrap_fn
    if disable:
        return model
    if isinstance(model, Module):
        # its __call__, as torch: the module's hooks and its train/eval guard are in the step
        return OptimizedModule(model, CompiledFunction(model.__call__, fullgraph, dynamic, mode))
    if not callable(model):
        raise RuntimeError("compile() expects a callable or an nn.Module")
    return CompiledFunction(model, fullgraph, dynamic, mode)


class OptimizedModule(Module):
    """What compile(module) returns, as torch's: a Module around `_orig_mod` whose forward
    is compiled; attributes not its own are the original module's."""

    def __init__(self, mod, compiled):
        super().__init__()
        self._orig_mod = mod
        object.__setattr__(self, "_compiled", compiled)

    def forward(self, *args, **kwargs):
        return self._compiled(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)


class ExplainOutput:
    """What explain() found, with torch._dynamo.explain's names."""

    def __init__(self, breaks, n_instrs):
        self.break_reasons = [f"{reason} ({where})" for reason, where in breaks]
        self.graph_break_count = len(breaks)
        self.graph_count = 1 if not breaks else 0
        self.op_count = n_instrs

    def __str__(self):
        lines = [f"Graph Count: {self.graph_count}", f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}"]
        if self.break_reasons:
            lines.append("Break Reasons:")
            lines.extend(f"  Break Reason {i + 1}: {r}" for i, r in enumerate(self.break_reasons))
        return "\n".join(lines)

    __repr__ = __str__


def explain(fn, *args, **kwargs):
    """Record one call of fn(*args, **kwargs) (it runs, eagerly) and report what a plan
    could not replay. Also usable as explain(fn)(*args), as torch._dynamo.explain."""
    if not args and not kwargs:
        return lambda *a, **k: explain(fn, *a, **k)
    cf = CompiledFunction(getattr(fn, "fn", fn))
    flat, _ = tree_flatten((args, kwargs))
    cf._record(None, flat, args, kwargs)
    entry = cf.cache[None]
    if type(entry) is _Eager:
        return ExplainOutput(entry.breaks, 0)
    return ExplainOutput([], len(entry.plan.names))
