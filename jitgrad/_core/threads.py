"""Threads and interrupts: how many threads the matrix products and parallel kernels use
(torch.set_num_threads / get_num_threads), Ctrl-C deferred across blocks that must not be
torn apart, and the locks that serialise accumulation into a leaf shared by threads.

Every matrix product, forward (numpy's matmul) and backward (the Numba kernels' gemm,
kernels/blas.py), runs in one BLAS library, numpy's own (_core/blaslib.py), so there is
one OpenBLAS thread pool. There used to be two, numpy's and SciPy's, whose workers keep
spinning for a while after each call: at two threads each, every forward call competed
with the other pool's spinning workers (the digits MLP epoch took 1.8 s instead of 45 ms
on 2 cores), so both were held at one thread. With one pool, jitgrad starts as PyTorch
does: one thread per physical core (of the cores this process may run on), or
JITGRAD_NUM_THREADS, or OMP_NUM_THREADS, in that order. set_num_threads(n) sets the BLAS
pool and Numba's thread count for prange kernels. Numba's threading layer starts only
when a parallel kernel is first compiled or loaded (it costs import time otherwise); its
count is applied then, by sync_parallel().
"""
import _signal as signal  # the C module: signal.py wraps every call in enum conversions (~8 us)
import ctypes
import os
import threading

import numpy as np
from numba.core import config as _numba_config
from numba.np.ufunc import parallel as _numba_parallel

from jitgrad._core.blaslib import FALLBACK, LIB, probe

_threads = {"n": None, "parallel": None}   # the count asked for; the one Numba's layer has


def _pools():
    """(set, get) of each BLAS pool this process runs products in: the chosen library's,
    and numpy's own where that is another (MKL chosen: numpy's other products stay in it)."""
    pools = []
    if LIB.set_threads is not None:
        pools.append((LIB.set_threads, LIB.get_threads))
    if not LIB.numpy_own:
        own = probe(ctypes.CDLL(np._core._multiarray_umath.__file__))
        if own is not None and own.set_threads is not None:
            pools.append((own.set_threads, own.get_threads))
    return pools


_POOLS = _pools()


def _controllers():
    """threadpoolctl over every loaded BLAS: where no pool can be set by its own symbols
    (the SciPy fallback, a plain cblas), the only way to reach them."""
    if LIB is FALLBACK:
        import scipy.linalg.cython_blas  # noqa: F401  (loads the BLAS the Numba kernels call)
    import threadpoolctl
    return threadpoolctl.ThreadpoolController().select(user_api="blas")


def set_num_threads(n):
    """Threads for the BLAS calls of both forward and backward and for parallel kernels."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise RuntimeError(f"set_num_threads expects an int, but got {type(n).__name__}")
    if n <= 0:
        raise RuntimeError("set_num_threads expects a positive integer")
    if _POOLS and LIB is not FALLBACK:
        for setn, _ in _POOLS:
            setn(n)
    else:
        _controllers().limit(limits=n)
    _threads["n"] = n
    sync_parallel()


def get_num_threads():
    if _threads["n"] is None:
        _threads["n"] = (_POOLS[0][1]() if _POOLS and LIB is not FALLBACK
                         else max((i["num_threads"] for i in _controllers().info()), default=1))
    return _threads["n"]


def sync_parallel():
    """Give Numba's threading layer the count set, once it runs (a parallel kernel was
    compiled or loaded): cheap to call before each parallel kernel's first use."""
    n = _threads["n"]
    if n is None or _threads["parallel"] == n or not _numba_parallel._is_initialized:
        return
    _numba_parallel.set_num_threads(min(n, _numba_config.NUMBA_NUM_THREADS))
    _threads["parallel"] = n


def physical_cores():
    """Physical cores among the CPUs this process may run on (torch.get_num_threads()'s
    default): SMT siblings count once."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        cpus = range(os.cpu_count() or 1)
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/core_cpus_list") as f:
                cores.add(f.read().strip())
        except OSError:   # no sysfs topology (not Linux): count logical CPUs
            cores.add(c)
    return max(len(cores), 1)


def default_threads():
    """Called once at import: JITGRAD_NUM_THREADS, else OMP_NUM_THREADS, else physical cores."""
    n = None
    for var in ("JITGRAD_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            n = int(os.environ.get(var, ""))
            break
        except ValueError:
            pass
    try:
        set_num_threads(n if n is not None and n > 0 else physical_cores())
    except ImportError:        # fallback without threadpoolctl: leave the BLAS pools as they are
        pass


# -- interrupts -------------------------------------------------------------------------
# Ctrl-C is delivered by running the SIGINT handler at the next bytecode of the main thread.
# Inside Numba's boxing of a compiled function's array result that bytecode is in
# _numba_unpickle: the KeyboardInterrupt then surfaces as "SystemError: ... returned a
# result with an exception set" (or worse) and the call's result is lost. Blocks that
# must not be torn apart (a compiled call, publishing a backward's results) run with the
# handler replaced by one that only notes the signal; the real handler runs at the end.
_MAIN_ID = threading.main_thread().ident
_defer = {"depth": 0, "saved": None, "hit": None}


def _note_interrupt(signum, frame):
    _defer["hit"] = (signum, frame)


class _DeferredInterrupts:
    __slots__ = ()

    def __enter__(self):
        if threading.get_ident() != _MAIN_ID:  # handlers only ever run in the main thread
            return
        d = _defer
        if d["depth"] == 0:
            h = signal.getsignal(signal.SIGINT)
            # SIG_DFL / SIG_IGN / a C handler: Python delivers nothing there to defer
            d["saved"] = h if callable(h) else None
            if d["saved"] is not None:
                signal.signal(signal.SIGINT, _note_interrupt)
        d["depth"] += 1

    def __exit__(self, *exc):
        if threading.get_ident() != _MAIN_ID:
            return
        d = _defer
        d["depth"] -= 1
        if d["depth"] or d["saved"] is None:
            return
        saved, hit = d["saved"], d["hit"]
        d["saved"] = d["hit"] = None
        signal.signal(signal.SIGINT, saved)
        if hit is not None:
            saved(*hit)  # default_int_handler: the KeyboardInterrupt reaches the caller now


deferred_interrupts = _DeferredInterrupts()


# -- accumulation into shared leaves ---------------------------------------------------------
# Threads that backpropagate into one leaf (hogwild training) must not lose updates:
# `grad is None` then assign, and numpy's `+=` (which releases the GIL on large arrays),
# are serialised per leaf, as PyTorch's AccumulateGrad is. Striped locks keyed on the
# tensor's id: no lock object per tensor, and two leaves rarely share a stripe.
_leaf_locks = tuple(threading.Lock() for _ in range(64))


def leaf_lock(t):
    return _leaf_locks[(id(t) >> 4) & 63]
