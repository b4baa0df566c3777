"""The forward half of autograd: when grad is being recorded, append the op's row to the
current tape and point the output tensor at it.

This runs once per op, so it allocates nothing but the output Tensor: rows are packed
appends to the tape's columns, and no Node object is made (graph/node.py makes them
on demand). The input tensors themselves are not kept: a saved input is kept as data
(inline or by address), and its grad_fn is recovered from the row's edge.
"""
import os
import threading
import traceback
import weakref

import numpy as np

from jitgrad._core.capture import state as _cap
from jitgrad._core.forward import state as _forward
from jitgrad._core.layout import CUDA_DT_OF, CUDA_NP_OF
from jitgrad._core.modes import _anomaly, _anomaly_parent, _packing, _saved_hooks  # noqa: F401  (read per op)
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph import saved as _saved
from jitgrad.graph.node import NOWHERE, AccumulateGrad
from jitgrad.graph.spec import OP_ACC, OP_EXT, OP_OUT, OP_PYFN, OpSpec  # noqa: F401  (OP_OUT, OP_PYFN: re-exported)
from jitgrad.graph.tape import (
    DT_F32,
    DT_F64,
    DT_OTHER,
    DT_PY,
    EW,
    MAX_ROWS,
    SPLIT_BYTES,
    SW,
    current_tape,
    on_device,
    pack_edge,
    pack_edge2,
    pack_ints,
    pack_row,
    tape_for,
)
from jitgrad.graph.tape import _local as _tape_local
from jitgrad.graph.tensor import rare, wrap
from jitgrad.graph.views import autograd_skips, made_inference

_DT = {np.dtype(np.float64): DT_F64, np.dtype(np.float32): DT_F32}


def _dtcode(d):
    """A row's dtype code for its output data d: CUDA rows have their own codes, so that the
    CPU sweep never reads them (_core/layout.py)."""
    return (CUDA_DT_OF if type(d) is DeviceArray else _DT).get(d.dtype, DT_OTHER)


def _pack_row(tape, row, tensors):
    """Under saved_tensors_hooks: keep pack(tensor) for each saved value instead of the
    value (None: not saved), and mark the row for the Python engine (which unpacks it)."""
    _saved.pack_row(tape, row, tensors, _saved_hooks.stack[-1])
_new = object.__new__


_acc_lock = threading.Lock()
_weakref = weakref.ref
_LAST_ROW = MAX_ROWS - 1  # a row at or past it closes its tape


def accumulator(t):
    """Leaf t's AccumulateGrad, made on first use: one per leaf (its hooks live on it), so
    threads first recording with the leaf at once make it under a lock."""
    x = t._x
    if x is None:
        x = rare(t)
    with _acc_lock:
        ref = x.acc
        acc = None if ref is None else ref()
        if acc is None:
            acc = _new(AccumulateGrad)
            acc.variable = t
            acc._at = NOWHERE  # every field set before another thread can reach the node
            acc._next = ()
            x.acc = _weakref(acc)
    return acc


def _leaf_row(tape, t):
    """Leaf t's AccumulateGrad row in `tape`, added at its first use there. Per leaf and
    graph: t._acc, acc._at and tape.add_row are read and done inline. Threads recording
    with one leaf each add rows to their own tapes: acc._at, where its latest row is, is
    read and replaced as one (tape, row) pair, never a tape with another tape's row."""
    x = t._x
    ref = None if x is None else x.acc
    acc = None if ref is None else ref()
    if acc is not None:
        at = acc._at
        if at[0]() is tape:
            return at[1]
    else:
        # a new graph (the last one that reached the leaf is gone, with its node)
        acc = accumulator(t)
    d = t._data
    dshape = d.shape
    shp = tape.shape_ptr.get(dshape)
    if shp is None:
        shp = tape.shape(dshape)
    row = tape.nrows
    tape.hdr.frombytes(pack_row(OP_ACC, (CUDA_DT_OF if type(d) is DeviceArray else _DT).get(d.dtype, DT_OTHER),
                                0, len(tape.edges) // EW, d.size, shp, 0, 0, 0))
    tape.nrows = row + 1
    if row >= _LAST_ROW:
        tape.closed = True
    tape.leaves[row] = acc
    acc._at = (_weakref(tape), row)
    return row


def _ext_row(tape, t):
    key = (t._tape.id, t._row)
    row = tape.ext_rows.get(key)
    if row is None:
        d = t._data
        row = tape.add_row(OP_EXT, _dtcode(d), 0, d.size, tape.shape(d.shape), 0, 0, 0)
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


_NP = {DT_F64: np.dtype(np.float64), DT_F32: np.dtype(np.float32), **CUDA_NP_OF}
_SCALAR_DT = {np.float64: DT_F64, np.float32: DT_F32}
_I64 = np.dtype(np.int64)


def _save_all(tape, saved, dt, index=(), need=None):
    """Save each value at the dtype its kernel reads it: int64 where `index` says so, else
    the row's float dtype (a bool mask, an int or other-float operand is cast here).
    need: per value, whether a wanted gradient reads it (graph/saved.py); one that none
    reads is kept for the kernel but not version-checked (PyTorch does not save it)."""
    kp = len(tape.slots) // SW
    want = _NP.get(dt)
    save = tape.save
    for i, x in enumerate(saved):
        if type(x) is float:
            tape.save_scalar(x, dt)
        else:
            save(x, need is None or need[i], _I64 if index and index[i] else want)
    return kp


def record_ew(spec, result, a, b, p0, p1, aux):
    """Record elementwise `spec` on Tensor a and b (a Tensor, a Python float standing for a
    constant, or None: unary), with float params p0, p1 and where's condition `aux`; the
    saved values are taken from them as spec.save_src says. The hot path of every scalar
    graph, hence written out: tape_for, _edge_row, tape.shape and the linking of the result
    are inlined for the cases that occur per op (the current tape, an input from it or a leaf)."""
    if made_inference[0] and _autograd_skips_ew(spec, a, b):
        return _unrecorded(result)
    ref = _tape_local.ref
    tape = None if ref is None else ref()
    if tape is None or tape.closed or tape.keep_bytes > SPLIT_BYTES:
        tape = tape_for(a, b)
    d = result._data
    tp = type(d)
    dev = tp is DeviceArray
    if tape.cuda is not dev:
        tape = on_device(tape, dev)
    # A 0-d result is a numpy float scalar (ops/elementwise.py): its type says its dtype and
    # shape, and an input of the same type has them too, without reading .dtype (slow on
    # scalars). tp is None for arrays, whose dtypes and shapes are compared.
    dt = _SCALAR_DT.get(tp)
    if dt is None:
        tp = None
        dt = (CUDA_DT_OF if dev else _DT).get(d.dtype, DT_OTHER)
        dshape = d.shape  # a new tuple per read: read once
        shp = tape.shape_ptr.get(dshape)
        if shp is None:
            shp = tape.shape(dshape)
    else:
        dshape, shp = (), 0
    ad = a._data
    if a._requires_grad:
        src = a._tape
        if src is tape:
            ra, nra = a._row, a._output_nr
        elif src is None:
            ra, nra = _leaf_row(tape, a), 0
        else:
            ra, nra = _ext_row(tape, a), a._output_nr
        if type(ad) is not tp and (ad.dtype != d.dtype or (type(ad) is DeviceArray) != dev):
            dt |= DT_PY  # its kernels would read one dtype and device: the row runs in Python
    else:
        ra, nra = -1, 0
    sa = shp if type(ad) is tp or ad.shape == dshape else tape.shape(ad.shape)
    bd = None
    if b is None:
        nin = 1
    elif type(b) is float:
        nin, rb, nrb, sb = 2, -1, 0, 0
    else:
        nin = 2
        bd = b._data
        if b._requires_grad:
            src = b._tape
            if src is tape:
                rb, nrb = b._row, b._output_nr
            elif src is None:
                rb, nrb = _leaf_row(tape, b), 0
            else:
                rb, nrb = _ext_row(tape, b), b._output_nr
            if type(bd) is not tp and (bd.dtype != d.dtype or (type(bd) is DeviceArray) != dev):
                dt |= DT_PY
        else:
            rb, nrb = -1, 0
        sb = shp if type(bd) is tp or bd.shape == dshape else tape.shape(bd.shape)
    # saved_tensors_hooks: the tensors to pack instead of saving (packed once linked, below)
    packed = _ew_packed(spec, result, a, b, aux) if _packing[0] and _saved_hooks.stack else None
    if (tp is not None or d.size == 1) and dt < DT_OTHER:
        # one-element CPU row: its saved values go straight into the value column and kp
        # indexes that column (no slot entries); see tape.saved_value. A CUDA row's values
        # stay on the device, saved by address (tape.save)
        col = tape.v64 if dt == DT_F64 else tape.v32
        kp = len(col)
        inline = packed is None
        for src in () if packed is not None else spec.save_src:  # input 0 / 1, the result (-1), where's mask (-2)
            x = ad if src == 0 else (b if bd is None else bd) if src == 1 else d if src == -1 else aux._data
            # a float or a 0-d value converts as it is appended; .item() is ~10x dearer
            col.append(x if type(x) is float or x.ndim == 0 else x.item())
    elif packed is not None or not spec.save_src:
        kp, inline = len(tape.slots) // SW, False
    else:
        kp, inline = _save_ew(tape, spec, result, a, b, aux, dt), False
    fp = len(tape.fp)
    if spec.nparams:
        tape.fp.extend((p0, p1)[:spec.nparams])
    row = tape.nrows
    tape.hdr.frombytes(pack_row(spec.op, dt, nin, len(tape.edges) // EW, d.size, shp, fp, kp, 0))
    tape.edges.frombytes(pack_edge(ra, nra, sa) if nin == 1 else pack_edge2(ra, nra, sa, rb, nrb, sb))
    tape.nrows = row + 1
    if row + 1 >= MAX_ROWS:
        tape.closed = True
    if _anomaly[0]:
        _trace(tape, row)
    result._requires_grad = True
    result._tape = tape
    result._row = row
    result._output_nr = 0
    if packed is not None:  # after linking: a packed output carries its grad_fn, as in PyTorch
        _pack_row(tape, row, packed)
    elif inline and (not a._requires_grad or bd is not None and not b._requires_grad):
        # a constant operand copied inline: an in-place write to it must still find this row
        tape.note_inline_const(bd if a._requires_grad else ad, row)
    return result


def _autograd_skips_ew(spec, a, b):
    ins = (a, b) if b is not None and type(b) is not float else (a, None)
    needed = [ins[src]._data for src, users in zip(spec.save_src, spec.save_users)
              if src in (0, 1) and ins[src] is not None
              and any(ins[u] is not None and ins[u]._requires_grad for u in users if u in (0, 1))]
    return autograd_skips([t for t in ins if t is not None], needed)


def _unrecorded(result):
    result._requires_grad = False
    result._tape = None
    return result


def _save_ew(tape, spec, result, a, b, aux, dt):
    """Save elementwise `spec`'s values (see record_ew) in slots; returns the first."""
    kp = len(tape.slots) // SW
    want = _NP.get(dt)
    d = result._data
    ga = a._requires_grad
    gb = b is not None and type(b) is not float and b._requires_grad
    for src, users in zip(spec.save_src, spec.save_users):
        if src == 1 and type(b) is float:
            tape.save_scalar(b, dt)
            continue
        x = a._data if src == 0 else b._data if src == 1 else d if src == -1 else aux._data.astype(d.dtype)
        # read only by the formula of an input that needs no gradient: saved, not version-checked
        check = (ga and 0 in users) or (gb and 1 in users) or d.size == 1
        # the result is a new array, at version 0 (unless the op's forward returned its input)
        tape.save(x, check, want, src == -1 and d.base is None and d is not a._data and (b is None or d is not b._data))
    return kp


def _ew_packed(spec, result, a, b, aux):
    """Under saved_tensors_hooks: the tensors to pack for the row, or None when some saved
    value is not a tensor (a float operand), which is then saved as usual."""
    if any(s == 1 and type(b) is float for s in spec.save_src):
        return None
    need = _saved.needed(spec, (a._requires_grad, b is not None and type(b) is not float and b._requires_grad))
    return [(a if s == 0 else b if s == 1 else result if s == -1 else aux) if n else None
            for s, n in zip(spec.save_src, need)]


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SameTapeParent:
    """Anomaly mode: the parent of a node recorded by a backward, a row of the node's own tape."""
    __slots__ = ("row",)

    def __init__(self, row):
        self.row = row


def _trace(tape, row):
    """Anomaly mode: where in the user's forward this node was made (kept in the node's
    metadata, as PyTorch keeps it); jitgrad's own frames are left out."""
    frames = [f for f in traceback.extract_stack() if not f.filename.startswith(_PACKAGE)]
    md = tape.metadata.setdefault(row, {})
    md["traceback_"] = traceback.format_list(frames)
    parent = _anomaly_parent.node
    if parent is not None:  # made by a backward: its error report goes on to that node
        # torch's child node holds its parent; here a parent in the same tape is named by
        # its row, since tape -> metadata -> node -> tape would be a cycle that keeps the
        # graph (and what users put in its metadata) alive after its last tensor is gone
        md["parent_"] = parent if parent._tape is not tape else SameTapeParent(parent._row)


def record(spec, result, inputs, saved=(), fparams=(), iparams=None, dual=True):
    """Record structural `spec` (see _record). While forward mode is live the ops layer's
    handler runs instead (ops/_forward.record): it calls back here with dual=False when
    the backward needs the row, then computes the output's tangent."""
    if _cap.on and _cap.mine():
        _cap.on = False  # what recording the row runs is not traced (_core/capture.py)
        try:
            out = record(spec, result, inputs, saved, fparams, iparams, dual)
        finally:
            _cap.on = True
        _cap.rec.struct(spec, out, inputs, saved, fparams, iparams)
        return out
    if dual and _forward.live:
        return _forward.record(spec, result, inputs, saved, fparams, iparams)
    if _packing[0] and _saved_hooks.stack:
        return _record_packed(spec, result, inputs, saved, fparams, iparams)
    return _record(spec, result, inputs, saved, fparams, iparams)


def _record_packed(spec, result, inputs, saved, fparams, iparams):
    tensors = []
    need = _saved.needed(spec, [t._requires_grad for t in inputs])
    for name, arr, n in zip(spec.saves, saved, need):
        # the tensor PyTorch would pack: the input itself for self / other (None: not saved)
        j = spec.input_of(name)
        t = inputs[j] if j is not None else None
        tensors.append(None if not n else t if t is not None and t._data is arr else
                       (result if arr is result._data else wrap(arr)))
    out = _record(spec, result, inputs, (), fparams, iparams)
    _pack_row(out._tape, out._row, tensors)
    return out


def pack_saved(t):
    """For a custom Function's save_for_backward: (unpack, pack(t)) under
    saved_tensors_hooks, or None."""
    if _packing[0] and _saved_hooks.stack:
        pack, unpack = _saved_hooks.stack[-1]
        return unpack, _saved.pack(pack, t)
    return None


def _record(spec, result, inputs, saved=(), fparams=(), iparams=None):
    """Append `spec`'s row for output `result` (a Tensor) computed from `inputs`.

    inputs:  Tensors
    saved:   data the kernel and the rule read, in the order of spec.saves
    fparams, iparams: the op's float and int parameters (see each kernel for its layout)

    Once per structural op, hence tape.add_row / shape and the linking of the result written out.
    """
    if made_inference[0] and autograd_skips(inputs, saved):
        return _unrecorded(result)
    ref = _tape_local.ref
    tape = None if ref is None else ref()
    if tape is None or tape.closed:
        tape = current_tape()
    if tape.keep_bytes > SPLIT_BYTES and _cap.rec is None and all(t._tape is not tape for t in inputs):
        tape = tape_for(inputs[0])
    d = result._data
    dtype = d.dtype
    dev = type(d) is DeviceArray
    if tape.cuda is not dev:
        tape = on_device(tape, dev)
    dt = (CUDA_DT_OF if dev else _DT).get(dtype, DT_OTHER)
    interned = tape.shape_ptr
    edges = []
    requires = []
    for t in inputs:
        td = t._data
        tshape = td.shape  # a new tuple per read: read once
        if t._requires_grad:
            requires.append(True)
            src = t._tape
            if src is tape:
                edges += (t._row, t._output_nr)
            elif src is None:
                edges += (_leaf_row(tape, t), 0)
            else:
                edges += (_ext_row(tape, t), t._output_nr)
            if td.dtype != dtype or (type(td) is DeviceArray) != dev:
                dt |= DT_PY  # as in record_ew
        else:
            requires.append(False)
            edges += (-1, 0)
        p = interned.get(tshape)
        edges.append(tape.shape(tshape) if p is None else p)
    if saved:
        kp = _save_all(tape, saved, dt, spec.index_saves, _saved.needed(spec, requires) if spec.save_users else None)
    else:
        kp = len(tape.slots) // SW
    fp = len(tape.fp)
    if fparams:
        tape.fp.extend(fparams)
    ip = tape.ints(iparams) if iparams else 0
    dshape = d.shape
    shp = interned.get(dshape)
    if shp is None:
        shp = tape.shape(dshape)
    row = tape.nrows
    nin = len(inputs)
    tape.hdr.frombytes(pack_row(spec.op, dt, nin, len(tape.edges) // EW, d.size, shp, fp, kp, ip))
    tape.edges.frombytes((pack_edge2 if nin == 2 else pack_edge if nin == 1 else pack_ints(len(edges)))(*edges))
    tape.nrows = row + 1
    if row >= _LAST_ROW:
        tape.closed = True
    if _anomaly[0]:
        _trace(tape, row)
    result._requires_grad = True
    result._tape = tape
    result._row = row
    result._output_nr = 0
    return result
