"""Rank script: a collective that rank 1 never joins times out on rank 0 with
DistBackendError after the group's timeout, and the group then refuses further use; a
Work waited with a timeout of its own times out after it. Rank 0 prints "timeout ok"."""
import datetime
import time

import jitgrad as torch
import jitgrad.distributed as dist

LIMIT = 2.0
dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=LIMIT))
RANK = dist.get_rank()


def times_out(fn, limit, what):
    start = time.perf_counter()
    try:
        fn()
    except dist.DistBackendError as e:
        took = time.perf_counter() - start
        assert isinstance(e, RuntimeError) and what in str(e) and f"after {limit:g} s" in str(e), str(e)
        assert limit <= took < limit + 5, took
        return
    raise AssertionError(f"{what} did not time out")


if RANK == 0:
    times_out(lambda: dist.all_reduce(torch.ones(3)), LIMIT, "all_reduce")
    try:
        dist.broadcast(torch.ones(3), 0)
    except dist.DistBackendError as e:
        assert "can no longer be used" in str(e) and "all_reduce timed out" in str(e), str(e)
    else:
        raise AssertionError("a broken group was used")
else:
    time.sleep(LIMIT + 1)  # busy elsewhere: never joins rank 0's all_reduce
dist.destroy_process_group()

dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=60))  # a fresh group works
if RANK == 0:
    work = dist.all_reduce(torch.ones(3), async_op=True)
    times_out(lambda: work.wait(timeout=datetime.timedelta(seconds=0.5)), 0.5, "all_reduce")
else:
    time.sleep(1.5)
dist.destroy_process_group()

# an init_process_group that rank 1 never calls: rank 0 times out, then may not try again
if RANK == 0:
    times_out(lambda: dist.init_process_group(timeout=datetime.timedelta(seconds=1)), 1, "init_process_group")
    try:
        dist.init_process_group()
    except dist.DistBackendError as e:
        assert "init_process_group timed out before" in str(e), str(e)
    else:
        raise AssertionError("init_process_group paired with a call of another rank that timed out")
    print("timeout ok")
else:
    time.sleep(1.5)
