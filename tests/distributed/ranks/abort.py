"""Rank script: the last rank raises an error it does not handle while the others wait in
an all_reduce (with the default timeout of 30 minutes): the job must end at once, with
the traceback and a nonzero exit status, instead of hanging."""
import jitgrad as torch
import jitgrad.distributed as dist

dist.init_process_group("mpi")
if dist.get_rank() == dist.get_world_size() - 1:
    raise ZeroDivisionError("this rank fails on purpose")
dist.all_reduce(torch.ones(3))
print("all_reduce returned: the failing rank was waited for")
