"""The Python engine: runs the graph's nodes as Tensor-level rules.

It executes the same gradient rules as the compiled path (the formula strings of
elementwise ops, and rules.py for the others), so with `create_graph=True` the backward
is recorded as ordinary differentiable ops and can be differentiated again. It also runs
graphs the compiled path does not take (mixed dtypes). It walks Python nodes; that is
fine here because its cost is dominated by the Tensor ops it records.
"""
import heapq
import importlib
import warnings

import numpy as np

from jitgrad._core import device as _device
from jitgrad._core import modes as _grad_mode
from jitgrad._core.layout import CUDA_NP_OF, DT_F32, DT_F64, DT_MASK, DT_OTHER, E_SHP, E_TGT, EW, H_DT, H_E0, HW
from jitgrad._core.messages import freed_error as _freed_error
from jitgrad._core.messages import modified_error, size_str
from jitgrad._core.modes import _anomaly, _anomaly_parent, _check_nan
from jitgrad._core.threads import leaf_lock
from jitgrad.engine.hooks import run_node_posthooks, run_node_prehooks, run_tensor_hooks
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.node import AccumulateGrad, Node, node_for
from jitgrad.graph.pynode import FunctionNode
from jitgrad.graph.record import SameTapeParent
from jitgrad.graph.rowinfo import RowInfo
from jitgrad.graph.spec import FUNCS
from jitgrad.ops import functional as F

_NS = {name: getattr(F, name) for name in FUNCS}
_FLOAT_OF_DT = {DT_F64: np.dtype(np.float64), DT_F32: np.dtype(np.float32), **CUDA_NP_OF}


def _seq(node):
    return node._sequence_nr()


def freed_or_modified(tape, row):
    stale = tape.stale.get(row)
    if isinstance(stale, RuntimeError):
        return RuntimeError(*stale.args)
    if stale is not None:
        return modified_error(*stale)
    return _freed_error()


def apply_rule(node, grad):
    """Input gradients of `node` for output gradient `grad` (Tensors; elementwise ones at
    the output's shape, the caller reduces them)."""
    spec = node._spec
    if spec.saves and node._tape.is_freed(node._row):
        raise freed_or_modified(node._tape, node._row)
    ri = RowInfo(node)
    if spec.kind != "ew":
        return spec.rule(grad, ri)
    ns = dict(_NS)
    ns["grad"] = grad
    live = [inp is not None for inp in node._inputs]
    for name, users in zip(spec.saves, spec.save_users):
        if any(live[j] for j in users):  # only what a computed gradient reads, as PyTorch saves
            ns[name] = ri.saved_named(name)  # as the spec declares it (graph/spec.py)
    for k, p in enumerate(ri.floats(spec.nparams)):
        ns[f"p{k}"] = p
    out = []
    for code, inp in zip(spec.code(), node._inputs):
        out.append(eval(code, ns) if (code is not None and inp is not None) else None)
    return tuple(out)


def run(roots, grads, targets, create_graph, accumulate, ran):
    """roots, targets: autograd._engine.Target of the outputs and of the requested inputs
    (None: every leaf is accumulated); grads: the outputs' gradients (Tensors).
    Returns {target key: grad} for the requested inputs; appends each node it ran to `ran`."""
    # Reachability, and which nodes lie on a path to a requested input.
    nodes = {}
    inputs_of = {}  # materialised once: nodes are views made on demand
    stack = [r.node for r in roots]
    order = []
    while stack:
        n = stack.pop()
        if n is None or id(n) in nodes:
            continue
        nodes[id(n)] = n
        order.append(n)
        inputs_of[id(n)] = n._inputs
        stack.extend(inputs_of[id(n)])
    # With requested inputs (PyTorch's exec_info): gradients flow only into `reach`, the nodes
    # on a path to one of them; a node runs only if `needed`. grad() runs no requested node
    # for itself (it only captures its gradient, after the tensor's hooks), so an input's
    # node hooks and a leaf's AccumulateGrad hooks stay quiet; backward(inputs=) runs them.
    needed = reach = None
    want = set() if targets is None else {tg.key for tg in targets}
    if targets is not None:
        reach = {tg.key[0] for tg in targets}
        needed = set(reach) if accumulate else set()
        for n in sorted(order, key=_seq):
            if any(i is not None and id(i) in reach for i in inputs_of[id(n)]):
                reach.add(id(n))
                needed.add(id(n))
    buffers = {}  # (id(node), output nr) -> gradient
    for r, g in zip(roots, grads):
        _add(buffers, r.key, g)
    heap = [(-_seq(r.node), id(r.node), r.node) for r in {id(r.node): r for r in roots}.values()]
    heapq.heapify(heap)
    queued = {id(r.node) for r in roots}
    captured = {}
    parent = _anomaly_parent.node
    try:
        with _grad_mode.set_grad_enabled(create_graph):
            _sweep(heap, buffers, captured, want, needed, reach, queued, create_graph, accumulate, ran)
    except BaseException as exc:
        if _anomaly[0]:
            report_error(_anomaly_parent.node if _anomaly_parent.node is not parent else None, exc)
        raise
    finally:
        _anomaly_parent.node = parent
    return captured


def _sweep(heap, buffers, captured, want, needed, reach, queued, create_graph, accumulate, ran):
    """Run the nodes in the heap, latest first (see run). The order of the user's code is
    PyTorch's: a tensor's hooks, then its retained .grad, then the node's pre-hooks, the
    node, its post-hooks. A requested gradient is captured as it arrives, except at a node
    that is not run, where it is captured after the tensor's hooks."""
    while heap:
        _, nid, node = heapq.heappop(heap)
        if _anomaly[0]:  # the node an error is reported against, and the parent of nodes made now
            _anomaly_parent.node = node
        run_it = needed is None or nid in needed
        if isinstance(node, AccumulateGrad):
            grad = buffers.pop((nid, 0))
            if run_it:
                grad = leaf_pre(node, grad)
                if accumulate:
                    accumulate_grad(node.variable, grad, create_graph)
                    leaf_post(node, grad)
            else:
                grad = leaf_tensor_hooks(node, grad)
            if (nid, 0) in want:
                captured[nid, 0] = grad
            continue
        if isinstance(node, FunctionNode):
            outs = [buffers.pop((nid, k), None) for k in range(len(node._out_meta))]
        else:
            outs = [buffers.pop((nid, 0))]
        if run_it:
            _capture(captured, want, nid, outs)
        tape, row = node._tape, node._row
        for k in range(len(outs)):
            hooks = tape.tensor_hooks.get(row + k)
            if hooks and (outs[k] is not None or len(outs) > 1):  # multi-output: None too
                outs[k] = run_tensor_hooks(hooks, outs[k])
            ref = tape.retained.get(row + k)
            kept = ref() if ref is not None else None
            if kept is not None and outs[k] is not None:  # in grad() too, as PyTorch
                accumulate_grad(kept, outs[k], create_graph)
        if not run_it:
            _capture(captured, want, nid, outs)
            continue
        pre = tape.node_prehooks.get(row)
        if pre:
            outs = run_node_prehooks(pre, outs)
        ran.append(node)
        if isinstance(node, FunctionNode):
            if node._released:
                raise _freed_error()
            results = node.run_backward(outs, create_graph)
        else:
            results = input_grads(node, outs[0])
        post = tape.node_hooks.get(row)
        if post:
            results = run_node_posthooks(post, results, outs)
        if _anomaly[0]:
            check_outputs(node, results)
        for (inp, nr), g in zip(node.next_functions, results):
            if inp is None or g is None:
                continue
            if reach is not None and id(inp) not in reach:
                continue
            iid = id(inp)
            _add(buffers, (iid, nr), g)
            if iid not in queued:
                queued.add(iid)
                heapq.heappush(heap, (-_seq(inp), iid, inp))


def _capture(captured, want, nid, outs):
    for k, g in enumerate(outs):
        if (nid, k) in want and g is not None:
            captured[nid, k] = g


def input_grads(node, grad):
    """A (non-Function) node's gradient for each input, at the input's shape and dtype."""
    results = list(apply_rule(node, grad))
    tape = node._tape
    e0 = tape.hdr[node._row * HW + H_E0]
    for j, g in enumerate(results):
        if g is None:
            continue
        if node._spec.kind == "ew":
            g = F.sum_to(g, input_shape(node, j))  # broadcasting is undone here, once
        t = tape.edges[EW * (e0 + j) + E_TGT]
        code = tape.hdr[t * HW + H_DT] & DT_MASK if t >= 0 else DT_OTHER
        want = _FLOAT_OF_DT.get(code)
        if want is not None and g._data.dtype != want:
            g = F.to_dtype(g, F._dtype.from_numpy_dtype(want))  # mixed dtypes: back to the input's
        if code != DT_OTHER and g._data.ndim == 0 and (type(g._data) is DeviceArray) != (code in CUDA_NP_OF):
            # a 0-d CPU tensor used beside CUDA ones: its gradient goes back to the CPU, as
            # PyTorch's validate_outputs moves a 0-dim gradient to its input's device
            g = F.to_device(g, _device.CUDA if code in CUDA_NP_OF else _device.CPU)
        results[j] = g
    return results


def _add(buffers, key, g):
    buffers[key] = buffers[key] + g if key in buffers else g


def input_shape(node, j):
    tape = node._tape
    p = tape.edges[EW * (tape.hdr[node._row * HW + H_E0] + j) + E_SHP]
    return tuple(tape.xs[p + 1:p + 1 + tape.xs[p]])


def leaf_has_hooks(acc):
    x = acc.variable._x
    return bool((x is not None and (x.hooks or x.post_hooks or active_group(x))) or getattr(acc, "_prehooks", None)
                or getattr(acc, "_posthooks", None))


def active_group(x):
    """The LeafGroup (graph/hooks.py) a leaf's rare state names, if it is active."""
    g = x.group
    return g if g is not None and g.active else None


def leaf_tensor_hooks(acc, grad):
    """A leaf's gradient after its tensor hooks."""
    x = acc.variable._x
    if x is not None and x.hooks:
        grad = run_tensor_hooks(x.hooks[0], grad)
    return grad


def leaf_pre(acc, grad):
    """A leaf's gradient after its tensor hooks and its AccumulateGrad's pre-hooks."""
    grad = leaf_tensor_hooks(acc, grad)
    pre = getattr(acc, "_prehooks", None)
    if pre:
        grad = run_node_prehooks(pre[0], [grad])[0]
    return grad


def leaf_post(acc, grad, group=True):
    """After accumulation: post-accumulate-grad hooks, then AccumulateGrad's post-hooks,
    then (unless the caller reports the leaf's group itself) its LeafGroup, for this leaf."""
    t = acc.variable
    x = t._x
    if x is not None and x.post_hooks:
        for fn in list(x.post_hooks[0].values()):
            if fn(t) is not None:
                raise RuntimeError("Tensor post accumulate grad hooks should return None.")
    post = getattr(acc, "_posthooks", None)
    if post:
        run_node_posthooks(post[0], [], [grad])
    if group and x is not None and active_group(x):
        x.group.fn([t])


def _check_in_place_add(out, other):
    try:
        full = np.broadcast_shapes(out, other)
    except ValueError:
        raise F._broadcast_error(out, other) from None
    if full != out:
        raise RuntimeError(f"output with shape {size_str(out)} doesn't match the broadcast shape "
                           f"{size_str(full)}")


def accumulate_grad(t, grad, create_graph, owned=False, alone=False):
    """AccumulateGrad: add `grad` into t.grad (owned: grad's data is ours to keep as is).
    Serialised per leaf: threads backpropagating into one leaf lose no update. alone: the
    caller knows no other thread exists (and runs no code that could start one)."""
    if grad._data.dtype != t._data.dtype:
        grad = F.to_dtype(grad, t.dtype)
    if alone:
        _accumulate(t, grad, create_graph, owned)
    else:
        with leaf_lock(t):
            _accumulate(t, grad, create_graph, owned)


def _accumulate(t, grad, create_graph, owned):
    old = t._grad
    if old is None:
        if create_graph and grad._requires_grad:
            # PyTorch's AccumulateGrad keeps a copy of a gradient with a graph: .grad's
            # grad_fn is then CopyBackwards, whose input is the gradient's own node
            t._grad = F.zeros_like(grad).copy_(grad)
            return
        # torch steals the incoming buffer only outside grad mode; under create_graph it keeps
        # a clone, so a hook writing .grad does not write the gradient its node handed on
        t._grad = grad if owned and not create_graph else F._wrap(grad._data.copy())
        return
    if old._data.shape != grad._data.shape:
        # the leaf's .data changed size since its .grad was made: torch adds in place, so a
        # gradient broadcasts into .grad, and one that would have to grow it is an error
        _check_in_place_add(old._data.shape, grad._data.shape)
    if create_graph or old._requires_grad:
        t._grad = old + grad
    elif type(old._data) is DeviceArray:
        # in place, as on the host (a view of .grad sees it); numba.cuda is loaded by now
        importlib.import_module("jitgrad.gpu.sweep").add_into(old._data, grad._data)
    else:
        try:
            old._data += grad._data
        except ValueError:  # a read-only .grad: torch's error where it is an expand() result
            importlib.import_module("jitgrad.ops.inplace")._check_writable(old)
            raise


def check_outputs(node, grads):
    """Anomaly mode: raise PyTorch's error if a gradient the node produced holds NaN, after
    warning with the node's forward traceback."""
    if not _check_nan[0]:
        return
    for i, g in enumerate(grads):
        if g is not None and np.isnan(g._data).any():  # on a CUDA tensor's device, no host copy
            raise RuntimeError(f"Function '{node.name()}' returned nan values in its {i}th output.")


def report_error(node, exc):
    """Anomaly mode: an error in `node`'s backward (its rule, its hooks, a check) warns with
    where the node was made in the forward, then where each node whose backward made it was
    made, as PyTorch does. Reported once, by the innermost backward call that saw it."""
    if node is None or getattr(exc, "_anomaly_reported", False):
        return
    try:
        exc._anomaly_reported = True
    except AttributeError:  # an exception type without a __dict__: it may be reported again
        pass
    md = node.metadata
    tb = md.get("traceback_")
    if tb:
        warnings.warn(f"Error detected in {node.name()}. Traceback of forward call that caused the error:\n"
                      + "".join(tb), stacklevel=3)
    else:
        warnings.warn(f"Error detected in {node.name()}. No forward pass information available. Enable detect "
                      "anomaly during forward pass for more information.", stacklevel=3)
    parent = _parent_of(node, md)
    while parent is not None:
        pmd = parent.metadata
        warnings.warn(f"\n\nPrevious calculation was induced by {parent.name()}. Traceback of forward call that "
                      "induced the previous calculation:\n" + "".join(pmd.get("traceback_", ())), stacklevel=3)
        parent = _parent_of(parent, pmd)


def _parent_of(node, md):
    parent = md.get("parent_")
    return node_for(node._tape, parent.row) if isinstance(parent, SameTapeParent) else parent


def _call_node(node, grad):
    """grad_fn(grad): the node's input gradients, in the current grad mode (graph/node.py's
    Node.__call__; the rules live in this layer, above the nodes)."""
    if isinstance(node, AccumulateGrad):  # the sink adds into the leaf's .grad and has no inputs
        accumulate_grad(node.variable, grad, _grad_mode.is_grad_enabled())
        return ()
    return tuple(apply_rule(node, grad))  # as PyTorch's node call: broadcast gradients are not reduced


Node._apply = _call_node
