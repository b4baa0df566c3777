"""Very deep graphs: backward and graph teardown must not recurse.

Each scenario runs in a subprocess so that a crash (segfault / stack overflow
in a recursive destructor) is reported as a test failure instead of killing
the test session.
"""
import os
import subprocess
import sys
import textwrap
import time

from conftest import ROOT

PRELUDE = textwrap.dedent("""
    import gc, math, os, sys, time
    sys.path.insert(0, %r)
    if os.environ.get("JITGRAD_TESTS_USE_TORCH") == "1":
        import torch as jitgrad
    else:
        import jitgrad
    sys.setrecursionlimit(1000)  # the default: nothing may rely on a raised limit
""") % ROOT


# Generous bound (the chains take a few seconds): catches quadratic behaviour, not jitter.
MAX_SECONDS = 60.0


def run_script(body, timeout=180):
    code = PRELUDE + textwrap.dedent(body)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
    dt = time.perf_counter() - t0
    assert proc.returncode == 0, (
        f"subprocess failed with rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    assert "DONE" in proc.stdout, proc.stdout
    if os.environ.get("JITGRAD_TESTS_USE_TORCH") != "1":
        assert dt < MAX_SECONDS, f"deep-graph script took {dt:.1f}s"
    return proc.stdout, dt


def test_million_node_chain_backward_and_delete():
    out, dt = run_script("""
        N = 1_000_000
        x = jitgrad.tensor(1.0, dtype=jitgrad.float64, requires_grad=True)
        y = x
        for i in range(N):
            y = y * 1.0000001
        y.backward()
        expected = 1.0000001 ** N
        assert abs(x.grad.item() - expected) < 1e-9 * expected, (x.grad.item(), expected)
        assert abs(y.item() - expected) < 1e-9 * expected
        del y
        gc.collect()
        print("DONE")
    """)
    print(f"1M chain: {dt:.1f}s")


def test_million_node_alternating_chain_grad_and_teardown_without_backward():
    out, dt = run_script("""
        N = 500_000            # 2 nodes per iteration -> 1M nodes
        x = jitgrad.tensor(0.5, dtype=jitgrad.float64, requires_grad=True)
        y = x
        for i in range(N):
            y = y * 1.000001
            y = y + 1e-7
        (g,) = jitgrad.autograd.grad(y, x, retain_graph=True)
        expected = 1.000001 ** N
        assert abs(g.item() - expected) < 1e-9 * expected, (g.item(), expected)
        del g, y
        gc.collect()
        # a graph that is never differentiated must also tear down cleanly
        z = x
        for i in range(1_000_000):
            z = z - 1e-9 if i % 2 else z * 1.0
        assert abs(z.item() - (0.5 - 500_000e-9)) < 1e-9
        del z
        gc.collect()
        print("DONE")
    """)
    print(f"alternating chains: {dt:.1f}s")
