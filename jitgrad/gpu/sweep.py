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

Measured (issue 12; no GPU was lent, so on the 2-core CI machine, numba-cuda 0.30.4):
- a 1e4-op scalar chain (20001 rows) backward: 4 launches (2 fills, 1 seed, 1 sweep);
  the same gradient as the CPU engine, bit for bit; under the simulator 20 s (1 ms per
  row: Python per simulated thread and barrier), which says nothing of a GPU's speed;
- the kernel compiles to PTX (sm_80) in 7.5-10 s per dtype (`ptx()`); a process pays
  that at its first CUDA backward per dtype (numba.cuda's disk cache is not used yet);
- host work per call: the mirror is 72 bytes a row plus 24 per edge and per saved
  value, one host -> device copy per column; 2 small copies around each launch (st,
  status). GPU timings beside PyTorch CUDA are gpu-bench's (benchmarks/): not taken.
"""
import sys

import numpy as np
from numba import cuda, types

from jitgrad.gpu import driver
from jitgrad.gpu.array import KERNELS, DeviceArray
from jitgrad.gpu.sweep_codegen import signature

LAUNCHES = [0]   # kernel launches made by the device backward (tests read it)
# Rows with more elements than this hand back to Python, whose Tensor-level rule launches
# over the whole GPU: one block (at most THREADS threads) is the right shape for many
# small rows, not for one large one. Not measured on a GPU yet (none was lent to issue
# 12): 64K elements is 256 per thread, about a row's worth of work for which a hand-back
# (kernel exit, Python rule, relaunch: tens of µs) costs no more than the block does.
# Under the simulator every row stays in the kernel unless a test lowers it.
BIG_ROW = 1 << 62 if driver.simulated() else 1 << 16


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


# The simulator runs a block's threads as Python threads and a barrier waits for its
# manager thread to poll them: at Python's default 5 ms switch interval a barrier costs
# ~13 ms (a 601-row chain swept in 7.9 s); at 20 µs, ~1 ms (0.6 s). Set for the launch only.
SIM_SWITCH_INTERVAL = 2e-5


def run(module, mirror, gaddr, st, hi, dt, threads):
    """One launch of the sweep from row `hi` down. st (host, uint8) is copied in and the
    kernel's updates copied back into it; returns (status, row)."""
    st_dev = cuda.to_device(st)
    status = cuda.to_device(np.zeros(2, np.int64))
    args = (mirror.hdr, mirror.edges, mirror.xs, mirror.fp, mirror.slots, mirror.v, gaddr, st_dev, mirror.freed, hi,
            dt, BIG_ROW, status)
    if driver.simulated():
        old = sys.getswitchinterval()
        sys.setswitchinterval(SIM_SWITCH_INTERVAL)
        try:
            module.sweep[1, threads](*args)
        finally:
            sys.setswitchinterval(old)
    else:
        module.sweep[1, threads](*args)
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


def _add_signatures():
    out = []
    for d in (types.float64, types.float32):
        for s in (types.float64, types.float32):
            for rank in (1, 4):
                tup = types.UniTuple(types.int64, rank)
                out.append((types.Array(d, 1, "C"), types.int64, tup, types.Array(s, 1, "C"), types.int64, tup, tup,
                            types.int64))
    return out


# gpu/ptx.py's convention: each kernel made at import declares the types it is launched with
# (here: gradients of either float dtype added into either)
PTX_SIGNATURES = {_add: _add_signatures()}


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


def ptx(module, dtype, cc=(8, 0)):
    """The sweep kernel of a generated module compiled to PTX for rows of `dtype`: the
    check that it types and compiles for a GPU, which the simulator (kernels run as
    Python) cannot give. Needs numba's real CUDA target (NUMBA_ENABLE_CUDASIM unset) and
    a way for its device functions to learn a compute capability (a GPU, or a test's
    stand-in for numba.cuda.dispatcher.get_current_device)."""
    code, _ = cuda.compile_ptx(module.sweep.py_func, signature(dtype), cc=cc)
    return code
