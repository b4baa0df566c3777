"""Run under mpiexec: DistributedDataParallel's checks and its unused-parameter handling.

    mpiexec -n 2 python tests/distributed/ranks/ddp_checks.py CASE

Prints "OK <case> rank <r>" when the case behaves as PyTorch's DDP does."""
import sys

import numpy as np

import jitgrad as torch
import jitgrad.distributed as dist
from jitgrad.nn.parallel import DistributedDataParallel as DDP

case = sys.argv[1]
threads_before = torch.get_num_threads()
dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


class TwoHeads(torch.nn.Module):
    """`head` is used on the ranks in `users` only."""

    def __init__(self, users):
        super().__init__()
        self.body = torch.nn.Linear(3, 4).double()
        self.head = torch.nn.Linear(4, 1).double()
        self.users = users

    def forward(self, x):
        h = self.body(x)
        return self.head(h).sum() if rank in self.users else h.sum()


def raises(fn, match):
    try:
        fn()
    except RuntimeError as e:
        assert match in str(e), str(e)
        return str(e)
    raise AssertionError(f"no RuntimeError matching {match!r}")


if case == "param_count":
    sizes = [3, 4] if rank == 0 else [3]
    m = torch.nn.Sequential(*[torch.nn.Linear(s, s) for s in sizes])
    msg = raises(lambda: DDP(m), "DDP expects same model across all ranks, but Rank")
    assert f"Rank {rank} has {2 * len(sizes)} params" in msg, msg
elif case == "param_shape":
    m = torch.nn.Linear(3, 4 if rank == 0 else 5)
    raises(lambda: DDP(m), "appears not to match sizes of the same param in process")
elif case == "unused":
    ddp = DDP(TwoHeads(users=()))
    ddp(torch.ones(2, 3, dtype=torch.float64)).backward()
    msg = raises(lambda: ddp(torch.ones(2, 3, dtype=torch.float64)),
                 "Expected to have finished reduction in the prior iteration before starting a new one")
    assert "find_unused_parameters=True" in msg and f"for rank {rank}: 2 3" in msg, msg
elif case == "find_unused":
    # head used on rank 0 only: its gradient is rank 0's divided by the world size; a
    # parameter no rank uses keeps .grad None
    ddp = DDP(TwoHeads(users=(0,)), find_unused_parameters=True)
    x = torch.full((2, 3), 1.0 + rank, dtype=torch.float64)
    for _ in range(2):
        ddp.zero_grad(set_to_none=True)
        ddp(x).backward()
    ref = TwoHeads(users=(rank,))
    ref.load_state_dict(ddp.module.state_dict())
    want = {}
    for r in range(world):
        ref.users = (0,) if r == 0 else ()
        ref.zero_grad(set_to_none=True)
        rank_was, rank = rank, r
        ref(torch.full((2, 3), 1.0 + r, dtype=torch.float64)).backward()
        rank = rank_was
        for name, p in ref.named_parameters():
            if p.grad is not None:
                want[name] = want.get(name, 0) + p.grad._data / world
    for name, p in ddp.module.named_parameters():
        np.testing.assert_allclose(p.grad._data, want[name], rtol=0, atol=1e-12)
    ddp2 = DDP(TwoHeads(users=()), find_unused_parameters=True)
    ddp2(x).backward()
    assert ddp2.module.head.weight.grad is None and ddp2.module.body.weight.grad is not None
elif case == "overlap":
    # with several buckets, the first starts while the backward still has layers to run
    m = torch.nn.Sequential(*[torch.nn.Linear(32, 32).double() for _ in range(4)])
    ddp = DDP(m, bucket_cap_mb=0.008)
    starts = []
    start = ddp.reducer._start

    def record(b):
        starts.append((b.index, m[0].weight.grad is None))
        start(b)

    ddp.reducer._start = record
    ddp(torch.ones(2, 32, dtype=torch.float64)).sum().backward()
    assert len(starts) == len(ddp.reducer.buckets) >= 3, starts
    assert [i for i, _ in starts] == list(range(len(starts)))
    assert starts[0][1], "the first bucket started only after the first layer's gradient was made"
elif case == "threads":
    # run without a thread count set: the ranks (all on this machine) share its cores
    from jitgrad._core.threads import physical_cores

    assert threads_before == physical_cores(), threads_before
    assert torch.get_num_threads() == max(1, physical_cores() // world), torch.get_num_threads()
else:
    raise SystemExit(f"unknown case {case}")
dist.barrier()
print(f"OK {case} rank {rank}", flush=True)
