"""kernels/blas.py's gemm against numpy, the BLAS library choice (_core/blaslib.py), its
SciPy fallback, and a gemm kernel that Numba's on-disk cache hands to a second process."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT
from numba import njit
from numba.core.config import DISABLE_JIT

from jitgrad._core import blaslib
from jitgrad.kernels.blas import BLAS_KEY, gemm


@njit(nogil=True)
def _gemm(x, tx, y, ty, c, beta):
    gemm(x, tx, y, ty, c, beta)


SHAPES = [(1, 1, 1), (3, 5, 2), (7, 1, 9), (64, 33, 17), (0, 4, 3), (4, 0, 3), (4, 3, 0)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("tx", [False, True])
@pytest.mark.parametrize("ty", [False, True])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_gemm_matches_numpy(dtype, m, k, n, tx, ty, beta):
    rng = np.random.default_rng(m * 1000 + k * 100 + n * 10 + 2 * tx + ty)
    x = rng.standard_normal((k, m) if tx else (m, k)).astype(dtype)
    y = rng.standard_normal((n, k) if ty else (k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    c = c0.copy()
    if beta == 0.0:
        c[...] = np.nan   # beta 0 overwrites: whatever C held must not leak in
    _gemm(x, tx, y, ty, c, beta)
    want = (x.T if tx else x).astype(np.float64) @ (y.T if ty else y).astype(np.float64) + (c0 if beta else 0)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
    assert c.dtype == dtype


def test_blas_key_names_library_and_integer_width():
    name, width = BLAS_KEY.split("/")
    assert width in ("ilp64", "lp64") and name == blaslib.LIB.name
    if not os.environ.get("JITGRAD_BLAS"):
        assert blaslib.LIB is not blaslib.FALLBACK, "numpy's BLAS exports none of the known gemm symbols"


def test_blas_key_is_in_every_kernels_cache_key():
    from jitgrad.kernels import _cache
    assert BLAS_KEY in _cache._extra_keys


def test_probe_finds_nothing_in_an_empty_list_and_select_falls_back(monkeypatch):
    import ctypes
    handle = ctypes.CDLL(np._core._multiarray_umath.__file__)
    assert blaslib.probe(handle, ()) is None
    monkeypatch.setattr(blaslib, "KNOWN", ())
    monkeypatch.setattr(blaslib, "probe", lambda h, known=(): None)
    assert blaslib.select("") is blaslib.FALLBACK
    assert blaslib.FALLBACK.key == "scipy_numba_xxgemm/lp64"


def test_select_rejects_unknown_choice_and_missing_mkl(monkeypatch):
    with pytest.raises(ImportError, match="JITGRAD_BLAS must be numpy, mkl or scipy"):
        blaslib.select("atlas")
    monkeypatch.setattr(blaslib, "_mkl_handle", lambda: None)
    with pytest.raises(ImportError, match=r"pip install jitgrad\[mkl\]"):
        blaslib.select("mkl")


def _run(code, tmp_path, fresh_cache=True, **env):
    e = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    if fresh_cache:
        e.update(NUMBA_CACHE_DIR=str(tmp_path / "nc"), JITGRAD_CACHE_DIR=str(tmp_path / "jc"))
    e.update(PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]), **env)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       cwd=str(tmp_path), timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.split()


KERNEL = '''
import numpy as np
from numba import njit
from jitgrad.kernels.blas import gemm

@njit(cache=True)
def product(x, y):
    c = np.zeros((x.shape[0], y.shape[0]), x.dtype)
    gemm(x, False, y, True, c, 0.0)
    return c
'''

CALL = '''
import numpy as np
from gemmkernel import product
from jitgrad._core.blaslib import BLAS_KEY
x = np.arange(12.0).reshape(3, 4)
y = np.arange(8.0).reshape(2, 4) - 3
assert np.array_equal(product(x, y), x @ y.T), product(x, y)
print(BLAS_KEY, product.stats.cache_hits.get(product.signatures[0], 0))
'''


@pytest.mark.skipif(DISABLE_JIT, reason="Numba's cache only exists compiled")
def test_cached_gemm_kernel_runs_in_a_second_process(tmp_path):
    (tmp_path / "gemmkernel.py").write_text(KERNEL)
    key, hits = _run(CALL, tmp_path)
    assert key == BLAS_KEY and hits == "0"           # compiled and written
    key, hits = _run(CALL, tmp_path)
    assert hits == "1"                               # loaded: the symbol resolved in the new process


@pytest.mark.skipif(DISABLE_JIT, reason="the fallback is a compiled path")
def test_scipy_fallback_computes_the_same_products(tmp_path):
    (tmp_path / "gemmkernel.py").write_text(KERNEL)
    key, _ = _run(CALL, tmp_path, JITGRAD_BLAS="scipy")
    assert key == "scipy_numba_xxgemm/lp64"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("layout", ["c", "a_t", "b_t", "strided"])
def test_forward_product_through_gemm_matches_numpy(dtype, layout):
    # the forward's route when the chosen BLAS is not numpy's own (JITGRAD_BLAS=mkl)
    from jitgrad.kernels.blas import _mm_chosen
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((6, 4)) * 4).astype(dtype)
    b = (rng.standard_normal((4, 3)) * 4).astype(dtype)
    if layout == "a_t":
        a = np.ascontiguousarray(a.T).T
    elif layout == "b_t":
        b = np.ascontiguousarray(b.T).T
    elif layout == "strided":
        a = np.repeat(a, 2, axis=1)[:, ::2]
    got = _mm_chosen(a, b)
    assert got.dtype == dtype and got.shape == (6, 3)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_import_loads_no_scipy_blas(tmp_path):
    # the kernels call numpy's BLAS: jitgrad itself needs no SciPy BLAS. (numba imports the
    # top-level scipy package at import, and scipy.linalg when its CPU target first loads
    # numba.np.arraymath, at the first kernel compiled or loaded: that part is numba's.)
    code = ("import sys, jitgrad; "
            "print(sorted(m for m in ('scipy.linalg', 'scipy.linalg.cython_blas') if m in sys.modules))")
    assert _run(code, tmp_path, fresh_cache=False) == ["[]"]
