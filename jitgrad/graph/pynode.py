"""The node of a custom autograd Function: its ctx (what forward and backward share, owned
by the tape), the node view grad_fn returns, and how it is lowered onto the tape.

`Function.apply` (autograd/function.py) runs `forward` under no_grad, then `record`
appends one row for the node (opcode OP_PYFN) plus one row per further output (OP_OUT,
with an edge to the node's row so that selective execution sees them). The compiled
scheduler hands the node back when the sweep reaches it (PYNODE); the engine calls
`run_backward` and resumes. With create_graph=True the Python engine runs it.

The ctx is separate from the node view `grad_fn` returns, which holds the tape like every
node and forwards attribute access to the ctx, so `y.grad_fn.saved_tensors` and ctx
attributes work as in PyTorch. The ctx holds no reference to its tape, so a graph with
Functions has no reference cycle.
"""
import weakref

import numpy as np

from jitgrad._core import modes as _grad_mode
from jitgrad._core import versions
from jitgrad._core.dtype import from_numpy_dtype
from jitgrad._core.messages import freed_error as _freed_error
from jitgrad._core.messages import modified_error, size_str
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph import saved as _saved
from jitgrad.graph.node import Node
from jitgrad.graph.record import _dtcode, _edge_row, _trace, pack_saved
from jitgrad.graph.spec import OP_OUT, OP_PYFN
from jitgrad.graph.tape import current_tape, on_device
from jitgrad.graph.tensor import Tensor, wrap

CLEARED_ERROR = ("saved_tensors can only be accessed once when clear_saved_tensors_on_access=True is set on the "
                 "autograd.Function. Either access saved_tensors only once, or set "
                 "clear_saved_tensors_on_access=False.")


class FunctionCtx:
    """What forward and backward share (PyTorch's ctx)."""

    def save_for_backward(self, *tensors):
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save variables, but argument {i} is of type "
                                f"{type(t).__name__}")
        self.to_save = tensors

    def save_for_forward(self, *tensors):
        """What a custom Function's jvp reads as ctx.saved_tensors (forward mode)."""
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_forward expects all arguments to be tensors; but argument {i} is of type "
                                f"{type(t).__name__}.")
        self.saved_for_forward = tensors

    @property
    def saved_tensors(self):
        if getattr(self, "_in_jvp", False):
            return tuple(getattr(self, "saved_for_forward", ()))
        if self._released:
            raise _freed_error()
        if getattr(getattr(self, "_fn", None), "clear_saved_tensors_on_access", False):
            # the Function asked that its saved tensors be dropped once read, so that they
            # are freed as soon as backward lets go of them
            if getattr(self, "_saved_taken", False):
                raise RuntimeError(CLEARED_ERROR)
            self._saved_taken = True
            saved, self.to_save = getattr(self, "to_save", ()), ()
            return tuple(_unpack(self, s) for s in saved)
        return tuple(_unpack(self, s) for s in getattr(self, "to_save", ()))

    @property
    def _raw_saved_tensors(self):
        """What save_for_backward saved, as SavedTensors (hooks can be registered on them)."""
        if self._released:
            raise _freed_error()
        return tuple(_RawSaved(self, i) for i in range(len(getattr(self, "to_save", ()))))

    def mark_dirty(self, *tensors):
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)


class FunctionState(FunctionCtx):
    """The ctx of one application of a Function (one class per Function, named like its
    node, <ClassName>Backward). Owned by the tape (tape.py_nodes)."""
    _fn = None
    _tape_ref = None

    @property
    def _tape(self):
        return None if self._tape_ref is None else self._tape_ref()

    def run_backward(self, grads_out, create_graph):
        """Call the user's backward with one gradient per output (Tensors or None);
        returns one gradient per edge (tensor input), checked like PyTorch."""
        grads = []
        tensor_grads = iter(zip(grads_out, self._out_meta))
        for is_tensor in self._out_is_tensor:
            if not is_tensor:
                grads.append(None)  # a non-tensor output has no gradient
                continue
            g, (shape, dtype) = next(tensor_grads)
            if g is None and self.materialize_grads:
                g = wrap(_zeros(shape, dtype, self._out_cuda))
            grads.append(g)
        with _grad_mode.set_grad_enabled(create_graph):
            result = _user_backward(self._fn)(self, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        n_in = len(self._arg_is_tensor)
        if len(result) != n_in:
            if len(result) > n_in and all(r is None for r in result[n_in:]):
                result = result[:n_in]  # extra trailing Nones are allowed, as in PyTorch
            else:
                raise RuntimeError(f"function {self.name()} returned an incorrect number of gradients "
                                   f"(expected {n_in}, got {len(result)})")
        out = []
        k = 0
        for i, is_tensor in enumerate(self._arg_is_tensor):
            g = result[i]
            if not is_tensor:
                if g is not None:
                    raise RuntimeError(f"function {self.name()} returned a gradient different than None at "
                                       f"position {i + 1}, but the corresponding forward input was not a Variable")
                continue
            shape, dtype, cuda = self._in_meta[k]
            k += 1
            out.append(validate_gradient(self.name(), i, g, shape, dtype, cuda))
        return out

    def name(self):
        return type(self).__name__

    def _release(self):
        self._released = True
        self.to_save = ()


class FunctionNode(Node):
    """The node view of a custom Function application (what grad_fn returns). Attribute
    reads and writes it does not have go to the ctx."""
    __slots__ = ()

    @property
    def _state(self):
        return self._tape.py_nodes[self._row]

    def name(self):
        return type(self).__name__

    @property
    def _spec(self):
        raise AttributeError("a custom Function node has no op spec")

    def __getattr__(self, name):
        return getattr(self._tape.py_nodes[self._row], name)

    def __call__(self, *args):
        # a custom Function's node is not callable in PyTorch either (only C++ nodes are)
        raise TypeError(f"'{type(self).__name__}' object is not callable")

    def __setattr__(self, name, value):
        if name in ("_tape", "_row", "_next"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._state, name, value)


def validate_gradient(name, i, g, shape, dtype, cuda=None):
    """PyTorch's validate_outputs for gradient i that node `name` returned for an input of
    `shape` and `dtype` (on the device when cuda, on the host when not, unchecked when
    None): reduced if it is broadcast, cast if it has another dtype, else an error. Every
    gradient Python hands back to the engine passes here."""
    if g is None:
        return g
    if not isinstance(g, Tensor):
        raise RuntimeError(f"expected Variable or None (got {type(g).__name__})")
    if cuda is not None and (type(g._data) is DeviceArray) != cuda:
        want, got = ("cuda:0", "cpu") if cuda else ("cpu", "cuda:0")
        raise RuntimeError(f"Function {name} returned an invalid gradient at index {i} - expected device {want} "
                           f"but got {got}")
    if tuple(g._data.shape) != tuple(shape):
        if not _expandable(shape, g._data.shape):
            raise RuntimeError(f"Function {name} returned an invalid gradient at index {i} - got "
                               f"{size_str(g._data.shape)} but expected shape compatible with {size_str(shape)}")
        g = _sum_to(g, shape)
    if g._data.dtype != dtype:
        g = g.to(from_numpy_dtype(dtype))
    return g


def _sum_to(g, shape):
    """Sum a broadcast gradient down to `shape` (Tensor methods: this layer is below ops)."""
    lead = g.dim() - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
    return (g.sum(dims, keepdim=True) if dims else g).reshape(shape)


def _expandable(shape, target):
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


class _Saved:
    """A saved tensor kept as PyTorch's SavedVariable keeps one: for a tensor of the
    node's own tape its data and where its gradient flows (not the Tensor, which holds
    the tape), and the version it had, checked when it is unpacked."""
    __slots__ = ("tensor", "ref", "data", "row", "nr", "stamp")

    def __init__(self, t, tape, is_output):
        own = t._tape is tape
        self.tensor = None if own else t
        # an input (not an output) of the node's own tape comes back as itself, as torch's
        # saved original does; held weakly, since it holds the tape that holds this. Once
        # it is gone an equal tensor is made (no one can tell them apart then)
        self.ref = weakref.ref(t) if own and not is_output else None
        self.data = t._data
        self.row, self.nr = (t._row, t._output_nr) if own else (-1, 0)
        self.stamp = versions.stamp(t._data)


class _Packed:
    """A saved tensor kept as saved_tensors_hooks' pack returned it."""
    __slots__ = ("unpack", "value")

    def __init__(self, unpack, value):
        self.unpack, self.value = unpack, value


class _RawSaved(_saved.SavedTensor):
    """Saved tensor i of a custom Function's ctx (grad_fn._raw_saved_tensors[i])."""
    __slots__ = ("_ctx", "_i")

    def __init__(self, ctx, i):
        self._ctx, self._i = ctx, i

    def _entry(self):
        if self._ctx._released:
            raise _freed_error()
        return self._ctx.to_save[self._i]

    def unpack(self):
        s = self._entry()
        return None if s is None else _unpack(self._ctx, s)

    @property
    def data(self):
        s = self._entry()
        return s.value if type(s) is _Packed else self.unpack()

    @property
    def unpack_hook(self):
        s = self._entry()
        return s.unpack if type(s) is _Packed else None

    def register_hooks(self, *hooks):
        if len(hooks) != 2 or not all(callable(h) for h in hooks):
            raise TypeError(_saved.CALL_ERROR)
        ctx = self._ctx
        if ctx._released:
            raise RuntimeError(_saved.FREED_ERROR)
        s = ctx.to_save[self._i]
        if type(s) is _Packed:
            raise RuntimeError(_saved.TWICE_ERROR)
        if s is None:
            raise RuntimeError(_saved.NONE_ERROR)
        packed = _Packed(hooks[1], _saved.pack(hooks[0], _unpack(ctx, s)))
        ctx.to_save = ctx.to_save[:self._i] + (packed,) + ctx.to_save[self._i + 1:]


def _unpack(ctx, s):
    """As PyTorch unpacks a SavedVariable: the tensor, with its grad_fn (in any grad mode)."""
    if type(s) is _Packed:
        return _saved.checked_unpack(s.unpack, s.value)
    if type(s) is not _Saved:
        return s
    now = versions.changed(s.stamp)
    if now is not None:
        raise modified_error(s.data, now, s.stamp[1])
    if s.tensor is not None:
        return s.tensor
    if s.ref is not None:
        t = s.ref()
        if t is not None and t._data is s.data and t._tape is ctx._tape and t._row == s.row:
            return t
    t = wrap(s.data)
    t._requires_grad = True
    t._tape, t._row, t._output_nr = ctx._tape, s.row, s.nr
    return t


def record(ctx, args, outputs):
    """Lower the Function's node and link its outputs to it."""
    single = not isinstance(outputs, tuple)
    outs = list((outputs,) if single else outputs)
    tensors_in = [a for a in args if isinstance(a, Tensor)]
    dirty = {id(t) for t in getattr(ctx, "dirty_tensors", ())}
    non_diff = {id(t) for t in getattr(ctx, "non_differentiable", ())}
    cuda = any(isinstance(o, Tensor) and type(o._data) is DeviceArray for o in outs)
    tape = current_tape()
    if tape.cuda is not cuda:  # a tape holds one device's rows (tape.on_device)
        tape = on_device(tape, cuda)
    edges = []
    for t in tensors_in:
        if t.requires_grad:
            edges += (_edge_row(tape, t), t._output_nr if t._tape is not None else 0, tape.shape(t._data.shape))
        else:
            edges += (-1, 0, tape.shape(t._data.shape))
    # outputs that are inputs: a dirty one is modified in place (its history is rebased);
    # a clean one gets a new tensor object sharing its data, as PyTorch returns a view
    for j, o in enumerate(outs):
        if isinstance(o, Tensor) and any(o is t for t in tensors_in):
            if id(o) in dirty:
                if o.requires_grad and o._tape is None:
                    raise RuntimeError("a leaf Variable that requires grad has been used in an in-place operation.")
                o._bump()
            else:
                outs[j] = wrap(o._data)
    tensor_outs = [(j, o) for j, o in enumerate(outs) if isinstance(o, Tensor)]
    first = None
    for k, (j, o) in enumerate(tensor_outs):
        d = o._data
        shp = tape.shape(d.shape)
        if k == 0:
            first = tape.add_row(OP_PYFN, _dtcode(d), len(tensors_in), d.size, shp, 0, 0, 0)
            tape.add_edges(edges)
            if _grad_mode._anomaly[0]:  # anomaly mode names the forward call of a failing node
                _trace(tape, first)
        else:
            # an extra output: its own buffer, and an edge to the node's row
            tape.add_row(OP_OUT, _dtcode(d), 1, d.size, shp, 0, 0, k)
            tape.add_edges((first, 0, shp))
        if id(o) in non_diff:
            continue
        o._requires_grad = True
        o._tape = tape
        o._row = first + k
        o._output_nr = k
    ctx._tape_ref = weakref.ref(tape)
    ctx._row = first
    ctx._out_is_tensor = tuple(isinstance(o, Tensor) for o in outs)
    if hasattr(ctx, "to_save"):
        out_ids = {id(o) for _, o in tensor_outs}
        ctx.to_save = tuple(_save(t, tape, id(t) in out_ids) for t in ctx.to_save)
    ctx._arg_is_tensor = tuple(isinstance(a, Tensor) for a in args)
    ctx._in_meta = tuple((tuple(t._data.shape), t._data.dtype, type(t._data) is DeviceArray) for t in tensors_in)
    ctx._out_meta = tuple((tuple(o._data.shape), o._data.dtype) for _, o in tensor_outs)
    ctx._out_cuda = cuda
    tape.py_nodes[first] = ctx
    return outs[0] if single else tuple(outs)


def _zeros(shape, dtype, cuda):
    """A materialized gradient for an output that got none, on the outputs' device."""
    if not cuda:
        return np.zeros(shape, dtype)
    z = DeviceArray.empty(shape, dtype)
    z.fill(0)
    return z


def _save(t, tape, is_output):
    if not isinstance(t, Tensor):
        return t
    packed = pack_saved(t)
    return _Saved(t, tape, is_output) if packed is None else _Packed(*packed)


def _user_backward(fn):
    """The custom Function's backward: `backward` or its alias `vjp`, whichever the user
    wrote (autograd.Function, the root class, defines both as one stub)."""
    root = next(c for c in reversed(fn.__mro__) if "backward" in c.__dict__)
    own_backward, own_vjp = fn.backward is not root.backward, fn.vjp is not root.vjp
    if own_backward and own_vjp:
        raise RuntimeError("Implementing both 'backward' and 'vjp' for a custom Function is not allowed. You should "
                           "only implement one of them.")
    return fn.vjp if own_vjp else fn.backward
