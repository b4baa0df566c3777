"""numba.cuda, loaded on first use: availability, launch geometry, allocation, pointers.

Every kernel launch and allocation in jitgrad goes through here, so the simulator's
constraints (NUMBA_ENABLE_CUDASIM=1: every CUDA thread is a Python thread, and
`grid.sync()` is only correct with one block) are handled in one place: `grid(n)`
gives the simulator one small block, and kernels loop grid-stride so any geometry
covers any size.
"""
import importlib
import os

import numpy as np

_cuda = None       # the numba.cuda module, once imported
_loaded = False    # the kernel modules (gpu/kernels/) registered


class OutOfMemoryError(RuntimeError):
    """torch.cuda.OutOfMemoryError."""


def simulated():
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def cuda():
    """The numba.cuda module (numba-cuda's when installed)."""
    global _cuda
    if _cuda is None:
        _cuda = importlib.import_module("numba.cuda")
    return _cuda


def available():
    try:
        return bool(cuda().is_available())
    except Exception:  # noqa: BLE001  (a broken driver install means: no GPU)
        return False


def device_count():
    if not available():
        return 0
    return 1 if simulated() else len(cuda().gpus)


def require():
    """Make sure a device can be used, else raise what a CPU-only PyTorch raises, naming
    what jitgrad needs; then register the kernels."""
    global _loaded
    if not _loaded:
        if not available():
            raise AssertionError("Torch not compiled with CUDA enabled (jitgrad: no CUDA device found; "
                                 "it needs an NVIDIA GPU with its driver and numba-cuda: "
                                 "pip install 'jitgrad[cuda]')")
        importlib.import_module("jitgrad.gpu.kernels")
        _loaded = True


# Threads per block and the most blocks a grid-stride kernel launches. The simulator runs
# each thread as a Python thread: one block of a few threads keeps it fast and keeps
# grid-wide synchronisation correct there.
THREADS = 256
MAX_BLOCKS = 4096
SIM_THREADS = 8


def grid(n):
    """(blocks, threads) for a grid-stride loop over n items."""
    if simulated():
        return 1, max(1, min(SIM_THREADS, n))
    return max(1, min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)), THREADS


def alloc(n, dtype):
    """A new 1-D device buffer of n elements (not initialised)."""
    require()
    try:
        return cuda().device_array(max(int(n), 1), dtype=np.dtype(dtype))
    except Exception as e:  # noqa: BLE001
        # the driver's CUDA_ERROR_OUT_OF_MEMORY; in the simulator, numpy's MemoryError
        if isinstance(e, MemoryError) or "OUT_OF_MEMORY" in str(e).upper().replace(" ", "_"):
            raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {_size(int(n) * np.dtype(dtype).itemsize)}."
                                   " (jitgrad: nothing was allocated; free tensors or use smaller batches)") from e
        raise


def _size(nbytes):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.2f} {unit}"
        nbytes /= 1024


def to_device(host):
    """A 1-D device copy of a contiguous host array."""
    buf = alloc(host.size, host.dtype)
    if host.size:
        buf[:host.size].copy_to_device(np.ascontiguousarray(host).reshape(-1))
    return buf


def pointer(buf):
    """The device address of buf's first element (in the simulator, its host address)."""
    if simulated():
        return buf._ary.ctypes.data  # the simulator's device memory is a host ndarray
    return buf.device_ctypes_pointer.value or 0


def synchronize():
    if available():
        cuda().synchronize()
