"""Device arrays by address inside CUDA kernels: the GPU twin of kernels/pointers.py.

A kernel that reads many arrays (the backward sweep's saved values, an optimizer's
parameter groups) takes a table of their device addresses instead of one argument per
array: `view(addr, n, like)` inside a `cuda.jit` kernel is the 1-D array of n elements of
like's dtype at `addr` (like: any array of that dtype; only its type is read). Indexing
it, `cuda.atomic.add` on it and slicing work as on any device array.

On a GPU, `view` is an inttoptr (a numba intrinsic) wrapped in a carray, inlined into
the kernel (an overload with inline="always": a CUDA device function may not return an
array it made). Under the simulator (NUMBA_ENABLE_CUDASIM=1) kernels run as Python and
device memory is host memory, so `view` is a ctypes view of the host address.

Only numba.cuda's import of this module (the kernel modules, at the first CUDA
allocation) loads it: `import jitgrad` never does.
"""
import ctypes

import numpy as np
from numba import types
from numba.cuda.extending import intrinsic, overload
from numba.cuda.np.numpy_support import carray

from jitgrad.gpu import driver


@intrinsic
def as_ptr(typingctx, addr, like):
    """The integer `addr` as a pointer to like's dtype (GPU code)."""
    ptrty = types.CPointer(like.dtype)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptrty))
    return ptrty(addr, like), codegen


def host_view(addr, n, like):
    """n elements of like's dtype at `addr` in this process's memory, as a 1-D array:
    `view` under the simulator, where device memory is host memory."""
    dtype = np.dtype(like.dtype)
    n = int(n)
    if n == 0:
        return np.zeros(0, dtype)
    buf = (ctypes.c_char * (n * dtype.itemsize)).from_address(int(addr))
    return np.frombuffer(buf, dtype=dtype, count=n)


def device_view(addr, n, like):
    """n elements of like's dtype at device address `addr` (compiled kernels only)."""
    raise TypeError("jitgrad.gpu.pointers.view runs inside CUDA kernels only")


@overload(device_view, target="cuda", inline="always")
def _device_view(addr, n, like):
    def impl(addr, n, like):
        return carray(as_ptr(addr, like), (n,))
    return impl


view = host_view if driver.simulated() else device_view
