"""Threads (issue 8, class 4; issue 25, section 6): recording beside a backward over the
same tape, several threads accumulating into one shared leaf (hogwild), a graph recorded
in one thread and run backward in another, and threads running their first backward at
once. Each test loops until a deadline (a few seconds) with a tiny GIL switch interval,
so that thread switches land inside jitgrad's critical steps; every thread is joined
with a timeout, so a hang fails the test instead of hanging CI.
"""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import ROOT
from numba.core.config import DISABLE_JIT

import jitgrad as jg

torch = pytest.importorskip("torch")

SECONDS = 3.0
HANG = 60.0  # a thread still running this long after its test's deadline is stuck


@pytest.fixture(autouse=True)
def _fast_switching():
    jg.tensor(1.0, requires_grad=True).sin().backward()  # the scheduler loads before threads start
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _run_threads(*targets, timeout=SECONDS + HANG):
    """Run each target in its own thread; the errors they raised. A thread still alive
    after `timeout` fails the test (it is a daemon: a spinning one cannot block the exit)."""
    errors = []

    def guard(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            errors.append(repr(e))

    threads = [threading.Thread(target=guard, args=(fn,), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    assert not stuck, f"{stuck} of {len(threads)} threads still running after {timeout:.0f} s: a hang"
    return errors


@pytest.mark.parametrize("recorder", ["worker", "main"])
def test_recording_beside_backward_on_the_same_tape(recorder):
    """One thread keeps extending a chain y_k = y_{k-1} * c on its tape; the other runs
    backward over the latest y_k meanwhile: d y_k / d a = c ** k, and no error."""
    c = 1.001
    a = jg.tensor(np.linspace(0.5, 1.5, 257), requires_grad=True)
    latest = [None]
    stop = threading.Event()
    checked = [0]

    def record():
        while not stop.is_set():
            y, k = a * 1.0, 0
            while k < 400 and not stop.is_set():
                y, k = y * c, k + 1
                latest[0] = (y, k)

    def differentiate():
        deadline = time.monotonic() + SECONDS
        try:
            while time.monotonic() < deadline:
                got = latest[0]
                if got is None:
                    continue
                y, k = got
                (g,) = jg.autograd.grad(y.sum(), a, retain_graph=True)
                np.testing.assert_allclose(g.numpy(), np.full(257, c ** k), rtol=1e-9)
                checked[0] += 1
        finally:
            stop.set()

    errors = _run_threads(*((record, differentiate) if recorder == "worker" else (differentiate, record)))
    assert errors == []
    assert checked[0] > 0


@pytest.mark.parametrize("numel", [1_000_000])  # the scalar race: the test below
def test_hogwild_accumulation_is_exact(numel):
    """Threads each run forward and backward into one shared leaf: p.grad is the exact sum
    of all their gradients (PyTorch serialises AccumulateGrad per leaf)."""
    n_threads = 4
    deadline = time.monotonic() + SECONDS
    counts = [0] * n_threads
    p = jg.tensor(np.zeros(numel), requires_grad=True)

    def work(i):
        def run():
            while time.monotonic() < deadline:
                (p * 2.0).sum().backward()
                counts[i] += 1
        return run

    rounds = 0
    while time.monotonic() < deadline:  # from p.grad None each round: that race too
        p.grad = None
        before = list(counts)
        errors = _run_threads(*(work(i) for i in range(n_threads)))
        assert errors == []
        done = sum(counts) - sum(before)
        assert p.grad is not None or done == 0
        if done:
            np.testing.assert_array_equal(p.grad.numpy(), np.full(numel, 2.0 * done))
        rounds += 1
    assert sum(counts) >= 2  # at least two accumulations met (slow without the JIT: a few)


def test_many_short_hogwild_rounds_lose_no_first_update():
    """Each round starts at p.grad None and every thread does one backward: the first
    accumulation (None, then assign) is the racy one."""
    p = jg.tensor(0.0, requires_grad=True)
    deadline = time.monotonic() + SECONDS
    barrier = threading.Barrier(4)

    def once():
        y = p * 3.0
        barrier.wait()
        y.backward()

    n = 0
    while time.monotonic() < deadline:
        p.grad = None
        assert _run_threads(*([once] * 4)) == []
        assert p.grad.item() == 12.0, f"lost an update in round {n}"
        n += 1


def test_backward_in_a_worker_then_version_check_in_main():
    """A graph recorded in the main thread runs backward in a worker; later, main records
    more, modifies a saved input in place and runs backward: PyTorch's in-place error
    (not an IndexError), and an unmodified graph still gives the right gradient."""
    deadline = time.monotonic() + SECONDS
    n = 0
    while time.monotonic() < deadline or n < 3:
        a = jg.tensor(np.linspace(0.1, 1.0, 10), requires_grad=True)
        b = a * 2.0
        c = (b * b).sin().sum()
        assert _run_threads(c.backward) == []
        ta = torch.tensor(np.linspace(0.1, 1.0, 10), dtype=torch.float64, requires_grad=True)
        tb = ta * 2.0
        (tb * tb).sin().sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-12)

        x = a * 3.0
        y = x.sin()  # one saved array now, where the freed graph had three
        x.mul_(2.0)
        with pytest.raises(RuntimeError, match="one of the variables needed for gradient computation has been "
                                               "modified by an inplace operation"):
            y.sum().backward()
        a.grad = None
        (a * 5.0).sin().sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), 5.0 * np.cos(5.0 * a.detach().numpy()), rtol=1e-12)
        n += 1


# --- issue 25: lost updates into a shared small leaf ------------------------------------------
# Each thread records its own graphs, so the leaf's one AccumulateGrad gets a sink row in every
# thread's tape in turn; where its latest row is must be read as one (tape, row) pair, or a
# thread links its op to a row of its own tape that another thread's number names, and that
# gradient lands elsewhere (eight threads x 300 calls lost 0.6 to 4.2 of 2400).
N_THREADS, CALLS = 8, 300


def _calls(fn, n, deadline, count, i):
    """fn() n times in thread i, counted in count[i]; past the deadline (a loaded machine) it
    stops early, after at least one call, so that a test's time stays bounded."""
    def run():
        for _ in range(n):
            if count[i] and time.monotonic() > deadline:
                break
            fn()
            count[i] += 1
    return run


@pytest.mark.parametrize("numel", [1, 3])
def test_threads_recording_with_one_leaf_link_each_op_to_its_node(numel):
    """8 threads record ops on one shared leaf as fast as they can: every op's input edge
    leads to the leaf's AccumulateGrad (before, a row number of another thread's tape was
    read with this thread's tape: an edge to a wrong row, or past the end of the tape)."""
    p = jg.zeros(numel, requires_grad=True) if numel > 1 else jg.tensor(0.0, requires_grad=True)
    deadline = time.monotonic() + SECONDS
    wrong = []

    def record():
        while time.monotonic() < deadline:
            ys = [p * 0.5 for _ in range(50)]
            for y in ys:
                node = y.grad_fn.next_functions[0][0]
                if getattr(node, "variable", None) is not p:
                    wrong.append(type(node).__name__)

    assert _run_threads(*[record] * N_THREADS) == []
    assert wrong == []


def _shared_leaf_graph(kind, p, q):
    """A backward call into shared leaf p (and, for "retain_grad", shared non-leaf q): every
    call adds exactly 1.0 to each element of p.grad, from several uses of p."""
    if kind == "retain_grad":
        (q * 0.5 + q * 0.25 + q * 0.25).sum().backward(retain_graph=True)
        return
    y = (p * 0.5 + p * 0.25 + p * 0.25).sum()
    y.backward(create_graph=kind == "python")  # create_graph=True: the Python engine


@pytest.mark.parametrize("numel", [1, 3])
@pytest.mark.parametrize("kind", ["compiled", "python", "leaf_hook", "post_hook", "retain_grad"])
def test_threads_sharing_a_small_leaf_lose_no_update(kind, numel):
    """8 threads x 300 backward calls into one float32 leaf of one or three elements: p.grad
    is exactly 2400 (PyTorch accumulates each gradient under the leaf's lock), on every
    accumulation path: the compiled sweep, the Python engine, a leaf with a tensor hook, with
    a post-accumulate hook, and a shared retained non-leaf."""
    deadline = time.monotonic() + SECONDS / 2  # ten of these
    rounds = 0
    while rounds == 0 or time.monotonic() < deadline:
        p = jg.zeros(numel, dtype=jg.float32, requires_grad=True) if numel > 1 else \
            jg.tensor(0.0, dtype=jg.float32, requires_grad=True)
        q = handle = None
        seen = []
        if kind == "leaf_hook":
            handle = p.register_hook(lambda g: g * 1.0)
        elif kind == "post_hook":
            handle = p.register_post_accumulate_grad_hook(lambda t: seen.append(1))
        elif kind == "retain_grad":
            q = p * 1.0
            q.retain_grad()
        count = [0] * N_THREADS
        work = [_calls(lambda: _shared_leaf_graph(kind, p, q), CALLS, deadline, count, i) for i in range(N_THREADS)]
        assert _run_threads(*work) == []
        if handle is not None:
            handle.remove()
        want = np.full(p.shape, float(sum(count)), np.float32)  # 2400 unless the machine is slow
        got = (p if kind != "retain_grad" else q).grad
        np.testing.assert_array_equal(got.detach().numpy(), want, err_msg=f"round {rounds}")
        if kind == "post_hook":
            assert len(seen) >= sum(count)  # (once per sink row the leaf has in a call's tape)
        rounds += 1


def test_a_fresh_leaf_first_used_by_threads_at_once():
    """Each round a new leaf, which threads released together by a barrier record with and
    differentiate into: its per-tensor state and its AccumulateGrad are made once (two made
    at once would drop the .grad or the node written into the first), p.grad exact."""
    deadline = time.monotonic() + SECONDS
    barrier = threading.Barrier(N_THREADS)
    n = 0
    while n < 3 or time.monotonic() < deadline:
        p = jg.tensor(0.0, requires_grad=True)

        def once():
            barrier.wait()
            (p * 0.5 + p * 0.5).backward()

        assert _run_threads(*[once] * N_THREADS) == []
        assert p.grad.item() == N_THREADS, f"lost an update in round {n}"
        n += 1


# --- issue 25: threads running their first backward at once ------------------------------------
_FIRST_BACKWARD = textwrap.dedent("""
    import os, sys, threading, time
    import jitgrad as jg
    sys.setswitchinterval(1e-6)
    n = 16
    barrier = threading.Barrier(n)
    done = []

    def work(i):
        x = jg.ones(5, dtype=jg.float32 if i % 2 else jg.float64, requires_grad=True)
        y = (x * 2.0).sin().sum()
        barrier.wait()
        y.backward()  # the first backward of the process, in 16 threads at once
        done.append(float(x.grad.sum()))

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + float(sys.argv[1])
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    print("stuck", sum(t.is_alive() for t in threads), "done", len(done), flush=True)
    os._exit(0)  # a stuck daemon thread must not keep the process alive
""")


def test_first_backward_in_many_threads_at_once_finishes():
    """A fresh process whose first backward runs in 16 threads at once: each dtype's kernel
    table is built once (two built at once left a thread sweeping with the orphaned one,
    told NEED_KERNEL forever: a hang at 100% CPU). The kernels are on disk already (this
    process compiled them), so each child takes about a second; the race is in-process."""
    for dt in (jg.float32, jg.float64):  # compile (or load) them here, into the shared cache
        x = jg.ones(5, dtype=dt, requires_grad=True)
        (x * 2.0).sin().sum().backward()
    env = {**os.environ, "PYTHONPATH": ROOT}
    join_s = 10.0
    deadline = time.monotonic() + 2 * SECONDS
    tries = 0
    while tries < 3 or (tries < 6 and time.monotonic() < deadline):  # (16 threads hung 5 tries in 8)
        p = subprocess.run([sys.executable, "-c", _FIRST_BACKWARD, str(join_s)], capture_output=True, text=True,
                           env=env, timeout=join_s + 120, check=False)
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.split()[-4:] == ["stuck", "0", "done", "16"], \
            f"try {tries}: threads hung in their first backward: {p.stdout.strip()}"
        tries += 1


def test_a_kernel_table_that_is_never_filled_raises_instead_of_spinning(monkeypatch):
    """The retry after NEED_KERNEL must make progress: a sweep handed a table that compiling
    does not fill (what the orphaned table was) raises jitgrad's internal error at once."""
    from jitgrad.engine import compiled
    from jitgrad.engine.kernel_table import KernelTables

    real = KernelTables.__getitem__
    monkeypatch.setattr(KernelTables, "__getitem__", lambda self, code: np.where(real(self, code) < 0, -1, 0))
    x = jg.ones(5, requires_grad=True)
    y = (x * 2.0).sin().sum()
    errors = []

    def run():
        try:
            y.backward()
        except RuntimeError as e:
            errors.append(str(e))

    assert _run_threads(run, timeout=HANG) == []
    assert len(errors) == 1 and "is still missing after compiling it" in errors[0], errors
    assert compiled.scheduler().KERNELS is not None


def test_a_compiled_step_and_eager_backward_share_a_parameter():
    """Threads replaying a jitgrad.compile step and threads running eager backward into the
    same large parameter: the replay's AccumulateGrad (first assignment, then numpy's +=, which
    releases the GIL on large arrays) takes the leaf's lock too, so w.grad is exact."""
    # numpy releases the GIL in a large +=: the longer it takes, the likelier two overlap
    # (without the JIT the kernels are Python loops: a smaller one)
    n, calls = (20_000, 5) if DISABLE_JIT else (200_000, 30)
    w = jg.zeros(n, requires_grad=True)
    x = jg.ones(n)

    def f(x):
        (w * x).sum().backward()

    step = jg.compile(f)
    for _ in range(3):  # recorded, then replayed
        step(x)
    deadline = time.monotonic() + SECONDS
    rounds = 0
    while rounds < 2 or time.monotonic() < deadline:
        w.grad = None
        count = [0] * 4
        work = [_calls(lambda: step(x), calls, deadline, count, 0),
                _calls(lambda: (w * x).sum().backward(), calls, deadline, count, 1),
                _calls(lambda: step(x), calls, deadline, count, 2),
                _calls(lambda: (w * x).sum().backward(), calls, deadline, count, 3)]
        assert _run_threads(*work) == []
        np.testing.assert_array_equal(w.grad.numpy(), np.full(n, float(sum(count))), err_msg=f"round {rounds}")
        rounds += 1
