"""Threads (issue 8, class 4): recording beside a backward over the same tape, several
threads accumulating into one shared leaf (hogwild), and a graph recorded in one thread
and run backward in another. Each test loops until a deadline (a few seconds) with a
tiny GIL switch interval, so that thread switches land inside jitgrad's critical steps.
"""
import sys
import threading
import time

import numpy as np
import pytest

import jitgrad as jg

torch = pytest.importorskip("torch")

SECONDS = 3.0


@pytest.fixture(autouse=True)
def _fast_switching():
    jg.tensor(1.0, requires_grad=True).sin().backward()  # the scheduler loads before threads start
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _run_threads(*targets):
    errors = []

    def guard(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            errors.append(repr(e))

    threads = [threading.Thread(target=guard, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
