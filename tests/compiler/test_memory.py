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
N_REPLAYS = 500 if numba.config.DISABLE_JIT else 10_000


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


def growth(call, total):
    """(bytes, objects) that a window of calls leaves allocated, out of `total` calls: a
    fifth traced first, then the smaller of two windows of two fifths. Caches that turn
    over (numpy's array headers, ctypes views of the arenas) move the count by a few kB,
    once; a leak grows both windows."""
    n = 2 * total // 5
    tracemalloc.start()
    try:
        for _ in range(total - 2 * n):
            call()
        windows = []
        for _ in range(2):
            objects = _live()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(n):
                call()
            gc.collect()
            windows.append((tracemalloc.get_traced_memory()[0] - before, _live() - objects))
        return min(b for b, _ in windows), max(o for _, o in windows)
    finally:
        tracemalloc.stop()


def test_many_replays_grow_no_memory():
    c = jitgrad.compile(training_step(jitgrad.optim.Adam, lr=0.001, amsgrad=True))
    xs = [ten(np.random.default_rng(k).normal(size=3)) for k in range(4)]
    k = [0]

    def call():
        k[0] += 1
        c(xs[k[0] % 4])

    call()
    assert_plan(c)
    grown, objects = growth(call, N_REPLAYS)
    # a few hundred bytes of noise; 16 bytes a replay would be 64 kB over a window of 4,000
    assert grown < 4096, f"replays left {grown} bytes allocated"
    assert objects < 10, "replays left objects behind"


class Net(jitgrad.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = jitgrad.nn.Parameter(ten(np.linspace(-1.0, 1.0, 16)))

    def forward(self, x):
        return ((x * self.w).tanh() * 2.0).sum(-1)


def test_graphs_handed_out_by_a_compiled_module_are_freed():
    """A compiled module's forward hands each call a graph over an arena of its own (graph
    mode): trained with backward outside, calls leave nothing behind."""
    m = Net()
    om = jitgrad.compile(m)
    opt = jitgrad.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = ten(np.random.default_rng(0).normal(size=(4, 16)))

    def train():
        loss = (om(x) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    train()
    assert_plan(om._compiled)
    grown, objects = growth(train, N_REPLAYS // 5)
    # a call's arena alone is over 1 kB
    assert grown < 4096, f"calls left {grown} bytes allocated"
    assert objects < 10, "calls left objects behind"
