"""The generated backward module holds only what the op table determines; the scheduler is
real Python (engine/scheduler.py); the module's name hashes everything its compiled code
depends on, so no edit can load stale compiled code.

Nothing here compiles: module_source() and load() only generate, hash and import.
"""
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, USING_TORCH_AS_JITGRAD

pytestmark = pytest.mark.skipif(USING_TORCH_AS_JITGRAD, reason="jitgrad's own engine")


def _codegen():
    from jitgrad.engine import codegen
    return codegen


def _name():
    return _codegen().module_source()[0]


def test_generated_source_has_no_scheduler_body():
    from jitgrad.engine import scheduler
    _, src = _codegen().module_source()
    for name in scheduler.SCHEDULER:
        assert f"def {name}(" not in src, name
    assert "for row in range(hi" not in src  # the sweep's loop
    # what is generated: the per-op parts (the scalar formulas the sweep inlines, one
    # backward kernel per elementwise op for the kernel table), and the tables
    for name in ("def scalar_grads(", "def ew_", "OP_IS_EW =", "OP_NSAVED =", "bind_scheduler(globals())"):
        assert name in src, name
    from jitgrad.graph.spec import BY_OP
    for spec in BY_OP:
        if spec.kind == "ew":
            assert f"def {_codegen().ew_kernel_name(spec)}(" in src, spec.name
    # no dispatch to every kernel: the sweep reaches kernels through the table only
    assert "def run_kernel(" not in src and "def ew(" not in src


def test_scheduler_is_plain_python():
    from jitgrad.engine import scheduler
    for name in scheduler.SCHEDULER:
        fn = getattr(scheduler, name)
        assert inspect.isfunction(fn), name  # not a numba dispatcher: linted, covered, read as code
        assert fn.__code__.co_filename == scheduler.__file__
    assert "def sweep(" in inspect.getsource(scheduler)


def test_ruff_checks_the_scheduler():
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(ruff):
        pytest.skip("ruff not installed")
    path = os.path.join(ROOT, "jitgrad", "engine", "scheduler.py")
    proc = subprocess.run([ruff, "check", "--no-cache", path, "--show-files"], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert path in proc.stdout  # seen, not excluded
    proc = subprocess.run([ruff, "check", "--no-cache", path], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _with_text_changed(monkeypatch, path):
    """module_source() as if the file at `path` had one more line."""
    codegen = _codegen()
    real = codegen._read_bytes
    path = os.path.abspath(path)
    monkeypatch.setattr(codegen, "_read_bytes",
                        lambda p: real(p) + b"\n# edited\n" if os.path.abspath(p) == path else real(p))
    try:
        return _name()
    finally:
        monkeypatch.setattr(codegen, "_read_bytes", real)


@pytest.mark.parametrize("module", ["jitgrad.engine.scheduler", "jitgrad._core.layout",
                                    "jitgrad.kernels.common", "jitgrad.kernels.linalg", "jitgrad.kernels.blas"])
def test_name_changes_with_a_dependency(monkeypatch, module):
    base = _name()
    path = sys.modules[importlib.import_module(module).__name__].__file__
    assert _with_text_changed(monkeypatch, path) != base
    assert _name() == base


def test_name_changes_with_a_registered_kernels_module(monkeypatch, tmp_path):
    from jitgrad.graph.spec import BY_OP

    spec = next(s for s in BY_OP if s.kind == "struct" and s.kernel is not None and s.base == s.op)
    kernel = getattr(spec.kernel, "py_func", spec.kernel)
    base = _name()
    # the same kernel, registered from a module outside jitgrad (as a user's or a test's)
    src = f"from {kernel.__module__} import {kernel.__name__}  # noqa\n"
    path = tmp_path / "my_kernels.py"
    path.write_text(src + f"def {kernel.__name__}_here(*a):\n    return {kernel.__name__}(*a)\n")
    mspec = importlib.util.spec_from_file_location("my_kernels_for_test_codegen", path)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    monkeypatch.setattr(spec, "kernel", getattr(mod, f"{kernel.__name__}_here"))
    registered = _name()
    assert registered != base
    # an edit of that module's text (the generated source is the same) gives another name
    assert _with_text_changed(monkeypatch, path) != registered
    monkeypatch.undo()
    assert _name() == base


def test_scheduler_is_bound_to_the_generated_module():
    from numba.core import config

    from jitgrad.engine import scheduler
    codegen = _codegen()
    mod = codegen.load()
    for name in scheduler.SCHEDULER:
        fn = getattr(mod, name)
        py = getattr(fn, "py_func", fn)
        assert py.__globals__ is vars(mod), name  # calls reach the generated scalar_grads, ew, run_kernel
        if config.DISABLE_JIT:
            assert py.__code__ is getattr(scheduler, name).__code__  # coverage and tracebacks: scheduler.py
        else:
            # numba's cache is found through the file name: one set of entries per generated module
            assert py.__code__.co_filename == mod.__file__
            if name != "sweep":  # the sweep is compiled with scalar_grads' body in place of its call
                assert py.__code__.co_code == getattr(scheduler, name).__code__.co_code

