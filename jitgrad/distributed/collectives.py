"""The collectives and point-to-point operations on Tensors, as torch.distributed's.

MPI reads and writes each Tensor's own numpy array through the buffer protocol: no copy
for a contiguous tensor. A non-contiguous one is communicated through a contiguous copy,
written back on completion (PyTorch accepts them too). The list forms (all_gather,
reduce_scatter) go through one contiguous buffer of all the ranks' parts, as PyTorch's
backends do; all_gather_into_tensor and reduce_scatter_tensor need no copy.

Each starts a nonblocking MPI operation and returns its Work (async_op=True) or waits for
it (bounded by the group's timeout). A tensor an operation writes has its version counter
bumped when the operation starts, so that a backward that saved it notices the write.
(PyTorch bumps it for some collectives only: its all_reduce does not.)
"""
import numpy as np

from jitgrad._core.capture import stop as _stop_capture
from jitgrad._core.dtype import from_numpy_dtype
from jitgrad.distributed._backend import ReduceOp, mpi, reduction
from jitgrad.distributed.process_group import default_group
from jitgrad.distributed.work import Work
from jitgrad.graph.tensor import Tensor


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce `tensor` over all ranks with `op`, in place on every rank."""
    pg = _group(group, "all_reduce")
    mpi_op, average = reduction(op, _array(tensor).dtype)
    buf, write_back = _target(tensor)
    req = pg.comm.Iallreduce(mpi().IN_PLACE, buf, op=mpi_op)
    return _start(Work([req], _finisher(buf, write_back, pg.size() if average else 0), name="all_reduce",
                       keep=(buf,)), async_op)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Copy `tensor` of rank `src` into `tensor` of every other rank."""
    pg = _group(group, "broadcast")
    src = _peer(src, group_src)
    if not 0 <= src < pg.size():
        raise RuntimeError(f"ProcessGroupMPI::broadcast: invalid root rank: {src}")
    if src == pg.rank():
        buf, write_back = _source(tensor), None
    else:
        buf, write_back = _target(tensor)
    req = pg.comm.Ibcast(buf, root=src)
    return _start(Work([req], write_back, name="broadcast", keep=(buf,)), async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce `tensor` over all ranks with `op` into `tensor` of rank `dst` (the others' are left as they are)."""
    pg = _group(group, "reduce")
    dst = _peer(dst, group_dst)
    if not 0 <= dst < pg.size():
        raise RuntimeError(f"ProcessGroupMPI::reduce: invalid root rank: {dst}")
    mpi_op, average = reduction(op, _array(tensor).dtype)
    if dst != pg.rank():
        send = _source(tensor)
        return _start(Work([pg.comm.Ireduce(send, None, op=mpi_op, root=dst)], name="reduce", keep=(send,)),
                      async_op)
    buf, write_back = _target(tensor)
    req = pg.comm.Ireduce(mpi().IN_PLACE, buf, op=mpi_op, root=dst)
    return _start(Work([req], _finisher(buf, write_back, pg.size() if average else 0), name="reduce",
                       keep=(buf,)), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """tensor_list[i] = `tensor` of rank i, on every rank."""
    pg = _group(group, "all_gather")
    send = _source(tensor)
    _check_list(tensor_list, "tensor_list", pg.size(), send, "allgather",
                "invalid output tensor list at index 0 (expected length {size}, got {got})")
    outs = [_writable(t) for t in tensor_list]
    gathered = np.empty((pg.size(),) + send.shape, send.dtype)
    for t in tensor_list:
        t._bump()
    req = pg.comm.Iallgather(send, gathered)

    def copy_out():
        for out, part in zip(outs, gathered):
            np.copyto(out, part)
    return _start(Work([req], copy_out, name="all_gather", keep=(send, gathered)), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """output_tensor (world_size times input_tensor's elements, rank after rank) = every
    rank's input_tensor, on every rank."""
    pg = _group(group, "all_gather_into_tensor")
    send = _source(input_tensor)
    out = _array(output_tensor, "output_tensor")
    _check_sizes("allgather", out, send, pg.size())
    buf, write_back = _target(output_tensor)
    req = pg.comm.Iallgather(send, buf)
    return _start(Work([req], write_back, name="all_gather_into_tensor", keep=(send, buf)), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """output on rank i = input_list[i] reduced with `op` over all ranks."""
    pg = _group(group, "reduce_scatter")
    out = _array(output, "output")
    _check_list(input_list, "input_list", pg.size(), out, "reduce_scatter",
                "invalid input tensor list size, must be world size ({size}, got {got})")
    mpi_op, average = reduction(op, out.dtype)
    send = np.empty((pg.size(),) + out.shape, out.dtype)
    for i, t in enumerate(input_list):
        send[i] = _array(t)
    buf, write_back = _target(output)
    req = pg.comm.Ireduce_scatter_block(send, buf, op=mpi_op)
    return _start(Work([req], _finisher(buf, write_back, pg.size() if average else 0), name="reduce_scatter",
                       keep=(send, buf)), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """output on rank i = the i-th of world_size equal parts of `input`, reduced over all ranks."""
    pg = _group(group, "reduce_scatter_tensor")
    send = _source(input)
    out = _array(output, "output")
    _check_sizes("reduce_scatter", send, out, pg.size())
    mpi_op, average = reduction(op, out.dtype)
    buf, write_back = _target(output)
    req = pg.comm.Ireduce_scatter_block(send, buf, op=mpi_op)
    return _start(Work([req], _finisher(buf, write_back, pg.size() if average else 0),
                       name="reduce_scatter_tensor", keep=(send, buf)), async_op)


def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    """Wait until every rank reached its barrier."""
    pg = _group(group, "barrier")
    return _start(Work([pg.comm.Ibarrier()], None, timeout, name="barrier"), async_op)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Start sending `tensor` to rank `dst`; its Work. `tensor` must not change until it completes."""
    pg = _group(group, "isend")
    dst = _peer(dst, group_dst)
    _check_peer(pg, dst, "destination")
    buf = _source(tensor)
    return Work([pg.comm.Isend(buf, dest=dst, tag=tag)], name="send", keep=(buf,))


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Start receiving into `tensor` from rank `src` (None: any rank); its Work."""
    pg = _group(group, "irecv")
    src = group_src if src is None else src
    if src is None:
        src = mpi().ANY_SOURCE
    else:
        _check_peer(pg, src, "source")
    buf, write_back = _target(tensor)
    return Work([pg.comm.Irecv(buf, source=src, tag=tag)], write_back, name="recv", keep=(buf,), statuses=True)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    isend(tensor, dst, group, tag, group_dst).wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into `tensor`; the sender's rank."""
    work = irecv(tensor, src, group, tag, group_src)
    work.wait()
    return work.source_rank()


def _group(group, what):
    # a collective in a step being captured by jitgrad.compile must run each time: a graph break
    _stop_capture(f"torch.distributed.{what}")
    pg = default_group(group)
    pg.check_usable()
    return pg


def _start(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


def _finisher(buf, write_back, divide_by):
    if not divide_by:
        return write_back

    def finish():
        np.divide(buf, divide_by, out=buf)  # ReduceOp.AVG: MPI has no mean, so a sum divided here
        if write_back is not None:
            write_back()
    return finish


def _array(tensor, name="tensor"):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"Invalid function argument. Expected parameter `{name}` of type torch.Tensor\n"
                        f"             but got {type(tensor)} instead.")
    if tensor.is_cuda:
        raise RuntimeError("No backend type associated with device type cuda: the mpi backend communicates CPU "
                           "tensors (move it with .cpu())")
    return tensor._array()


def _source(tensor, name="tensor"):
    """The contiguous array MPI reads `tensor` from."""
    return np.ascontiguousarray(_array(tensor, name))


def _writable(tensor, name="tensor"):
    arr = _array(tensor, name)
    if not arr.flags.writeable:
        if any(s == 0 and n > 1 for n, s in zip(arr.shape, arr.strides)):
            raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                               "single memory location. Please clone() the tensor before performing the operation.")
        raise RuntimeError("the tensor to write is read-only memory: clone() it first")
    return arr


def _target(tensor, name="tensor"):
    """(the contiguous array MPI writes `tensor`'s result into, the step that copies it
    back into `tensor` on completion, or None); `tensor` is counted as written."""
    arr = _writable(tensor, name)
    tensor._bump()
    if arr.flags.c_contiguous:
        return arr, None
    buf = np.ascontiguousarray(arr)
    return buf, lambda: np.copyto(arr, buf)


def _peer(rank, group_rank):
    if rank is not None and group_rank is not None:
        raise ValueError("Can't specify both group_rank and global_rank")
    rank = group_rank if rank is None else rank
    if rank is None:
        raise ValueError("Must specify global_rank or group_rank")
    return rank


def _check_peer(pg, rank, role):
    if rank == pg.rank():
        raise ValueError(f"Invalid {role} rank: {role} rank should not be the same as the rank of the current "
                         "process.")
    if not 0 <= rank < pg.size():
        raise ValueError(f"Invalid {role} rank: {rank} is not a rank of the group (world size {pg.size()})")


def _shape(shape):
    return "(" + ", ".join(str(n) for n in shape) + ")"


def _check_list(tensors, name, size, like, op, length_message):
    """PyTorch's checks of a list of one tensor per rank, each like `like` (an array)."""
    if not isinstance(tensors, list):
        raise TypeError(f"Invalid function argument. Expected parameter `{name}` of type List[torch.Tensor]\n"
                        f"             but got {type(tensors)} instead.")
    if not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError(f"Invalid function argument. Expected parameter `{name}` of type List[torch.Tensor]\n"
                        f"             but got {type(tensors)} with elements of type {[type(t) for t in tensors]}.")
    if len(tensors) != size:
        raise RuntimeError(f"ProcessGroupMPI::{op}: " + length_message.format(size=size, got=len(tensors)))
    for i, t in enumerate(tensors):
        arr = _array(t, name)
        if arr.dtype != like.dtype:
            raise ValueError(f"Invalid usage of tensors with different dtypesFound {t.dtype} and  "
                             f"{from_numpy_dtype(like.dtype)}")
        if arr.shape != like.shape:
            raise RuntimeError(f"ProcessGroupMPI::{op}: invalid tensor size at index {i} (expected "
                               f"{_shape(like.shape)}, got {_shape(arr.shape)})")


def _check_sizes(op, whole, part, size):
    if whole.dtype != part.dtype:
        raise RuntimeError(f"ProcessGroupMPI::{op}: invalid tensor type (expected {from_numpy_dtype(part.dtype)}, "
                           f"got {from_numpy_dtype(whole.dtype)})")
    if whole.size != size * part.size:
        raise RuntimeError(f"ProcessGroupMPI::{op}: invalid tensor size (the whole tensor must have world size "
                           f"({size}) times {part.size} elements, got {whole.size})")
