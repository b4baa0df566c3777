"""Runs backward on the compiled scheduler: one call per tape the graph touches.

Python work here is per call and per leaf, never per node: build the state arrays, seed
the roots, call the scheduler, then hand the leaves their gradients. Tapes are processed
newest first; an EXT row's gradient becomes a root of the older tape it points into
(every row of an older tape precedes every row of a newer one, so order is kept).

numpy views of a tape's columns exist only inside `_with_views`: while a view is alive
the array.array behind it cannot grow, so none may outlive a call (not even in a
traceback).
"""
import numpy as np
from numba import types
from numba.np.numpy_support import from_dtype
from numba.typed import List

from ..kernels import codegen
from ..kernels.structural import DONE, EXEC, HAS, KEEP, RECV, mark_need
from ._tape import DT_F32, DT_F64, H_NUMEL, H_SHP, HW

FALLBACK = object()  # returned when the graph needs the Python engine
FREED = object()     # returned when a row's saved values were already freed

_sched = []
_LIST_TYPES = {}
_DT = {np.dtype(np.float64): DT_F64, np.dtype(np.float32): DT_F32}


def scheduler():
    if not _sched:
        _sched.append(codegen.load())
    return _sched[0]


def _list_type(npd):
    t = _LIST_TYPES.get(npd)
    if t is None:
        t = _LIST_TYPES[npd] = types.Array(from_dtype(npd), 1, "C")
    return t


def _view(col, dtype, empty_len):
    return np.frombuffer(col, dtype) if len(col) else np.zeros(empty_len, dtype)


class _TapeRun:
    """The per-backward state of one tape: which rows take, have and keep gradient, and
    the gradient buffers (g1 for one-element rows, bigs for the rest)."""

    def __init__(self, tape, npd):
        n = tape.nrows
        self.tape = tape
        self.npd = npd
        self.st = np.full(n, RECV | EXEC, np.uint8)
        self.g1 = np.zeros(n, npd)
        self.bslot = np.full(n, -1, np.int64)
        self.bigs = List.empty_list(_list_type(npd))
        self.hi = -1

    def seed(self, row, arr):
        self.st[row] |= HAS
        self.hi = max(self.hi, row)
        if self.tape.hdr[row * HW + H_NUMEL] == 1:
            self.g1[row] += np.asarray(arr).reshape(-1)[0]
            return
        s = self.bslot[row]
        if s < 0:
            self.bslot[row] = len(self.bigs)
            self.bigs.append(np.array(arr, dtype=self.npd).reshape(-1))
        else:
            self.bigs[s] += np.asarray(arr).reshape(-1)

    def value(self, row):
        tape = self.tape
        shape = tape.shape_at(tape.hdr[row * HW + H_SHP])
        if tape.hdr[row * HW + H_NUMEL] == 1:
            return np.full(shape, self.g1[row], self.npd)
        return self.bigs[self.bslot[row]].reshape(shape)

    def mark_need(self):
        tape = self.tape
        mark_need(_view(tape.hdr, np.int64, HW), _view(tape.edges, np.int64, 3), tape.nrows, self.st)

    def run(self, retain):
        tape = self.tape
        tape.grow_freed()
        v = tape.v64 if self.npd == np.float64 else tape.v32
        return scheduler().run(
            _view(tape.hdr, np.int64, HW), _view(tape.edges, np.int64, 3), _view(tape.xs, np.int64, 1),
            _view(tape.fp, np.float64, 1), _view(tape.slots, np.int64, 3), _view(v, self.npd, 1),
            self.g1, self.st, self.bslot, self.bigs, np.frombuffer(tape.freed, np.int8), self.hi, retain,
            _DT[self.npd])


def _tapes_from(roots):
    seen = {}
    stack = [r._tape for r in roots]
    while stack:
        t = stack.pop()
        if t.id in seen:
            continue
        seen[t.id] = t
        stack.extend(ft for ft, _ in t.ext.values())
    return sorted(seen.values(), key=lambda t: t.id)


def run(roots, grads, in_nodes, retain):
    """Returns ({id(input node): grad array}, [(leaf tensor, grad array)], [(retaining tensor,
    grad array)]), or FALLBACK / FREED. With in_nodes, leaves are captured, not accumulated."""
    npd = grads[0]._data.dtype
    if npd not in _DT or any(g._data.dtype != npd for g in grads):
        return FALLBACK
    tapes = _tapes_from(roots)
    runs = {t.id: _TapeRun(t, npd) for t in tapes}
    want = None if in_nodes is None else {id(n) for n in in_nodes}
    if want is not None:
        for t in tapes:  # oldest first: EXT rows read their foreign tape's decision
            r = runs[t.id]
            r.st[:] = 0
            for node in in_nodes:
                if node._tape is t:
                    r.st[node._row] |= RECV
            for row, acc in t.leaves.items():
                if id(acc) in want:
                    r.st[row] |= RECV
            for row, (ft, frow) in t.ext.items():
                if runs[ft.id].st[frow] & RECV:
                    r.st[row] |= RECV
            r.mark_need()
    for node, g in zip(roots, grads):
        runs[node._tape.id].seed(node._row, g._data)
    captured = {}
    leaves = []
    retained = []
    for t in reversed(tapes):
        r = runs[t.id]
        if r.hi < 0:
            continue
        st = r.st
        for row in t.retained:
            st[row] |= KEEP
        if want is not None:
            for node in in_nodes:
                if node._tape is t:
                    st[node._row] |= KEEP
        status, _ = r.run(retain)
        if status == 1:
            return FREED
        if status == 2:
            return FALLBACK
        for lrow, acc in t.leaves.items():
            if st[lrow] & HAS:
                if want is None:
                    leaves.append((acc.variable, r.value(lrow)))
                elif id(acc) in want:
                    captured[id(acc)] = r.value(lrow)
        for erow, (ft, frow) in t.ext.items():
            if st[erow] & HAS:
                runs[ft.id].seed(frow, r.value(erow))
        for rrow, ref in t.retained.items():
            tensor = ref()
            if tensor is not None and st[rrow] & HAS:
                retained.append((tensor, r.value(rrow)))
        if want is not None:
            for node in in_nodes:
                if node._tape is t and st[node._row] & HAS:
                    captured[id(node)] = r.value(node._row)
        if not retain:
            _release(t, r)
    return captured, leaves, retained


def _release(tape, r):
    """Free saved values. When every recorded node of the tape has run, drop them all at once."""
    ran = int(np.count_nonzero(r.st & DONE))
    if ran + len(tape.leaves) + len(tape.ext) >= tape.nrows:
        tape.keep = []
        tape.keep_bytes = 0
