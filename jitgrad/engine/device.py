"""Runs backward on CUDA tapes with the device sweep: engine/compiled.py's twin for the GPU.

The sweep itself is one persistent kernel per tape (gpu/sweep.py documents the design
and its costs); this driver does the per-call and per-hand-back work in Python, never
per node: decide that the call can run on the device (every row of its tapes at one
CUDA dtype code), mirror the tapes, seed the roots, launch, and run in Python what the
kernel hands back (PYNODE: a row's Tensor-level rule on the device, a custom Function,
post-hooks; PREHOOKS: tensor and node pre-hooks), then relaunch below that row.

Hooks on leaves run after the sweep, with the accumulations (engine/run.py), where the
CPU sweep stops at each leaf as it becomes ready (LEAF_READY): the gradients and the
hooks' results are the same, only their order relative to other nodes' hooks differs.

What it returns, and when the graph is freed, is compiled.run's contract: the sinks'
gradients (views of one device array), and a commit the engine applies with the .grad
updates. Anything it does not take (create_graph, anomaly mode, mixed dtypes or
devices, a .data resized after recording) is FALLBACK: the Python engine runs the call
with the same rules on the same device.

numba.cuda is loaded with the first CUDA backward (gpu/sweep.py and the module generated
from the op table by gpu/sweep_codegen.py), never at `import jitgrad`.
"""
import importlib
import sys
import threading

import numpy as np

from jitgrad._core.layout import (
    CUDA_DT_OF,
    DONE,
    E_SHP,
    E_TGT,
    EW,
    EXEC,
    H_E0,
    H_IP,
    H_NIN,
    H_NUMEL,
    H_OP,
    HAS,
    HW,
    PRE,
    PREHOOKS,
    PYNODE,
    PYRUN,
    RECV,
)
from jitgrad._core.layout import FREED as ROW_FREED
from jitgrad._core.messages import freed_error as _freed_error
from jitgrad._core.messages import torch_size
from jitgrad._core.modes import no_grad
from jitgrad.engine import codegen
from jitgrad.engine import compiled as _compiled
from jitgrad.engine import executor as pyengine
from jitgrad.engine.hooks import run_node_posthooks, run_node_prehooks, run_tensor_hooks, version_of, written
from jitgrad.gpu import driver
from jitgrad.gpu.array import DeviceArray, assign
from jitgrad.graph.node import node_for
from jitgrad.graph.pynode import FunctionNode, validate_gradient
from jitgrad.graph.spec import BY_OP, OP_OUT
from jitgrad.graph.tape import close_current_tape, live_tape
from jitgrad.ops import functional as F

# structural ops the kernel runs itself, by their base op's name (the rest hand back)
_KERNEL_KINDS = {"view": "K_VIEW", "expand": "K_EXPAND", "permute": "K_PERMUTE", "sum": "K_SUM", "cat": "K_CAT"}

_loaded = []   # [len(BY_OP) when generated, the generated module]
_lock = threading.Lock()


def host():
    """jitgrad.gpu.sweep: the sweep's host side (importing it loads numba.cuda)."""
    driver.require()
    return importlib.import_module("jitgrad.gpu.sweep")


def module():
    """The device sweep compiled for the op table as it is now (regenerated when an op is
    declared after the first CUDA backward, as engine/compiled.scheduler)."""
    with _lock:
        if not _loaded or _loaded[0] != len(BY_OP):
            host()
            gen = importlib.import_module("jitgrad.gpu.sweep_codegen")
            kern = importlib.import_module("jitgrad.gpu.sweep_kernel")
            src = gen.generate(_table(gen, kern), {s.name: s.op for s in BY_OP if s.kind == "sink"})
            name = gen.module_name(src)
            mod = codegen._execute("jitgrad.gpu." + name, src, codegen._module_file(name, src))
            sys.modules[mod.__name__] = mod   # among jitgrad.gpu's modules (gpu/ptx.py reads their signatures)
            _loaded[:] = [len(BY_OP), mod]
        return _loaded[1]


def ptx(dtype=np.float64, cc=(8, 0)):
    """The device sweep for the op table compiled to PTX (gpu/sweep.ptx says what it needs),
    without a GPU: the module is generated and bound in memory, nothing is launched."""
    gen = importlib.import_module("jitgrad.gpu.sweep_codegen")
    kern = importlib.import_module("jitgrad.gpu.sweep_kernel")
    src = gen.generate(_table(gen, kern), {s.name: s.op for s in BY_OP if s.kind == "sink"})
    mod = codegen._execute(gen.module_name(src), src, None)
    return importlib.import_module("jitgrad.gpu.sweep").ptx(mod, dtype, cc)


def _table(gen, kern):
    rows = []
    for s in BY_OP:
        if s.kind == "ew":
            kind = kern.K_EW
        elif s.kind == "sink":
            kind = kern.K_SKIP
        else:
            kind = getattr(kern, _KERNEL_KINDS.get(BY_OP[s.base].name, "K_PYTHON"))
        rows.append(gen.OpRow(s.op, kind, s.saves, s.save_src, s.grads if s.kind == "ew" else (), s.nparams))
    return rows


def add_into(dst, src):
    """dst += src on the device, in place (AccumulateGrad into an existing CUDA .grad)."""
    host().add_into(dst, src)


def _copy(col, dtype, n):
    """The first n items of a tape column, copied (see compiled._copy), at least one item."""
    a = _compiled._copy(col, dtype, 1)
    return a[:max(n, 1)] if a.size > n else a


class _DeviceRun:
    """One tape's part of a CUDA backward call: row states, seeds, gradient arenas."""

    def __init__(self, tape, npd):
        self.tape = tape
        self.npd = np.dtype(npd)
        self.code = CUDA_DT_OF[self.npd]
        self.st = np.full(tape.nrows, RECV | EXEC, np.uint8)
        self.seeds = {}
        self.to_release = []
        self.row = -1
        self.leaves, self.ext, self.retained = tape.leaves, tape.ext, tape.retained
        if tape.owner != threading.get_ident():  # as compiled._TapeRun: the rows that existed at the start
            n = self.st.size
            self.leaves, self.ext, self.retained = ({k: v for k, v in d.copy().items() if k < n}
                                                    for d in (tape.leaves, tape.ext, tape.retained))

    def _hdr(self):
        """The header column (for compiled._runs_at), a private copy."""
        return _copy(self.tape.hdr, np.int64, self.st.size * HW)

    def seed(self, row, arr):
        s = self.seeds.get(row)
        if s is None:
            self.seeds[row] = arr
        else:
            s = s.copy()
            add_into(s, arr)
            self.seeds[row] = s

    # -- buffers ------------------------------------------------------------------------------
    def _arenas(self, hdr, sinks, hi):
        """Give each row that may get gradient (RECV, at or below hi) a buffer: sinks in
        `out`, the rest in `scratch` (gpu/sweep.py). Returns the device address table."""
        n = self.st.size
        numel = hdr[H_NUMEL::HW][:n]
        take = (self.st & RECV) != 0
        take[hi + 1:] = False
        is_sink = np.zeros(n, bool)
        is_sink[sinks] = True
        self.off = np.zeros(n, np.int64)
        self.arena_of = np.zeros(n, np.int8)   # 0: no buffer, 1: out, 2: scratch
        gaddr = np.zeros(n, np.int64)
        item = self.npd.itemsize
        arenas = []
        for k, rows in ((1, sinks), (2, np.flatnonzero(take & ~is_sink))):
            sizes = numel[rows]
            offs = np.zeros(rows.size, np.int64)
            np.cumsum(sizes[:-1], out=offs[1:])
            a = host().arena(int(sizes.sum()), self.npd)
            arenas.append(a)
            self.off[rows] = offs
            self.arena_of[rows] = k
            gaddr[rows] = a.ptr + offs * item
        self.out, self.scratch = arenas
        self.numel = numel
        return gaddr

    def buffer(self, row):
        """Row's gradient buffer at its output's shape (a view of its arena), made directly:
        once per leaf of a wide graph, where slicing and reshaping cost several times more."""
        a = self.out if self.arena_of[row] == 1 else self.scratch
        shape = self.tape.out_shape(row)
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        return DeviceArray(a.buf, a.offset + int(self.off[row]), shape, strides[::-1], a.dtype)

    def value(self, row):
        """Gradient of sink `row` (a view of the out arena)."""
        return self.buffer(row)

    # -- the call -------------------------------------------------------------------------------
    def run(self, sinks, retain):
        tape = self.tape
        n = self.st.size
        tape.grow_freed()
        hdr = _copy(tape.hdr, np.int64, n * HW)
        hi = max(self.seeds)
        sinks = np.fromiter(sinks, np.int64, len(sinks))
        gaddr = self._arenas(hdr, sinks, hi)
        for row, arr in self.seeds.items():
            add_into(self.buffer(row), arr)
            self.st[row] |= HAS
        for row in (*tape.tensor_hooks, *tape.node_prehooks):
            self.st[row] |= PRE
            if tape.hdr[row * HW + H_OP] == OP_OUT:  # its node's row runs it if this output gets nothing
                self.st[row - tape.hdr[row * HW + H_IP]] |= PRE
        for row in tape.node_hooks:
            self.st[row] |= PYRUN
        if live_tape() is tape:
            # Python run during the sweep may record ops (a hook, a Function's backward):
            # they go to a new tape, not onto the one being swept
            close_current_tape()
        sw = host()
        v = tape.v64 if self.npd == np.float64 else tape.v32
        mirror = sw.Mirror(hdr, _copy(tape.edges, np.int64, len(tape.edges)), _copy(tape.xs, np.int64, len(tape.xs)),
                           _copy(tape.fp, np.float64, len(tape.fp)),
                           _copy(tape.slots, np.int64, len(tape.slots)), _copy(v, self.npd, len(v)),
                           _copy(tape.freed, np.int8, n))
        gaddr = sw.cuda.to_device(gaddr)
        threads = sw.threads_for(int(self.numel[:hi + 1].max()))
        mod = module()
        while True:
            status, row = sw.run(mod, mirror, gaddr, self.st, hi, self.code, threads)
            with no_grad():  # Python in a backward without create_graph records nothing
                if status == PREHOOKS:
                    self._run_pre_hooks(row)
                    hi = row
                    continue
                if status == PYNODE:
                    self._run_python_node(row, retain)
                    hi = row - 1
                    continue
            break
        self.row = row
        self.scratch = None
        return status

    # -- hand-backs (as compiled._TapeRun's, on device data) ----------------------------------
    def _grad(self, row):
        if not self.st[row] & HAS:
            return None
        return F._wrap(self.buffer(row).copy())

    def _set_grad(self, row, g):
        self._check_device(row, g)
        assign(self.buffer(row), g._data)
        self.st[row] |= HAS

    def _contribute(self, t, g):
        self._check_device(t, g)
        add_into(self.buffer(t), g._data)
        self.st[t] |= HAS

    def _check_device(self, row, g):
        if type(g._data) is not DeviceArray:
            raise RuntimeError(f"Function {node_for(self.tape, row).name()} got a gradient on the cpu for a "
                               "tensor on cuda:0 (expected device cuda:0 but got cpu)")
        if g._data.size != self.numel[row]:
            raise RuntimeError(f"Function {node_for(self.tape, row).name()} got a gradient of {g._data.size} "
                               f"elements, but its output has {self.numel[row]}")

    def _run_pre_hooks(self, row):
        tape = self.tape
        n_out = 1 if tape.hdr[row * HW + H_OP] == OP_OUT else _compiled._n_outputs(tape, row)
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
            rows = range(row, row + _compiled._n_outputs(tape, row))
            grads = [self._grad(r) for r in rows]
            seen = [version_of(g) for g in grads]
            for r, old, new, v in zip(rows, grads, run_node_prehooks(pre, grads), seen):
                if written(old, new, v):
                    self._set_grad(r, old if new is None else new)
        self.st[row] &= 0xFF ^ PRE

    def _run_python_node(self, row, retain):
        """A row the kernel handed back: a custom Function, a node with post-hooks, or a
        structural op without device code here, through its Tensor-level rule."""
        tape = self.tape
        st = self.st
        node = node_for(tape, row)
        rows = range(row, row + _compiled._n_outputs(tape, row))
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
            result = pyengine.input_grads(node, grads[0])
        post = tape.node_hooks.get(row)
        if post:
            result = run_node_posthooks(post, result, grads)
        e0 = tape.hdr[row * HW + H_E0]
        for j, g in enumerate(result):
            t = tape.edges[EW * (e0 + j) + E_TGT]
            if g is None or t < 0 or not st[t] & RECV:
                continue
            g = validate_gradient(node.name(), j, g, tape.shape_at(tape.edges[EW * (e0 + j) + E_SHP]), self.npd,
                                  cuda=True)
            self._contribute(t, g)


def mark_need(tape, st):
    """Selective execution for grad(): rows on a path to a requested input (RECV preset on
    the inputs), as scheduler.mark_need, on the host without the CPU module."""
    n = st.size
    hdr = _copy(tape.hdr, np.int64, n * HW).reshape(-1, HW)[:n]
    tgt = _copy(tape.edges, np.int64, len(tape.edges))[E_TGT::EW].tolist()
    e0s, nins = hdr[:, H_E0].tolist(), hdr[:, H_NIN].tolist()
    recv = (st & RECV != 0).tolist()
    for row in range(n):
        e = e0s[row]
        for j in range(nins[row]):
            t = tgt[e + j]
            if t >= 0 and recv[t]:
                recv[row] = True
                st[row] |= RECV | EXEC
                break


def run(roots, grads, targets, retain, tapes):
    """compiled.run for CUDA tapes (the same arguments and results), or a compiled.Fallback."""
    npd = grads[0]._data.dtype
    if npd not in CUDA_DT_OF or any(type(g._data) is not DeviceArray or g._data.dtype != npd for g in grads):
        return _compiled.Fallback("a CUDA backward's roots mix dtypes or devices")
    code = CUDA_DT_OF[npd]
    runs = {t.id: _DeviceRun(t, npd) for t in tapes}
    for t in tapes:
        # decided before any tape is swept (a run abandoned halfway would have run hooks)
        if t.reshaped or not _compiled._runs_at(runs[t.id], code):
            return _compiled.Fallback("a CUDA graph mixes dtypes or devices, or a recorded tensor's .data changed")
    want, inner = _compiled.requested(tapes, runs, targets, lambda t, r: mark_need(t, r.st))
    for i, (tg, g) in enumerate(zip(roots, grads)):
        shape = tg.tape.out_shape(tg.row)
        if g._data.shape != shape:
            raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of {torch_size(g._data.shape)} "
                               f"and output[{i}] has a shape of {torch_size(shape)}.")
        runs[tg.tape.id].seed(tg.row, g._data)
    captured, leaves, retained = {}, [], []
    commit = _compiled._Commit()
    for t in reversed(tapes):
        r = runs[t.id]
        if not r.seeds:
            continue
        inputs_here = [tg.row for tg in inner if tg.tape is t]
        sinks = list(dict.fromkeys([*r.leaves, *r.ext, *r.retained, *inputs_here]))
        status = r.run(sinks, retain)
        if status == ROW_FREED:
            raise pyengine.freed_or_modified(t, r.row)
        st = r.st
        for lrow, acc in r.leaves.items():
            if st[lrow] & HAS:
                if want is None:
                    leaves.append((acc, r.value(lrow)))
                elif (id(acc), 0) in want:
                    prev = captured.get((id(acc), 0))
                    if prev is None:
                        captured[id(acc), 0] = r.value(lrow)
                    else:
                        add_into(prev, r.value(lrow))
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
