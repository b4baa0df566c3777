"""Rank script: PyTorch's errors, raised alike on every rank before anything is sent, so
that after each one the group still works (checked at the end); rank 0 prints "errors ok"."""
import datetime
import os

import numpy as np
from mpi4py import MPI

import jitgrad as torch
import jitgrad.distributed as dist
from jitgrad.distributed import ReduceOp


def raises(kind, start, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except kind as e:
        assert str(e).startswith(start), f"{type(e).__name__}: {e!r} does not start with {start!r}"
        return
    raise AssertionError(f"{fn.__name__} did not raise {kind.__name__} ({start!r})")


NOT_INIT = "Default process group has not been initialized, please make sure to call init_process_group."
for fn, args in [(dist.get_rank, ()), (dist.get_world_size, ()), (dist.all_reduce, (torch.ones(1),)),
                 (dist.barrier, ()), (dist.broadcast, (torch.ones(1), 0)), (dist.get_backend, ())]:
    raises(ValueError, NOT_INIT, fn, *args)
raises(AssertionError, "Process group cannot be None", dist.destroy_process_group)
raises(ValueError, "Invalid backend: 'nccl'", dist.init_process_group, "nccl")
raises(TypeError, "Expected timeout argument to be of type datetime.timedelta", dist.init_process_group, timeout=5)

# what the launcher or the script says about the ranks must agree with MPI
mpi_rank = MPI.COMM_WORLD.Get_rank()
raises(ValueError, "init_process_group(rank=7) disagrees with MPI", dist.init_process_group, rank=7)
raises(ValueError, "init_process_group(world_size=99)", dist.init_process_group, world_size=99)
os.environ["RANK"] = "-3"
raises(ValueError, "environment variable RANK=-3 disagrees with MPI", dist.init_process_group)
os.environ["RANK"] = str(mpi_rank)
dist.init_process_group("MPI", "env://", datetime.timedelta(seconds=60), rank=mpi_rank)
RANK, N = dist.get_rank(), dist.get_world_size()
assert RANK == mpi_rank and dist.is_initialized()
raises(ValueError, "trying to initialize the default process group twice!", dist.init_process_group)

for dtype in [torch.int64, torch.int32, torch.bool]:
    name = {torch.int64: "Long", torch.int32: "Int", torch.bool: "Bool"}[dtype]
    raises(RuntimeError, f"result type Float can't be cast to the desired output type {name}",
           dist.all_reduce, torch.ones(3, dtype=dtype), op=ReduceOp.AVG)
raises(RuntimeError, "Cannot use ReduceOp.BAND with non-integral dtype", dist.all_reduce, torch.ones(2),
       op=ReduceOp.BAND)
raises(TypeError, "Invalid function argument. Expected parameter `tensor` of type torch.Tensor",
       dist.all_reduce, np.ones(2))
raises(RuntimeError, "unsupported operation: more than one element of the written-to tensor refers to a single "
       "memory location", dist.all_reduce, torch.ones(1).expand(3))
for src in (N, -1):
    raises(RuntimeError, f"ProcessGroupMPI::broadcast: invalid root rank: {src}", dist.broadcast, torch.ones(2), src)
raises(ValueError, "Must specify global_rank or group_rank", dist.broadcast, torch.ones(2))
raises(RuntimeError, f"ProcessGroupMPI::reduce: invalid root rank: {N}", dist.reduce, torch.ones(2), N)
raises(RuntimeError, "result type Float can't be cast to the desired output type Long", dist.reduce,
       torch.ones(2, dtype=torch.int64), 0, ReduceOp.AVG)
raises(ValueError, "Invalid destination rank: destination rank should not be the same as the rank of the current "
       "process.", dist.send, torch.ones(2), RANK)
raises(ValueError, "Invalid destination rank", dist.isend, torch.ones(2), N + 1)
raises(ValueError, "Invalid source rank: source rank should not be the same", dist.recv, torch.ones(2), RANK)
raises(ValueError, "Invalid source rank", dist.irecv, torch.ones(2), -2)

raises(RuntimeError, f"ProcessGroupMPI::allgather: invalid output tensor list at index 0 (expected length {N}, "
       f"got {N + 1})", dist.all_gather, [torch.zeros(2) for _ in range(N + 1)], torch.ones(2))
raises(ValueError, "Invalid usage of tensors with different dtypesFound torch.float64 and  torch.float32",
       dist.all_gather, [torch.zeros(2, dtype=torch.float64) for _ in range(N)], torch.ones(2))
raises(RuntimeError, "ProcessGroupMPI::allgather: invalid tensor size at index 0 (expected (3, 2), got (2, 3))",
       dist.all_gather, [torch.zeros(2, 3) for _ in range(N)], torch.ones(3, 2))
raises(TypeError, "Invalid function argument. Expected parameter `tensor_list` of type List[torch.Tensor]",
       dist.all_gather, (torch.zeros(2),) * N, torch.ones(2))
raises(RuntimeError, "ProcessGroupMPI::reduce_scatter: invalid input tensor list size, must be world size",
       dist.reduce_scatter, torch.zeros(2), [torch.ones(2)] * (N + 1))
raises(RuntimeError, "ProcessGroupMPI::allgather: invalid tensor size", dist.all_gather_into_tensor,
       torch.zeros(2 * N + 1), torch.ones(2))
raises(RuntimeError, "ProcessGroupMPI::reduce_scatter: invalid tensor type", dist.reduce_scatter_tensor,
       torch.zeros(2), torch.ones(2 * N, dtype=torch.float64))
raises(ValueError, "Invalid process group specified", dist.get_rank, object())

# none of them sent anything: the ranks still agree on what comes next
t = torch.ones(2)
dist.all_reduce(t)
assert t.tolist() == [float(N)] * 2
dist.destroy_process_group()
raises(ValueError, NOT_INIT, dist.all_reduce, t)
if RANK == 0:
    print("errors ok")
