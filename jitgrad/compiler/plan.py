"""A plan: a recorded step (compiler/recorder.py) lowered to flat arrays.

What a plan holds (the layout is _core/layout.py's FW / VW):
- `vals`: per value, the address of its data, its size, shape and dtype. Results of ops
  and constants live in one arena (one allocation per plan, 64-byte aligned slices);
  the call's tensor arguments are copied into the arena at each replay, so every
  address the compiled code reads is fixed for the plan's life. Tensors from outside
  the call (parameters) are read in place: the guard is that each still holds the array
  it held when recorded (the optimizer updates it in place, so it does);
- `prog`, `fin`, `xs`, `fp`: the forward program (engine/replayer.py runs it);
- per backward() of the step, a copy of the tape the recording made, with each saved
  value's address pointed at the value in the arena that the forward program rewrites
  at every replay (and, for one-element values the kernels read inline, a list of
  copies to make first): the existing compiled backward then sweeps it unchanged;
- segments: the order in which to run the forward program's stretches and the events
  (backward, optimizer calls, .grad assignments).

Building a plan compiles nothing: the interpreter and the sweep are compiled once for
every plan (kernels are generic over the plan; a plan is data).
"""
import math

import numpy as np

from jitgrad._core import versions
from jitgrad._core.layout import (
    DT_OF,
    EXEC,
    FW,
    H_DT,
    H_KP,
    H_NUMEL,
    H_OP,
    H_SHP,
    HW,
    NOP_OP,
    PK_ARRAYS,
    PK_COUNT,
    PY_OP,
    RECV,
    S_KEEP,
    S_NUMEL,
    S_REF,
    SW,
    VD_OF,
    VW,
)
from jitgrad.compiler.recorder import ARG, CONST, EXT
from jitgrad.engine.executor import leaf_has_hooks
from jitgrad.graph.hooks import leaf_hooks
from jitgrad.graph.spec import SPECS
from jitgrad.graph.tape import _address
from jitgrad.optim import _replay as _optim_replay
from jitgrad.optim.optimizer import Optimizer

ALIGN = 64

FWD, BACKWARD, CALL, SETGRAD, STEP, FUSED = range(6)


class Unsupported(Exception):
    """What the recording did cannot be replayed (the message says what, `where` the line of
    user code); the signature runs eagerly, or under fullgraph=True the error is raised."""

    def __init__(self, msg, where="plan"):
        super().__init__(msg)
        self.where = where


class BackwardPlan:
    __slots__ = ("hdr", "edges", "xs", "fp", "slots", "v", "vdst", "vsrc", "st0", "freed", "seed_rows",
                 "seed_offs", "seed", "seed_vid", "sinks", "hi", "dt", "leaves", "out", "views", "spans", "fixed",
                 "saved", "arena_slots", "kt")

    def kernels(self, sched):
        """The kernel table the replayed backward runs with, its kernels compiled on the
        first call (the sweep would stop at a missing one, after the fused step's forward
        has run)."""
        kt = getattr(self, "kt", None)
        if kt is None:
            sched.KERNELS.ensure_rows(int(self.dt), self.hdr, self.st0.size)
            self.kt = kt = sched.KERNELS[int(self.dt)]
        return kt


class GraphPlan:
    __slots__ = ("hdr", "edges", "xs", "fp", "slots", "v", "vdst", "vsrc", "saved", "arena_slots", "base0",
                 "leaves", "outputs", "checks", "consts", "keep")


class Plan:
    def __init__(self, rec, tape_floor, outputs=()):
        values = rec.values
        self.dtype = _plan_dtype(rec)
        self.like = np.empty(0, self.dtype)
        self.xs = [0]
        self._shape_ptr = {(): 0}
        # -- values: one arena for everything made in the step ---------------------------
        # (64-byte aligned slices for arrays, item-aligned for one-element values: a scalar
        # graph's values sit packed, as in the tape's inline columns). One pass; what depends
        # only on a value's shape and dtype is worked out once per pair.
        meta = {}
        offs, vals, total = [], [], 0
        scalars = {}          # dtype -> ([element offsets], [values]) of one-element constants, written at once
        consts, args, exts = [], [], []
        for k, v in enumerate(values):
            m = meta.get((v.shape, v.dtype))
            if m is None:
                dt = VD_OF.get(v.dtype)
                if dt is None:
                    raise Unsupported(f"a tensor of dtype {v.dtype}")
                n = math.prod(v.shape)
                nbytes = max(1, n) * v.dtype.itemsize
                m = meta[v.shape, v.dtype] = (n, nbytes, ALIGN if nbytes >= ALIGN else 8, self._shape(v.shape), dt)
            n, nbytes, align, sp, dt = m
            kind = v.kind
            if kind == EXT:
                offs.append(-1)
                vals.extend((0, n, sp, dt))
                exts.append(k)
                continue
            total = -(-total // align) * align
            offs.append(total)
            vals.extend((total, n, sp, dt))
            total += nbytes
            if kind == CONST:
                if n == 1:
                    at, xs = scalars.setdefault(v.dtype, ([], []))
                    at.append(total - nbytes)
                    xs.append(np.asarray(v.src).reshape(-1)[0])  # a 0-d or a (1,) constant: its one value
                else:
                    consts.append((k, v.src))
            elif kind == ARG:
                args.append((v.src, k))
        self.arena = np.zeros(max(total, ALIGN) + ALIGN, np.uint8)
        base = self.arena.ctypes.data
        shift = (-base) % ALIGN
        self.vals = np.array(vals, np.int64)
        offs = np.array(offs, np.int64)
        self._in_arena = np.flatnonzero(offs >= 0) * VW
        self.vals[self._in_arena] += base + shift
        # (shape, dtype) per value: the plan keeps none of the recording's tensors alive
        self._shift, self._offs = shift, offs
        self._values = [(v.shape, v.dtype, v.kind == EXT) for v in values]
        self._arrays = {}     # value id -> ndarray over its data, made when asked (array())
        self.ext = []         # (tensor, its array, requires_grad): guards
        for k in exts:
            t = values[k].tensor
            d = t._data
            if not isinstance(d, np.ndarray) or not d.flags.c_contiguous:
                d = t._array()
                if not d.flags.c_contiguous:
                    raise Unsupported("a parameter or captured tensor that is not contiguous")
            self.vals[k * VW] = _address(d) if d.size else 0
            self.ext.append((t, d, t._requires_grad))
            self._arrays[k] = d
        self._consts, self._arg_vids = consts, args  # what a new arena (rebase) is filled with / bound to
        for k, src in consts:
            self.array(k)[...] = src
        self.args = [(src, self.array(k)) for src, k in args]  # copied in at each call
        self._scalars = [(dtype, np.array(at, np.int64) // dtype.itemsize, np.array(xs, dtype).reshape(-1))
                         for dtype, (at, xs) in scalars.items()]
        self._write_scalars()
        # -- the forward program --------------------------------------------------------------
        prog, fin, fp = [], [], []
        self.py = {}
        live = _live(rec, outputs)
        for i, ins in enumerate(rec.instrs):
            if not live[i]:
                outs = ins.outs
                op = NOP_OP
            elif ins.kind == "ew":
                outs = ins.outs[:1]  # the saved values are its inputs or its result
                op = ins.spec.op
            elif ins.kind == "struct":
                outs = ins.outs
                op = ins.spec.op
            else:
                outs = ins.outs
                op = PY_OP
                self.py[i] = (ins.pyfn, list(ins.ins), list(outs))
            ip = 0
            if ins.iparams:
                ip = len(self.xs)
                self.xs.append(len(ins.iparams))
                self.xs.extend(int(x) for x in ins.iparams)
            prog.extend((op, len(fin), len(ins.ins), len(fp), ip, ins.made))
            fin.extend(ins.ins)
            fin.extend(outs)
            fp.extend(ins.fparams if ins.fparams else (0.0, 0.0))
        assert len(prog) == FW * len(rec.instrs)
        self.prog = np.array(prog, np.int64)
        self.fin = np.array(fin, np.int64)
        self.fp = np.array(fp + [0.0, 0.0], np.float64)
        self.xs = np.array(self.xs, np.int64)
        self.names = [ins.name for ins in rec.instrs]
        # -- segments ---------------------------------------------------------------------------
        self.segments = []
        self.grad_views = []  # (parameter, the view of a backward's output array its .grad may be)
        at = 0
        for kind, pos, payload in rec.events:
            if pos > at:
                self.segments.append((FWD, at, pos))
                at = pos
            if kind == "backward":
                try:
                    self.segments.append((BACKWARD, self._backward(rec, payload, tape_floor)))
                except Unsupported as e:  # name the backward() call that cannot be replayed
                    raise Unsupported(str(e), payload[5]) from None
            elif kind == "call" and payload[0] is Optimizer.step:
                opt = payload[1][0]  # one compiled call per group when the gradients are where the plan put them
                fast = _optim_replay.make(opt, {id(p): view for p, view in self.grad_views})
                self.segments.append((STEP, opt, fast))
            elif kind == "call":
                self.segments.append((CALL, payload[0], payload[1]))
            else:
                t, k = payload
                self.segments.append((SETGRAD, *_target(rec, t), None if k is None else self.array(k)))
        if len(rec.instrs) > at:
            self.segments.append((FWD, at, len(rec.instrs)))
        self.modules = list(rec.modules.values())
        self.graph = self._graph(rec, outputs, tape_floor)
        self.segments = self._fuse(self.segments)
        self.backwards = [seg[1] for seg in self.segments if seg[0] == BACKWARD] + \
            [seg[1][1][1] for seg in self.segments if seg[0] == FUSED]
        # a backward whose gradients an optimizer step of the plan reads keeps them at fixed
        # addresses (its buffer); the others give each call's .grads their own memory
        steps = [i for i, seg in enumerate(self.segments) if seg[0] in (STEP, FUSED)]
        for i, seg in enumerate(self.segments):
            if seg[0] == BACKWARD:
                seg[1].fixed = any(j > i for j in steps)
            elif seg[0] == FUSED:
                seg[1][1][1].fixed = True
        fixed = {id(v) for bp in self.backwards if bp.fixed for v in bp.views}
        self.fixed_views = [(p, v) for p, v in self.grad_views if id(v) in fixed]

    def _fuse(self, segments):
        """forward, backward, optimizer step (one group): one compiled call (replay.py runs
        the three apart when a call does not meet its conditions)."""
        out = []
        i = 0
        while i < len(segments):
            three = segments[i:i + 3]
            if (len(three) == 3 and [s[0] for s in three] == [FWD, BACKWARD, STEP] and three[2][2] is not None
                    and len(three[2][2].groups) == 1 and sum(s[0] == STEP for s in segments) == 1
                    and three[1][1].seed_vid is None  # (a gradient the forward computes is read before it)
                    and not any(k in self.py for k in range(three[0][1], three[0][2]))):
                packed, step = self._pack(*three)
                out.append((FUSED, [three[0], three[1], step], packed))
                i += 3
            else:
                out.append(segments[i])
                i += 1
        return out

    def _graph(self, rec, outputs, tape_floor):
        """When the step returns tensors that require grad and did not backward through
        them itself (a compiled module's forward), each replay hands back a graph: a tape
        like the recorded one over that call's arena (replay.give_graph)."""
        # an output whose graph the step's own backward() went through comes back detached
        # (eager's would have a freed graph)
        swept = {payload[3] for kind, _, payload in rec.events if kind == "backward" and not payload[2]}
        live = [k for k in outputs if rec.values[k].tensor is not None and rec.values[k].tensor._requires_grad
                and rec.values[k].tensor._tape is not None and rec.values[k].tensor._tape not in swept]
        if not live:
            return None
        if swept:
            raise Unsupported("a step that calls backward() and returns other tensors that require grad")
        tapes = {rec.values[k].tensor._tape for k in live}
        if len(tapes) != 1:
            raise Unsupported("outputs recorded on several graphs")
        tape = tapes.pop()
        gp = GraphPlan()
        self._lower(rec, tape, tape_floor, gp)
        gp.base0 = self.arena.ctypes.data
        # (row, AccumulateGrad node, None) of the parameters; (row, None, index) of the call's
        # tensor arguments that require grad (their nodes are those of each call's tensors)
        gp.leaves = [(row, acc, None) if t is not None else (row, None, arg)
                     for row, acc in tape.leaves.items() for t, arg in [_target(rec, acc.variable)]]
        gp.outputs = {k: (rec.values[k].tensor._row, rec.values[k].tensor._output_nr) for k in live}
        self._version_checks(rec, tape, gp, set(outputs))
        # each call's tape.keep (replay._ArenaKeep): the arena, then per value saved by address
        # what the Python engine reads for it (create_graph=True, anomaly mode): a parameter's
        # array, or (first byte, end byte, shape, dtype) of the value in that call's arena
        gp.keep = []
        for slot, vid, _ in gp.saved:
            v = rec.values[vid]
            gp.slots[slot * SW + S_KEEP] = 1 + len(gp.keep)
            at = self._shift + self._offs[vid]
            gp.keep.append(self.array(vid) if v.kind == EXT else
                           (at, at + math.prod(v.shape) * v.dtype.itemsize, v.shape, v.dtype))
        return gp

    def _version_checks(self, rec, tape, gp, outputs):
        """What each call's graph checks at backward, as eager's does (graph/tape.check_versions).
        The recorded tape says which saved values eager checks (not one that no gradient
        reads: x * w saves no w when x needs no gradient) and which storage each belongs to;
        a saved value that is (a view of) a parameter, one of the call's tensor arguments or
        a returned tensor is checked at each call against that tensor's storage then (the
        arena holds copies of the arguments, the caller gets copies of the outputs). An
        in-place write to it before backward() raises PyTorch's "modified by an inplace
        operation"; a write to anything else is no error, as in eager.
        gp.checks: (slot, row, parameter array, argument index, output value id), one of
        the last three set; gp.consts: (row, parameter array, argument index) of
        one-element values the tape copied (an in-place op finds their rows: note_inline_const)."""
        bases = {}  # slot -> the storage of the array eager saved there
        for slot, _, stamp in tape.kept:
            if type(stamp) is tuple:  # a cast copy, stamped with its source's storage
                bases[slot] = stamp[0]() if stamp[0] is not None else None
            else:
                bases[slot] = versions.base_of(tape.keep[int(tape.slots[slot * SW + S_KEEP])])
        owners = {}  # id(storage) -> (parameter array, argument index, output value id)
        for k in outputs:
            if rec.values[k].tensor is not None:
                owners[id(versions.base_of(rec.values[k].tensor._data))] = (None, None, k)
        for k, v in enumerate(rec.values):
            if v.kind in (ARG, EXT) and v.tensor is not None:
                owners[id(versions.base_of(v.tensor._data))] = (self.array(k), None, None) if v.kind == EXT else \
                    (None, v.src, None)
        gp.checks = []
        for slot, _, row in gp.saved:
            base = bases.get(slot)
            owner = None if base is None else owners.get(id(base))
            if owner is not None:
                gp.checks.append((slot, row, *owner))
        outside = {id(v.tensor._data): v for v in rec.values if v.kind in (ARG, EXT) and v.tensor is not None}
        gp.consts = []
        for arr, rows in tape.inline_consts.values():
            v = outside.get(id(arr))
            if v is not None and v.tensor._data is arr:
                src = (v.tensor._data, None) if v.kind == EXT else (None, v.src)
                gp.consts.extend((row, *src) for row in rows)

    def _write_scalars(self):
        shift = self._shift
        for dtype, at, xs in self._scalars:
            flat = self.arena[shift:shift + (len(self.arena) - shift) // dtype.itemsize * dtype.itemsize].view(dtype)
            flat[at] = xs

    def rebase(self):
        """Move to a new arena (the old one now belongs to a graph handed to the caller):
        addresses shift, constants are written again, views are made afresh."""
        old = self.arena
        raw = np.empty(old.size + ALIGN, np.uint8)
        off = (old.ctypes.data - raw.ctypes.data) % ALIGN   # the same alignment as the old one
        new = raw[off:off + old.size]
        self.vals[self._in_arena] += new.ctypes.data - old.ctypes.data
        self.arena = new
        self._arrays = {k: a for k, a in self._arrays.items() if self._values[k][2]}
        self._write_scalars()
        for k, src in self._consts:
            self.array(k)[...] = src
        self.args = [(src, self.array(k)) for src, k in self._arg_vids]

    def array(self, k, v=None):
        """Value k's data as an ndarray of its shape (a view into the arena)."""
        arr = self._arrays.get(k)
        if arr is None:
            shape, dtype = (v.shape, v.dtype) if v is not None else self._values[k][:2]
            start = self._shift + self._offs[k]
            arr = self.arena[start:start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
            self._arrays[k] = arr
        return arr

    def _pack(self, fwd, bwd, step):
        """The arrays of a fused forward + backward + step, packed for one compiled call
        (engine/replayer.train_step_packed: each argument of a call from Python costs
        ~0.5 us). The backward's inline values, seed and gradient buffer move into the
        packed float array; the optimizer's table is made again over the moved buffer."""
        bp, opt, fast = bwd[1], step[1], step[2]
        width = 5 if fast.kind == _optim_replay.SGD_KIND else 8
        nrows = len(fast.groups[0].params)
        parts = [bp.v, bp.seed, bp.out, np.zeros(nrows * width, self.dtype)]
        data, doffs = _concat(parts, self.dtype)
        bp.v, bp.seed, bp.out = (data[o:o + n] for o, n in doffs[:3])
        sc = data[doffs[3][0]:doffs[3][0] + nrows * width].reshape(nrows, width)
        where = {id(v): k for k, (_, v) in enumerate(self.grad_views)}
        old = bp.views
        ends = np.cumsum([0] + [v.size for v in old])
        bp.views = [bp.out[ends[i]:ends[i + 1]].reshape(v.shape) for i, v in enumerate(old)]
        for v_old, v_new, (_, p, _, _) in zip(old, bp.views, bp.leaves):
            if p is not None:
                self.grad_views[where[id(v_old)]] = (p, v_new)
        fast = _optim_replay.make(opt, {id(p): v for p, v in self.grad_views})
        if fast is None or len(fast.groups) != 1:
            raise Unsupported("the optimizer's table could not be made again")
        step = (step[0], opt, fast)
        g = fast.groups[0]
        ints = [self.prog, self.fin, self.vals, self.xs, bp.hdr, bp.edges, bp.xs, bp.slots, bp.vdst, bp.vsrc,
                bp.seed_rows, bp.seed_offs, bp.sinks, g.ptrs.reshape(-1), g.sizes]
        head = np.zeros(PK_ARRAYS + 2 * PK_COUNT, np.int64)
        packed_ints, ioffs = _concat(ints, np.int64, start=head.size)
        floats, foffs = _concat([self.fp, bp.fp], np.float64)
        flag1, flag2 = fast.flags(g)
        head[:PK_ARRAYS] = (fwd[1], fwd[2], bp.hi, bp.dt, fast.kind, flag1, flag2, g.ptrs.shape[0],
                            g.ptrs.shape[1], nrows, width)
        for k, (o, n) in enumerate(ioffs + foffs + doffs):
            head[PK_ARRAYS + 2 * k:PK_ARRAYS + 2 * k + 2] = (o, n)
        packed_ints[:head.size] = head
        states = np.concatenate([bp.st0, bp.st0])
        return (packed_ints, floats, data, states, bp.freed, sc, (flag1, flag2)), step

    def _shape(self, shape):
        shape = tuple(int(s) for s in shape)
        p = self._shape_ptr.get(shape)
        if p is None:
            p = len(self.xs)
            self.xs.append(len(shape))
            self.xs.extend(shape)
            self._shape_ptr[shape] = p
        return p

    def _backward(self, rec, payload, tape_floor):
        root, gv, _retain, tape, leaves, _where = payload
        bp = BackwardPlan()
        self._lower(rec, tape, tape_floor, bp)
        hdr = bp.hdr
        n = tape.nrows
        bp.st0 = np.full(n, RECV | EXEC, np.uint8)
        bp.freed = np.zeros(n, np.int8)
        rv = rec.values[root]
        root_row = rv.tensor._row
        bp.seed_rows = np.array([root_row], np.int64)
        numel = int(hdr[root_row * HW + H_NUMEL])
        bp.seed_offs = np.array([0, numel], np.int64)
        bp.seed = np.ones(numel, self.dtype)
        bp.seed_vid = gv
        if gv is not None and (rec.values[gv].dtype != self.dtype
                               or math.prod(rec.values[gv].shape) != numel):
            raise Unsupported("backward(gradient) of another dtype or size")
        bp.hi = root_row
        bp.dt = DT_OF.get(self.dtype)
        bp.leaves = [(row, *_target(rec, p), None if k is None else self.array(k)) for row, p, k in leaves]
        bp.sinks = np.array([row for row, _, _ in leaves], np.int64)
        # the leaves' gradients land in one array of the plan's, at the same place every call
        # (so a compiled optimizer step can read them by address); views of it become .grad
        sizes = [int(hdr[row * HW + H_NUMEL]) for row, _, _ in leaves]
        bp.out = np.zeros(sum(sizes), self.dtype)
        ends = np.cumsum([0] + sizes)
        bp.views = [bp.out[ends[i]:ends[i + 1]].reshape(tape.shape_at(hdr[row * HW + H_SHP]))
                    for i, (row, _, _) in enumerate(leaves)]
        bp.spans = [(int(ends[i]), int(ends[i + 1]), v.shape) for i, v in enumerate(bp.views)]
        bp.fixed = True
        # (a tensor argument's .grad is the tensor passed to each call: never the buffer itself)
        self.grad_views.extend((p, view) for (_, p, _, _), view in zip(bp.leaves, bp.views) if p is not None)
        return bp

    def _lower(self, rec, tape, tape_floor, into):
        """The columns of `tape` (recorded in the step) for the compiled sweep, each saved
        value pointed at its value in the arena: into.hdr, edges, xs, fp, slots, v, the
        inline copies to make before a sweep (vdst, vsrc), and the slots holding arena
        addresses (arena_slots, positions in slots), and per value saved by address
        (saved: (slot, value id, row)). Raises Unsupported for a tape the compiled sweep cannot run alone."""
        if tape.id < tape_floor:
            raise Unsupported("backward() through a graph recorded before the step")
        if tape.ext or tape.retained or tape.packed or tape.needs_python() or tape.metadata or tape.stale:
            raise Unsupported("backward() through a graph with hooks, custom Functions, retained grads, "
                              "saved-tensor hooks, anomaly mode or an edge into another graph")
        if leaf_hooks[0] and any(leaf_has_hooks(acc) for acc in tape.leaves.values()):
            raise Unsupported("backward() into a tensor with hooks (they run in Python)")
        code = DT_OF.get(self.dtype)
        n = tape.nrows
        hdr = np.frombuffer(bytearray(tape.hdr), np.int64)[:n * HW].copy()
        claimed = np.zeros(n, bool)
        slots = np.frombuffer(bytearray(tape.slots), np.int64).copy() if len(tape.slots) else np.zeros(SW, np.int64)
        vcol = tape.v64 if code == 0 else tape.v32
        v = np.frombuffer(bytearray(vcol), self.dtype).copy() if len(vcol) else np.zeros(1, self.dtype)
        vdst, vsrc, saved, arena_slots = [], [], [], []
        for ins in rec.instrs:
            if ins.row is None or ins.row[0] is not tape:
                continue
            row = ins.row[1]
            claimed[row] = True
            spec = ins.spec
            b = row * HW
            kp = int(hdr[b + H_KP])
            saves = ins.outs[1:1 + len(spec.saves)]
            if spec.kind == "ew" and hdr[b + H_NUMEL] == 1:
                for k, vid in enumerate(saves):  # read straight from v (graph/record.record_ew)
                    vdst.append(kp + k)
                    vsrc.append(vid)
                continue
            for k, vid in enumerate(saves):
                if vid < 0:  # not saved by this row (recorder.struct)
                    continue
                slot = kp + k
                ref = slots[slot * SW + S_REF]
                want = np.dtype(np.int64) if spec.index_saves[k] else self.dtype
                val = rec.values[vid]
                n_el = math.prod(val.shape)
                if ref < 0:  # an inline one-element copy
                    if n_el != 1 or val.dtype != self.dtype:
                        raise Unsupported(f"{spec.name}: saved value {k} does not fit its slot")
                    vdst.append(-ref - 1)
                    vsrc.append(vid)
                    continue
                if val.dtype != want or n_el != slots[slot * SW + S_NUMEL]:
                    raise Unsupported(f"{spec.name}: saved value {k} is {val.dtype} of {n_el} elements, the "
                                      f"kernel reads {want} of {slots[slot * SW + S_NUMEL]}")
                slots[slot * SW + S_REF] = self.vals[vid * VW]
                saved.append((slot, vid, row))
                if val.kind != EXT:
                    arena_slots.append(slot * SW + S_REF)
        for row in range(n):
            op = hdr[row * HW + H_OP]
            if SPECS[op].kind == "sink":
                continue
            if not claimed[row]:
                raise Unsupported(f"{SPECS[op].node_name} was recorded by an op jitgrad.compile does not trace")
            if hdr[row * HW + H_DT] != code:
                raise Unsupported(f"{SPECS[op].node_name} mixes dtypes (the compiled backward runs one per graph)")
        into.hdr = hdr
        into.edges = np.frombuffer(bytearray(tape.edges), np.int64).copy() if len(tape.edges) else \
            np.zeros(3, np.int64)
        into.xs = np.frombuffer(bytearray(tape.xs), np.int64).copy()
        into.fp = np.frombuffer(bytearray(tape.fp), np.float64).copy() if len(tape.fp) else np.zeros(1)
        into.slots, into.v = slots, v
        into.vdst = np.array(vdst, np.int64)
        into.vsrc = np.array(vsrc, np.int64)
        into.saved = saved
        into.arena_slots = np.array(arena_slots, np.int64)

def _live(rec, outputs):
    """Per instruction, whether anything reads what it makes: a later live instruction, a
    backward (a saved value, a seed), the caller (an output, a .grad). Python instructions
    always run (a random draw moves the generator as eager's did). The rest are skipped:
    e.g. linear's t(weight), whose copy the matrix product does not read (it reads the
    weight transposed), would cost a copy of the weight per replay."""
    needed = set(outputs)
    for kind, _, payload in rec.events:
        if kind == "backward" and payload[1] is not None:
            needed.add(payload[1])
        elif kind == "setgrad" and payload[1] is not None:
            needed.add(payload[1])
    live = [False] * len(rec.instrs)
    for i in range(len(rec.instrs) - 1, -1, -1):
        ins = rec.instrs[i]
        keep = ins.kind == "py" or any(k in needed for k in ins.outs if k >= 0)
        if not keep and ins.row is not None:  # its row's saved values are read by the backward
            keep = len(ins.spec.saves) > 0
        if keep:
            live[i] = True
            needed.update(ins.ins)
            if ins.row is not None:
                needed.update(k for k in ins.outs if k >= 0)
    return live


def _target(rec, t):
    """(tensor, None) for a tensor from outside the call, (None, index) for the call's
    tensor argument `index`: a replay updates the .grad of the tensor passed then."""
    k = rec.vid.get(id(t))
    if k is not None and rec.values[k].kind == ARG:
        return None, rec.values[k].src
    return t, None


def _concat(arrays, dtype, start=0):
    """One array holding `arrays` one after another from `start`, and each one's (offset, length)."""
    offs, at = [], start
    for a in arrays:
        offs.append((at, a.size))
        at += a.size
    out = np.zeros(max(at, 1), dtype)
    for a, (o, n) in zip(arrays, offs):
        out[o:o + n] = a.reshape(-1)
    return out, offs


def _plan_dtype(rec):
    """The one float dtype the compiled kernels of this plan run at."""
    dts = {rec.values[ins.outs[0]].dtype for ins in rec.instrs if ins.kind != "py"}
    if len(dts) > 1:
        raise Unsupported(f"ops at several float dtypes ({', '.join(sorted(str(d) for d in dts))})")
    dt = dts.pop() if dts else np.dtype(np.float64)
    if dt not in DT_OF:
        raise Unsupported(f"ops at dtype {dt}")
    return dt
