"""Runs backward on the compiled scheduler: one call per tape the graph touches.

Python work here is per call and per sink (leaf), never per node: say which rows are
roots and sinks, call the scheduler, then hand the sinks their gradients, which come back
as slices of one array. Tapes are processed newest first; an EXT row's gradient becomes
a root of the older tape it points into (every row of an older tape precedes every row of
a newer one, so order is kept).

numpy views of a tape's columns exist only for the duration of the call: while a view
is alive, the array.array behind it cannot grow.
"""
import numpy as np

from ..kernels import codegen
from ..kernels.structural import DONE, EXEC, HAS, RECV, mark_need
from ._tape import DT_F32, DT_F64, H_SHP, HW

FALLBACK = object()  # returned when the graph needs the Python engine
FREED = object()     # returned when a row's saved values were already freed

_sched = []
_DT = {np.dtype(np.float64): DT_F64, np.dtype(np.float32): DT_F32}


def scheduler():
    if not _sched:
        _sched.append(codegen.load())
    return _sched[0]


def _view(col, dtype, empty_len):
    return np.frombuffer(col, dtype) if len(col) else np.zeros(empty_len, dtype)


class _TapeRun:
    """One tape's part of a backward call: row states, seeds, and the sinks' gradients."""

    def __init__(self, tape, npd):
        self.tape = tape
        self.npd = npd
        self.st = np.full(tape.nrows, RECV | EXEC, np.uint8)
        self.seeds = {}
        self.out = self.where = None

    def seed(self, row, arr):
        s = self.seeds.get(row)
        self.seeds[row] = arr if s is None else s + arr

    def run(self, sinks, retain):
        tape = self.tape
        tape.grow_freed()
        rows = np.fromiter(self.seeds, np.int64, len(self.seeds))
        vals = [np.asarray(a, self.npd).reshape(-1) for a in self.seeds.values()]
        if len(vals) == 1:  # the usual single root
            offs = np.array((0, vals[0].size), np.int64)
            vals = vals[0]
        else:
            offs = np.zeros(len(vals) + 1, np.int64)
            np.cumsum([a.size for a in vals], out=offs[1:])
            vals = np.concatenate(vals)
        sink_rows = np.fromiter(sinks, np.int64, len(sinks))
        v = tape.v64 if self.npd == np.float64 else tape.v32
        status, row, self.out, self.offs = scheduler().backward(
            _view(tape.hdr, np.int64, HW), _view(tape.edges, np.int64, 3), _view(tape.xs, np.int64, 1),
            _view(tape.fp, np.float64, 1), _view(tape.slots, np.int64, 3), _view(v, self.npd, 1),
            self.st, np.frombuffer(tape.freed, np.int8), rows, offs, vals, sink_rows, int(rows.max()), retain,
            _DT[self.npd])
        self.where = {r: i for i, r in enumerate(sinks)}
        return status

    def value(self, row):
        """Gradient of sink `row`, at its shape (a view into the shared output array)."""
        i = self.where[row]
        shape = self.tape.shape_at(self.tape.hdr[row * HW + H_SHP])
        return self.out[self.offs[i]:self.offs[i + 1]].reshape(shape)


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
            mark_need(_view(t.hdr, np.int64, HW), _view(t.edges, np.int64, 3), t.nrows, r.st)
    for node, g in zip(roots, grads):
        runs[node._tape.id].seed(node._row, g._data)
    captured = {}
    leaves = []
    retained = []
    for t in reversed(tapes):
        r = runs[t.id]
        if not r.seeds:
            continue
        inputs_here = [node._row for node in in_nodes if node._tape is t] if want is not None else []
        # each row once: a leaf can also be a requested input
        sinks = list(dict.fromkeys([*t.leaves, *t.ext, *t.retained, *inputs_here]))
        status = r.run(sinks, retain)
        if status == 1:
            return FREED
        if status == 2:
            return FALLBACK
        st = r.st
        for lrow, acc in t.leaves.items():
            if st[lrow] & HAS:
                if want is None:
                    leaves.append((acc.variable, r.value(lrow)))
                elif id(acc) in want:
                    # a leaf used in several tapes has a sink row in each: the parts add up
                    prev = captured.get(id(acc))
                    captured[id(acc)] = r.value(lrow) if prev is None else prev + r.value(lrow)
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
