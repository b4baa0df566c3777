"""The backward driver: validates the call like PyTorch, then runs the graph.

`backward` and `grad` normalise their arguments, build the root gradients, and pick an
executor: the compiled scheduler (_compiled, running the module engine/codegen.py
generates) for ordinary calls, the device sweep (_device, engine/device.py) for those
whose root gradients are on CUDA, the Python engine (_pyengine) for create_graph=True and
for graphs the compiled paths do not take.

A call holds the locks of the tapes it runs (one backward at a time per tape, whatever
the thread). On the compiled path nothing the user can see changes until the end: .grad
updates and the freeing of the graph are published together in one block that Ctrl-C
cannot split, so an interrupted call leaves either all of them or none.
"""
import itertools
import threading
from collections import namedtuple

import numpy as np

from jitgrad._core import capture as _capture
from jitgrad._core import versions
from jitgrad._core.capture import state as _cap
from jitgrad._core.messages import torch_size
from jitgrad._core.modes import _anomaly, no_grad, restore_saved_hooks, saved_hooks_state
from jitgrad._core.modes import _state as _grad_mode_state
from jitgrad._core.threads import deferred_interrupts
from jitgrad.engine import compiled as _compiled
from jitgrad.engine import device as _device
from jitgrad.engine import executor as _pyengine
from jitgrad.engine import stats as _stats
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph import tape as _tape
from jitgrad.graph.hooks import leaf_hooks
from jitgrad.graph.node import AccumulateGrad, node_for
from jitgrad.graph.pynode import FunctionNode
from jitgrad.graph.record import _leaf_row
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import functional as F


def _as_tuple(x):
    if x is None:
        return ()
    if isinstance(x, Tensor):
        return (x,)
    return tuple(x)


def _make_grads(outputs, grad_outputs):
    out = []
    for i, (t, g) in enumerate(zip(outputs, grad_outputs)):
        if g is None:
            if t.requires_grad and t._data.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if t._data.dtype.kind != "f":
                raise RuntimeError(f"grad can be implicitly created only for real scalar outputs but got {t.dtype}")
            g = F._wrap(np.ones_like(t._data))
        else:
            if not isinstance(g, Tensor):
                g = F._wrap(np.asarray(g, dtype=t._data.dtype))
            if (type(g._data) is DeviceArray) != (type(t._data) is DeviceArray):
                want, got = ("cuda:0", "cpu") if type(t._data) is DeviceArray else ("cpu", "cuda:0")
                raise RuntimeError(f"invalid gradient at index {i} - expected device {want} but got {got}")
            if g._data.shape != t._data.shape:
                raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of {torch_size(g._data.shape)} "
                                   f"and output[{i}] has a shape of {torch_size(t._data.shape)}.")
        out.append(g)
    return out


class Target(namedtuple("Target", "node tape row nr")):
    """Where a tensor's gradient lives: its node, and the row holding gradient `nr` of
    that node's outputs (a multi-output node's output k has its own row)."""

    @property
    def key(self):
        return (id(self.node), self.nr)


def _root_target(t, i, hold):
    if not t.requires_grad:
        raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
    return _target(t, hold)


def _target(t, hold):
    """t's grad_fn, or its AccumulateGrad for a leaf. A leaf's sink row may have to be made
    in the current tape; `hold` keeps that tape alive for the call (sinks hold it weakly)."""
    if t._tape is not None:
        return Target(node_for(t._tape, t._row), t._tape, t._row, t._output_nr)
    ref = t._acc
    acc = ref() if ref is not None else None
    tape, row = (None, -1) if acc is None else acc._where()  # one pair: other threads move it
    if tape is None:
        tape = _tape.current_tape()
        hold.append(tape)
        row = _leaf_row(tape, t)
        acc = t._acc()
    return Target(acc, tape, row, 0)


class GradientEdge(namedtuple("GradientEdge", "node output_nr ownership_token", defaults=(None,))):
    """torch.autograd.graph.GradientEdge (exported there): the gradient flowing into output
    `output_nr` of `node`. It lives here, below autograd/, because grad() takes one
    wherever it takes an input tensor."""
    __slots__ = ()


def _edge_target(edge, hold):
    node = edge.node
    if isinstance(node, AccumulateGrad):  # a leaf's edge: its sink, remade if its tape is gone
        return _target(node.variable, hold)
    # output k of a multi-output node has its own row, k rows below the node's (graph/pynode.py)
    return Target(node, node._tape, node._row + edge.output_nr, edge.output_nr)


def _input_target(t, i, hold):
    if isinstance(t, GradientEdge):
        return _edge_target(t, hold)
    if not t.requires_grad:
        raise RuntimeError("One of the differentiated Tensors does not require grad")
    return _target(t, hold)


class _CallState(threading.local):
    call = 0          # numbers this thread's backward calls (multi-grad hooks key on it)
    callbacks = None  # run at the end of the current call (queue_callback)
    partial = False   # the current call has requested inputs (grad(), backward(inputs=))
    depth = 0         # backward calls nested in this thread (a Function's backward calling backward)
    inherited = frozenset()  # ids of tapes whose locks a waiting ancestor thread holds for us
    held = frozenset()       # ids of tapes whose locks this thread holds


_calls = _CallState()
_call_ids = itertools.count(1)


def current_call():
    return _calls.call


def checkpoint_valid():
    """Whether a reentrant checkpoint may run in the current backward call: not in one with
    requested inputs, which would not reach the inputs of its recomputed graph (PyTorch's
    _is_checkpoint_valid)."""
    return not _calls.partial


def queue_callback(fn):
    """Run fn when the current backward call has finished (PyTorch's queue_callback)."""
    _calls.callbacks.append(fn)


# A reentrant backward (one called from inside a backward) nests about ten Python frames
# per level; past this many levels in one thread the call moves to a new thread, which has
# a stack of its own, and this one waits for it (PyTorch moves deep reentrant calls to a
# worker thread too), so a 2,000-deep recursion of backward calls runs.
_MAX_DEPTH = 40
# The compiled sweep's cost grows with the tapes a call touches, which deeply nested calls
# keep growing (each level records onto the tape the level above is sweeping); past this
# depth the Python engine runs them, whose cost is what each call reaches.
_COMPILED_DEPTH = 4


def _run(outputs, grad_outputs, retain_graph, create_graph, inputs, accumulate):
    if _calls.depth >= _MAX_DEPTH:
        return _in_new_thread(_run, outputs, grad_outputs, retain_graph, create_graph, inputs, accumulate)
    _calls.depth += 1
    try:
        return _run_nested(outputs, grad_outputs, retain_graph, create_graph, inputs, accumulate)
    finally:
        _calls.depth -= 1


def _in_new_thread(fn, *args):
    """fn(*args) in a new thread that starts from this thread's state (grad mode, saved-tensor
    hooks, numpy's floating-point error setting, the tape locks held by the calls it is
    nested in); its result or error comes back."""
    grad_mode = (_grad_mode_state.enabled, _grad_mode_state.inference)
    fp_errors = np.geterr()
    hooks = saved_hooks_state()
    held = _calls.inherited | _calls.held
    out = []

    def work():
        _grad_mode_state.enabled, _grad_mode_state.inference = grad_mode
        np.seterr(**fp_errors)
        restore_saved_hooks(hooks)
        _calls.inherited = held
        try:
            out.append((True, fn(*args)))
        except BaseException as e:  # noqa: BLE001  (raised again in the waiting thread)
            out.append((False, e))
        finally:
            restore_saved_hooks(((), None))  # a worker thread ends as it began: no hooks

    worker = threading.Thread(target=work, name="jitgrad-reentrant-backward")
    worker.start()
    worker.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _run_nested(outputs, grad_outputs, retain_graph, create_graph, inputs, accumulate):
    outer = (_calls.call, _calls.callbacks, _calls.partial)
    _calls.call, _calls.callbacks, _calls.partial = next(_call_ids), [], inputs is not None
    # user code run by the backward (unpack hooks, hooks, Functions) may leave a
    # saved_tensors_hooks context entered; torch runs each node under the thread state the
    # call began with, so such a context must not outlive the call
    saved_hooks = saved_hooks_state()
    try:
        result = _run_call(outputs, grad_outputs, retain_graph, create_graph, inputs, accumulate)
        for fn in _calls.callbacks:
            fn()
        return result
    finally:
        _calls.call, _calls.callbacks, _calls.partial = outer
        restore_saved_hooks(saved_hooks)


def _run_call(outputs, grad_outputs, retain_graph, create_graph, inputs, accumulate):
    hold = []
    roots = [_root_target(t, i, hold) for i, t in enumerate(outputs)]
    grads = _make_grads(outputs, grad_outputs)
    if retain_graph is None:
        retain_graph = create_graph
    targets = None if inputs is None else [_input_target(t, i, hold) for i, t in enumerate(inputs)]
    if not roots:  # nothing to differentiate: every input is unused (as torch)
        return {}, targets
    tapes = _compiled._tapes_from(roots)
    taken = _lock(tapes)
    try:
        return _run_locked(roots, grads, retain_graph, create_graph, inputs, targets, accumulate, tapes)
    finally:
        _unlock(taken)


def _lock(tapes):
    """Take the tapes' locks in id order (tapes is sorted), so two calls never deadlock.
    Locks that a thread waiting on this one holds (see _in_new_thread) are not taken again.
    Returns the tapes locked, for _unlock."""
    taken = []
    try:
        for t in tapes:
            if t.id in _calls.inherited:
                continue
            t.lock.acquire()
            taken.append(t)
    except BaseException:  # interrupted while waiting: give back what was taken
        _unlock(taken)
        raise
    _calls.held = _calls.held | {t.id for t in taken}
    return taken


def _unlock(tapes):
    for t in reversed(tapes):
        t.lock.release()
    _calls.held = _calls.held - {t.id for t in tapes if not t.lock._is_owned()}


def _run_locked(roots, grads, retain_graph, create_graph, inputs, targets, accumulate, tapes):
    if versions.generation[0]:  # some in-place write happened: are saved values still valid?
        for tape in tapes:
            tape.check_versions()
    out = _python_reason(create_graph, targets, tapes)
    if out is None:
        try:
            # a CUDA root's graph is swept on the device (engine/device.py), never by the
            # CPU sweep, which would read device addresses as host memory
            engine = _device if type(grads[0]._data) is DeviceArray else _compiled
            out = engine.run(roots, grads, targets, bool(retain_graph), tapes)
        except BaseException:
            # an error (a hook's, a check's, Ctrl-C) may leave numpy views of the tapes'
            # columns alive in its traceback: the current tape must not grow under them
            if any(r.tape is _tape.live_tape() for r in roots):
                _tape.close_current_tape()
            raise
    if isinstance(out, _compiled.Fallback):
        _stats.python_call(out.reason)
        ran = []
        captured = _pyengine.run(roots, grads, targets, create_graph, accumulate, ran)  # accumulates inputs too
        if not retain_graph:
            with deferred_interrupts:
                _free(ran)
                _close([r.node for r in roots])
        return captured, targets
    _stats.compiled_call()
    arrays, leaves, retained, commit = out
    captured = {k: F._wrap(a) for k, a in arrays.items()}
    # the arrays are slices of the scheduler's fresh output array: ours to hand out
    if leaf_hooks[0]:
        # user hooks run between the accumulations, as in PyTorch: Ctrl-C in one of them
        # leaves the leaves before it updated (but the graph intact: the commit comes later)
        # (a call with requested inputs and leaf hooks runs on the Python engine)
        with no_grad():  # hooks run as in any backward without create_graph
            for acc, a in leaves:
                g = _pyengine.leaf_pre(acc, F._wrap(a))
                _pyengine.accumulate_grad(acc.variable, g, False, owned=True)
                _pyengine.leaf_post(acc, g)
        leaves = ()
    # no user code runs in this loop, so if this is the only thread, it stays the only one:
    # the per-leaf locks can be skipped (they are most of a wide graph's per-leaf cost)
    alone = threading.active_count() == 1
    with deferred_interrupts:  # the publishing block: all of it or none of it
        for acc, a in leaves:
            _pyengine.accumulate_grad(acc.variable, F._wrap(a), False, owned=True, alone=alone)
        for t, a in retained:  # grad() fills retained gradients too, as PyTorch
            _pyengine.accumulate_grad(t, F._wrap(a), False, owned=True)
        _accumulate_inputs(inputs, targets, captured, accumulate, False)
        if not retain_graph:
            commit.apply()
            _close([r.node for r in roots])
    return captured, targets


def _python_reason(create_graph, targets, tapes):
    """A Fallback saying why the whole call runs on the Python engine, or None."""
    if create_graph:  # the backward's own ops are recorded, by the Tensor-level rules
        return _compiled.Fallback("create_graph=True records the backward's ops node by node")
    if _anomaly[0]:  # it checks each node's results and names the forward line of a failure
        return _compiled.Fallback("anomaly detection is on")
    if targets is not None and _has_hooks(tapes):
        # PyTorch's rules on which hooks run when inputs are requested
        return _compiled.Fallback("inputs= are requested with hooks in the graph")
    if _calls.depth >= _COMPILED_DEPTH:
        return _compiled.Fallback(f"backward is nested {_COMPILED_DEPTH} or more calls deep")
    return None


def _has_hooks(tapes):
    # leaf_hooks counts hooked leaves process-wide: only these tapes' leaves matter here
    return any(t.tensor_hooks or t.node_prehooks or t.node_hooks for t in tapes) or \
        leaf_hooks[0] and any(_pyengine.leaf_has_hooks(acc) for t in tapes for acc in list(t.leaves.values()))


def _accumulate_inputs(inputs, targets, captured, accumulate, create_graph):
    """backward(inputs=...): the engines captured the inputs' gradients; accumulate them
    (a non-leaf input's: backward() made it retain its gradient, which filled it)."""
    if accumulate and inputs is not None:
        for t, tg in zip(inputs, targets):
            g = captured.get(tg.key)
            if g is not None and not (isinstance(t, Tensor) and t._tape is not None and t.retains_grad):
                _pyengine.accumulate_grad(t, g, create_graph)


def _close(roots):
    """The graph was freed: the next op records onto a new tape. Every root's tape, not
    only this thread's: a graph recorded in another thread closes there too."""
    for r in roots:
        t = r._tape
        if t is not None:
            t.closed = True


def _free(ran):
    """Release the saved values of the nodes that ran (PyTorch frees what ran: a grad()
    that stops at its inputs leaves the graph below them usable)."""
    for n in ran:
        n._tape.grow_freed()
        n._tape.freed[n._row] = 1
        if isinstance(n, FunctionNode):
            n._release()


def _check_grad_types(grads):
    """torch checks each gradient's type before counting them: backward([1., 1.]) is a
    TypeError about the float, not a count mismatch."""
    for g in grads:
        if g is not None and not isinstance(g, Tensor):
            raise TypeError(f"gradients can be either Tensors or None, but got {type(g).__name__}")


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None, inputs=None):
    if _cap.on and _cap.mine():  # jitgrad.compile is recording: the recorder runs this call and notes it
        return _cap.rec.backward(backward, tensors, grad_tensors, retain_graph, create_graph, inputs)
    tensors = _as_tuple(tensors)
    grad_tensors = _as_tuple(grad_tensors) or (None,) * len(tensors)
    _check_grad_types(grad_tensors)
    if len(grad_tensors) != len(tensors):
        raise RuntimeError(f"got {len(grad_tensors)} tensors and {len(tensors)} gradients")
    inputs = _as_tuple(inputs) if inputs is not None else None
    if inputs is not None and len(inputs) == 0:
        raise RuntimeError("`inputs` argument to `backward()` cannot be empty.")
    for t in inputs or ():
        if isinstance(t, Tensor) and t.requires_grad and t._tape is not None:
            t.retain_grad()  # as PyTorch: a non-leaf input's .grad is filled by the retain mechanism
    _run(tensors, grad_tensors, retain_graph, create_graph, inputs, accumulate=True)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
         allow_unused=None, is_grads_batched=False, materialize_grads=False):
    if materialize_grads and allow_unused is False:
        raise ValueError("Expected allow_unused to be True or not passed when materialize_grads=True, "
                         "but got: allow_unused=False.")
    if allow_unused is None:
        allow_unused = materialize_grads
    _capture.stop("autograd.grad() is not replayed (loss.backward() is)")
    outputs = _as_tuple(outputs)
    inputs = (inputs,) if isinstance(inputs, GradientEdge) else _as_tuple(inputs)  # an edge is one input
    if not inputs:
        raise RuntimeError("`inputs` argument to `grad()` cannot be empty.")
    grad_outputs = _as_tuple(grad_outputs) or (None,) * len(outputs)
    _check_grad_types(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise RuntimeError(f"grad requires one grad_output per output: got {len(grad_outputs)} grad_outputs and "
                           f"{len(outputs)} outputs")
    if is_grads_batched:
        return _grad_batched(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused,
                             materialize_grads)
    captured, targets = _run(outputs, grad_outputs, retain_graph, create_graph, inputs, accumulate=False)
    result = []
    for i, (t, tg) in enumerate(zip(inputs, targets)):
        g = captured.get(tg.key)
        if g is None:
            if not allow_unused:
                raise RuntimeError(f"The differentiated Tensor at index {i} appears to not have been used in the "
                                   "graph. Set allow_unused=True if this is the desired behavior.")
            if materialize_grads:
                if isinstance(t, GradientEdge):
                    raise RuntimeError("materialize_grads cannot be used when the given input is a GradientEdge")
                g = F._wrap(np.zeros_like(t._data))
                g._requires_grad = bool(create_graph)  # a leaf the next grad can differentiate, as torch's
        elif not create_graph and g.requires_grad:
            g = g.detach()
        result.append(g)
    return tuple(result)


def _grad_batched(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused, materialize_grads):
    """grad(..., is_grads_batched=True): the first dimension of each grad_output is a batch
    of vectors, and the result is the batch of vector-Jacobian products. PyTorch vmaps one
    backward; here the graph is retained and swept once per vector (every sweep is one
    compiled call), and the results are stacked, differentiably under create_graph."""
    batched = []
    for i, (t, g) in enumerate(zip(outputs, grad_outputs)):
        if g is not None and not isinstance(g, Tensor):
            g = F._wrap(np.asarray(g, dtype=t._data.dtype))
        if g is not None and g._data.ndim == 0:
            raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python or `tensor.item<T>()` "
                             "in C++ to convert a 0-dim tensor to a number")
        if g is None:
            if t.requires_grad and t._data.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            g = F._wrap(np.ones_like(t._data))
        if g._data.ndim == 0:
            raise ValueError("vmap(vjp, in_dims=0, ...)(<inputs>): Got in_dim=0 for some input, but that input is "
                             "a Tensor of dimensionality 0 so expected in_dim to satisfy 0 <= in_dim < 0.")
        if g._data.shape[1:] != t._data.shape:
            raise RuntimeError(
                "If `is_grads_batched=True`, we interpret the first dimension of each grad_output as the batch "
                "dimension. The sizes of the remaining dimensions are expected to match the shape of corresponding "
                f"output, but a mismatch was detected: grad_output[{i}] has a shape of "
                f"{torch_size(g._data.shape[1:])} and output[{i}] has a shape of {torch_size(t._data.shape)}. If you "
                "only want some tensors in `grad_output` to be considered batched, consider using vmap.")
        batched.append(g)
    sizes = [g._data.shape[0] for g in batched]
    if len(set(sizes)) > 1:
        raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped dimension, got sizes "
                         f"{sizes} for the mapped dimension")
    n = sizes[0] if sizes else 0
    if n == 0:
        raise IndexError("index 0 is out of bounds for dimension 0 with size 0")  # as torch's _make_grads
    keep = create_graph if retain_graph is None else retain_graph
    if not create_graph and not _anomaly[0]:
        fast = _grad_batched_compiled(outputs, inputs, batched, keep)
        if fast is not None:
            return _batched_result(fast, inputs, allow_unused, materialize_grads)
    per = [grad(outputs, inputs, tuple(g[b] for g in batched), retain_graph=True if b < n - 1 else keep,
                create_graph=create_graph, allow_unused=allow_unused)
           for b in range(n)]
    result = []
    for j, t in enumerate(inputs):
        gs = [p[j] for p in per]
        if gs[0] is None:
            # torch materializes unused inputs unbatched, as zeros_like(input)
            result.append(F._wrap(np.zeros_like(t._data)) if materialize_grads else None)
            continue
        result.append(F.stack(gs) if create_graph else F._wrap(np.stack([g._data for g in gs])))
    return tuple(result)


def _grad_batched_compiled(outputs, inputs, batched, retain_graph):
    """The batch on the compiled path with the call's set-up done once (compiled.run_batched):
    a list of (n, *input.shape) arrays or None per input, or None where that path does not
    take the graph."""
    hold = []
    roots = [_root_target(t, i, hold) for i, t in enumerate(outputs)]
    targets = [_input_target(t, i, hold) for i, t in enumerate(inputs)]
    tapes = _compiled._tapes_from(roots)
    taken = _lock(tapes)
    try:
        if versions.generation[0]:
            for tape in tapes:
                tape.check_versions()
        try:
            out = _compiled.run_batched(roots, batched, targets, tapes)
        except BaseException:
            if any(r.tape is _tape.live_tape() for r in roots):  # as in _run_locked
                _tape.close_current_tape()
            raise
        if isinstance(out, _compiled.Fallback):
            return None
        arrays, sweep = out
        if not retain_graph:
            with deferred_interrupts:
                _compiled.release(sweep)
                _close([r.node for r in roots])
        return [arrays.get(tg.key) for tg in targets]
    finally:
        _unlock(taken)


def _batched_result(arrays, inputs, allow_unused, materialize_grads):
    result = []
    for i, (t, a) in enumerate(zip(inputs, arrays)):
        if a is None:
            if not allow_unused:
                raise RuntimeError(f"The differentiated Tensor at index {i} appears to not have been used in the "
                                   "graph. Set allow_unused=True if this is the desired behavior.")
            result.append(F._wrap(np.zeros_like(t._data)) if materialize_grads else None)
        else:
            result.append(F._wrap(a))
    return tuple(result)


def _tensor_backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    backward(self, gradient, retain_graph, create_graph, inputs=inputs)


Tensor.backward = _tensor_backward  # bound here: the Tensor (graph/) sits below the engine
