"""Kernels compile on first use, one cache entry each (issue 14).

- a process compiles only the kernels its graphs use, and says so once on stderr;
- the next process loads them from the cache: nothing is compiled again, nothing is said;
- editing a helper the kernels share (kernels/common.py) makes every entry stale, even
  those of kernels whose own file did not change (Numba alone only checks that file);
- a kernel called through the table raises into Python like a direct call;
- the verbosity controls.

The cache scenarios run in subprocesses on a copy of the package with private caches in
tmp_path, so they compile (the compiled pass of CI runs them; they skip without the JIT).
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT, USING_TORCH_AS_JITGRAD

pytestmark = pytest.mark.skipif(USING_TORCH_AS_JITGRAD, reason="jitgrad's own engine")

JIT_DISABLED = os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")
needs_jit = pytest.mark.skipif(JIT_DISABLED, reason="compiles in subprocesses: the compiled pass runs it")

# one backward through mul (elementwise, of 3 elements: a generated kernel) and sum_all (a
# structural one, kernels/reduce.py); then what each kernel's dispatcher did
SCRIPT = textwrap.dedent("""
    import json, jitgrad
    from jitgrad.engine.compiled import scheduler
    from jitgrad.graph.spec import BY_OP
    x = jitgrad.tensor([0.5, -1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
    (x * x).sum().backward()
    tables = scheduler().KERNELS
    stats = {}
    for name in ("mul", "sum_all", "exp"):
        k = tables.kernel(next(s for s in BY_OP if s.name == name))
        stats[name] = [sum(k._cache_misses.values()), sum(k._cache_hits.values()), len(k.overloads)]
    print(json.dumps({"grad": x.grad.tolist(), "kernels": stats}))
""")


def _run(pkg, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "JITGRAD_VERBOSITY")}
    env.update(JITGRAD_CACHE_DIR=str(tmp_path / "jc"), NUMBA_CACHE_DIR=str(tmp_path / "nc"), NUMBA_DISABLE_JIT="0",
               PYTHONPATH=str(pkg))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=str(pkg),
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(out["grad"], [1.0, -2.0, 4.0])
    compiling = [ln for ln in proc.stderr.splitlines() if ln.startswith("jitgrad: compiling")]
    return out["kernels"], compiling


@needs_jit
def test_kernels_compile_once_load_next_time_and_go_stale_with_their_helpers(tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(os.path.join(ROOT, "jitgrad"), pkg / "jitgrad", ignore=shutil.ignore_patterns("__pycache__"))

    # a cold process: compiles mul's and sum's kernels (not exp's, unused), says so once
    kernels, said = _run(pkg, tmp_path)
    assert kernels["mul"][0] > 0 and kernels["sum_all"][0] > 0
    assert kernels["exp"][2] == 0
    assert len(said) == 1 and "mul" in said[0] and "sum_all" in said[0], said

    # the next process loads both from the cache, and has nothing to say
    kernels, said = _run(pkg, tmp_path)
    assert kernels["mul"][:2] == [0, 1] and kernels["sum_all"][:2] == [0, 1], kernels
    assert said == []

    # a shared helper changes: every entry is stale, also sum's, whose file did not change
    common = pkg / "jitgrad" / "kernels" / "common.py"
    common.write_text(common.read_text() + "\n# edited\n")
    kernels, said = _run(pkg, tmp_path)
    assert kernels["mul"][0] > 0 and kernels["sum_all"][0] > 0, kernels
    assert len(said) == 1


def test_a_kernel_that_raises_raises_through_the_table():
    """The sweep calls kernels by address; an exception in one must reach Python as if the
    kernel had been called directly (compiled: through Numba's status code)."""
    from numba import njit

    from jitgrad.kernels import table

    def bad(row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
        if row < 0:
            raise ValueError("negative row")
        g1[row] += 1.0

    kernel = njit(bad)
    addr = table.address(kernel, table.kernel_signature(np.float64))

    @njit
    def caller(addr, row, i64, f64, u8):
        table.call_kernel(addr, row, i64, i64, i64, f64, i64, f64, f64, i64, i64, u8)

    i64, f64, u8 = np.zeros(1, np.int64), np.zeros(1), np.zeros(1, np.uint8)
    caller(addr, 0, i64, f64, u8)
    assert f64[0] == 1.0  # (g1 is f64: the kernel ran on it)
    with pytest.raises(ValueError, match="negative row"):
        caller(addr, -1, i64, f64, u8)


def test_verbosity(monkeypatch, capsys):
    from jitgrad._core import verbosity

    monkeypatch.setitem(verbosity._state, "said", set())
    monkeypatch.setitem(verbosity._state, "level", None)
    monkeypatch.setenv("JITGRAD_VERBOSITY", "0")
    verbosity.compiling(["kernels for mul"])
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("JITGRAD_VERBOSITY")
    verbosity.compiling(["kernels for mul"])
    verbosity.compiling(["kernels for exp"])  # once per process
    verbosity.compiling(["kernels for softmax"], "forward")  # and once for compiled forwards
    verbosity.compiling(["kernels for conv2d"], "forward")
    assert capsys.readouterr().err.splitlines() == ["jitgrad: compiling kernels for mul (first use; cached afterwards)",
                                                   "jitgrad: compiling kernels for softmax (first use; cached afterwards)"]
    import jitgrad
    jitgrad.set_verbosity(2)
    assert jitgrad.get_verbosity() == 2
    verbosity.compiling(["kernels for exp"])
    verbosity.compiled(["kernels for exp"], 1.5)
    assert capsys.readouterr().err.splitlines() == [
        "jitgrad: compiling kernels for exp (first use; cached afterwards)", "jitgrad: compiled kernels for exp in 1.50 s"]
    jitgrad.set_verbosity(0)
    verbosity.compiling(["kernels for exp"])
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="set_verbosity expects a non-negative int"):
        jitgrad.set_verbosity(-1)
