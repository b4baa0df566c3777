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
import numpy as np

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
    PY_OP,
    RECV,
    S_NUMEL,
    S_REF,
    SW,
    VD_OF,
    VW,
)
from jitgrad.compiler.recorder import ARG, CONST, EXT
from jitgrad.graph.spec import SPECS
from jitgrad.graph.tape import _address

ALIGN = 64

FWD, BACKWARD, CALL, SETGRAD = range(4)


class Unsupported(Exception):
    """What the recording did cannot be replayed (the message says what); the signature
    runs eagerly, or under fullgraph=True the error is raised."""


class BackwardPlan:
    __slots__ = ("hdr", "edges", "xs", "fp", "slots", "v", "vdst", "vsrc", "st0", "freed", "seed_rows",
                 "seed_offs", "seed", "seed_vid", "sinks", "hi", "dt", "leaves", "shapes")


class Plan:
    def __init__(self, rec, tape_floor):
        values = rec.values
        self.dtype = _plan_dtype(rec)
        self.like = np.empty(0, self.dtype)
        self.xs = [0]
        self._shape_ptr = {(): 0}
        # -- values: one arena for everything made in the step ---------------------------
        offs, total = [], 0
        for v in values:
            offs.append(total)
            if v.kind != EXT:
                total += -(-max(1, int(np.prod(v.shape, dtype=np.int64))) * v.dtype.itemsize // ALIGN) * ALIGN
        self.arena = np.zeros(max(total, ALIGN) + ALIGN, np.uint8)
        base = self.arena.ctypes.data
        shift = (-base) % ALIGN
        self.vals = np.zeros(len(values) * VW, np.int64)
        self.arrays = []      # per value: an ndarray over its data (EXT: the tensor's own array)
        self.args = []        # (arg index, array in the arena) copied in at each call
        self.ext = []         # (tensor, its array, requires_grad): guards
        for k, v in enumerate(values):
            n = int(np.prod(v.shape, dtype=np.int64))
            if v.dtype not in VD_OF:
                raise Unsupported(f"a tensor of dtype {v.dtype}")
            self.vals[k * VW:(k + 1) * VW] = (0, n, self._shape(v.shape), VD_OF[v.dtype])
            if v.kind == EXT:
                d = v.tensor._data
                if not isinstance(d, np.ndarray) or not d.flags.c_contiguous:
                    d = v.tensor._array()
                    if not d.flags.c_contiguous:
                        raise Unsupported("a parameter or captured tensor that is not contiguous")
                self.vals[k * VW] = _address(d) if d.size else 0
                self.ext.append((v.tensor, d, v.tensor._requires_grad))
                self.arrays.append(d)
                continue
            start = shift + offs[k]
            arr = self.arena[start:start + n * v.dtype.itemsize].view(v.dtype).reshape(v.shape)
            self.vals[k * VW] = base + start
            self.arrays.append(arr)
            if v.kind == CONST:
                arr[...] = v.src
            elif v.kind == ARG:
                self.args.append((v.src, arr))
        # -- the forward program --------------------------------------------------------------
        prog, fin, fp = [], [], []
        self.py = {}
        for i, ins in enumerate(rec.instrs):
            if ins.kind == "ew":
                outs = ins.outs[:1]  # the saved values are its inputs or its result
                op = ins.spec.op
            elif ins.kind == "struct":
                outs = ins.outs
                op = ins.spec.op
            else:
                outs = ins.outs
                op = PY_OP
                self.py[i] = (ins.pyfn, [self.arrays[k] for k in ins.ins], [self.arrays[k] for k in outs])
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
        at = 0
        for kind, pos, payload in rec.events:
            if pos > at:
                self.segments.append((FWD, at, pos))
                at = pos
            if kind == "backward":
                self.segments.append((BACKWARD, self._backward(rec, payload, tape_floor)))
            elif kind == "call":
                self.segments.append((CALL, payload[0], payload[1]))
            else:
                t, k = payload
                self.segments.append((SETGRAD, t, None if k is None else self.arrays[k]))
        if len(rec.instrs) > at:
            self.segments.append((FWD, at, len(rec.instrs)))
        self.modules = list(rec.modules.values())

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
        root, gv, _retain, tape, leaves = payload
        if tape.id < tape_floor:
            raise Unsupported("backward() through a graph recorded before the step")
        if tape.ext or tape.retained or tape.packed or tape.needs_python() or tape.metadata or tape.stale:
            raise Unsupported("backward() through a graph with hooks, custom Functions, retained grads, "
                              "saved-tensor hooks, anomaly mode or an edge into another graph")
        code = DT_OF.get(self.dtype)
        n = tape.nrows
        hdr = np.frombuffer(bytearray(tape.hdr), np.int64)[:n * HW].copy()
        claimed = np.zeros(n, bool)
        bp = BackwardPlan()
        bp.slots = np.frombuffer(bytearray(tape.slots), np.int64).copy() if len(tape.slots) else \
            np.zeros(SW, np.int64)
        vcol = tape.v64 if code == 0 else tape.v32
        bp.v = np.frombuffer(bytearray(vcol), self.dtype).copy() if len(vcol) else np.zeros(1, self.dtype)
        vdst, vsrc = [], []
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
                ref = bp.slots[slot * SW + S_REF]
                want = np.dtype(np.int64) if spec.index_saves[k] else self.dtype
                val = rec.values[vid]
                n_el = int(np.prod(val.shape, dtype=np.int64))
                if ref < 0:  # an inline one-element copy
                    if n_el != 1 or val.dtype != self.dtype:
                        raise Unsupported(f"{spec.name}: saved value {k} does not fit its slot")
                    vdst.append(-ref - 1)
                    vsrc.append(vid)
                    continue
                if val.dtype != want or n_el != bp.slots[slot * SW + S_NUMEL]:
                    raise Unsupported(f"{spec.name}: saved value {k} is {val.dtype} of {n_el} elements, the "
                                      f"kernel reads {want} of {bp.slots[slot * SW + S_NUMEL]}")
                bp.slots[slot * SW + S_REF] = self.vals[vid * VW]
        for row in range(n):
            op = hdr[row * HW + H_OP]
            if SPECS[op].kind == "sink":
                continue
            if not claimed[row]:
                raise Unsupported(f"{SPECS[op].node_name} was recorded by an op jitgrad.compile does not trace")
            if hdr[row * HW + H_DT] != code:
                raise Unsupported(f"{SPECS[op].node_name} mixes dtypes (the compiled backward runs one per graph)")
        bp.hdr = hdr
        bp.edges = np.frombuffer(bytearray(tape.edges), np.int64).copy() if len(tape.edges) else np.zeros(3, np.int64)
        bp.xs = np.frombuffer(bytearray(tape.xs), np.int64).copy()
        bp.fp = np.frombuffer(bytearray(tape.fp), np.float64).copy() if len(tape.fp) else np.zeros(1)
        bp.vdst = np.array(vdst, np.int64)
        bp.vsrc = np.array(vsrc, np.int64)
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
                               or int(np.prod(rec.values[gv].shape, dtype=np.int64)) != numel):
            raise Unsupported("backward(gradient) of another dtype or size")
        bp.hi = root_row
        bp.dt = code
        bp.leaves = [(row, p, None if k is None else self.arrays[k]) for row, p, k in leaves]
        bp.sinks = np.array([row for row, _, _ in leaves], np.int64)
        bp.shapes = [tape.shape_at(hdr[row * HW + H_SHP]) for row, _, _ in leaves]
        return bp


def _plan_dtype(rec):
    """The one float dtype the compiled kernels of this plan run at."""
    dts = {rec.values[ins.outs[0]].dtype for ins in rec.instrs if ins.kind != "py"}
    if len(dts) > 1:
        raise Unsupported(f"ops at several float dtypes ({', '.join(sorted(str(d) for d in dts))})")
    dt = dts.pop() if dts else np.dtype(np.float64)
    if dt not in DT_OF:
        raise Unsupported(f"ops at dtype {dt}")
    return dt
