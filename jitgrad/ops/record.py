"""The forward half of autograd: when grad is being recorded, append the op's row to the
current tape and point the output tensor at it.

This runs once per op, so it allocates nothing but the output Tensor: rows are packed
appends to the tape's columns, and no Node object is made (autograd/graph.py makes them
on demand). The input tensors themselves are not kept: a saved input is kept as data
(inline or by address), and its grad_fn is recovered from the row's edge.
"""
import weakref

import numpy as np

from .. import _grad_mode
from ..autograd._tape import DT_F32, DT_F64, DT_OTHER, current_tape, pack_edge, pack_edge2
from ..autograd.graph import SINK_OPS, AccumulateGrad
from .spec import OpSpec

OP_ACC = SINK_OPS["acc"] = OpSpec("_acc", "AccumulateGrad", "sink").op   # leaf sink row
OP_EXT = SINK_OPS["ext"] = OpSpec("_ext", "ExternalEdge", "sink").op     # edge into an older tape

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
        t._acc = weakref.ref(acc)
    if acc._tape is not tape:
        d = t._data
        acc._row = tape.add_row(OP_ACC, _DT.get(d.dtype, DT_OTHER), 0, d.size, tape.shape(d.shape), 0, 0, 0)
        acc._tape = tape
        tape.leaves[acc._row] = acc
    return acc._row


def _ext_row(tape, t):
    key = (t._tape.id, t._row)
    row = tape.ext_rows.get(key)
    if row is None:
        d = t._data
        row = tape.add_row(OP_EXT, _DT.get(d.dtype, DT_OTHER), 0, d.size, tape.shape(d.shape), 0, 0, 0)
        tape.ext[row] = (t._tape, t._row)
        tape.ext_rows[key] = row
    return row


def _edge_row(tape, t):
    """The row that input tensor t's gradient flows to, in `tape`."""
    src = t._tape
    if src is None:
        return _leaf_row(tape, t)
    if src is tape:
        return t._row
    return _ext_row(tape, t)


def _link(tape, row, result):
    if _anomaly[0]:
        import traceback
        tape.tracebacks[row] = traceback.format_stack()[:-3]
    result._requires_grad = True
    result._tape = tape
    result._row = row
    result._output_nr = 0
    return result


def _save_all(tape, saved, dt):
    kp = len(tape.slots) // 3
    for x in saved:
        if type(x) is float:
            tape.save_scalar(x, dt)
        else:
            tape.save(x)
    return kp


def record_binary(spec, result, a, b, saved, fparams):
    """Elementwise op of Tensor a and b (a Tensor, or a Python float standing for a constant)."""
    tape = current_tape()
    d = result._data
    dt = _DT.get(d.dtype, DT_OTHER)
    shp = 0 if d.ndim == 0 else tape.shape(d.shape)
    ad = a._data
    if a._requires_grad:
        ea = (_edge_row(tape, a), a.output_nr, shp if ad.shape == d.shape else tape.shape(ad.shape))
        if ad.dtype != d.dtype:
            dt = DT_OTHER  # the compiled path keeps one dtype per graph; mixed ones run in Python
    else:
        ea = (-1, 0, shp if ad.shape == d.shape else tape.shape(ad.shape))
    if type(b) is float:
        eb = (-1, 0, 0)
    else:
        bd = b._data
        eb = (_edge_row(tape, b) if b._requires_grad else -1, b.output_nr,
              shp if bd.shape == d.shape else tape.shape(bd.shape))
        if b._requires_grad and bd.dtype != d.dtype:
            dt = DT_OTHER
    kp = _save_all(tape, saved, dt)
    fp = len(tape.fp)
    if fparams:
        tape.fp.extend(fparams)
    row = tape.add_row(spec.op, dt, 2, d.size, shp, fp, kp, 0)
    tape.edges.frombytes(pack_edge2(*ea, *eb))
    return _link(tape, row, result)


def record_unary(spec, result, a, saved, fparams):
    tape = current_tape()
    d = result._data
    dt = _DT.get(d.dtype, DT_OTHER)
    if a._data.dtype != d.dtype:
        dt = DT_OTHER
    shp = 0 if d.ndim == 0 else tape.shape(d.shape)
    er = _edge_row(tape, a)
    kp = _save_all(tape, saved, dt)
    fp = len(tape.fp)
    if fparams:
        tape.fp.extend(fparams)
    row = tape.add_row(spec.op, dt, 1, d.size, shp, fp, kp, 0)
    tape.edges.frombytes(pack_edge(er, a.output_nr, shp if a._data.shape == d.shape else tape.shape(a._data.shape)))
    return _link(tape, row, result)


def record(spec, result, inputs, saved=(), fparams=(), iparams=None):
    """Append `spec`'s row for output `result` (a Tensor) computed from `inputs`.

    inputs:  Tensors, or ndarrays standing for constants (no edge, but a shape)
    saved:   data the kernel and the rule read, in the order of spec.saves
    fparams, iparams: the op's float and int parameters (see each kernel for its layout)
    """
    tape = current_tape()
    d = result._data
    dt = _DT.get(d.dtype, DT_OTHER)
    edges = []
    for t in inputs:
        if getattr(t, "requires_grad", False):
            edges.append(_edge_row(tape, t))
            edges.append(t.output_nr)
            if t._data.dtype != d.dtype:
                dt = DT_OTHER
        else:
            edges.append(-1)
            edges.append(0)
        edges.append(tape.shape(tuple(np.shape(t._data if hasattr(t, "_data") else t))))
    kp = _save_all(tape, saved, dt)
    fp = len(tape.fp)
    if fparams:
        tape.fp.extend(fparams)
    ip = tape.ints(iparams) if iparams else 0
    row = tape.add_row(spec.op, dt, len(inputs), d.size, tape.shape(d.shape), fp, kp, ip)
    tape.edges.extend(edges)
    return _link(tape, row, result)
