"""Runs backward on the compiled scheduler: one call per tape the graph touches.

Python work here is per call and per sink (leaf), never per node: say which rows are
roots and sinks, call the scheduler, then hand the sinks their gradients, which come back
as slices of one array. Tapes are processed newest first; an EXT row's gradient becomes
a root of the older tape it points into (every row of an older tape precedes every row of
a newer one, so order is kept).

numpy views of a tape's columns exist only for the duration of the call: while a view
is alive, the array.array behind it cannot grow. A backward in a thread that does not
own the tape reads copies instead (see _tape's module doc); the caller holds the locks.

Nothing here changes what the user or a later backward sees: the compiled code is told
to keep the graph (retain), and what a call frees comes back as a _Commit that the
engine applies together with the .grad updates, in one block that Ctrl-C cannot split
(_threads.deferred_interrupts). So an exception at any point before that block leaves
.grad untouched and the graph intact for a retry.
"""
import threading

import numpy as np
from numba import typeof
from numba.core.config import DISABLE_JIT

from jitgrad._core import verbosity
from jitgrad._core.layout import (
    DONE,
    DT_F32,
    DT_F64,
    DT_MASK,
    DT_OF,
    DT_PY,
    E_SHP,
    E_TGT,
    EW,
    EXEC,
    FREED,
    H_DT,
    H_E0,
    H_IP,
    H_NIN,
    H_NUMEL,
    H_OP,
    H_SHP,
    HAS,
    HW,
    LEAF_READY,
    NEED_KERNEL,
    NP_OF,
    PRE,
    PREHOOKS,
    PYNODE,
    PYRUN,
    RECV,
    SW,
)
from jitgrad._core.messages import freed_error as _freed_error
from jitgrad._core.messages import size_str, torch_size
from jitgrad._core.modes import no_grad
from jitgrad._core.threads import deferred_interrupts
from jitgrad.engine import codegen, stats
from jitgrad.engine import executor as pyengine
from jitgrad.engine.executor import input_grads
from jitgrad.engine.hooks import run_node_posthooks, run_node_prehooks, run_tensor_hooks, version_of, written
from jitgrad.engine.kernel_table import KernelTables
from jitgrad.graph.hooks import leaf_hooks
from jitgrad.graph.node import AccumulateGrad, node_for
from jitgrad.graph.pynode import FunctionNode, validate_gradient
from jitgrad.graph.record import OP_OUT
from jitgrad.graph.spec import BY_OP, SPECS
from jitgrad.graph.tape import close_current_tape, live_tape
from jitgrad.kernels._cache import is_cached
from jitgrad.ops import functional as F


class Fallback:
    """run()'s answer when the call needs the Python engine, with the reason (engine/stats.py)."""
    __slots__ = ("reason",)

    def __init__(self, reason):
        self.reason = reason


FALLBACK = Fallback("the graph needs the Python engine")  # the generic answer

_sched = [(-1, None)]  # (len(BY_OP) it was made for, the module): replaced whole, read once
_sched_lock = threading.Lock()
_DT = DT_OF


def scheduler():
    """The compiled module of the op table as it is now, with its kernel tables (KERNELS).
    The table only grows: an op declared after the first backward (ops.defop) gives a new
    module, which also runs every opcode the old one knew. Made once under a lock (threads
    running their first backward together must share one KERNELS: see kernel_table)."""
    n, mod = _sched[0]
    if n != len(BY_OP):
        with _sched_lock:
            n, mod = _sched[0]
            if n != len(BY_OP):
                n = len(BY_OP)
                mod = codegen.load()
                if not hasattr(mod, "KERNELS"):
                    mod.KERNELS = KernelTables(mod)
                _sched[0] = (n, mod)
    return mod


def _view(col, dtype, empty_len):
    return np.frombuffer(col, dtype) if len(col) else np.zeros(empty_len, dtype)


def _copy(col, dtype, empty_len):
    """A private copy of a column: bytearray copies it while holding the GIL, so no view of
    the shared array is left for its owner's next append to trip over."""
    return np.frombuffer(bytearray(col), dtype) if len(col) else np.zeros(empty_len, dtype)


def _boxed(fn, *args):
    """A compiled call returning arrays: Numba boxes them through a Python-level helper
    where a Ctrl-C would tear the call apart (SystemError, lost result); defer it."""
    with deferred_interrupts:
        return fn(*args)


class _TapeRun:
    """One tape's part of a backward call: row states, seeds, and the sinks' gradients."""

    def __init__(self, tape, npd):
        self.tape = tape
        self.npd = npd
        self.code = _DT[npd]
        self.st = np.full(tape.nrows, RECV | EXEC, np.uint8)
        self.seeds = {}
        # the gradients of rows at another dtype than the sweep's (Tensors at their own
        # dtype): the rows that feed them run in Python, and so do they
        self.py_grads = {}
        self.foreign = False  # the tape has node rows the sweep hands back for their dtype (run())
        self.out = self.where = None
        self.accumulated = set()  # leaf rows already accumulated during the sweep
        # leaves with hooks, reported as they become ready: row -> the row where its count is
        # kept (its own, or its LeafGroup's first row here), and that row -> (group, members)
        self.hooked = {}
        self.groups = {}
        self.grp = None  # hooked as an array for count_pending (-1: no hooks)
        self.fired = set()  # the rows of `hooked` counts that reached 0
        self.to_release = []      # custom Function nodes whose saved tensors go at commit
        # a thread other than the owner reads a snapshot (rows <= any seed are complete in it)
        self.snapshot = None
        self.leaves, self.ext, self.retained = tape.leaves, tape.ext, tape.retained
        if tape.owner != threading.get_ident():
            self.snapshot = self._read_columns(_copy)
            # the owner may be adding rows (and their entries) right now: this call sees
            # the rows that existed when it started, which include every row it reaches
            n = self.st.size
            self.leaves, self.ext, self.retained = ({k: v for k, v in d.copy().items() if k < n}
                                                    for d in (tape.leaves, tape.ext, tape.retained))

    def here(self, row):
        """Whether row's gradient is the sweep's (its dtype is the run's), not in py_grads."""
        return self.tape.hdr[row * HW + H_DT] & DT_MASK == self.code

    def seed(self, row, arr):
        if not self.here(row):
            self._py_add(row, F._wrap(np.asarray(arr)))
            return
        s = self.seeds.get(row)
        self.seeds[row] = arr if s is None else s + arr

    def _py_add(self, row, g):
        prev = self.py_grads.get(row)
        self.py_grads[row] = g if prev is None else prev + g
        self.st[row] |= HAS

    def find_hooked_leaves(self):
        """Fill `hooked` and `groups` with this tape's leaves that have hooks or an active
        LeafGroup (the members of a group in one tape are reported together)."""
        for row, acc in self.leaves.items():
            x = acc.variable._x
            group = x is not None and pyengine.active_group(x)
            if group:
                first = self.groups.setdefault(id(group), (group, row, []))
                first[2].append(row)
                self.hooked[row] = first[1]
            elif pyengine.leaf_has_hooks(acc):
                self.hooked[row] = row
        self.groups = {row: (group, members) for group, row, members in self.groups.values()}

    def run(self, sinks, retain):
        with verbosity.in_backward:  # what it compiles, the kernel table's line names
            return self._run(sinks, retain)

    def _run(self, sinks, retain):
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
            vals = np.concatenate(vals) if vals else np.zeros(0, self.npd)
        if tape.reshaped:
            # seeds are roots (checked against their rows) or EXT gradients, whose sizes can
            # only differ from their rows' after a .data change, which marks the tape
            self._check_seeds(rows, offs)
        sink_rows = np.fromiter(sinks, np.int64, len(sinks))
        self.where = {r: i for i, r in enumerate(sinks)}
        sched = scheduler()
        hi = max(int(rows.max()) if rows.size else -1, max(self.py_grads, default=-1))
        # the kernels read `freed` and are told to retain: freeing is the commit's job
        freed = _copy(tape.freed, np.int8, 1)
        code = _DT[self.npd]
        kt = sched.KERNELS[code]
        if not tape.needs_python() and not self.hooked and not self.foreign and not self.py_grads:
            # the whole tape in one compiled call
            while True:
                args = (*self._columns(), self.st, freed, rows, offs, vals, sink_rows, hi, True, code, kt)
                if code not in sched.KERNELS.primed:
                    self._prime(sched, code, sched.backward, args)
                status, self.row, self.out, self.offs = _boxed(sched.backward, *args)
                del args
                if status == PYNODE:  # (backward undid itself) a row without a kernel: sweep resumably
                    break
                if status != NEED_KERNEL:  # (after NEED_KERNEL, backward undid itself: call it again)
                    return status
                self._need_kernels(sched, code, kt, self.row)
        # rows that need Python: the sweep hands each back and resumes
        for row in (*tape.tensor_hooks, *tape.node_prehooks):
            self.st[row] |= PRE
            if tape.hdr[row * HW + H_OP] == OP_OUT:  # its node's row runs it if this output gets nothing
                self.st[row - tape.hdr[row * HW + H_IP]] |= PRE
        for row in tape.node_hooks:
            self.st[row] |= PYRUN
        if live_tape() is tape and (tape.needs_python() or self.hooked):
            # user code run during the sweep may record ops (a checkpoint recomputes its
            # forward): they must go to a new tape, not grow the one being swept (rows
            # handed back for their dtype run their rules under no_grad: they record nothing)
            close_current_tape()
        cols = self._columns()
        g1, gaddr, gown, self.out, self.offs = _boxed(sched.start, cols[0], self.st, rows, offs, vals, sink_rows,
                                                      cols[5])
        self.pend = np.zeros(0, np.int64)
        if self.hooked:  # leaves with hooks run when they become ready, as in PyTorch
            self.grp = np.full(self.st.size, -1, np.int64)
            self.grp[list(self.hooked)] = list(self.hooked.values())
            self.pend = _boxed(sched.count_pending, cols[0], cols[1], self.st, hi, self.grp)
        del cols
        try:
            status, row = self._sweeps(sched, code, kt, g1, gaddr, gown, freed, hi, retain)
        except BaseException:
            sched.release(gaddr, gown)  # Python abandoned the backward midway: free its buffers
            raise
        sched.finish(self._hdr(), g1, gaddr, gown, sink_rows, self.offs, self.out)
        self.row = row
        return status

    def _sweeps(self, sched, code, kt, g1, gaddr, gown, freed, hi, retain):
        """Sweep, doing what each stop hands back to Python, until the sweep is done or
        stops for good. Returns the last (status, row)."""
        while True:
            args = (*self._columns(), g1, self.st, gaddr, gown, freed, hi, True, code, self.pend, kt)
            if code not in sched.KERNELS.primed:
                self._prime(sched, code, sched.sweep, args)
            status, row = sched.sweep(*args)
            del args
            with no_grad():  # Python in a backward without create_graph records nothing
                if status == NEED_KERNEL:  # compile, then run the row
                    self._need_kernels(sched, code, kt, row)
                    hi = row
                    continue
                if status == PREHOOKS:  # hooks before the row, then the row itself
                    self._run_pre_hooks(row, g1, gaddr, gown)
                    hi = row
                    continue
                if status == PYNODE:  # the node runs in Python, then the sweep goes on below it
                    self._run_python_node(row, g1, gaddr, gown, retain)
                    self._leaves_ready_after(row, g1, gaddr, gown, decrement=True)
                elif status == LEAF_READY:  # the row made leaves with hooks ready
                    self._leaves_ready_after(row, g1, gaddr, gown, decrement=False)
                else:
                    break
            hi = row - 1
        return status, row

    def _prime(self, sched, code, fn, args):
        """The first backward at dtype `code` in this process: compile (or load) the kernels
        this tape needs before the engine, so that a first run names all it compiles in
        one line."""
        engine_cached = True if DISABLE_JIT else is_cached(fn, tuple(typeof(a) for a in args))
        self._need_kernels(sched, code, also=() if engine_cached else ("the backward engine",))
        sched.KERNELS.primed.add(code)

    def _need_kernels(self, sched, code, kt=None, row=-1, also=()):
        """Compile the kernels of every opcode this tape uses (NEED_KERNEL at `row`: its
        kernel was missing from `kt`, the table the sweep reads). The caller sweeps again,
        so that must find the kernel: if it still would not, this raises rather than let the
        caller retry forever."""
        hdr = self._hdr()
        sched.KERNELS.ensure_rows(code, hdr, self.st.size, also)  # (the rows at dtype `code`)
        op = int(hdr[row * HW + H_OP]) if row >= 0 else -1
        del hdr
        if row >= 0 and not (0 <= op < kt.size and kt[op] != 0):
            name = BY_OP[op].name if 0 <= op < len(BY_OP) else f"opcode {op}"
            raise RuntimeError(f"jitgrad: internal error: the backward kernel of {name} (row {row}, dtype code "
                               f"{code}) is still missing after compiling it; please report this")

    def _check_seeds(self, rows, offs):
        """The kernels would copy each seed into its row's buffer: sizes must agree."""
        sizes = np.diff(offs)
        numel = self._hdr()[H_NUMEL::HW][rows]
        bad = np.flatnonzero(numel != sizes)
        if bad.size:
            row = int(rows[bad[0]])
            got, want = int(sizes[bad[0]]), int(numel[bad[0]])
            del numel
            raise RuntimeError(f"Function {node_for(self.tape, row).name()} got a gradient of {got} elements, but "
                               f"its output has {want}: a tensor's .data changed size after it was used")

    def _columns(self):
        """Fresh numpy views of the tape's columns (none may outlive a call: see module doc),
        or in a thread that does not own the tape, its snapshot."""
        return self.snapshot or self._read_columns(_view)

    def _read_columns(self, how):
        tape = self.tape
        v = tape.v64 if self.npd == np.float64 else tape.v32
        return (how(tape.hdr, np.int64, HW), how(tape.edges, np.int64, EW), how(tape.xs, np.int64, 1),
                how(tape.fp, np.float64, 1), how(tape.slots, np.int64, SW), how(v, self.npd, 1))

    def _hdr(self):
        return self.snapshot[0] if self.snapshot else _view(self.tape.hdr, np.int64, HW)

    def value(self, row):
        """Gradient of sink `row`, at its shape (a view into the shared output array, or a
        private copy of one kept in Python, which is the caller's to keep)."""
        if not self.here(row):
            return np.array(self.py_grads[row]._data)
        i = self.where[row]
        shape = self.tape.shape_at(self.tape.hdr[row * HW + H_SHP])
        return self.out[self.offs[i]:self.offs[i + 1]].reshape(shape)

    def _sink_grad(self, row, g1, gaddr, gown):
        """_grad, for a sink: a larger one's gradient is complete in its slice of `out`
        already (start), so it is handed out from there without a compiled call and a
        copy (a one-element sink's is still in g1 until finish)."""
        i = self.where.get(row)
        if not self.here(row):
            return self.py_grads.get(row)
        if i is None or self.offs[i + 1] - self.offs[i] == 1 or not self.st[row] & HAS:
            return self._grad(row, g1, gaddr, gown)
        return F._wrap(self.value(row))

    def _grad(self, row, g1, gaddr, gown):
        """Row's gradient as a Tensor at its shape, or None if it got none."""
        if not self.here(row):
            return self.py_grads.get(row)
        if not self.st[row] & HAS:
            return None
        shape = self.tape.shape_at(self.tape.hdr[row * HW + H_SHP])
        return F._wrap(_boxed(scheduler().grad_of, row, self._hdr(), g1, gaddr, gown).reshape(shape))

    def _buffer(self, row, g):
        """g's data as the flat array the scheduler copies into row's gradient buffer: at
        the run's dtype and, checked here, of the row's size (hooks and Python nodes are
        validated before this; this is the last line before compiled code writes it)."""
        a = np.ascontiguousarray(g._data, dtype=self.npd).reshape(-1)
        n = self.tape.hdr[row * HW + H_NUMEL]
        if a.size != n:
            raise RuntimeError(f"Function {node_for(self.tape, row).name()} got a gradient of {a.size} elements, "
                               f"but its output has {n}")
        return a

    def _set_grad(self, row, g, g1, gaddr, gown):
        if not self.here(row):
            want = NP_OF.get(self.tape.hdr[row * HW + H_DT] & DT_MASK)
            self.py_grads[row] = g if want is None or g._data.dtype == want else F._wrap(g._data.astype(want))
            self.st[row] |= HAS
            return
        scheduler().set_grad(row, self._buffer(row, g), self._hdr(), g1, gaddr, gown, self.st)

    def _run_pre_hooks(self, row, g1, gaddr, gown):
        """The hooks of the tensor whose gradient is `row`'s, then (at a node's own row)
        the node's pre-hooks over all its outputs' gradients."""
        tape = self.tape
        # the tensor hooks of this row's output; at a multi-output node's row also those of
        # its outputs that got no gradient (their rows never stop the sweep): with None
        n_out = 1 if tape.hdr[row * HW + H_OP] == OP_OUT else _n_outputs(tape, row)
        for r in range(row, row + n_out):
            hooks = tape.tensor_hooks.get(r)
            if hooks and (r == row or not self.st[r] & HAS):
                g = self._grad(r, g1, gaddr, gown)
                seen = version_of(g)
                new = run_tensor_hooks(hooks, g)
                if written(g, new, seen):
                    self._set_grad(r, g if new is None else new, g1, gaddr, gown)
        pre = tape.node_prehooks.get(row)
        if pre:
            rows = range(row, row + _n_outputs(tape, row))
            grads = [self._grad(r, g1, gaddr, gown) for r in rows]
            seen = [version_of(g) for g in grads]
            for r, old, new, v in zip(rows, grads, run_node_prehooks(pre, grads), seen):
                if written(old, new, v):
                    self._set_grad(r, old if new is None else new, g1, gaddr, gown)
        self.st[row] &= 0xFF ^ PRE

    def _leaves_ready_after(self, row, g1, gaddr, gown, decrement):
        """Accumulate (with their hooks) the leaves, or LeafGroups, that `row` was the last
        to feed. decrement: row ran in Python, so its edges' counts are taken off here."""
        tape, pend = self.tape, self.pend
        e0 = tape.hdr[row * HW + H_E0]
        for j in range(tape.hdr[row * HW + H_NIN]):
            t = tape.edges[EW * (e0 + j) + E_TGT]
            # grp is -1 for every row without leaf hooks (an intermediate, a leaf with none):
            # only the hooked leaves are this method's to accumulate
            if t < 0 or not pend.size or self.grp[t] < 0:
                continue
            c = self.grp[t]  # where t's count is kept
            if c in self.fired:
                continue
            if decrement:
                if pend[c] <= 0:
                    continue
                pend[c] -= 1
            if pend[c] == 0:
                self._accumulate_ready(c, g1, gaddr, gown)

    def _accumulate_ready(self, c, g1, gaddr, gown):
        """Leaf row c, or the LeafGroup counted at c, is ready: accumulate with hooks."""
        self.fired.add(c)
        group, members = self.groups.get(c, (None, (c,)))
        done = []
        for t in members:
            if t in self.accumulated or group is not None and not self.st[t] & HAS:
                continue  # a group's member that this tape gave nothing
            acc = self.leaves[t]
            g = pyengine.leaf_pre(acc, self._sink_grad(t, g1, gaddr, gown))
            pyengine.accumulate_grad(acc.variable, g, False, owned=True)
            pyengine.leaf_post(acc, g, group=False)
            self.accumulated.add(t)
            done.append(acc.variable)
        if group is not None and done:
            group.fn(done)

    def _run_python_node(self, row, g1, gaddr, gown, retain):
        """Run a node in Python: a custom Function's backward, or a node with post-hooks
        through its Tensor-level rule. Its outputs' gradients in, its inputs' out."""
        tape = self.tape
        st = self.st
        node = node_for(tape, row)
        rows = range(row, row + _n_outputs(tape, row))
        grads = [self._grad(r, g1, gaddr, gown) for r in rows]
        for r in rows:
            st[r] |= DONE
        if isinstance(node, FunctionNode):
            if node._released:
                raise _freed_error()
            result = node.run_backward(grads, False)
            if not retain:
                self.to_release.append(node)
        else:
            with no_grad():
                result = input_grads(node, grads[0])
        post = tape.node_hooks.get(row)
        if post:
            result = run_node_posthooks(post, result, grads)
        stats.handed_back(self._why_python(row, node))
        e0 = tape.hdr[row * HW + H_E0]
        for j, g in enumerate(result):
            t = tape.edges[EW * (e0 + j) + E_TGT]
            if g is None or t < 0 or not st[t] & RECV:
                continue
            # cast at the edge into a row of another dtype, as PyTorch's validate_outputs
            code = tape.hdr[t * HW + H_DT] & DT_MASK
            g = validate_gradient(node.name(), j, g, tape.shape_at(tape.edges[EW * (e0 + j) + E_SHP]),
                                  NP_OF.get(code, g._data.dtype))
            if code == self.code:
                scheduler().contribute(t, self._buffer(t, g), self._hdr(), g1, gaddr, gown, st)
            else:
                self._py_add(t, g)

    def _why_python(self, row, node):
        """Why the sweep handed `row` back (engine_stats' "rows_in_python" keys)."""
        code = self.tape.hdr[row * HW + H_DT]
        if isinstance(node, FunctionNode):
            return "custom Function"
        if row in self.tape.node_hooks:
            return "node post-hook"
        if code & DT_PY:
            return "mixes dtypes or devices, or hooks packed its saved values"
        if code != self.code:
            return "another dtype than the sweep's"
        return "no compiled kernel"


def _n_outputs(tape, row):
    node = tape.py_nodes.get(row)
    return 1 if node is None else len(node._out_meta)


def _tapes_from(roots):
    seen = {}
    stack = [r.tape for r in roots]
    while stack:
        t = stack.pop()
        if t.id in seen:
            continue
        seen[t.id] = t
        stack.extend(ft for ft, _ in t.ext.values())
    return sorted(seen.values(), key=lambda t: t.id)


def requested(tapes, runs, targets, mark_need):
    """For grad(inputs=...): ({key of each requested tensor}, [the requested non-leaves]),
    with each tape's rows on a path to one of them marked RECV by mark_need(tape, run);
    (None, []) for backward(), which sweeps everything. Shared by the CPU and CUDA drivers."""
    if targets is None:
        return None, []
    want = {tg.key for tg in targets}
    inner = [tg for tg in targets if not isinstance(tg.node, AccumulateGrad)]
    for t in tapes:  # oldest first: EXT rows read their foreign tape's decision
        r = runs[t.id]
        r.st[:] = 0
        for tg in inner:
            if tg.tape is t:
                r.st[tg.row] |= RECV
        for row, acc in r.leaves.items():
            if (id(acc), 0) in want:
                r.st[row] |= RECV
        for row, (ft, frow) in r.ext.items():
            if runs[ft.id].st[frow] & RECV:
                r.st[row] |= RECV
        mark_need(t, r)
    return want, inner


def _mark_need(tape, r):
    cols = r._columns()
    scheduler().mark_need(cols[0], cols[1], r.st.size, r.st)


def run(roots, grads, targets, retain, tapes=None):
    """roots, targets: autograd._engine.Target of the outputs and of the requested inputs;
    tapes: _tapes_from(roots), whose locks the caller holds.
    Returns ({target key: grad array}, [(AccumulateGrad, grad array)], [(retaining tensor,
    grad array)], _Commit), or a Fallback. With targets, leaves are captured, not accumulated.

    Each tape is swept at its most common float dtype; its rows at another dtype, and those
    that mix dtypes, are handed back one by one (their gradients kept in Python at their
    own dtype), so a float64 row beside float32 ones costs that row, not the call."""
    if tapes is None:
        tapes = _tapes_from(roots)
    # decided before any tape is swept: a run abandoned halfway would already have run
    # hooks and freed the saved values of the tapes swept before
    if any(t.cuda for t in tapes):
        return Fallback("the graph spans the CPU and a CUDA device")
    runs = {}
    for t in tapes:
        code, foreign = sweep_dtype(t, grads[0]._data.dtype)
        r = runs[t.id] = _TapeRun(t, NP_OF[code])
        r.foreign = foreign
    want, inner = requested(tapes, runs, targets, _mark_need)
    for t in tapes:
        r = runs[t.id]
        if t.reshaped:
            if _retyped(r):
                return Fallback("a recorded tensor's .data changed dtype")
            check_edge_shapes(r)
            if _leaf_resized(t):
                # torch's saved leaf is the tensor itself, so its rules see the new .data:
                # the Python engine reads leaves that way, the kernels read what was saved
                return Fallback("a leaf's .data changed shape after it was used")
    for i, (tg, g) in enumerate(zip(roots, grads)):
        shape = tg.tape.shape_at(tg.tape.hdr[tg.row * HW + H_SHP])
        if g._data.shape != shape:  # the output's .data changed shape after it was recorded
            raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of {torch_size(g._data.shape)} "
                               f"and output[{i}] has a shape of {torch_size(shape)}.")
        runs[tg.tape.id].seed(tg.row, g._data)
    captured = {}
    leaves = []
    retained = []
    commit = _Commit()
    for t in reversed(tapes):
        r = runs[t.id]
        if not r.seeds and not r.py_grads:
            continue
        inputs_here = [tg.row for tg in inner if tg.tape is t]
        # each row once: a leaf can also be a requested input
        sinks = list(dict.fromkeys([*r.leaves, *r.ext, *r.retained, *inputs_here]))
        if want is None and leaf_hooks[0]:
            r.find_hooked_leaves()
        status = r.run(sinks, retain)
        if status == FREED:
            raise pyengine.freed_or_modified(t, r.row)
        st = r.st
        for lrow, acc in r.leaves.items():
            if st[lrow] & HAS and lrow not in r.accumulated:
                if want is None:
                    leaves.append((acc, r.value(lrow)))
                elif (id(acc), 0) in want:
                    # a leaf used in several tapes has a sink row in each: the parts add up
                    prev = captured.get((id(acc), 0))
                    captured[id(acc), 0] = r.value(lrow) if prev is None else prev + r.value(lrow)
        for erow, (ft, frow) in r.ext.items():
            if st[erow] & HAS:
                runs[ft.id].seed(frow, r.value(erow))
        for rrow, ref in r.retained.items():
            tensor = ref()
            if tensor is not None and st[rrow] & HAS:
                retained.append((tensor, r.value(rrow)))
        for tg in inner:
            if tg.tape is t and st[tg.row] & HAS:
                captured[tg.key] = r.value(tg.row)
        if not retain:
            commit.runs.append(r)
    return captured, leaves, retained, commit


_is_sink = [np.zeros(0, bool)]


def _sinks():
    """Per opcode: a sink row (leaf, edge into another tape, a node run in Python). Read
    once: another thread may replace it (with an equal array) meanwhile."""
    is_sink = _is_sink[0]
    if len(is_sink) != len(SPECS):
        is_sink = _is_sink[0] = np.array([s.kind == "sink" for s in SPECS], bool)
    return is_sink


def dtype_counts(tape, hdr=None):
    """{dtype code: how many node rows (not sinks) of `tape` have it}. Each row is scanned
    once in the tape's life (under its lock; tape.run_in_python keeps the counts true).
    hdr: the header to read, when the caller has a snapshot."""
    n, end = tape.dt_scanned, tape.nrows if hdr is None else len(hdr) // HW
    if n < end:
        if hdr is None:
            hdr = _view(tape.hdr, np.int64, HW)
        dts = hdr[n * HW + H_DT:end * HW:HW]
        ops = hdr[n * HW + H_OP:end * HW:HW]
        found = np.bincount(dts[~_sinks()[ops]], minlength=1)
        counts = tape.dt_count
        for d in np.flatnonzero(found).tolist():
            counts[d] = counts.get(d, 0) + int(found[d])
        tape.dt_scanned = end
        del hdr, dts, ops
    return tape.dt_count


def sweep_dtype(tape, root_dtype):
    """(code, foreign): the float dtype code a sweep of `tape` runs at (its most common
    among node rows; the root's for a tape of sinks only), and whether some node rows have
    another code and so are handed back."""
    mine = tape.owner == threading.get_ident()  # another thread reads a copy (see _TapeRun)
    counts = dtype_counts(tape, None if mine else _copy(tape.hdr, np.int64, HW))
    n64, n32 = counts.get(DT_F64, 0), counts.get(DT_F32, 0)
    code = DT_F32 if n32 > n64 else DT_F64 if n64 else _DT.get(root_dtype, DT_F64)
    return code, sum(counts.values()) > counts.get(code, 0)


def _runs_at(r, code):
    """Whether every node row of run r's tape runs at dtype `code` (the paths that keep one
    dtype per call: the CUDA sweep, the batched one)."""
    counts = dtype_counts(r.tape, r._hdr())
    return sum(counts.values()) == counts.get(code, 0)


def check_edge_shapes(r):
    """After `.data` gave a recorded tensor another shape or dtype, ops recorded since read
    it at the new one, but its row (and so its gradient buffer) has the old: PyTorch's
    error, before the kernels would write one size into a buffer of another."""
    tape = r.tape
    cols = r._columns()
    hdr = cols[0].reshape(-1, HW)
    edges = cols[1].reshape(-1, EW)
    del cols
    target = edges[:, E_TGT]
    # shapes are interned per tape, so equal shapes have equal pointers
    bad = np.flatnonzero((target >= 0) & (edges[:, E_SHP] != hdr[np.maximum(target, 0), H_SHP]))
    if bad.size:
        e = int(bad[0])
        row = int(np.searchsorted(hdr[:, H_E0], e, side="right")) - 1
        while hdr[row, H_NIN] == 0:  # sinks own no edges but share the next row's start
            row -= 1
        j, got, want = e - int(hdr[row, H_E0]), int(edges[e, E_SHP]), int(hdr[target[e], H_SHP])
        del hdr, edges, target  # views of the tape's columns must not live on in the traceback
        raise RuntimeError(f"Function {node_for(tape, row).name()} returned an invalid gradient at index {j} - got "
                           f"{size_str(tape.shape_at(got))} but expected shape compatible with "
                           f"{size_str(tape.shape_at(want))}")


def _retyped(r):
    """After `.data` gave a recorded tensor another dtype, rows recorded since have the new
    one but read the tensor's old row: a gradient would cross dtypes on an edge whose row
    is not marked DT_PY, which only the Python engine handles."""
    tape = r.tape
    return r.foreign or any(tape.hdr[row * HW + H_DT] != r.code for row in (*r.leaves, *r.ext))


def _leaf_resized(tape):
    return any(acc.variable._data.shape != tape.shape_at(tape.hdr[row * HW + H_SHP])
               for row, acc in tape.leaves.items())


class _Commit:
    """What a backward without retain_graph frees, applied by the engine (apply) in the
    same uninterruptible block as the .grad updates: until then the graph is intact."""
    __slots__ = ("runs",)

    def __init__(self):
        self.runs = []

    def apply(self):
        for r in self.runs:
            _release(r.tape, r)


def _release(tape, r):
    """Free saved values of the rows that ran. When every recorded node of the tape has
    run, drop them all at once; only the owner does, as it alone may be saving onto it."""
    done = (r.st & DONE) != 0
    tape.mark_freed(done)
    for node in r.to_release:
        node._release()
    ran = int(np.count_nonzero(done))
    if ran + len(tape.leaves) + len(tape.ext) >= tape.nrows and tape.owner == threading.get_ident():
        tape.release_saved()


def run_batched(roots, batched, targets, tapes):
    """grad(..., is_grads_batched=True) on the compiled path: the call's set-up (row
    states, sinks, checks) is done once, then the tape is swept once per batch row with
    that row's seeds, each sweep one compiled call. Only for a graph on one tape that
    needs no Python during the sweep and no leaf hooks; otherwise FALLBACK (the caller
    loops over grad()). Returns ({target key: (n, *shape) array}, the run) with the graph
    kept: the caller frees it (release(run)) when the call does not retain it."""
    npd = batched[0]._data.dtype
    if len(tapes) != 1 or npd not in _DT or any(g._data.dtype != npd for g in batched):
        return FALLBACK
    tape = tapes[0]
    if tape.needs_python() or tape.reshaped or leaf_hooks[0]:
        return FALLBACK
    r = _TapeRun(tape, npd)
    if not _runs_at(r, _DT[npd]):
        return FALLBACK
    want = {tg.key for tg in targets}
    inner = [tg for tg in targets if not isinstance(tg.node, AccumulateGrad)]
    r.st[:] = 0
    for tg in inner:
        r.st[tg.row] |= RECV
    for row, acc in r.leaves.items():
        if (id(acc), 0) in want:
            r.st[row] |= RECV
    cols = r._columns()
    scheduler().mark_need(cols[0], cols[1], r.st.size, r.st)
    del cols
    start = r.st.copy()
    for i, (tg, g) in enumerate(zip(roots, batched)):
        shape = tape.shape_at(tape.hdr[tg.row * HW + H_SHP])
        if g._data.shape[1:] != shape:  # the output's .data changed shape after it was recorded
            raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of "
                               f"{torch_size(g._data.shape[1:])} and output[{i}] has a shape of "
                               f"{torch_size(shape)}.")
    # where each target's gradient is read: its own row, or its leaf's sink row
    rows = {tg.key: tg.row for tg in inner}
    rows.update({(id(acc), 0): row for row, acc in r.leaves.items() if (id(acc), 0) in want})
    sinks = list(dict.fromkeys([*r.leaves, *r.retained, *(tg.row for tg in inner)]))
    n = batched[0]._data.shape[0]
    out = {}
    for b in range(n):
        r.st[:] = start
        r.seeds = {}
        for tg, g in zip(roots, batched):
            r.seed(tg.row, g._data[b])
        status = r.run(sinks, True)
        if status == FREED:
            raise pyengine.freed_or_modified(tape, r.row)
        for key, row in rows.items():
            if r.st[row] & HAS:
                if key not in out:
                    out[key] = np.zeros((n,) + tape.shape_at(tape.hdr[row * HW + H_SHP]), npd)
                out[key][b] = r.value(row)
    return out, r


def release(r):
    """Free what run r's sweeps ran (a batched call that does not retain the graph)."""
    _release(r.tape, r)
