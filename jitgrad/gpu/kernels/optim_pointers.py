"""Device memory by address inside a kernel: how the optimizer kernels reach every
parameter, gradient and state array of a group from one table of addresses, in one launch.

On the GPU `as_ptr(addr, like)` is a typed pointer (an `inttoptr` to like's dtype) that
the kernel indexes. The simulator runs kernels as Python and its device memory is host
memory, so there it is a small object indexing the host address, with numpy scalars of
like's dtype (float32 arithmetic stays float32, as on the device).
"""
import ctypes

import numpy as np
from numba import types
from numba.extending import intrinsic

from jitgrad.gpu import driver


class _HostPointer:
    __slots__ = ("addr", "dtype")

    def __init__(self, addr, dtype):
        self.addr, self.dtype = int(addr), np.dtype(dtype)

    def _cell(self, i):
        size = self.dtype.itemsize
        return np.frombuffer((ctypes.c_char * size).from_address(self.addr + int(i) * size), self.dtype, 1)

    def __getitem__(self, i):
        return self._cell(i)[0]

    def __setitem__(self, i, value):
        self._cell(i)[0] = value


if driver.simulated():
    def as_ptr(addr, like):
        return _HostPointer(addr, like.dtype)
else:
    @intrinsic
    def as_ptr(typingctx, addr, like):
        """The integer `addr` as a pointer to like's dtype."""
        ptrty = types.CPointer(like.dtype)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(ptrty))
        return ptrty(addr, like), codegen
