"""A damaged or unwritable on-disk cache, and a first backward from many threads (issue 8).

Every scenario runs in a subprocess whose caches point into tmp_path, so the shared cache
is never touched: JITGRAD_CACHE_DIR for the generated module (engine/codegen.py), and for
the compiled scenarios a copy of the package whose __pycache__ cannot be written. Each one
checks that the process exits 0, computes PyTorch's gradient, and says what happened in
exactly one CacheWarning.

Scenarios about the generated module file run with NUMBA_DISABLE_JIT=1 (no compile). The
ones about Numba's own .nbi/.nbc files need the JIT, and start from a copy of the already
compiled cache (compiling it only if there is none), so each recompiles one small function.
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

pytestmark = pytest.mark.skipif(USING_TORCH_AS_JITGRAD, reason="jitgrad's own cache")

JIT_DISABLED = os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")

# one backward, its gradient printed as JSON on the last line
SCRIPT = textwrap.dedent("""
    import json, jitgrad
    x = jitgrad.tensor([0.5, -1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
    ((x * x).sin() * x).sum().backward()
    print(json.dumps(x.grad.tolist()))
""")


# no temporary directory can be made either
NO_TMP = textwrap.dedent("""
    import tempfile
    def _no_tmp(*a, **k):
        raise PermissionError(13, "Permission denied")
    tempfile.mkdtemp = _no_tmp
""")


def expected_grad():
    torch = pytest.importorskip("torch")
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    ((x * x).sin() * x).sum().backward()
    return x.grad.tolist()


def module_source():
    from jitgrad.engine import codegen
    return codegen.module_source()


def run(code, cache, jit, pythonpath=ROOT, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONWARNINGS")}
    e.update(JITGRAD_CACHE_DIR=str(cache), NUMBA_DISABLE_JIT="0" if jit else "1", PYTHONPATH=str(pythonpath),
             **env)
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=e, cwd=str(pythonpath),
                          timeout=600)


def check(proc, warns):
    """Exit 0, PyTorch's gradient, and `warns` CacheWarnings (0 or 1); returns the warning's line."""
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    grad = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(grad, expected_grad(), rtol=1e-12, atol=1e-14)
    lines = [ln for ln in proc.stderr.splitlines() if "CacheWarning: jitgrad:" in ln]
    assert len(lines) == warns, proc.stderr[-3000:]
    return lines[0] if lines else ""


# --- the generated module (no JIT needed) -----------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncated", "other", "empty", "binary"])
def test_damaged_generated_module_is_rewritten(tmp_path, damage):
    name, src = module_source()
    path = tmp_path / f"{name}.py"
    bad = {"truncated": src[:len(src) // 2], "other": "x = 1\n", "empty": "", "binary": "\xff\x00\xfe"}[damage]
    path.write_bytes(bad.encode("latin-1"))
    line = check(run(SCRIPT, tmp_path, jit=False), warns=1)
    assert "damaged" in line and str(path) in line
    assert path.read_text() == src
    check(run(SCRIPT, tmp_path, jit=False), warns=0)  # and the next process loads it as it is


def test_unwritable_cache_dir_falls_back_to_a_temporary_one(tmp_path):
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "jitgrad"  # under a regular file: cannot be created, even by root
    line = check(run(SCRIPT, cache, jit=False), warns=1)
    assert "cannot write the generated backward module" in line and str(cache) in line


def test_no_writable_directory_at_all_runs_from_memory(tmp_path):
    (tmp_path / "file").write_text("")
    # no temporary directory can be made either: the module runs from its source, uncached
    line = check(run(NO_TMP + SCRIPT, tmp_path / "file" / "jitgrad", jit=False), warns=1)
    assert "using memory" in line


@pytest.mark.parametrize("jit", [False, True])
def test_no_writable_directory_at_all_loads_the_module(tmp_path, jit):
    # with the JIT the module's @njit(cache=True) functions have no file: numba keeps them in
    # memory (only loaded here: calling them would compile the whole engine)
    (tmp_path / "file").write_text("")
    code = NO_TMP + textwrap.dedent("""
        from jitgrad.engine import codegen
        m = codegen.load()
        assert callable(m.backward)
        print(getattr(getattr(m.backward, "_cache", None), "_enabled", None))  # numba's cache of it: off
    """)
    proc = run(code, tmp_path / "file" / "jitgrad", jit=jit)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [str(False if jit else None)]
    assert proc.stderr.count("CacheWarning: jitgrad:") == 1, proc.stderr[-3000:]


def test_first_backward_from_eight_threads(tmp_path):
    # a fresh cache directory and process: every thread's backward is the first and loads the module
    code = textwrap.dedent("""
        import json, threading, jitgrad
        n = 8
        start = threading.Barrier(n)
        grads, errors = [None] * n, []
        def work(i):
            x = jitgrad.tensor([0.5, -1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
            y = ((x * x).sin() * x).sum()
            start.wait()
            try:
                y.backward()
                grads[i] = x.grad.tolist()
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert all(g == grads[0] for g in grads), grads
        print(json.dumps(grads[0]))
    """)
    for _ in range(2):  # the race lost every time on the original code; twice for good measure
        shutil.rmtree(tmp_path / "c", ignore_errors=True)
        check(run(code, tmp_path / "c", jit=False), warns=0)


# --- Numba's cache files (JIT needed) ---------------------------------------------------------------

compiled = pytest.mark.skipif(JIT_DISABLED, reason="about Numba's on-disk cache, which NUMBA_DISABLE_JIT=1 has not "
                                                   "got; CI's compiled run covers it")


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A directory with the generated module and its compiled cache: copied from the real
    cache where it is there, else compiled once."""
    from jitgrad.engine import codegen

    name, _ = module_source()
    warm = tmp_path_factory.mktemp("warm")
    real = codegen.cache_dir()
    pyc = os.path.join(real, "__pycache__")
    have = [f for f in (os.listdir(pyc) if os.path.isdir(pyc) else []) if f.startswith(f"{name}.")]
    if any(f.startswith(f"{name}.backward-") and f.endswith(".nbi") for f in have):
        shutil.copy(os.path.join(real, f"{name}.py"), warm / f"{name}.py")
        (warm / "__pycache__").mkdir()
        for f in have:
            shutil.copy(os.path.join(pyc, f), warm / "__pycache__" / f)
    else:
        check(run(SCRIPT, warm, jit=True), warns=0)
    return warm, name


@compiled
def test_damaged_numba_cache_files_are_recompiled(tmp_path, warm_cache):
    warm, name = warm_cache
    cache = tmp_path / "c"
    shutil.copytree(warm, cache)
    pyc = cache / "__pycache__"
    # the index of the backward entry point, truncated; the data files of `finish`, which
    # compiling backward loads, overwritten
    (index,) = pyc.glob(f"{name}.backward-*.nbi")
    index.write_bytes(index.read_bytes()[:20])
    for data in pyc.glob(f"{name}.finish-*.nbc"):
        data.write_bytes(b"garbage")
    line = check(run(SCRIPT, cache, jit=True), warns=1)
    assert "is damaged" in line and "recompiling" in line
    check(run(SCRIPT, cache, jit=True), warns=0)  # both were rewritten: the next process loads them


def _package_without_writable_pycache(dest):
    """A copy of jitgrad whose __pycache__ directories are files: numba cannot cache next to it."""
    shutil.copytree(os.path.join(ROOT, "jitgrad"), dest / "jitgrad", ignore=shutil.ignore_patterns("__pycache__"))
    for d, _, _ in os.walk(dest / "jitgrad"):
        open(os.path.join(d, "__pycache__"), "w").close()


@compiled
def test_no_writable_numba_cache_dir(tmp_path, warm_cache):
    warm, _ = warm_cache
    _package_without_writable_pycache(tmp_path / "site")
    (tmp_path / "file").write_text("")
    code = textwrap.dedent(f"""
        import jitgrad
        assert jitgrad.__file__.startswith({str(tmp_path / "site")!r}), jitgrad.__file__
        w = jitgrad.tensor([1.0, 2.0], dtype=jitgrad.float64, requires_grad=True)
        w.grad = jitgrad.tensor([0.5, -1.0], dtype=jitgrad.float64)
        jitgrad.optim.SGD([w], lr=0.1).step()  # a kernel compiled and cached in the fallback directory
        assert abs(w[0].item() - 0.95) < 1e-12 and abs(w[1].item() - 2.1) < 1e-12, w
    """) + SCRIPT
    cache = tmp_path / "c"
    shutil.copytree(warm, cache)
    # numba's user cache (XDG_CACHE_HOME/numba) under a regular file: not writable either
    line = check(run(code, cache, jit=True, pythonpath=tmp_path / "site", XDG_CACHE_HOME=str(tmp_path / "file")),
                 warns=1)
    assert "no writable directory" in line
