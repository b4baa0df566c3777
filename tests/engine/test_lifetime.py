"""Graph lifetime and tape boundaries: memory is released by reference counting alone,
and gradients cross from one tape into an older one (EXT rows) correctly."""
import threading
import weakref

import numpy as np
import pytest

import jitgrad as J

torch = pytest.importorskip("torch")


def test_graph_is_freed_without_the_cycle_collector(no_gc):
    w = J.randn(64, 64, requires_grad=True)
    y = (J.randn(8, 64) @ w).relu().sum()
    tape = weakref.ref(y._tape)
    y.backward()
    del y
    assert tape() is None


def test_forward_only_loop_does_not_pin_earlier_graphs(no_gc):
    # each forward saves > 1 MB, so the next one starts a new tape; dropping the
    # previous output must free its graph (as PyTorch frees it)
    w = J.randn(512, 512, requires_grad=True)
    x = J.randn(256, 512)
    first = (x @ w).relu().sum()
    tape = weakref.ref(first._tape)
    second = (x @ w).relu().sum()
    assert second._tape is not first._tape
    del first
    assert tape() is None
    second.backward()
    assert w.grad is not None


def test_gradient_crosses_into_an_older_tape():
    for T in (J, torch):
        x = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
        a = -(x + 1.0)                   # first graph (saves nothing); backward closes its tape
        a.sum().backward()
        b = (a * x).sum()                # new tape: edges into the old one, and x again
        b.backward()
        if T is J:
            assert b._tape is not a._tape
            got = x.grad.numpy()
        else:
            want = x.grad.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_create_graph_across_tapes():
    out = []
    for T in (J, torch):
        x = T.tensor([0.5, -1.5], dtype=T.float64, requires_grad=True)
        a = x.exp()
        a.sum().backward(retain_graph=True)
        J.graph.tape.close_current_tape() if T is J else None  # force a tape boundary
        y = (a * x * x).sum()                # x reached from both tapes
        (g,) = T.autograd.grad(y, x, create_graph=True)
        (h,) = T.autograd.grad(g.sum(), x)
        out.append((g.detach().numpy(), h.numpy()))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-12)
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-12)


def test_backward_from_eight_threads():
    errors = []
    results = {}

    def work(k):
        try:
            x = J.tensor(np.linspace(0.1, 1.0, 50) * (k + 1), dtype=J.float64, requires_grad=True)
            for _ in range(20):
                x.grad = None
                y = (x.sin() * x).sum()
                y.backward()
            results[k] = x.grad.numpy().copy()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, g in results.items():
        x = np.linspace(0.1, 1.0, 50) * (k + 1)
        np.testing.assert_allclose(g, np.cos(x) * x + np.sin(x), rtol=1e-12)
