"""Arrays by address: how the kernels read saved values in place, without a copy and
without passing one Python object per saved array into the compiled code."""
import ctypes

import numpy as np
from numba import carray, njit, types
from numba.core.config import DISABLE_JIT
from numba.extending import intrinsic


@intrinsic
def as_ptr(typingctx, addr, like):
    """The integer `addr` as a pointer to like's dtype."""
    ptrty = types.CPointer(like.dtype)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptrty))
    return ptrty(addr, like), codegen


if DISABLE_JIT:
    def view(addr, n, like):
        """n elements of like's dtype at `addr`, as a 1-D array (the memory stays owned elsewhere)."""
        buf = (ctypes.c_char * int(n * like.itemsize)).from_address(int(addr))
        return np.frombuffer(buf, dtype=like.dtype, count=int(n))
else:
    @njit(cache=True, nogil=True, error_model="numpy")
    def view(addr, n, like):
        return carray(as_ptr(addr, like), (n,))
