"""Threads and interrupts: how many threads BLAS uses (torch.set_num_threads /
get_num_threads), Ctrl-C deferred across blocks that must not be torn apart, and the
locks that serialise accumulation into a leaf shared by threads.

jitgrad's forward GEMMs run in numpy's OpenBLAS, its backward GEMMs (np.dot inside the
Numba kernels) in scipy's. Each OpenBLAS pool keeps its workers spinning for a while
after a call, so with both pools at the core count every forward call competes with
the other pool's spinning workers and the reverse: on 2 cores the digits MLP epoch took
1.8 s instead of 45 ms. jitgrad therefore starts with both pools at one thread (or at
JITGRAD_NUM_THREADS); set_num_threads(n) sets both pools together. OMP_NUM_THREADS is
not followed: at 2 it would bring the contention back.
"""
import _signal as signal  # the C module: signal.py wraps every call in enum conversions (~8 us)
import os
import threading


def _controllers():
    import scipy.linalg.cython_blas  # noqa: F401  (loads the BLAS the Numba kernels call)
    import threadpoolctl
    return threadpoolctl.ThreadpoolController().select(user_api="blas")


def set_num_threads(n):
    """Threads for the BLAS calls of both forward and backward (all loaded BLAS pools)."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise RuntimeError(f"set_num_threads expects an int, but got {type(n).__name__}")
    if n <= 0:
        raise RuntimeError("set_num_threads expects a positive integer")
    _controllers().limit(limits=n)


def get_num_threads():
    info = _controllers().info()
    return max((i["num_threads"] for i in info), default=1)


def default_threads():
    """Called once at import: one thread, unless JITGRAD_NUM_THREADS names a count."""
    try:
        n = int(os.environ.get("JITGRAD_NUM_THREADS", "1"))
    except ValueError:
        n = 1
    try:
        set_num_threads(max(n, 1))
    except ImportError:        # threadpoolctl missing: leave the BLAS pools as they are
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
