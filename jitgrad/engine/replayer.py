"""The forward interpreter of jitgrad.compile: runs a plan's program over its values.

A plan (compiler/plan.py) is data: `prog` (one instruction per op of the recorded step),
`fin` (each instruction's input and output value ids), `vals` (each value's address,
size, shape and dtype), `xs` / `fp` (shapes, int and float params). The interpreter
walks the instructions in order and runs each with its op's forward kernel: the
elementwise ones generated from the op table's forward formulas (`fwd_ew`), the
structural ones through `run_fwd_kernel` (each spec's `fwd_kernel`). So a new plan
needs no compilation: the same compiled function runs every program, as the sweep
(engine/scheduler.py) runs every tape.

Like the sweep it is resumable: an instruction with opcode PY_OP (a comparison, a random
draw: something Python computes) makes it return that instruction's index; the driver
(compiler/replay.py) runs it and calls `forward` again from the next one.

Bound into the generated module like the scheduler (engine/codegen.py), so the names
below that the module supplies (OP_IS_EW, fwd_ew, run_fwd_kernel) are its.
"""
import numpy as np

from jitgrad._core.layout import (
    F_OP,
    FW,
    NOP_OP,
    PK_ARRAYS,
    PK_BHI,
    PK_DT,
    PK_FLAG1,
    PK_FLAG2,
    PK_HI,
    PK_KIND,
    PK_LO,
    PK_NPTR,
    PK_NSC,
    PK_PTRW,
    PK_SCW,
    SWEPT,
    V_ADDR,
    VW,
)
from jitgrad.kernels.optim import adam_all, sgd_all
from jitgrad.kernels.pointers import view

# the functions the generated module compiles, bound to its names (engine/codegen.py)
REPLAYER = ("forward", "copy_saved", "train_step", "part", "train_step_packed")

# --- supplied by the generated module ---------------------------------------------------------
OP_IS_EW = np.zeros(0, np.int8)


def fwd_ew(op, i, prog, fin, vals, xs, fp, like):
    """Run elementwise instruction i (opcode op)."""
    raise NotImplementedError("bound by the generated module (engine/codegen.py)")


def run_fwd_kernel(op, i, prog, fin, vals, xs, fp, like):
    """Run structural instruction i with its op's forward kernel; False if it has none."""
    raise NotImplementedError("bound by the generated module (engine/codegen.py)")


def backward_into(hdr, edges, xs, fp, slots, v, st, freed, seed_rows, seed_offs, seed_vals, sinks, hi, retain, dt,
                  kt, out):
    """engine/scheduler.py's, bound by the generated module."""
    raise NotImplementedError("bound by the generated module (engine/codegen.py)")


def forward(prog, fin, vals, xs, fp, like, lo, hi):
    """Run instructions lo .. hi - 1; returns -1 when done, or the index of an instruction
    Python must run (resume at the next one)."""
    for i in range(lo, hi):
        op = prog[i * FW + F_OP]
        if op < 0:
            if op == NOP_OP:
                continue
            return i
        if OP_IS_EW[op]:
            fwd_ew(op, i, prog, fin, vals, xs, fp, like)
        elif not run_fwd_kernel(op, i, prog, fin, vals, xs, fp, like):
            return i
    return -1


def copy_saved(dst, src, vals, v):
    """The backward reads one-element saved values from its inline column v: copy each
    value src[k] (one element of v's dtype) to v[dst[k]]."""
    for k in range(dst.size):
        v[dst[k]] = view(vals[src[k] * VW + V_ADDR], 1, v)[0]


def train_step(prog, fin, vals, xs, fp, like, lo, hi,
               hdr, edges, bxs, bfp, slots, v, vdst, vsrc, st, freed, seed_rows, seed_offs, seed, sinks, bhi, dt,
               kt, out, kind, ptrs, sizes, sc, flag1, flag2):
    """A training step in one call: the forward program lo .. hi - 1 (it has no Python
    instruction), the backward from the seeded root into `out` (the leaves' gradients,
    at the addresses the optimizer's pointer table holds), then the optimizer's update
    of one group (kind 1: SGD, flags momentum / nesterov; 2: Adam, flags decoupled /
    amsgrad). Returns the sweep's status (SWEPT when all of it ran)."""
    forward(prog, fin, vals, xs, fp, like, lo, hi)
    copy_saved(vdst, vsrc, vals, v)
    status, row = backward_into(hdr, edges, bxs, bfp, slots, v, st, freed, seed_rows, seed_offs, seed, sinks, bhi,
                                True, dt, kt, out)
    if status != SWEPT:
        return status
    if kind == 1:
        sgd_all(ptrs, sizes, sc, like, flag1, flag2)
    elif kind == 2:
        adam_all(ptrs, sizes, sc, like, flag1, flag2)
    return status



def part(a, head, k):
    """Array k of a packed call (train_step_packed)."""
    o = head[PK_ARRAYS + 2 * k]
    return a[o:o + head[PK_ARRAYS + 2 * k + 1]]


def train_step_packed(ints, floats, data, states, freed, kt):
    """train_step with its arrays packed into four (ints, floats, data at the plan's
    dtype, states: the row states' template then their working copy): a call from Python
    pays per argument (~0.5 us each), and train_step has 31. ints starts with the header
    (_core/layout.py's PK_*). kt: the backward's kernel table (kernels/table.py)."""
    head = ints
    n = states.size // 2
    st = states[n:]
    st[:] = states[:n]
    prog = part(ints, head, 0)
    fin = part(ints, head, 1)
    vals = part(ints, head, 2)
    xs = part(ints, head, 3)
    hdr = part(ints, head, 4)
    edges = part(ints, head, 5)
    bxs = part(ints, head, 6)
    slots = part(ints, head, 7)
    vdst = part(ints, head, 8)
    vsrc = part(ints, head, 9)
    seed_rows = part(ints, head, 10)
    seed_offs = part(ints, head, 11)
    sinks = part(ints, head, 12)
    ptrs = part(ints, head, 13).reshape((head[PK_NPTR], head[PK_PTRW]))
    sizes = part(ints, head, 14)
    fp = part(floats, head, 15)
    bfp = part(floats, head, 16)
    v = part(data, head, 17)
    seed = part(data, head, 18)
    out = part(data, head, 19)
    sc = part(data, head, 20).reshape((head[PK_NSC], head[PK_SCW]))
    like = data[0:0]
    return train_step(prog, fin, vals, xs, fp, like, head[PK_LO], head[PK_HI],
                      hdr, edges, bxs, bfp, slots, v, vdst, vsrc, st, freed, seed_rows, seed_offs, seed, sinks,
                      head[PK_BHI], head[PK_DT], kt, out, head[PK_KIND], ptrs, sizes, sc, head[PK_FLAG1] != 0,
                      head[PK_FLAG2] != 0)
