"""Running a plan (compiler/plan.py) for a call whose guards hold.

Per call: the tensor arguments are copied into the arena; then each segment runs in
order. A forward stretch is one compiled call (engine/replayer.forward) that returns
only at an instruction Python must run; a backward is one compiled sweep over the
plan's tape copy (engine/scheduler.backward), whose leaf gradients are accumulated into
the parameters' .grad as eager's AccumulateGrad does; an optimizer's step() or
zero_grad() is that same call. Nothing here loops over the ops of the step.
"""
import numpy as np

from jitgrad._core.layout import HAS, SWEPT
from jitgrad.compiler.plan import BACKWARD, CALL, FWD
from jitgrad.compiler.recorder import param_ids
from jitgrad.engine.compiled import scheduler
from jitgrad.engine.executor import accumulate_grad, leaf_has_hooks
from jitgrad.graph.hooks import leaf_hooks
from jitgrad.graph.tensor import wrap


class GuardFailed(Exception):
    """A tensor from outside the call no longer holds what the plan reads: re-record."""


def check(plan, tensors):
    """The guards a call's signature cannot see: outside tensors, modules' modes and
    parameters, and hooks on the leaves a backward reaches (they must run: eagerly)."""
    for t, d, rg in plan.ext:
        if t._data is not d or t._requires_grad != rg:
            return False
    for m, training, params in plan.modules:
        if m.training != training or param_ids(m) != params:
            return False
    if leaf_hooks[0]:
        for seg in plan.segments:
            if seg[0] == BACKWARD and any(_hooked(tensors[arg] if p is None else p) for _, p, arg, _ in seg[1].leaves):
                return False
    return True


def _hooked(t):
    x = t._x
    acc = t._acc() if t._acc is not None else None
    return bool(x is not None and (x.hooks or x.post_hooks)) or (acc is not None and leaf_has_hooks(acc))


def run(plan, tensors):
    """Replay `plan` with the call's tensor arguments (in the order the recorder saw them)."""
    sched = scheduler()
    for k, arr in plan.args:
        np.copyto(arr, tensors[k]._data)
    for seg in plan.segments:
        kind = seg[0]
        if kind == FWD:
            lo, hi = seg[1], seg[2]
            while lo < hi:
                i = sched.forward(plan.prog, plan.fin, plan.vals, plan.xs, plan.fp, plan.like, lo, hi)
                if i < 0:
                    break
                _run_python(plan, i)
                lo = i + 1
        elif kind == BACKWARD:
            _backward(sched, plan, seg[1], tensors)
        elif kind == CALL:
            seg[1](*seg[2])
        else:  # SETGRAD
            t, arg, arr = seg[1:]
            t = tensors[arg] if t is None else t
            t._grad = None if arr is None else wrap(arr.copy())


def _run_python(plan, i):
    entry = plan.py.get(i)
    if entry is None:  # a structural op whose kernel returned False: a bug in the plan's build
        raise RuntimeError(f"jitgrad.compile: instruction {i} ({plan.names[i]}) has no forward kernel")
    fn, ins, outs = entry
    results = fn(*ins)
    for out, r in zip(outs, results):
        np.copyto(out, r)


def _backward(sched, plan, bp, tensors):
    if bp.vdst.size:
        sched.copy_saved(bp.vdst, bp.vsrc, plan.vals, bp.v)
    st = bp.st0.copy()
    seed = bp.seed if bp.seed_vid is None else plan.arrays[bp.seed_vid].reshape(-1)
    status, row, out, offs = sched.backward(bp.hdr, bp.edges, bp.xs, bp.fp, bp.slots, bp.v, st, bp.freed.copy(),
                                            bp.seed_rows, bp.seed_offs, seed, bp.sinks, bp.hi, True, bp.dt)
    if status != SWEPT:
        raise RuntimeError(f"jitgrad.compile: the replayed backward stopped at row {row} (status {status})")
    for i, (row, p, arg, keep) in enumerate(bp.leaves):
        if st[row] & HAS:
            p = tensors[arg] if p is None else p
            g = out[offs[i]:offs[i + 1]].reshape(bp.shapes[i])
            accumulate_grad(p, wrap(g), False, owned=True, alone=True)
            if keep is not None:  # ops later in the step read this .grad
                np.copyto(keep, p._grad._data)
