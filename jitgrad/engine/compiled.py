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
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.hooks import leaf_hooks
from jitgrad.graph.node import AccumulateGrad, node_for
from jitgrad.graph.pynode import FunctionNode, validate_gradient
from jitgrad.graph.record import OP_OUT, OP_PYFN
from jitgrad.graph.spec import BY_OP, REGISTRY, SPECS
from jitgrad.graph.tape import close_current_tape, live_tape
from jitgrad.kernels._cache import is_cached
from jitgrad.ops import functional as F


class Fallback:
    """run()'s answer when the call needs the Python engine, with the reason (engine/stats.py)."""
    __slots__ = ("reason",)

    def __init__(self, reason):
        self.reason = reason


FALLBACK = Fallback("the graph needs the Python engine")  # run_batched's answer

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


class _Grads:
    """The compiled gradient state of one float dtype in a tape's backward call: its seeds
    and sinks, the one-element arena g1, the buffers (gaddr, gown: see engine/scheduler.py)
    and the sinks' output array. A tape whose rows have two float dtypes has two, and the
    sweep alternates between them (_TapeRun._sweeps)."""
    __slots__ = ("code", "npd", "kt", "seeds", "sinks", "where", "g1", "gaddr", "gown", "out", "offs")

    def __init__(self, code, kt):
        self.code = code
        self.npd = NP_OF[code]
        self.kt = kt  # the kernel table the sweep reads at this dtype
        self.seeds = {}
        self.sinks = np.zeros(0, np.int64)
        self.where = {}  # sink row -> its index in sinks
        self.g1 = self.gaddr = self.gown = self.out = self.offs = None

    def seed_arrays(self):
        """(rows, offsets, values) of the seeds, as the scheduler's start takes them."""
        rows = np.fromiter(self.seeds, np.int64, len(self.seeds))
        vals = [np.asarray(a, self.npd).reshape(-1) for a in self.seeds.values()]
        if len(vals) == 1:  # the usual single root
            return rows, np.array((0, vals[0].size), np.int64), vals[0]
        offs = np.zeros(len(vals) + 1, np.int64)
        np.cumsum([a.size for a in vals], out=offs[1:])
        return rows, offs, np.concatenate(vals) if vals else np.zeros(0, self.npd)

    def set_sinks(self, sinks):
        """sinks: an int64 array of rows."""
        self.sinks = sinks
        self.where = {r: i for i, r in enumerate(sinks.tolist())}


class _TapeRun:
    """One tape's part of a backward call: row states, seeds, and the sinks' gradients.

    The tape is swept at `code`, its most common float dtype. Rows of the other float
    dtype are swept too, by the same compiled sweep at theirs: when it reaches one, the
    driver goes on with the other dtype's gradient state from that row, and back (a switch
    costs a compiled call; edges between the two only leave rows marked DT_PY, which run in
    Python and cast at the edge). The gradients of rows of any other dtype are Tensors in
    py_grads, and those rows run in Python."""

    def __init__(self, tape, code):
        self.tape = tape
        self.code = code
        self.st = np.full(tape.nrows, RECV | EXEC, np.uint8)
        self.grads = {code: _Grads(code, scheduler().KERNELS[code])}  # float dtype code -> its state
        self.py_grads = {}
        self.foreign = False  # the tape has node rows at another dtype than `code` (set by run())
        self.accumulated = set()  # leaf rows already accumulated during the sweep
        # leaves with hooks, reported as they become ready: row -> the row where its count is
        # kept (its own, or its LeafGroup's first row here), and that row -> (group, members)
        self.hooked = {}
        self.groups = {}
        self.grp = None  # hooked as an array for count_pending (-1: no hooks)
        self.fired = set()  # the rows of `hooked` counts that reached 0
        self.to_release = []      # custom Function nodes whose saved tensors go at commit
        self.row = -1
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

    # -- where a row's gradient is ----------------------------------------------------------
    def _state_of(self, row, make=False):
        """The compiled state holding row's gradient, or None: then it is in py_grads.
        make: create the state of row's float dtype (before the sweep starts only)."""
        code = self.tape.hdr[row * HW + H_DT] & DT_MASK
        s = self.grads.get(code)
        if s is None and make and code in NP_OF:
            s = self.grads[code] = _Grads(code, scheduler().KERNELS[code])
        return s

    def seed(self, row, arr):
        s = self._state_of(row, make=True)
        if s is None:
            self._py_add(row, F._wrap(np.asarray(arr)))
            return
        prev = s.seeds.get(row)
        s.seeds[row] = arr if prev is None else prev + arr

    def reseed(self):
        """Forget the seeds and what Python held (run_batched sweeps once per seed)."""
        for s in self.grads.values():
            s.seeds = {}
        self.py_grads = {}

    def seeded(self):
        return bool(self.py_grads) or any(s.seeds for s in self.grads.values())

    def _py_add(self, row, g):
        prev = self.py_grads.get(row)
        self.py_grads[row] = g if prev is None else prev + g
        self.st[row] |= HAS

    def _contribute(self, row, g):
        """Add g (validated, at row's dtype) to row's gradient: a Python node's output."""
        s = self._state_of(row)
        if s is None:
            self._py_add(row, g)
        else:
            scheduler().contribute(row, self._buffer(row, g, s), self._hdr(), s.g1, s.gaddr, s.gown, self.st)

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
        sink_rows = np.fromiter(sinks, np.int64, len(sinks))
        hdr = self._hdr()
        codes = hdr[sink_rows * HW + H_DT] & DT_MASK  # (a wide graph has 1e4s of sinks: no Python loop)
        del hdr
        mixed = self.foreign or bool(codes.size) and not (codes == self.code).all()
        if mixed:  # rows of the other float dtype may get gradient (from Python nodes, or as sinks)
            for code in NP_OF:
                if code not in self.grads:
                    self.grads[code] = _Grads(code, scheduler().KERNELS[code])
        states = sorted(self.grads.values(), key=lambda s: s.code != self.code)  # this run's dtype first
        for s in states:
            s.set_sinks(sink_rows[codes == s.code] if mixed else sink_rows)
        seeded = [s.seed_arrays() for s in states]
        if tape.reshaped:
            # seeds are roots (checked against their rows) or EXT gradients, whose sizes can
            # only differ from their rows' after a .data change, which marks the tape
            for rows, offs, _ in seeded:
                self._check_seeds(rows, offs)
        sched = scheduler()
        hi = max(max((int(rows.max()) for rows, _, _ in seeded if rows.size), default=-1),
                 max(self.py_grads, default=-1))
        # the kernels read `freed` and are told to retain: freeing is the commit's job
        freed = _copy(tape.freed, np.int8, 1)
        if len(states) == 1 and not tape.needs_python() and not self.hooked and not self.foreign \
                and not self.py_grads:
            # the whole tape in one compiled call
            s = states[0]
            rows, offs, vals = seeded[0]
            while True:
                cols = self._columns()
                args = (*cols[:5], self._v(cols, s), self.st, freed, rows, offs, vals, s.sinks, hi, True, s.code,
                        s.kt)
                del cols
                if s.code not in sched.KERNELS.primed:
                    self._prime(sched, s.code, sched.backward, args)
                status, self.row, s.out, s.offs = _boxed(sched.backward, *args)
                del args
                if status == PYNODE:  # (backward undid itself) a row without a kernel: sweep resumably
                    break
                if status != NEED_KERNEL:  # (after NEED_KERNEL, backward undid itself: call it again)
                    return status
                self._need_kernels(sched, s.code, s.kt, self.row)
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
        started = []
        try:
            for s, (rows, offs, vals) in zip(states, seeded):
                s.g1, s.gaddr, s.gown, s.out, s.offs = _boxed(sched.start, cols[0], self.st, rows, offs, vals,
                                                              s.sinks, self._v(cols, s))
                started.append(s)
            self.pend = np.zeros(0, np.int64)
            if self.hooked:  # leaves with hooks run when they become ready, as in PyTorch
                self.grp = np.full(self.st.size, -1, np.int64)
                self.grp[list(self.hooked)] = list(self.hooked.values())
                self.pend = _boxed(sched.count_pending, cols[0], cols[1], self.st, hi, self.grp)
            del cols
            status, row = self._sweeps(sched, states[0], freed, hi, retain)
        except BaseException:
            for s in started:  # Python abandoned the backward midway: free its buffers
                sched.release(s.gaddr, s.gown)
            raise
        for s in states:
            sched.finish(self._hdr(), s.g1, s.gaddr, s.gown, s.sinks, s.offs, s.out)
        self.row = row
        return status

    def _sweeps(self, sched, cur, freed, hi, retain):
        """Sweep, doing what each stop hands back to Python, until the sweep is done or
        stops for good. Returns the last (status, row)."""
        while True:
            cols = self._columns()
            args = (*cols[:5], self._v(cols, cur), cur.g1, self.st, cur.gaddr, cur.gown, freed, hi, True, cur.code,
                    self.pend, cur.kt)
            del cols
            if cur.code not in sched.KERNELS.primed:
                self._prime(sched, cur.code, sched.sweep, args)
            status, row = sched.sweep(*args)
            del args
            with no_grad():  # Python in a backward without create_graph records nothing
                if status == NEED_KERNEL:  # compile, then run the row
                    self._need_kernels(sched, cur.code, cur.kt, row)
                    hi = row
                    continue
                if status == PREHOOKS:  # hooks before the row, then the row itself
                    self._run_pre_hooks(row)
                    hi = row
                    continue
                if status == PYNODE:
                    other = self._switch(row, cur)
                    if other is not None:  # a row of the other float dtype: sweep on at that one
                        cur = other
                        hi = row
                        continue
                    # the node runs in Python, then the sweep goes on below it
                    self._run_python_node(row, retain)
                    self._leaves_ready_after(row, decrement=True)
                elif status == LEAF_READY:  # the row made leaves with hooks ready
                    self._leaves_ready_after(row, decrement=False)
                else:
                    break
            hi = row - 1
        return status, row

    def _switch(self, row, cur):
        """The state to sweep `row` with when the sweep at cur's dtype handed it back for
        its dtype alone (not a Python node, a hooked one, nor one that mixes dtypes)."""
        tape = self.tape
        code = tape.hdr[row * HW + H_DT]
        if code == cur.code or tape.hdr[row * HW + H_OP] == OP_PYFN or self.st[row] & PYRUN:
            return None
        return self.grads.get(code)

    def _prime(self, sched, code, fn, args):
        """The first backward at dtype `code` in this process: compile (or load) the kernels
        this tape needs before the engine, so that a first run names all it compiles in
        one line."""
        engine_cached = True if DISABLE_JIT else is_cached(fn, tuple(typeof(a) for a in args))
        self._need_kernels(sched, code, also=() if engine_cached else ("the backward engine",))
        sched.KERNELS.primed.add(code)

    def _need_kernels(self, sched, code, kt=None, row=-1, also=()):
        """Compile the kernels of every opcode this tape's rows at `code` use (NEED_KERNEL at
        `row`: its kernel was missing from `kt`, the table the sweep reads). The caller
        sweeps again, so that must find the kernel: if it still would not, this raises
        rather than let the caller retry forever."""
        hdr = self._hdr()
        sched.KERNELS.ensure_rows(code, hdr, self.st.size, also)
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
        or in a thread that does not own the tape, its snapshot: (hdr, edges, xs, fp, slots,
        v64, v32)."""
        return self.snapshot or self._read_columns(_view)

    @staticmethod
    def _v(cols, s):
        """The value column state s's kernels read."""
        return cols[5] if s.code == DT_F64 else cols[6]

    def _read_columns(self, how):
        tape = self.tape
        return (how(tape.hdr, np.int64, HW), how(tape.edges, np.int64, EW), how(tape.xs, np.int64, 1),
                how(tape.fp, np.float64, 1), how(tape.slots, np.int64, SW), how(tape.v64, np.float64, 1),
                how(tape.v32, np.float32, 1))

    def _hdr(self):
        return self.snapshot[0] if self.snapshot else _view(self.tape.hdr, np.int64, HW)

    def value(self, row):
        """Gradient of sink `row`, at its shape (a view into the shared output array, or a
        private copy of one kept in Python, which is the caller's to keep)."""
        s = self._state_of(row)
        if s is None:
            d = self.py_grads[row]._data
            return d.copy() if type(d) is DeviceArray else np.array(d)  # (a CUDA leaf of a CPU graph)
        i = s.where[row]
        shape = self.tape.shape_at(self.tape.hdr[row * HW + H_SHP])
        return s.out[s.offs[i]:s.offs[i + 1]].reshape(shape)

    def _sink_grad(self, row):
        """_grad, for a sink: a larger one's gradient is complete in its slice of `out`
        already (start), so it is handed out from there without a compiled call and a
        copy (a one-element sink's is still in g1 until finish)."""
        s = self._state_of(row)
        if s is None:
            return self.py_grads.get(row)
        i = s.where.get(row)
        if i is None or s.offs[i + 1] - s.offs[i] == 1 or not self.st[row] & HAS:
            return self._grad(row)
        return F._wrap(self.value(row))

    def _grad(self, row):
        """Row's gradient as a Tensor at its shape, or None if it got none."""
        s = self._state_of(row)
        if s is None:
            return self.py_grads.get(row)
        if not self.st[row] & HAS:
            return None
        shape = self.tape.shape_at(self.tape.hdr[row * HW + H_SHP])
        return F._wrap(_boxed(scheduler().grad_of, row, self._hdr(), s.g1, s.gaddr, s.gown).reshape(shape))

    def _buffer(self, row, g, s):
        """g's data as the flat array the scheduler copies into row's gradient buffer: at
        state s's dtype and, checked here, of the row's size (hooks and Python nodes are
        validated before this; this is the last line before compiled code writes it)."""
        a = np.ascontiguousarray(g._data, dtype=s.npd).reshape(-1)
        n = self.tape.hdr[row * HW + H_NUMEL]
        if a.size != n:
            raise RuntimeError(f"Function {node_for(self.tape, row).name()} got a gradient of {a.size} elements, "
                               f"but its output has {n}")
        return a

    def _set_grad(self, row, g):
        s = self._state_of(row)
        if s is None:
            want = NP_OF.get(self.tape.hdr[row * HW + H_DT] & DT_MASK)
            self.py_grads[row] = g if want is None or g._data.dtype == want else F._wrap(g._data.astype(want))
            self.st[row] |= HAS
            return
        scheduler().set_grad(row, self._buffer(row, g, s), self._hdr(), s.g1, s.gaddr, s.gown, self.st)

    def _run_pre_hooks(self, row):
        """The hooks of the tensor whose gradient is `row`'s, then (at a node's own row)
        the node's pre-hooks over all its outputs' gradients."""
        tape = self.tape
        # the tensor hooks of this row's output; at a multi-output node's row also those of
        # its outputs that got no gradient (their rows never stop the sweep): with None
        n_out = 1 if tape.hdr[row * HW + H_OP] == OP_OUT else _n_outputs(tape, row)
        for r in range(row, row + n_out):
            hooks = tape.tensor_hooks.get(r)
            if hooks and (r == row or not self.st[r] & HAS):
                g = self._grad(r)
                seen = version_of(g)
                new = run_tensor_hooks(hooks, g)
                if written(g, new, seen):
                    self._set_grad(r, g if new is None else new)
        pre = tape.node_prehooks.get(row)
        if pre:
            rows = range(row, row + _n_outputs(tape, row))
            grads = [self._grad(r) for r in rows]
            seen = [version_of(g) for g in grads]
            for r, old, new, v in zip(rows, grads, run_node_prehooks(pre, grads), seen):
                if written(old, new, v):
                    self._set_grad(r, old if new is None else new)
        self.st[row] &= 0xFF ^ PRE

    def _leaves_ready_after(self, row, decrement):
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
                self._accumulate_ready(c)

    def _accumulate_ready(self, c):
        """Leaf row c, or the LeafGroup counted at c, is ready: accumulate with hooks."""
        self.fired.add(c)
        group, members = self.groups.get(c, (None, (c,)))
        done = []
        for t in members:
            if t in self.accumulated or group is not None and not self.st[t] & HAS:
                continue  # a group's member that this tape gave nothing
            acc = self.leaves[t]
            g = pyengine.leaf_pre(acc, self._sink_grad(t))
            pyengine.accumulate_grad(acc.variable, g, False, owned=True)
            pyengine.leaf_post(acc, g, group=False)
            self.accumulated.add(t)
            done.append(acc.variable)
        if group is not None and done:
            group.fn(done)

    def _run_python_node(self, row, retain):
        """Run a node in Python: a custom Function's backward, or a node with post-hooks
        through its Tensor-level rule. Its outputs' gradients in, its inputs' out."""
        if self._cast(row):
            return
        tape = self.tape
        st = self.st
        node = node_for(tape, row)
        rows = range(row, row + _n_outputs(tape, row))
        grads = [self._grad(r) for r in rows]
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
            self._contribute(t, g)

    def _cast(self, row):
        """Run `row` if it is a cast between the two float dtypes (x.float(), y.double()), the
        rows the dtypes' gradients cross by: its gradient, cast to its input's dtype, goes
        from one state to the other in a compiled read and a compiled add (its Tensor-level
        rule does the same at several times the cost). False for any other row."""
        tape = self.tape
        hdr = tape.hdr
        if hdr[row * HW + H_OP] != REGISTRY["to_copy"].op or row in tape.node_hooks:
            return False
        t = tape.edges[EW * hdr[row * HW + H_E0] + E_TGT]
        s, ts = self._state_of(row), self._state_of(t) if t >= 0 else None
        if s is None or ts is None:  # a non-float side (or none): the rule does it
            return False
        self.st[row] |= DONE
        stats.handed_back("a cast between float dtypes")
        if self.st[t] & RECV:
            sched, h = scheduler(), self._hdr()
            g = _boxed(sched.grad_of, row, h, s.g1, s.gaddr, s.gown)
            sched.contribute(t, g.astype(ts.npd), h, ts.g1, ts.gaddr, ts.gown, self.st)
        return True

    def _why_python(self, row, node):
        """Why the sweep handed `row` back (engine_stats' "rows_in_python" keys)."""
        code = self.tape.hdr[row * HW + H_DT]
        if isinstance(node, FunctionNode):
            return "custom Function"
        if row in self.tape.node_hooks:
            return "node post-hook"
        if code & DT_PY:
            return "mixes dtypes or devices, or hooks packed its saved values"
        if code not in self.grads:
            return "a dtype without compiled kernels"
        return "an op without a compiled kernel"


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
        r = runs[t.id] = _TapeRun(t, code)
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
        if not r.seeded():
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
    r = _TapeRun(tape, _DT[npd])
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
        r.reseed()
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
