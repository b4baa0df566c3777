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

from jitgrad._core.layout import F_OP, FW, PY_OP, V_ADDR, VW
from jitgrad.kernels.pointers import view

# the functions the generated module compiles, bound to its names (engine/codegen.py)
REPLAYER = ("forward", "copy_saved")

# --- supplied by the generated module ---------------------------------------------------------
OP_IS_EW = np.zeros(0, np.int8)


def fwd_ew(op, i, prog, fin, vals, xs, fp, like):
    """Run elementwise instruction i (opcode op)."""
    raise NotImplementedError("bound by the generated module (engine/codegen.py)")


def run_fwd_kernel(op, i, prog, fin, vals, xs, fp, like):
    """Run structural instruction i with its op's forward kernel; False if it has none."""
    raise NotImplementedError("bound by the generated module (engine/codegen.py)")


def forward(prog, fin, vals, xs, fp, like, lo, hi):
    """Run instructions lo .. hi - 1; returns -1 when done, or the index of an instruction
    Python must run (resume at the next one)."""
    for i in range(lo, hi):
        op = prog[i * FW + F_OP]
        if op == PY_OP:
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
