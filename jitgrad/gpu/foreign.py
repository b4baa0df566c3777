"""Device memory jitgrad did not allocate, as DeviceArrays sharing it: what
`__cuda_array_interface__` (cupy, torch CUDA tensors, numba device arrays) and CUDA DLPack
capsules describe.

The memory stays its producer's: the buffer holds `owner` (the producer's object, or what
calls a DLPack deleter when it goes) for as long as any view of it lives. A buffer covers
the elements the description can reach, from the lowest address to the highest, so
negative and zero strides need nothing special. Under the simulator device memory is host
memory: the address is read as host memory.
"""
import ctypes

import numpy as np

from jitgrad._core.dlpack import c_strides
from jitgrad._core.dtype import from_numpy_dtype
from jitgrad.gpu import driver
from jitgrad.gpu.array import DeviceArray


def buffer(ptr, n, dtype, owner):
    """The 1-D device buffer of n elements of dtype at device address ptr, holding owner. An
    empty array's address may be 0: it gets a buffer of its own (nothing of it is read)."""
    dtype = np.dtype(dtype)
    driver.require()
    if not ptr:
        return driver.alloc(1, dtype)
    if driver.simulated():
        cells = (ctypes.c_char * (n * dtype.itemsize)).from_address(ptr)
        cells.owner = owner  # the host view keeps the producer alive
        return driver.cuda().cudadrv.devicearray.FakeCUDAArray(np.frombuffer(cells, dtype, n))
    desc = {"shape": (n,), "typestr": dtype.str, "data": (ptr, False), "strides": None, "version": 3,
            "stream": None}
    return driver.cuda().from_cuda_array_interface(desc, owner=owner, sync=False)


def from_pointer(ptr, shape, estrides, dtype, owner):
    """A DeviceArray over foreign memory: shape, strides in elements (None: C order)."""
    shape = tuple(int(d) for d in shape)
    estrides = c_strides(shape) if estrides is None else tuple(int(s) for s in estrides)
    empty = any(d == 0 for d in shape)
    lo = 0 if empty else sum(s * (d - 1) for d, s in zip(shape, estrides) if s < 0)
    hi = 0 if empty else sum(s * (d - 1) for d, s in zip(shape, estrides) if s > 0)
    buf = buffer(0 if empty else ptr + lo * np.dtype(dtype).itemsize, hi - lo + 1, dtype, owner)
    return DeviceArray(buf, -lo, shape, estrides, np.dtype(dtype))


def from_interface(obj):
    """A DeviceArray over the memory obj's `__cuda_array_interface__` describes (obj kept alive)."""
    desc = obj.__cuda_array_interface__
    dtype = np.dtype(desc["typestr"])
    if dtype.byteorder == ">" or (dtype.byteorder == "|" and dtype.itemsize > 1):
        raise TypeError(f"dtype {desc['typestr']!r} of a __cuda_array_interface__ is not supported")
    if desc.get("mask") is not None:
        raise TypeError("masked arrays (a __cuda_array_interface__ with a mask) are not supported")
    strides = desc.get("strides")
    if strides is not None:
        if any(s % dtype.itemsize for s in strides):
            raise ValueError("a __cuda_array_interface__ whose strides are not whole elements is not supported")
        strides = [s // dtype.itemsize for s in strides]
    stream = desc.get("stream")
    if stream is not None and not driver.simulated():
        driver.cuda().external_stream(stream).synchronize()  # the producer's pending writes, first
    ptr = desc["data"][0] or 0
    return from_pointer(ptr, desc["shape"], strides, dtype, obj)


def is_cuda_array(x):
    """x is device memory a CUDA tensor can be made from: a DeviceArray, or an object that
    describes itself with `__cuda_array_interface__`."""
    return type(x) is DeviceArray or hasattr(x, "__cuda_array_interface__")


def array_from(obj, dtype, device, copy):
    """A tensor's array from device memory obj (see is_cuda_array): obj's memory itself unless
    copy, a dtype other than its own (None: its own), or the CPU (device: a checked device,
    None for where obj is) needs another."""
    arr = obj if type(obj) is DeviceArray else from_interface(obj)
    from_numpy_dtype(arr.dtype)  # torch's error for a dtype jitgrad tensors do not have
    if dtype is not None and np.dtype(dtype) != arr.dtype:
        arr = arr.astype(dtype)
    elif copy:
        arr = arr.copy()
    return arr.get() if device is not None and device.type == "cpu" else arr
