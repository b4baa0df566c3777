"""Rank script: the last rank raises an error it does not handle, either before
init_process_group (argv[1] == "before-init": the others wait in MPI's initialization,
which no timeout bounds) or while the others wait in an all_reduce (with the default
timeout of 30 minutes): the job must end at once, with the traceback and a nonzero exit
status, instead of hanging."""
import os
import sys

import jitgrad as torch
import jitgrad.distributed as dist

last = int(os.environ["PMI_RANK"]) == int(os.environ["PMI_SIZE"]) - 1  # MPICH's launcher says who is who
if last and sys.argv[1] == "before-init":
    raise ZeroDivisionError("this rank fails on purpose")
dist.init_process_group("mpi")
if last:
    raise ZeroDivisionError("this rank fails on purpose")
dist.all_reduce(torch.ones(3))
print("all_reduce returned: the failing rank was waited for")
