"""Backward on the device without a Python call per node: the host side of the device sweep.

The design (issue 12; measured costs below):
- ONE persistent kernel with ONE block sweeps a tape's rows from the top down
  (gpu/sweep_kernel.py), `syncthreads()` between rows, the block's threads splitting each
  row's elements. A deep graph of small nodes (a scalar chain, a wide tree of scalars)
  is then one launch, where PyTorch launches a kernel per node. One block also keeps the
  simulator's barriers exact (it runs grid-wide sync correctly only with one block).
- Rows the kernel has no code for (matmul, conv, softmax, indexing...: "big" structural
  rows), custom Functions and hooks hand back to Python with a status; the engine
  (engine/device.py) runs that row's Tensor-level rule on the device and relaunches the
  sweep below it. Such rows are large, and PyTorch launches kernels per node for them
  too, so the launch per hand-back is the price PyTorch pays anyway.
- The tape is mirrored on the device once per backward call: its columns (hdr, edges,
  xs, fp, slots) and the Python-number operands (v) are copied host -> device in one
  packed transfer per column, the rows' states (`st`) copied back and forth around each
  hand-back. Keeping a mirror updated while the forward records would make every op pay
  a transfer (the forward records ~1 µs per op); one bulk copy per backward is ~10-70
  bytes per row at PCIe/NVLink bandwidth, a few µs per thousand rows.
- Gradients: every row that may receive gradient gets a buffer in one of two arenas,
  zeroed by one fill launch each: `out` for the sinks (leaves, edges into older tapes,
  retained and requested tensors: their .grad is a view of it, as the CPU engine's are
  slices of one output array) and `scratch` for the rest, dropped after the call. The
  kernel reads the buffers through a table of device addresses (gaddr). The scratch
  arena holds one gradient per activation: the memory of the forward's activations,
  where PyTorch frees each buffer once consumed (a trade for having no allocator in the
  kernel).
Launches per backward call: fill (out), fill (scratch), one per root seed, one sweep, one
more per hand-back; constant in the graph's depth for graphs of small rows (`LAUNCHES`
counts them; tests/cuda/test_backward.py asserts it).

On a GPU with the simulator off, the kernel's code is checked by `ptx()`.
"""
import numpy as np
from numba import cuda

from jitgrad.gpu import driver
from jitgrad.gpu.array import KERNELS, DeviceArray

LAUNCHES = [0]   # kernel launches made by the device backward (tests read it)


def _to_device(host):
    driver.require()
    return cuda.to_device(np.ascontiguousarray(host))


class Mirror:
    """A tape's columns on the device for one backward call."""

    def __init__(self, hdr, edges, xs, fp, slots, v, freed):
        self.hdr, self.edges, self.xs, self.fp, self.slots, self.v, self.freed = (
            _to_device(a) for a in (hdr, edges, xs, fp, slots, v, freed))


def arena(n, dtype):
    """A zeroed device array of n elements (one fill launch)."""
    a = DeviceArray.empty((n,), dtype)
    if n:
        KERNELS["fill"](a, 0)
        LAUNCHES[0] += 1
    return a


def threads_for(max_numel):
    """Threads of the sweep's one block: no more than the largest row has elements."""
    if driver.simulated():
        return max(1, min(driver.SIM_THREADS, max_numel))
    return int(min(driver.THREADS, max(32, -(-max_numel // 32) * 32)))


def run(module, mirror, gaddr, st, hi, dt, threads):
    """One launch of the sweep from row `hi` down. st (host, uint8) is copied in and the
    kernel's updates copied back into it; returns (status, row)."""
    st_dev = cuda.to_device(st)
    status = cuda.to_device(np.zeros(2, np.int64))
    module.sweep[1, threads](mirror.hdr, mirror.edges, mirror.xs, mirror.fp, mirror.slots, mirror.v, gaddr,
                             st_dev, mirror.freed, hi, dt, status)
    LAUNCHES[0] += 1
    st[:] = st_dev.copy_to_host()
    code, row = status.copy_to_host()
    return int(code), int(row)


@cuda.jit
def _add(dst, doff, dst_st, src, soff, sst, shape, n):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        r = i
        s = soff
        d = doff
        for k in range(len(shape) - 1, -1, -1):
            c = r % shape[k]
            r //= shape[k]
            s += c * sst[k]
            d += c * dst_st[k]
        dst[d] += src[s]
        i += step


def add_into(dst, src):
    """dst += src, in place, for DeviceArrays: src of dst's shape or broadcasting to it,
    cast to dst's dtype (accumulating a gradient: no element of dst is written twice)."""
    n = dst.size
    if n == 0:
        return
    if src.shape != dst.shape:
        src = src.broadcast_to(dst.shape)
    if dst.shape:
        shape, dst_st, sst = dst.shape, dst.estrides, src.estrides
    else:
        shape, dst_st, sst = (1,), (0,), (0,)
    blocks, threads = driver.grid(n)
    _add[blocks, threads](dst.buf, dst.offset, dst_st, src.buf, src.offset, sst, shape, n)
    LAUNCHES[0] += 1
