"""jitgrad.distributed: torch.distributed's API, over MPI (mpi4py).

    mpiexec -n 2 python train.py      # pip install "jitgrad[distributed]": mpi4py and mpich

    import jitgrad.distributed as dist
    dist.init_process_group("mpi")    # ranks from MPI
    dist.all_reduce(t, op=dist.ReduceOp.SUM)

mpi4py is optional: this package imports without it, and the first call that needs MPI
says how to install it. Modules: _backend (mpi4py, errors, ReduceOp), process_group (the
default group: init, rank, size, destroy, the abort on unhandled errors), work (Work: a
pending operation, its bounded wait), _wait (the poll that bounds it), collectives (on
Tensors), objects (on picklable objects).

Internal, for DistributedDataParallel (jitgrad.nn.parallel): _comm(group) is the group's
mpi4py communicator; Work.from_requests(requests, on_done=None, timeout=None) wraps the
requests of operations started on it.
"""
from jitgrad.distributed._backend import DistBackendError, DistError, ReduceOp, is_mpi_available
from jitgrad.distributed.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    barrier,
    broadcast,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    send,
)
from jitgrad.distributed.objects import all_gather_object, broadcast_object_list
from jitgrad.distributed.process_group import DEFAULT_TIMEOUT as default_pg_timeout
from jitgrad.distributed.process_group import (
    GroupMember,
    ProcessGroup,
    _comm,  # noqa: F401  (internal, for DistributedDataParallel)
    destroy_process_group,
    get_backend,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_initialized,
)
from jitgrad.distributed.work import Work

__all__ = ["DistBackendError", "DistError", "GroupMember", "ProcessGroup", "ReduceOp", "Work", "all_gather",
           "all_gather_into_tensor", "all_gather_object", "all_reduce", "barrier", "broadcast",
           "broadcast_object_list", "default_pg_timeout", "destroy_process_group", "get_backend", "get_rank", "get_world_size", "group",
           "init_process_group", "irecv", "is_available", "is_initialized", "is_mpi_available", "isend", "recv",
           "reduce", "reduce_scatter", "reduce_scatter_tensor", "send"]


def is_available():
    """Whether the distributed package is there (it is; whether MPI is: is_mpi_available())."""
    return True
