"""Run under mpiexec: trains a small MLP with DistributedDataParallel, each rank on its
shard of every global batch (uneven when the batch does not split evenly), and checks on
every rank that the parameters equal those of one process training on the whole batches.

    mpiexec -n 2 python tests/distributed/ranks/ddp_train.py --opt adam --accum 2

Prints "OK <max difference>" on success; raises (so mpiexec exits nonzero) otherwise."""
import argparse

import numpy as np

import jitgrad as torch
import jitgrad.distributed as dist
from jitgrad.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--opt", choices=["sgd", "adam"], default="sgd")
p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
p.add_argument("--steps", type=int, default=4)
p.add_argument("--batch", type=int, default=13)
p.add_argument("--accum", type=int, default=1, help="micro-batches per step (all but the last under no_sync)")
p.add_argument("--bucket-mb", type=float, default=0.0005, help="small: several buckets")
p.add_argument("--as-view", action="store_true", help="gradient_as_bucket_view=True")
p.add_argument("--hidden", type=int, default=16, help="96 in float64: weights all-reduced in their own .grad")
args = p.parse_args()

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
dtype = getattr(torch, args.dtype)
tol = 1e-10 if args.dtype == "float64" else 1e-5


def model(seed):
    torch.manual_seed(seed)
    h = args.hidden
    m = torch.nn.Sequential(torch.nn.Linear(6, h), torch.nn.Tanh(), torch.nn.Linear(h, h), torch.nn.Tanh(),
                            torch.nn.Linear(h, 3)).to(dtype)
    m.register_buffer("scale", torch.full((1,), 1.0 + seed, dtype=dtype))
    return m


def optimizer(m):
    if args.opt == "sgd":
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.Adam(m.parameters(), lr=0.01)


rng = np.random.default_rng(0)
n_micro = args.steps * args.accum
X = rng.standard_normal((n_micro, args.batch, 6))
Y = rng.integers(0, 3, (n_micro, args.batch))


def loss_of(m, x, y, share):
    # `share`: this batch's part of the step's mean over all its samples
    out = m(torch.tensor(x, dtype=dtype)) * m.module.scale if isinstance(m, DDP) else m(torch.tensor(x, dtype=dtype)) * m.scale
    return torch.nn.functional.cross_entropy(out, torch.tensor(y), reduction="sum") * share


# one process, whole batches
ref = model(0)
opt = optimizer(ref)
for s in range(args.steps):
    opt.zero_grad()
    for k in range(args.accum):
        i = s * args.accum + k
        loss_of(ref, X[i], Y[i], 1.0 / (args.batch * args.accum)).backward()
    opt.step()

# every rank starts from a different model: DDP must copy rank 0's parameters and buffers
ddp = DDP(model(rank), bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=args.as_view)
assert len(ddp.reducer.buckets) > 1 or args.bucket_mb >= 1
opt = optimizer(ddp)
for s in range(args.steps):
    opt.zero_grad()
    for k in range(args.accum):
        i = s * args.accum + k
        part = np.array_split(np.arange(args.batch), world)[rank]
        # DDP averages over ranks: scale so the average is the mean over the whole batch
        share = world / (args.batch * args.accum)
        if k + 1 < args.accum:
            with ddp.no_sync():
                loss_of(ddp, X[i][part], Y[i][part], share).backward()
        else:
            loss_of(ddp, X[i][part], Y[i][part], share).backward()
    opt.step()

diff = max(float(np.abs(a._data - b._data).max()) for a, b in zip(ref.parameters(), ddp.module.parameters()))
assert diff <= tol, f"rank {rank}: parameters differ from one process on the whole batch by {diff}"
dist.barrier()
dist.destroy_process_group()
print(f"OK rank {rank} {diff:.3g}")
