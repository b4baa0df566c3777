"""Calling a kernel by address: how the compiled sweep runs kernels it was not compiled with.

Numba compiles a function together with everything it calls, so a sweep that called each
kernel by name compiled all of them on its first use (a minute, cold). Instead the sweep
reads a kernel's address from a table (an int64 array it is passed, one entry per opcode)
and calls it with `call_kernel`. A kernel is compiled, or loaded from its own cache entry,
the first time a graph uses it (engine/kernel_table.py fills the table); the sweep itself
never recompiles.

The address is that of the kernel's native function, called with Numba's own calling
convention: arguments as Numba passes them between compiled functions (borrowed, no
reference counting), a status code back. An exception raised in the kernel therefore
propagates through the sweep to Python as if the kernel had been called directly. The
argument types must be exactly those the kernel was compiled for: kernel_signature()
gives them, from the dtype, and the sweep's arrays are built to match (scheduler.start).

Kernels reached only this way are compiled without the wrappers that let Python call
them (table_jit): unboxing eleven arguments is code to compile, and it was half the
compile time of a small kernel.

Under NUMBA_DISABLE_JIT=1 an "address" is an index into a list of Python functions.
"""
import types as pytypes

import numpy as np
from numba import from_dtype, njit, types
from numba.core import cgutils
from numba.core.config import DISABLE_JIT
from numba.extending import intrinsic, overload

_PY = [None]  # DISABLE_JIT: index -> kernel; 0 stays "no kernel"

# the options of kernels/common.py's jit, less the wrappers for calls from Python
table_jit = njit(cache=True, nogil=True, error_model="numpy", no_cpython_wrapper=True, no_cfunc_wrapper=True)


def for_table(kernel):
    """A table_jit dispatcher of `kernel`'s Python function. It gets a qualified name of
    its own, so that its cache entries (named after it) are not the ones of `kernel`,
    which Python may call."""
    fn = getattr(kernel, "py_func", kernel)
    if DISABLE_JIT:
        return fn
    twin = pytypes.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    twin.__qualname__ = fn.__qualname__ + "_by_address"
    twin.__module__ = fn.__module__
    twin.__doc__ = fn.__doc__
    return table_jit(twin)


def call_kernel(addr, row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    """Run the kernel at `addr` on `row` (plain Python: addr indexes the registry)."""
    _PY[addr](row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st)


@intrinsic
def _call_native(typingctx, addr, row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    argtys = (row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st)

    def codegen(context, builder, sig, args):
        cc = context.call_conv
        fnty = cc.get_function_type(types.none, argtys)
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        # allocas in the entry block: the call sits in the sweep's loop
        ret = cgutils.alloca_once(builder, fnty.args[0].pointee)
        builder.store(cgutils.get_null_value(fnty.args[0].pointee), ret)
        excinfo = cgutils.alloca_once(builder, fnty.args[1].pointee)
        packed = list(cc._get_arg_packer(argtys).as_arguments(builder, args[1:]))
        code = builder.call(fn, [ret, excinfo, *packed])
        status = cc._get_return_status(builder, code, builder.load(excinfo))
        with builder.if_then(status.is_error, likely=False):
            cc.return_status_propagate(builder, status)  # the kernel raised: so does the caller
        return context.get_dummy_value()
    return types.none(addr, *argtys), codegen


@overload(call_kernel)
def _call_kernel_compiled(addr, row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
    def impl(addr, row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st):
        _call_native(addr, row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st)
    return impl


def kernel_signature(dtype):
    """The argument types every node kernel is compiled for at `dtype` (float32 / float64):
    (row, hdr, edges, xs, fp, slots, v, g1, gaddr, gown, st), as the sweep holds them."""
    i64 = types.int64[::1]
    a = types.Array(from_dtype(np.dtype(dtype)), 1, "C")
    return (types.int64, i64, i64, i64, types.float64[::1], i64, a, a, i64, i64, types.uint8[::1])


def address(kernel, sig):
    """The address to put in a kernel table for `kernel` (a Numba dispatcher) compiled
    for `sig`: it is compiled here, or loaded from its cache."""
    if DISABLE_JIT:
        fn = getattr(kernel, "py_func", kernel)
        if fn not in _PY:
            _PY.append(fn)
        return _PY.index(fn)
    kernel.compile(sig)
    cres = kernel.overloads[tuple(sig)]
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
