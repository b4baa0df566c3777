"""The forward half of autograd: wrap an op's numpy result in a Tensor and, when grad is
being recorded, append the op's row to the current tape and create its grad_fn node."""
import weakref

import numpy as np

from .. import _grad_mode
from ..autograd import _tape
from ..autograd._tape import DT_F32, DT_F64, DT_OTHER, current_tape
from ..autograd.graph import AccumulateGrad
from .spec import OpSpec

OP_ACC = OpSpec("_acc", "AccumulateGrad", "sink").op     # leaf sink row
OP_EXT = OpSpec("_ext", "ExternalEdge", "sink").op       # edge into an older tape

_DT = {np.dtype(np.float64): DT_F64, np.dtype(np.float32): DT_F32}
_anomaly = [False]  # set by autograd.anomaly_mode (later issue); kept here so recording can check it cheaply


def _leaf_row(tape, t):
    ref = t._acc
    acc = ref() if ref is not None else None
    if acc is None:
        acc = AccumulateGrad.__new__(AccumulateGrad)
        acc.variable = t
        acc._tape = None
        acc._row = -1
        acc._metadata = None
        acc._inputs = ()
        acc._nrs = ()
        acc._ext = None
        t._acc = weakref.ref(acc)
    if acc._tape is not tape:
        d = t._data
        acc._row = tape.add_row(OP_ACC, _DT.get(d.dtype, DT_OTHER), 0, d.size, tape.shape(d.shape), 0, 0, 0)
        acc._tape = tape
        tape.leaves[acc._row] = acc
    return acc, acc._row


def _ext_row(tape, gf, t):
    ext = gf._ext
    if ext is not None and ext[0] is tape:
        return ext[1]
    d = t._data
    row = tape.add_row(OP_EXT, _DT.get(d.dtype, DT_OTHER), 0, d.size, tape.shape(d.shape), 0, 0, 0)
    tape.ext[row] = (gf._tape, gf._row)
    gf._ext = (tape, row)
    return row


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
    nrs = []
    edges = []
    for t in inputs:
        if getattr(t, "requires_grad", False):
            gf = t._grad_fn
            if gf is None:
                node, row = _leaf_row(tape, t)
            else:
                node = gf
                row = gf._row if gf._tape is tape else _ext_row(tape, gf, t)
            if t._data.dtype != d.dtype:
                dt = DT_OTHER  # the compiled path keeps one dtype per graph; mixed ones run in Python
            nodes.append(node)
            nrs.append(t._output_nr)
            edges.append(row)
            edges.append(t._output_nr)
        else:
            nodes.append(None)
            nrs.append(0)
            edges.append(-1)
            edges.append(0)
        edges.append(tape.shape(t.shape))
    kp = len(tape.slots) >> 1
    for a in saved:
        tape.save(a)
    fp = len(tape.fp)
    if fparams:
        tape.fp.extend(fparams)
    ip = tape.ints(iparams) if iparams else 0
    row = tape.add_row(spec.op, dt, len(inputs), d.size, tape.shape(d.shape), fp, kp, ip)
    tape.edges.extend(edges)
    node = spec.cls.__new__(spec.cls)
    node._spec = spec
    node._tape = tape
    node._row = row
    node._inputs = tuple(nodes)
    node._nrs = tuple(nrs)
    node._k = len(tape.keep)
    tape.keep.append(pysaved)
    node._metadata = None
    node._ext = None
    if _anomaly[0]:
        import traceback
        node.metadata["traceback_"] = traceback.format_stack()[:-2]
    result.requires_grad = True
    result._grad_fn = node
    return result
