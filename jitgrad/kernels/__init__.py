"""Compiled backward: @njit kernels and the scheduler that sweeps the lowered graph."""
from jitgrad.kernels import _cache, _scipyblas

_cache.install()  # before any kernel module's @njit(cache=True) runs (see _cache's docstring)
_scipyblas.install()  # numba's first compile or cache load finds SciPy's BLAS without scipy.linalg
