"""Memory: a plan's arena lives as long as its compiled function, and replays allocate
nothing that outlives the call.

The arena (every intermediate of the step, preallocated) belongs to the plan; the plan
to its compiled function's cache. Dropping the compiled function, or a plan replaced
after a guard failure, frees them by reference counting (the tests run with the cycle
collector off). The plan must not keep the recording's tensors (arguments, results)
alive. 10,000 replays of a training step must leave the number of live objects and the
traced allocations where they were (a smaller count where the kernels run as Python).
"""
import gc
import tracemalloc
import weakref

import numba
import numpy as np
from compile_helpers import assert_plan, plans

import jitgrad

# where the kernels run as plain Python (CI's NUMBA_DISABLE_JIT pass) a replay costs ~100x more
N_REPLAYS = 300 if numba.config.DISABLE_JIT else 10_000


def ten(a, rg=False):
    return jitgrad.tensor(np.asarray(a, dtype=np.float64), requires_grad=rg)


def training_step(optimizer=jitgrad.optim.SGD, **opts):
    w = ten([0.5, -1.0, 2.0], rg=True)
    b = ten([0.1, 0.2, 0.3], rg=True)
    opt = optimizer([w, b], **opts)

    def step(x):
        loss = ((x * w + b).tanh() ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def arena_refs(c):
    (entry,) = plans(c)
    return weakref.ref(entry.plan), weakref.ref(entry.plan.arena)


def test_the_arena_is_freed_with_the_compiled_function(no_gc):
    c = jitgrad.compile(training_step(lr=0.1))
    outs = [c(ten([1.0, 2.0, 3.0])) for _ in range(3)]  # outputs the caller keeps
    plan, arena = arena_refs(c)
    assert arena() is not None
    del c
    assert plan() is None and arena() is None
    assert [float(o) for o in outs]  # the outputs are the caller's own copies


def test_every_plan_of_a_compiled_module_is_freed_with_it(no_gc):
    m = jitgrad.nn.Sequential(jitgrad.nn.Tanh())
    om = jitgrad.compile(m)
    with jitgrad.no_grad():
        for n in (2, 3, 4):
            om(ten(np.ones(n)))
            om(ten(np.ones(n)))
    refs = [weakref.ref(e.plan.arena) for e in plans(om._compiled)]
    assert len(refs) == 3
    del om
    assert all(r() is None for r in refs)
    assert m(ten([0.0])) is not None  # the module itself lives on


def test_a_plan_replaced_after_a_guard_failure_is_freed(no_gc):
    w = ten([0.5, -1.0], rg=True)

    def step(x):
        loss = (x * w).sum()
        loss.backward()
        return loss

    c = jitgrad.compile(step)
    c(ten([1.0, 2.0]))
    c(ten([1.0, 2.0]))
    old_plan, old_arena = arena_refs(c)
    w.data = ten([1.0, 1.0])  # the plan read the old array: re-record
    c(ten([1.0, 2.0]))
    assert old_plan() is None and old_arena() is None
    assert_plan(c)


def test_the_plan_keeps_no_tensor_of_the_recording(no_gc):
    c = jitgrad.compile(training_step(optimizer=jitgrad.optim.Adam, lr=0.01))
    x = ten([1.0, 2.0, 3.0], rg=True)
    out = c(x)
    refs = [weakref.ref(x), weakref.ref(out), weakref.ref(x.grad)]
    del x, out
    assert all(r() is None for r in refs)
    c(ten([1.0, 2.0, 3.0]))
    assert_plan(c)


def _live():
    gc.collect()
    return len(gc.get_objects())


def test_many_replays_grow_no_memory():
    c = jitgrad.compile(training_step(jitgrad.optim.Adam, lr=0.001, amsgrad=True))
    xs = [ten(np.random.default_rng(k).normal(size=3)) for k in range(4)]
    for k in range(50):  # record, then let every cache the replay fills be filled
        c(xs[k % 4])
    assert_plan(c)
    objects = _live()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(N_REPLAYS):
            c(xs[k % 4])
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a few hundred bytes of interpreter noise; 16 bytes a replay would be 4.8 kB even at 300 replays
    assert grown < 3072, f"{N_REPLAYS} replays left {grown} bytes allocated"
    assert _live() - objects < 10, "replays left objects behind"
