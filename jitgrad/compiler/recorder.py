"""Recording a compiled function's first call: what its ops did, as values and instructions.

The function runs eagerly, as it would uncompiled, while every op reports itself here
(_core/capture.py). What is written down:

- values: every tensor the step reads or makes. Each is an argument of the call, a
  tensor from outside the call (a parameter, a buffer: read again at every replay), a
  constant (a Python number used as an operand; a saved value the op's spec declares
  constant, such as indexing's positions), a result of an op, or a gradient the
  step's backward() left in a .grad;
- instructions: one per op, in order: its spec, its input and output values, its params
  and, when grad was recorded, the tape row it made (the backward replays that row);
- events: what the step did that is not an op: backward(), an optimizer's step() and
  zero_grad(), a .grad assigned. They are replayed as the same calls;
- breaks: anything the replay cannot reproduce (an in-place op, .item(), a custom
  Function, a hook...), with the line of user code that did it. A recording with a break
  gives no plan: the function runs eagerly for that signature (compiler/api.py).

A tensor an op reads that is none of these was made in the step by something that does
not report itself. The recorder holds such tensors weakly; one that is gone when the
call returns was a temporary of the step, whose value a replay could not reproduce: that
is a break too, never a stale value.
"""
import os
import sys
import threading
import weakref

import numpy as np

from jitgrad._core.capture import state as _cap
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.tensor import Tensor

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES = os.path.join(_PACKAGE, "examples")  # user code, though it ships with jitgrad

ARG, EXT, CONST, OP, GRAD = "arg", "ext", "const", "op", "grad"


class GraphBreak(RuntimeError):
    """fullgraph=True and the function does something a plan cannot replay."""


class Value:
    __slots__ = ("kind", "shape", "dtype", "src", "tensor", "ref")

    def __init__(self, kind, shape, dtype, src=None, tensor=None):
        self.kind = kind        # ARG, EXT, CONST, OP or GRAD
        self.shape = shape if type(shape) is tuple else tuple(shape)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.src = src          # ARG: index among the call's tensors; CONST: the array; GRAD: the parameter
        self.tensor = tensor    # OP, ARG: the tensor (kept alive while recording, so ids stay unique)
        self.ref = None         # EXT: a weak reference to the tensor


class Instr:
    __slots__ = ("kind", "spec", "ins", "outs", "made", "fparams", "iparams", "row", "pyfn", "name")

    def __init__(self, kind, spec, ins, outs, made=0, fparams=(), iparams=None, row=None, pyfn=None, name=None):
        self.kind = kind          # "ew", "struct" or "py"
        self.spec = spec
        self.ins = ins            # input value ids
        self.outs = outs          # output value ids: result, then per saved value (struct), then extras
        self.made = made          # bit k: saved value k is made by the op (F_MADE)
        self.fparams = fparams
        self.iparams = iparams
        self.row = row            # (tape, row) when the op recorded a row, else None
        self.pyfn = pyfn          # "py": fn(*input arrays) -> output arrays
        self.name = name or (spec.name if spec is not None else "?")


def user_frame():
    """(file, line) of the innermost frame outside jitgrad (where the user's code did it):
    a walk up the frames, ~1 us, where traceback.extract_stack reads source lines (~600 us)."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_PACKAGE) or name.startswith(_EXAMPLES):
            return Where(name, f.f_lineno)
        f = f.f_back
    return Where("?", 0)


class Where(tuple):
    """Where user code did something: formats as 'file:line'."""
    __slots__ = ()

    def __new__(cls, filename, lineno):
        return tuple.__new__(cls, (filename, lineno))

    def __str__(self):
        return f"{self[0]}:{self[1]}"


class Recorder:
    def __init__(self, arg_tensors):
        self.thread = threading.get_ident()
        self.values = []
        self.vid = {}          # id(tensor) -> value id (OP / ARG / GRAD: the tensor is held)
        self.ext = {}          # id(tensor) -> value id of an EXT value (held weakly; checked by identity)
        self.instrs = []
        self.events = []       # ("backward" | "call" | "setgrad", position in instrs, payload)
        self.breaks = []       # (reason, where)
        self.held = []         # tensors kept alive while recording
        self.modules = {}      # id -> (module, its training flag, param_ids(module)): guards of the plan
        self.fullgraph = False  # a break raises GraphBreak where it happens
        self.arrays = {}       # id(array) -> value id: the data of a Python instruction's output
        for i, t in enumerate(arg_tensors):
            if id(t) not in self.vid:
                self._new(ARG, t, src=i)

    # -- values -----------------------------------------------------------------------
    def _new(self, kind, t=None, shape=None, dtype=None, src=None):
        k = len(self.values)
        if t is not None:
            d = t._data
            if type(d) is DeviceArray:  # the plan's kernels are CPU ones; they must never get device memory
                self.stop("a CUDA tensor (jitgrad.compile replays CPU steps; on CUDA the step runs eagerly)")
            v = Value(kind, d.shape, d.dtype, src)
            if kind == EXT:
                v.ref = weakref.ref(t)
                self.ext[id(t)] = k
            else:
                v.tensor = t
                self.vid[id(t)] = k
                self.held.append(t)
        else:
            v = Value(kind, shape, dtype, src)
        self.values.append(v)
        return k

    def value_of(self, t):
        """The value id of tensor t as an input (a tensor not seen before is EXT)."""
        k = self.vid.get(id(t))
        if k is not None:
            return k
        k = self.ext.get(id(t))
        if k is not None and self.values[k].ref() is t:
            if self.values[k].shape != t._data.shape or self.values[k].dtype != t._data.dtype:
                self.stop("a tensor's .data changed shape or dtype during the step")
            return k
        return self._new(EXT, t)

    def constant(self, x, dtype):
        if type(x) is float and isinstance(dtype, np.dtype):  # an operand of nearly every scalar op
            self.values.append(Value(CONST, (), dtype, x))
            return len(self.values) - 1
        arr = np.asarray(x, dtype=dtype)
        return self._new(CONST, shape=arr.shape, dtype=arr.dtype, src=arr)

    def result(self, t):
        """A new value for tensor t, the output of the op being recorded."""
        if id(t) in self.vid:  # an op that returned its input (x.float() of a float tensor...)
            return self.vid[id(t)]
        return self._new(OP, t)

    def mine(self):
        return threading.get_ident() == self.thread

    # -- the hooks (_core/capture.py) ----------------------------------------------------------
    def ew(self, spec, res, a, b, p0, p1, aux):
        if not self.mine():
            return
        dt = res._data.dtype
        if dt.kind != "f":
            return self.stop(f"{spec.name} on {dt} tensors (only floating-point ops are replayed)")
        if spec.fwd is None:
            return self.stop(f"{spec.name} has no forward formula")
        ins = [self._float_input(a, dt)]
        if b is not None:
            ins.append(self.constant(b, dt) if type(b) is float else self._float_input(b, dt))
        if aux is not None:  # where's condition: the bool mask as a float of the result's dtype, at its shape
            ins.append(self._float_input(aux, dt, res._data.shape))
        out = self.result(res)
        saves = []
        for src in spec.save_src:
            saves.append(out if src == -1 else ins[2] if src == -2 else ins[src])
        self.instrs.append(Instr("ew", spec, ins, [out] + saves, fparams=(p0, p1), row=self._row(spec, res)))

    def _float_input(self, t, dt, shape=None):
        """t's value id, cast to dtype dt first when it is not at dt (the op computed at dt),
        and broadcast to `shape` if given."""
        k = self.value_of(t)
        v = self.values[k]
        if v.dtype == dt and (shape is None or v.shape == shape):
            return k
        out = self._new(OP, shape=v.shape if shape is None else shape, dtype=dt)
        self.instrs.append(Instr("py", None, [k], [out], pyfn=_caster(dt, shape), name=f"cast to {dt}"))
        return out

    def alias(self, t, source):
        """Tensor t stands for `source` (a tensor, or Python data: a constant)."""
        if not self.mine():
            return
        if isinstance(source, Tensor):
            self.vid[id(t)] = self.value_of(source)
        else:
            self.vid[id(t)] = self.constant(source, np.asarray(source).dtype)
        self.held.append(t)

    def struct(self, spec, res, inputs, saved, fparams, iparams, extra=()):
        if not self.mine():
            return
        if spec.fwd_kernel is None:
            return self.stop(f"{spec.name} has no forward kernel yet")
        if len(saved) > len(spec.saves):
            return self.stop(f"{spec.name} reported {len(saved)} saved values for {len(spec.saves)}")
        ins = [self.value_of(t) for t in inputs]
        out = self.result(res)
        outs, made = [out], 0
        datas = [t._data for t in inputs]
        for k, arr in enumerate(saved):
            j = next((j for j, d in enumerate(datas) if d is arr), None)
            if j is not None:
                outs.append(ins[j])
            elif arr is res._data:
                outs.append(out)
            elif id(arr) in self.arrays:  # a Python instruction made it (indexing's positions by tensor)
                outs.append(self.arrays[id(arr)])
            elif spec.saves[k] in spec.consts:
                outs.append(self.constant(arr, arr.dtype))
            else:
                arr = np.asarray(arr)
                outs.append(self._new(OP, shape=arr.shape, dtype=arr.dtype))
                made |= 1 << k
        outs.extend([-1] * (len(spec.saves) - len(saved)))  # optional ones it did not save (layer_norm's weight)
        outs.extend(self.result(t) for t in extra)
        self.instrs.append(Instr("struct", spec, ins, outs, made, fparams, iparams, self._row(spec, res)))

    def python(self, fn, inputs, outputs, name):
        """An op replayed by Python: fn(*input arrays) -> a tuple of output arrays."""
        if not self.mine():
            return
        ins = [self.value_of(t) for t in inputs]
        outs = [self.result(t) for t in outputs]
        self.arrays.update((id(t._data), k) for t, k in zip(outputs, outs))
        self.instrs.append(Instr("py", None, ins, outs, pyfn=fn, name=name))

    def constant_tensor(self, t):
        """A tensor made in the step from Python values (zeros, tensor(...)): the same every call."""
        if self.mine() and id(t) not in self.vid:
            k = self._new(OP, t)
            self.values[k].kind = CONST
            self.values[k].src = np.array(t._data, copy=True)

    @staticmethod
    def _row(spec, res):
        if res._requires_grad and res._tape is not None and res._tape.op(res._row) == spec.op:
            return (res._tape, res._row)
        return None

    def stop(self, reason):
        if self.mine():
            self.breaks.append((reason, user_frame()))
            if self.fullgraph:  # at once, as torch's tracing would: the step goes no further
                raise GraphBreak(f"jitgrad.compile(fullgraph=True): {reason} at {self.breaks[-1][1]}")

    # -- events ---------------------------------------------------------------------------
    def backward(self, run, tensors, grad_tensors, retain_graph, create_graph, inputs):
        """loss.backward() in the step: run it, and note the root and what it left in .grads."""
        if create_graph or inputs is not None:
            self.stop("backward(create_graph=True) or backward(inputs=...)")
        roots = tensors if isinstance(tensors, (tuple, list)) else (tensors,)
        grads = grad_tensors if isinstance(grad_tensors, (tuple, list)) else (grad_tensors,)
        payload = None
        if len(roots) != 1 or not isinstance(roots[0], Tensor):
            self.stop("backward() of several tensors")
        else:
            g = grads[0] if grads else None
            root = self.vid.get(id(roots[0]))
            gv = None if g is None else self.value_of(g)
            if root is None or roots[0]._tape is None:
                self.stop("backward() of a tensor not made in the step")
            payload = [root, gv, bool(retain_graph), roots[0]._tape, None, user_frame()]
        _cap.on = False
        try:
            out = run(tensors, grad_tensors, retain_graph, create_graph, inputs=inputs)
        finally:
            _cap.on = True
        if payload is not None:
            tape = payload[3]
            leaves = []
            for row, acc in tape.leaves.items():
                p = acc.variable
                g = p._grad
                k = None
                if g is not None:
                    k = self.vid.get(id(g))
                    if k is None:
                        k = self._new(GRAD, g, src=p)
                leaves.append((row, p, k))
            payload[4] = leaves
            self.events.append(("backward", len(self.instrs), payload))
        return out

    def call(self, fn, *args):
        """optimizer.step(), zero_grad(): run now, replayed as the same call."""
        _cap.on = False
        try:
            out = fn(*args)
        finally:
            _cap.on = True
        self.events.append(("call", len(self.instrs), (fn, args)))
        return out

    def set_grad(self, t, value):
        if not self.mine():
            return
        k = None if value is None else self.value_of(value)
        self.events.append(("setgrad", len(self.instrs), (t, k)))

    def module(self, m):
        if self.mine():
            self.modules[id(m)] = (m, m.training, param_ids(m))

    def read_grad(self, g):
        if self.mine() and id(g) not in self.vid:
            self.stop("reads a .grad made before the step (accumulating across calls)")

    def finish(self):
        """After the call: EXT values must still be alive (else they were temporaries the
        step made untraced)."""
        for v in self.values:
            if v.kind == EXT:
                t = v.ref()
                if t is None:
                    self.stop("a tensor made in the step by an op jitgrad.compile does not trace yet")
                    break
                v.tensor = t


def param_ids(m):
    """Which tensors module m holds as parameters: one assigned anew (m.w = Parameter(...))
    is not the tensor the plan reads."""
    return tuple(map(id, m._parameters.values()))


def _caster(dt, shape):
    def cast(x):
        return (np.broadcast_to(x, shape).astype(dt) if shape is not None else x.astype(dt),)
    return cast
