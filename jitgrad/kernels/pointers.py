"""Arrays by address: how the kernels read saved values in place, without a copy and
without passing one Python object per saved array into the compiled code; and how the
backward keeps its gradient buffers alive by address (own / disown), so that it holds
them in two int64 arrays instead of a typed List, whose code took seconds of every first
compile."""
import ctypes
import itertools

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
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


if DISABLE_JIT:
    _owned = {}
    _keys = itertools.count(1)

    def own(arr):
        """Keep `arr` alive until disown(key); returns key (non-zero)."""
        k = next(_keys)
        _owned[k] = arr
        return k

    def disown(key):
        del _owned[key]
else:
    @intrinsic
    def own(typingctx, arr):
        """A reference to arr's memory (its meminfo, incref'd) as an int64: disown() drops it."""
        def codegen(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, args[0])
            context.nrt.incref(builder, sig.args[0], args[0])
            return builder.ptrtoint(a.meminfo, ir.IntType(64))
        return types.int64(arr), codegen

    @intrinsic
    def disown(typingctx, key):
        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "NRT_decref")
            builder.call(fn, [builder.inttoptr(args[0], cgutils.voidptr_t)])
            return context.get_dummy_value()
        return types.none(key), codegen
