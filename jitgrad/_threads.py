"""How many threads BLAS uses: torch.set_num_threads / get_num_threads.

jitgrad's forward GEMMs run in numpy's OpenBLAS, its backward GEMMs (np.dot inside the
Numba kernels) in scipy's. Each OpenBLAS pool keeps its workers spinning for a while
after a call, so with both pools at the core count every forward call competes with
the other pool's spinning workers and the reverse: on 2 cores the digits MLP epoch took
1.8 s instead of 45 ms. jitgrad therefore starts with both pools at one thread (or at
JITGRAD_NUM_THREADS); set_num_threads(n) sets both pools together. OMP_NUM_THREADS is
not followed: at 2 it would bring the contention back.
"""
import os


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
