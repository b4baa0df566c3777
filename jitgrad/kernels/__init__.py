"""Compiled backward: @njit kernels and the scheduler that sweeps the lowered graph."""
from jitgrad.kernels import _cache, _scipyblas

_cache.install()  # before any kernel module's @njit(cache=True) runs (see _cache's docstring)
_scipyblas.preload()  # before numba's first compile or cache load imports it the slow way
