"""`import jitgrad` stays short: what it need not load, it does not (checked in a fresh
process, without timing: benchmarks/startup.py measures the seconds), and every name it
loads late still works."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, USING_TORCH_AS_JITGRAD

import jitgrad

pytestmark = pytest.mark.skipif(USING_TORCH_AS_JITGRAD, reason="about jitgrad's own imports")

# modules `import jitgrad` must leave unloaded: optional, heavy or only needed by a feature
# that is not used yet
NOT_AT_IMPORT = [
    "jitgrad.compiler", "jitgrad.func", "jitgrad.utils", "jitgrad.viz", "jitgrad.serialization", "jitgrad.cuda",
    "jitgrad.backends", "jitgrad.accelerator", "jitgrad.distributed", "mpi4py",
    "jitgrad.gpu.sweep", "jitgrad.gpu.kernels",   # the CUDA backward: loaded with the first CUDA tensor's backward
    "numba.cuda", "graphviz", "torch", "scipy.special", "matplotlib", "tqdm",
    # (SciPy's BLAS: _core/threads.py loads it at import where numpy's own cannot be used;
    # numba loads it at its first compile, through kernels/_scipyblas.py: tested below)
]


def _fresh(code, **env):
    """Run `code` in a fresh interpreter that imports this checkout's jitgrad; its last
    stdout line, parsed as JSON."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    e.update(env)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_leaves_optional_parts_unloaded():
    loaded = _fresh(
        "import json, sys; import jitgrad; "
        f"print(json.dumps([m for m in {NOT_AT_IMPORT!r} if m in sys.modules]))")
    assert loaded == []


def test_a_small_backward_leaves_them_unloaded_too():
    # the eager CPU path of a forward and backward needs none of them either (but numba,
    # when the backward is compiled, needs SciPy's BLAS extension)
    code = ("import json, sys; import jitgrad as T; x = T.ones(3, requires_grad=True); (x * 2).sum().backward(); "
            f"assert x.grad.tolist() == [2.0, 2.0, 2.0]; print(json.dumps([m for m in {NOT_AT_IMPORT!r} "
            "if m in sys.modules and m != 'scipy.linalg.cython_blas']))")
    assert _fresh(code) == []


def test_late_names_resolve_to_their_modules():
    import jitgrad.compiler
    import jitgrad.func
    import jitgrad.serialization
    for name, (module, attr) in jitgrad._LAZY.items():
        mod = sys.modules.get(module) or __import__(module, fromlist=["_"])
        assert getattr(jitgrad, name) is (mod if attr is None else getattr(mod, attr)), name
        assert name in dir(jitgrad)
    assert jitgrad.compile is jitgrad.compiler.compile
    assert jitgrad.func.vmap is not None and jitgrad.save is jitgrad.serialization.save


def test_late_names_work_in_a_fresh_process():
    # each first reached as an attribute, the way user code (`torch.func.vmap(...)`) does
    code = """
import json
import jitgrad as T
x = T.arange(6.0).reshape(2, 3)
out = {
    "vmap": T.func.vmap(lambda r: r.sum())(x).tolist(),
    "cuda": T.cuda.is_available() in (True, False),
    "mps": T.backends.mps.is_available(),
    "accelerator": T.accelerator.device_count() >= 0,
    "compile": callable(T.compile(lambda a: a * 2)),
    "data": len(T.utils.data.TensorDataset(x)),
    "viz": T.viz.print_graph.__name__,
    "save": callable(T.save) and callable(T.load),
    "grad": T.autograd.grad((x.requires_grad_() * 3).sum(), x)[0].tolist(),
}
print(json.dumps(out))
"""
    out = _fresh(code)
    assert out == {"vmap": [3.0, 12.0], "cuda": True, "mps": False, "accelerator": True, "compile": True, "data": 2,
                   "viz": "print_graph", "save": True, "grad": [[3.0] * 3] * 2}


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'jitgrad' has no attribute 'no_such_thing'"):
        jitgrad.no_such_thing  # noqa: B018


def test_numba_finds_scipys_blas_without_the_scipy_linalg_package():
    # numba's first compile imports scipy.linalg.cython_blas (its BLAS check): once
    # _scipyblas is installed it must load the extension alone, and scipy.linalg must still
    # work when imported. (The module is loaded by path: importing jitgrad could load
    # SciPy's BLAS itself, see _core/threads.py.)
    code = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("scipyblas", {path!r})
scipyblas = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scipyblas)
scipyblas.install()
import numba
import numpy as np
out = {{"first_compile": numba.njit(lambda a, b: np.dot(a, b))(np.ones((2, 3)), np.ones((3, 2))).tolist(),
        "extension_only": sorted(m for m in sys.modules if m.startswith("scipy.linalg"))}}
import scipy.linalg
import scipy.linalg.cython_blas as blas
out["attribute"] = scipy.linalg.cython_blas is blas is sys.modules["scipy.linalg.cython_blas"]
out["package_works"] = scipy.linalg.det(np.eye(3) * 2.0)
out["capi"] = "dgemm" in blas.__pyx_capi__
out["finders_left"] = [type(f).__name__ for f in sys.meta_path if type(f).__module__ == "scipyblas"]
print(json.dumps(out))
""".format(path=os.path.join(ROOT, "jitgrad", "kernels", "_scipyblas.py"))
    out = _fresh(code, NUMBA_DISABLE_JIT="0")
    assert out == {"first_compile": [[3.0, 3.0], [3.0, 3.0]], "extension_only": ["scipy.linalg.cython_blas"],
                   "attribute": True, "package_works": 8.0, "capi": True, "finders_left": []}


def test_preload_leaves_an_imported_scipy_linalg_alone():
    code = """
import json, sys
import scipy.linalg
import jitgrad
from jitgrad.kernels import _scipyblas
import numba.np.linalg
before = [type(f).__name__ for f in sys.meta_path if type(f).__module__ == _scipyblas.__name__]
print(json.dumps([_scipyblas.preload(), before, numba.np.linalg.ensure_blas.preloads,
                  [type(f).__name__ for f in sys.meta_path if type(f).__module__ == _scipyblas.__name__]]))
"""
    # numba.np.linalg is wrapped (now, or at import by kernels/blas.py), and no finder is left over
    assert _fresh(code) == [True, [], True, []]
