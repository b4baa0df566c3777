"""An optimizer step over CUDA parameters: one kernel launch per group and dtype.

The CPU step batches its parameters into one compiled call (optim/_kernels.Batch); this is
the same for the device: `DeviceBatch` collects each parameter's arrays as device
addresses and its scalars, and `run` launches gpu/kernels/optim.py's kernel once over the
whole table. State arrays are made on the parameter's device, like it (C-contiguous, its
dtype); a gradient the kernel cannot read as it is (broadcast, strided, another dtype) is
first copied into that form on the device, and a strided parameter is updated in a
contiguous copy that is then written back.
"""
import numpy as np

from jitgrad.gpu import array as _garray
from jitgrad.gpu.array import DeviceArray

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def on_device(d):
    return isinstance(d, DeviceArray)


def check_same_device(d, *others):
    """torch's error when a parameter and its gradient or state are on different devices."""
    dev = on_device(d)
    for a in others:
        if a is not None and on_device(a) != dev:
            raise RuntimeError(MIXED)


def zeros_like(d):
    z = DeviceArray.empty(d.shape, d.dtype)
    z.fill(0)
    return z


def empty_like(d):
    return DeviceArray.empty(d.shape, d.dtype)


def move(a, to_device, dtype):
    """a (a host or device array) on the device or the host, in dtype."""
    if to_device:
        if not on_device(a):
            return DeviceArray.from_host(np.asarray(a, dtype))
        return a if a.dtype == dtype else a.astype(dtype)
    if on_device(a):
        a = a.get()
    return np.asarray(a, dtype)


def _fitted(d, a, what):
    """a as the kernel reads it: d's shape and dtype, C-contiguous (a copy if it is not)."""
    if a.shape != d.shape:
        try:
            a = a.broadcast_to(d.shape)
        except ValueError:
            raise RuntimeError(f"The size of the {what} {list(a.shape)} does not match the parameter's "
                               f"{list(d.shape)}") from None
    if a.dtype != d.dtype or not a.is_c_contiguous():
        a = a.astype(d.dtype)
    return a


class DeviceBatch:
    """The rows of one step's launches, by dtype; the arrays are held until the launch so
    that the addresses stay valid."""

    def __init__(self):
        self.by_dtype = {}
        self.writeback = []  # (strided parameter array, the contiguous copy updated in its place)

    def add(self, d, g, state, scalars):
        """d: the parameter's array, g: its gradient's, state: its state arrays in the
        kernel's order (a missing optional one is given as d)."""
        check_same_device(d, g, *state)
        work = d if d.is_c_contiguous() else d.copy()
        if work is not d:
            self.writeback.append((d, work))
        state = tuple(work if s is d else _fitted(d, s, "optimizer state") for s in state)
        if any(s is not work and s.shape != d.shape for s in state):
            raise RuntimeError("optimizer state of a CUDA parameter must have the parameter's shape")
        arrays = (work, _fitted(d, g, "gradient")) + state
        held, rows, sc = self.by_dtype.setdefault(d.dtype, ([], [], []))
        held.append(arrays)
        rows.append([d.size] + [a.ptr for a in arrays])
        sc.append(scalars)

    def run(self, name, *flags):
        for dtype, (_held, rows, sc) in self.by_dtype.items():
            _garray.KERNELS[name](np.array(rows, np.int64), np.array(sc, np.float64), dtype, *flags)
        for d, work in self.writeback:
            _garray.assign(d, work)
