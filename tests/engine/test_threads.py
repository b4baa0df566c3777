"""set_num_threads / get_num_threads: one BLAS pool (numpy's, which the kernels' gemm
shares) and Numba's parallel kernels; the default is torch's (physical cores)."""
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT
from numba.core.config import DISABLE_JIT

import jitgrad
from jitgrad._core import blaslib, threads


def _pool_threads():
    """The thread counts of the BLAS pools jitgrad runs products in, as threadpoolctl reads
    them: not torch's MKL (a test imported torch), nor SciPy's OpenBLAS (scipy.special loads
    it) unless the kernels fall back to it."""
    import threadpoolctl
    skip = [f"{os.sep}torch{os.sep}"] + ([] if blaslib.LIB is blaslib.FALLBACK else ["scipy.libs"])
    return sorted({i["num_threads"] for i in threadpoolctl.threadpool_info()
                   if i["user_api"] == "blas" and not any(s in i["filepath"] for s in skip)})


def _default_in_child(**env):
    e = {k: v for k, v in os.environ.items() if k not in ("JITGRAD_NUM_THREADS", "OMP_NUM_THREADS")}
    e.update(PYTHONPATH=ROOT, **env)
    p = subprocess.run([sys.executable, "-c", "import jitgrad; print(jitgrad.get_num_threads())"],
                       capture_output=True, text=True, env=e, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    return int(p.stdout.split()[-1])


def test_default_is_torchs_physical_core_count():
    torch = pytest.importorskip("torch")
    n = _default_in_child()
    assert n == threads.physical_cores()
    if not (os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")):
        assert n == torch.get_num_threads()


@pytest.mark.parametrize("env, want", [({"JITGRAD_NUM_THREADS": "1"}, 1), ({"OMP_NUM_THREADS": "1"}, 1),
                                       ({"JITGRAD_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}, 3),
                                       ({"JITGRAD_NUM_THREADS": "lots"}, None)])
def test_default_follows_the_environment(env, want):
    assert _default_in_child(**env) == (want or threads.physical_cores())


def test_set_num_threads_moves_the_blas_pool():
    before = jitgrad.get_num_threads()
    try:
        for n in (1, 2, 1):
            jitgrad.set_num_threads(n)
            assert jitgrad.get_num_threads() == n and _pool_threads() == [n]
    finally:
        jitgrad.set_num_threads(before)
    assert jitgrad.get_num_threads() == before


@pytest.mark.skipif(DISABLE_JIT, reason="Numba's threading layer runs compiled parallel code only")
def test_parallel_kernels_follow_set_num_threads():
    import numba
    from numba import njit, prange

    @njit(parallel=True)
    def total(x):
        s = 0.0
        for i in prange(x.size):
            s += x[i]
        return s

    before = jitgrad.get_num_threads()
    try:
        jitgrad.set_num_threads(1)
        assert total(np.ones(8)) == 8
        threads.sync_parallel()   # the layer started with the compile above: it gets the count now
        assert numba.get_num_threads() == 1
        jitgrad.set_num_threads(2)
        assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
    finally:
        jitgrad.set_num_threads(before)


@pytest.mark.parametrize("bad, msg", [(0, "expects a positive integer"), (-1, "expects a positive integer"),
                                      (1.5, "expects an int, but got float"), (True, "expects an int, but got bool")])
def test_set_num_threads_rejects_bad_counts_like_torch(bad, msg):
    import torch
    with pytest.raises(RuntimeError, match=msg):
        torch.set_num_threads(bad)
    before = jitgrad.get_num_threads()
    with pytest.raises(RuntimeError, match="set_num_threads " + msg):
        jitgrad.set_num_threads(bad)
    assert jitgrad.get_num_threads() == before
