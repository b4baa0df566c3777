"""The forward half of autograd: when grad is being recorded, append the op's row to the
current tape and create its grad_fn node. This runs once per op in the forward pass, so it
is written for speed: packed appends, no per-call allocation beyond the node itself."""
import weakref

import numpy as np

from .. import _grad_mode
from ..autograd._tape import DT_F32, DT_F64, DT_OTHER, current_tape, pack_edge, pack_edge2
from ..autograd.graph import AccumulateGrad
from .spec import OpSpec

OP_ACC = OpSpec("_acc", "AccumulateGrad", "sink").op     # leaf sink row
OP_EXT = OpSpec("_ext", "ExternalEdge", "sink").op       # edge into an older tape

_DT = {np.dtype(np.float64): DT_F64, np.dtype(np.float32): DT_F32}
_anomaly = [False]  # set by anomaly mode (later issue); read here so recording checks it cheaply
_new = object.__new__


def _leaf_row(tape, t):
    ref = t._acc
    acc = ref() if ref is not None else None
    if acc is None:
        acc = _new(AccumulateGrad)
        acc.variable = t
        acc._tape = None
        acc._row = -1
        acc._inputs = ()
        t._acc = weakref.ref(acc)
    if acc._tape is not tape:
        d = t._data
        acc._row = tape.add_row(OP_ACC, _DT.get(d.dtype, DT_OTHER), 0, d.size, tape.shape(d.shape), 0, 0, 0)
        acc._tape = tape
        tape.leaves[acc._row] = acc
    return acc, acc._row


def _ext_row(tape, gf, t):
    ext = getattr(gf, "_ext", None)
    if ext is not None and ext[0] is tape:
        return ext[1]
    d = t._data
    row = tape.add_row(OP_EXT, _DT.get(d.dtype, DT_OTHER), 0, d.size, tape.shape(d.shape), 0, 0, 0)
    tape.ext[row] = (gf._tape, gf._row)
    gf._ext = (tape, row)
    return row


def _edge(tape, t):
    """(node, row) that input tensor t's gradient flows to."""
    gf = t._grad_fn
    if gf is None:
        return _leaf_row(tape, t)
    if gf._tape is tape:
        return gf, gf._row
    return gf, _ext_row(tape, gf, t)


def _node(spec, tape, row, inputs, pysaved, result):
    node = _new(spec.cls)
    node._spec = spec
    node._tape = tape
    node._row = row
    node._inputs = inputs
    node._k = len(tape.keep)
    tape.keep.append(pysaved)
    if _anomaly[0]:
        import traceback
        node.metadata["traceback_"] = traceback.format_stack()[:-3]
    result.requires_grad = True
    result._grad_fn = node
    return result


def record_binary(spec, result, a, b, saved, fparams, pysaved):
    """Elementwise op of Tensor a and b (a Tensor, or a Python number when b_is_number)."""
    tape = current_tape()
    d = result._data
    dt = _DT.get(d.dtype, DT_OTHER)
    if a.requires_grad:
        na, ra = _edge(tape, a)
        if a._data.dtype != d.dtype:
            dt = DT_OTHER  # the compiled path keeps one dtype per graph; mixed ones run in Python
    else:
        na, ra = None, -1
    if type(b) is not float and b.requires_grad:
        nb, rb = _edge(tape, b)
        if b._data.dtype != d.dtype:
            dt = DT_OTHER
        eb = (rb, b._output_nr, tape.shape(b._data.shape))
    else:
        nb = None
        eb = (-1, 0, 0 if type(b) is float else tape.shape(b._data.shape))
    kp = len(tape.slots) >> 1
    for x in saved:
        if type(x) is float:
            tape.save_scalar(x, dt)
        else:
            tape.save(x)
    fp = len(tape.fp)
    if fparams:
        tape.fp.extend(fparams)
    shp = 0 if d.ndim == 0 else tape.shape(d.shape)
    row = tape.add_row(spec.op, dt, 2, d.size, shp, fp, kp, 0)
    tape.edges.frombytes(pack_edge2(ra, a._output_nr, shp if a._data.shape == d.shape else tape.shape(a._data.shape),
                                    *eb))
    return _node(spec, tape, row, (na, nb), pysaved, result)


def record_unary(spec, result, a, saved, fparams, pysaved):
    tape = current_tape()
    d = result._data
    dt = _DT.get(d.dtype, DT_OTHER)
    na, ra = _edge(tape, a)
    if a._data.dtype != d.dtype:
        dt = DT_OTHER
    kp = len(tape.slots) >> 1
    for x in saved:
        tape.save(x)
    fp = len(tape.fp)
    if fparams:
        tape.fp.extend(fparams)
    shp = 0 if d.ndim == 0 else tape.shape(d.shape)
    row = tape.add_row(spec.op, dt, 1, d.size, shp, fp, kp, 0)
    tape.edges.frombytes(pack_edge(ra, a._output_nr, shp if a._data.shape == d.shape else tape.shape(a._data.shape)))
    return _node(spec, tape, row, (na,), pysaved, result)


def needs_grad(inputs):
    if not _grad_mode.is_grad_enabled():
        return False
    for t in inputs:
        if getattr(t, "requires_grad", False):
            return True
    return False


def record(spec, result, inputs, saved=(), fparams=(), iparams=None, pysaved=None):
    """Append `spec`'s row for output `result` (a Tensor) computed from `inputs`.

    inputs:  Tensors, or ndarrays standing for constants (no edge, but a shape)
    saved:   ndarrays the compiled kernel reads, in the order the kernel expects
    pysaved: whatever the Python rule needs (Tensors, params); freed with the graph
    """
    tape = current_tape()
    d = result._data
    dt = _DT.get(d.dtype, DT_OTHER)
    nodes = []
    edges = []
    for t in inputs:
        if getattr(t, "requires_grad", False):
            node, row = _edge(tape, t)
            if t._data.dtype != d.dtype:
                dt = DT_OTHER
            nodes.append(node)
            edges.append(row)
            edges.append(t._output_nr)
        else:
            nodes.append(None)
            edges.append(-1)
            edges.append(0)
        edges.append(tape.shape(tuple(np.shape(t._data if hasattr(t, "_data") else t))))
    kp = len(tape.slots) >> 1
    for a in saved:
        tape.save(a)
    fp = len(tape.fp)
    if fparams:
        tape.fp.extend(fparams)
    ip = tape.ints(iparams) if iparams else 0
    row = tape.add_row(spec.op, dt, len(inputs), d.size, tape.shape(d.shape), fp, kp, ip)
    tape.edges.extend(edges)
    return _node(spec, tape, row, tuple(nodes), pysaved, result)
