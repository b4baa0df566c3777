"""Threads per rank: ranks on one machine share its cores. jitgrad's default is a thread
per physical core (_core/threads.py), right for one process and wrong for several: two
ranks at two BLAS threads each on 2 cores made the MNIST MLP's DDP step about 4x slower
than at one thread each (their threads and MPI's waits competed for the cores). PyTorch's
launcher sets OMP_NUM_THREADS=1 per process for the same reason; here each rank gets its
share of the cores instead, unless the user chose a count (JITGRAD_NUM_THREADS,
OMP_NUM_THREADS, or torch.set_num_threads before init_process_group)."""
import os

from jitgrad._core import threads


def share_cores(MPI, comm):
    """Give this rank physical cores // (ranks on this machine) threads, at least one.
    A collective over comm (every rank calls it from init_process_group)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    n = local.Get_size()
    local.Free()
    if any(os.environ.get(v, "").strip() for v in ("JITGRAD_NUM_THREADS", "OMP_NUM_THREADS")):
        return
    if threads.get_num_threads() != threads.physical_cores():  # set by the user already
        return
    threads.set_num_threads(max(1, threads.physical_cores() // n))
