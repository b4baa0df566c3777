"""Running a plan (compiler/plan.py) for a call whose guards hold.

Per call: the tensor arguments are copied into the arena; then each segment runs in
order. A forward stretch is one compiled call (engine/replayer.forward) that returns
only at an instruction Python must run; a backward is one compiled sweep over the
plan's tape copy (engine/scheduler.backward), whose leaf gradients are accumulated into
the parameters' .grad as eager's AccumulateGrad does; an optimizer's step() or
zero_grad() is that same call. Nothing here loops over the ops of the step.
"""
import threading
import weakref

import numpy as np

from jitgrad._core import versions
from jitgrad._core.layout import HAS, HW, SWEPT
from jitgrad._core.threads import leaf_lock
from jitgrad.compiler.plan import BACKWARD, CALL, FUSED, FWD, STEP
from jitgrad.engine.compiled import scheduler
from jitgrad.engine.executor import accumulate_grad, active_group, leaf_has_hooks
from jitgrad.graph.hooks import leaf_hooks
from jitgrad.graph.record import accumulator
from jitgrad.graph.tape import Tape, close_current_tape
from jitgrad.graph.tensor import wrap

# check()'s answer when leaves the plan's backward reaches have hooks: the call runs eagerly
# (the hooks must run, an optimizer stepped from a post-accumulate-grad hook among them) and
# the plan is kept for calls made once the hooks are gone; recording again would not help
HOOKED = "hooked"


def check(plan, tensors):
    """The guards a call's signature cannot see, on tensors: outside tensors' arrays and
    requires_grad (False: record again), and hooks on the leaves a backward reaches
    (HOOKED). (What the step reached by name, modules included: compiler/guards.py.)"""
    for t, d, rg in plan.ext:
        if t._data is not d or t._requires_grad != rg:
            return False
    if leaf_hooks[0]:
        for bp in plan.backwards:
            if any(_hooked(tensors[arg] if p is None else p) for _, p, arg, _ in bp.leaves):
                return HOOKED
    return True


def _hooked(t):
    x = t._x
    acc = t._acc() if t._acc is not None else None
    return (bool(x is not None and (x.hooks or x.post_hooks or active_group(x)))
            or (acc is not None and leaf_has_hooks(acc)))


def run(plan, tensors):
    """Replay `plan` with the call's tensor arguments (in the order the recorder saw them)."""
    sched = scheduler()
    for k, arr in plan.args:
        np.copyto(arr, tensors[k]._data)
    _run(sched, plan, plan.segments, tensors)
    if plan.fixed_views:
        _release_grads(plan)


def _run(sched, plan, segments, tensors):
    for seg in segments:
        kind = seg[0]
        if kind == FUSED:
            if not _fused(sched, plan, seg[1], seg[2], tensors):
                _run(sched, plan, seg[1], tensors)
        elif kind == FWD:
            lo, hi = seg[1], seg[2]
            while lo < hi:
                i = sched.forward(plan.prog, plan.fin, plan.vals, plan.xs, plan.fp, plan.like, lo, hi)
                if i < 0:
                    break
                _run_python(plan, i)
                lo = i + 1
        elif kind == BACKWARD:
            _backward(sched, plan, seg[1], tensors)
        elif kind == STEP:
            if seg[2] is None or not seg[2]():
                seg[1].step()
        elif kind == CALL:
            seg[1](*seg[2])
        else:  # SETGRAD
            t, arg, arr = seg[1:]
            t = tensors[arg] if t is None else t
            t._grad = None if arr is None else wrap(arr.copy())


def _fused(sched, plan, three, packed, tensors):
    """forward, backward and the optimizer's step in one compiled call (engine/replayer.
    train_step_packed), when every parameter's .grad is None before it (as a zero_grad()
    ending the last step leaves it) and the optimizer's tables hold; False: run them apart."""
    bp, fast = three[1][1], three[2][2]
    for _, p, arg, _ in bp.leaves:
        if (tensors[arg] if p is None else p)._grad is not None:
            return False
    if not fast.ready(False) or fast.flags(fast.groups[0]) != packed[6]:
        return False
    ints, floats, data, states, freed, sc, _ = packed
    sc[...] = fast.scalars(fast.groups[0])
    status = sched.train_step_packed(ints, floats, data, states, freed, bp.kernels(sched))
    st = states[states.size // 2:]
    if status != SWEPT:
        raise RuntimeError(f"jitgrad.compile: the replayed backward stopped (status {status})")
    alone = threading.active_count() == 1  # as in engine/run.py: then no leaf lock is needed
    for (row, p, arg, keep), view in zip(bp.leaves, bp.views):
        if st[row] & HAS:
            p = tensors[arg] if p is None else p
            _publish(p, wrap(view if arg is None else view.copy()), alone)
            if keep is not None:
                np.copyto(keep, p._grad._data)
    fast.bump()
    return True


def _publish(p, g, alone):
    """AccumulateGrad into p.grad, under p's leaf lock unless this is the only thread: a
    parameter can be shared with another thread's eager backward or compiled step (hogwild),
    and `.grad is None, then assign` must not race with its accumulation."""
    if not alone:
        with leaf_lock(p):
            return _publish(p, g, True)
    if p._grad is None:  # AccumulateGrad's first gradient: the plan's buffer itself, no copy
        p._grad = g
    else:
        accumulate_grad(p, g, False, alone=True)


def _run_python(plan, i):
    entry = plan.py.get(i)
    if entry is None:  # a structural op whose kernel returned False: a bug in the plan's build
        raise RuntimeError(f"jitgrad.compile: instruction {i} ({plan.names[i]}) has no forward kernel")
    fn, ins, outs = entry
    results = fn(*[plan.array(k) for k in ins])
    for k, r in zip(outs, results):
        np.copyto(plan.array(k), r)


def outputs(plan, vids, tensors):
    """The call's returned tensors, value id -> Tensor: fresh copies (the arena is rewritten
    by the next call), and for a plan in graph mode linked to this call's graph."""
    made = {k: wrap(plan.array(k).copy()) for k in vids}
    if plan.graph is not None:
        _give_graph(plan, made, tensors)
    return made


def _accumulator(t):
    """t's AccumulateGrad node, made as recording makes it (graph/record._leaf_row)."""
    ref = t._acc
    acc = ref() if ref is not None else None
    return acc if acc is not None else accumulator(t)


class _ArenaKeep(list):
    """tape.keep of a graph mode call's tape: the arena, then per saved value a parameter's
    array or (first byte, end byte, shape, dtype) in the arena (plan._graph), made a view when first
    read: only the Python engine reads saved values from keep (create_graph=True, anomaly
    mode), so a call does not pay for a view per saved value."""
    __slots__ = ()

    def __getitem__(self, i):
        x = list.__getitem__(self, i)
        if type(x) is tuple:
            lo, hi, shape, dtype = x
            x = list.__getitem__(self, 0)[lo:hi].view(dtype).reshape(shape)
            list.__setitem__(self, i, x)
        return x


def _give_graph(plan, made, tensors):
    """A graph mode plan's call: a tape over this call's arena, like the recorded one, whose
    rows the returned tensors point at; then a new arena for the next call. A later
    backward runs through it as through any tape."""
    gp = plan.graph
    tape = Tape()
    n = gp.hdr.size // HW
    slots = gp.slots.copy()
    slots[gp.arena_slots] += plan.arena.ctypes.data - gp.base0
    v = gp.v.copy()
    if gp.vdst.size:
        scheduler().copy_saved(gp.vdst, gp.vsrc, plan.vals, v)
    tape.keep = _ArenaKeep(gp.keep)
    tape.keep.insert(0, plan.arena)
    # what eager's graph would have saved, checked at backward as eager's (plan._version_checks):
    # a parameter, an argument or a returned tensor changed in place before backward() raises
    for slot, row, arr, arg, out in gp.checks:
        src = arr if arr is not None else tensors[arg]._data if arg is not None else made[out]._data
        tape.kept.append((slot, row, versions.stamp(src)))
    for col, arr in ((tape.hdr, gp.hdr), (tape.edges, gp.edges), (tape.fp, gp.fp), (tape.slots, slots),
                     (tape.v64 if v.dtype == np.float64 else tape.v32, v)):
        col.frombytes(arr.tobytes())
    del tape.xs[:]
    tape.xs.frombytes(gp.xs.tobytes())
    tape.nrows = n
    tape.keep_bytes = plan.arena.nbytes
    tape.closed = True   # later ops start their own tape, with edges into this one
    # ...and so must the ops on the current tape: a backward sweeps tapes newest first, so
    # edges may only go from a newer tape into an older one (engine/compiled._tapes_from)
    close_current_tape()
    for row, arr, arg in gp.consts:  # one-element values copied into the tape: as in eager (ops/inplace.py)
        tape.note_inline_const(arr if arr is not None else tensors[arg]._data, row)
    for row, acc, arg in gp.leaves:
        if acc is None:
            acc = _accumulator(tensors[arg])
        tape.leaves[row] = acc
        acc._at = (weakref.ref(tape), row)
    for k, (row, nr) in gp.outputs.items():
        t = made[k]
        t._requires_grad = True
        t._tape, t._row, t._output_nr = tape, row, nr
    plan.rebase()


def _backward(sched, plan, bp, tensors):
    if bp.vdst.size:
        sched.copy_saved(bp.vdst, bp.vsrc, plan.vals, bp.v)
    if bp.fixed:
        for (_, p, arg, _), view in zip(bp.leaves, bp.views):
            p = tensors[arg] if p is None else p
            g = p._grad
            if g is not None and g._data is view:  # a second backward in the step rewrites the buffer
                p._grad = wrap(view.copy())
    st = bp.st0.copy()
    seed = bp.seed if bp.seed_vid is None else plan.array(bp.seed_vid).reshape(-1)
    status, row = sched.backward_into(bp.hdr, bp.edges, bp.xs, bp.fp, bp.slots, bp.v, st, bp.freed,
                                      bp.seed_rows, bp.seed_offs, seed, bp.sinks, bp.hi, True, bp.dt,
                                      bp.kernels(sched), bp.out)
    if status != SWEPT:
        raise RuntimeError(f"jitgrad.compile: the replayed backward stopped at row {row} (status {status})")
    # the .grads: views of the plan's buffer where an optimizer step of the plan reads them
    # there (bp.fixed; _release_grads hands over copies of any left at the end), else
    # views of this call's own copy of it, which nothing rewrites
    out = bp.out if bp.fixed else bp.out.copy()
    has = (st[bp.sinks] & HAS).tolist()
    fixed = out is bp.out
    alone = threading.active_count() == 1
    for (row, p, arg, keep), (lo, hi, shape), view, h in zip(bp.leaves, bp.spans, bp.views, has):
        if not h:
            continue
        if p is None:
            p = tensors[arg]
        # (the plan's own view object: _release_grads and the optimizer step know it by identity)
        g = (view if arg is None else view.copy()) if fixed else out[lo:hi].reshape(shape)
        _publish(p, wrap(g), alone)
        if keep is not None:  # ops later in the step read this .grad
            np.copyto(keep, p._grad._data)


def _release_grads(plan):
    """A .grad still on the plan's buffer when the step returns is handed over as a copy:
    the next replay rewrites the buffer, and eager would have made a new tensor."""
    for p, view in plan.grad_views:
        g = p._grad
        if g is not None and g._data is view:
            p._grad = wrap(view.copy())
