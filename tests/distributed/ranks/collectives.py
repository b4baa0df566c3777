"""Rank script: every collective and ReduceOp against numpy, on any number of ranks.

Each rank's input is drawn from a generator seeded by its rank, so every rank can compute
every other rank's input and hence the expected result. An assertion that fails ends the
job with a nonzero status (init_process_group's abort on unhandled errors); the last line
rank 0 prints is "collectives ok"."""
import itertools

import numpy as np
from mpi4py import MPI

import jitgrad as torch
import jitgrad.distributed as dist
from jitgrad.distributed import ReduceOp

dist.init_process_group("mpi")
RANK, N = dist.get_rank(), dist.get_world_size()
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-12)}


def data(rank, shape, dtype, seed):
    rng = np.random.default_rng([seed, rank])
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.dtype(dtype).kind == "i":
        return np.asarray(rng.integers(-4, 5, shape), dtype)
    return np.asarray(rng.standard_normal(shape), dtype)


def same(got, expected):
    got = got.numpy()
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape, expected.shape)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, **TOL[got.dtype.type])
    else:
        np.testing.assert_array_equal(got, expected)


def reduced(arrays, op):
    stack = np.stack(arrays)
    if stack.dtype == np.bool_:  # PyTorch's: or for SUM and MAX, and for PRODUCT and MIN
        return stack.any(0) if op in (ReduceOp.SUM, ReduceOp.MAX) else stack.all(0)
    fn = {ReduceOp.SUM: np.sum, ReduceOp.AVG: np.mean, ReduceOp.PRODUCT: np.prod, ReduceOp.MIN: np.min,
          ReduceOp.MAX: np.max}[op]
    return fn(stack, axis=0).astype(stack.dtype)


OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
DTYPES = [np.float32, np.float64, np.int64, np.int32, np.bool_]
for seed, (dtype, op) in enumerate(itertools.product(DTYPES, OPS)):
    if op == ReduceOp.AVG and dtype not in (np.float32, np.float64):
        continue  # an error (run_errors.py)
    for shape in [(5, 3), (), (0,), (1000,)]:
        t = torch.from_numpy(data(RANK, shape, dtype, seed).copy())
        before = t._version
        assert dist.all_reduce(t, op=op) is None
        same(t, reduced([data(r, shape, dtype, seed) for r in range(N)], op))
        assert t._version == before + 1, "an in-place write counts on the version counter"

# a non-contiguous tensor: reduced through a contiguous copy written back into its view
base = torch.from_numpy(data(RANK, (4, 6), np.float64, 100))
view = base.t()[1:5]
dist.all_reduce(view, op=ReduceOp.MAX)
expected = data(RANK, (4, 6), np.float64, 100)
expected.T[1:5] = reduced([data(r, (4, 6), np.float64, 100).T[1:5] for r in range(N)], ReduceOp.MAX)
same(base, expected)

# a leaf that requires grad may be written, as in PyTorch (DistributedDataParallel broadcasts parameters)
w = torch.ones(3, requires_grad=True)
dist.all_reduce(w)
assert w.requires_grad and w.tolist() == [float(N)] * 3

# async_op: a Work; the result is in place once wait() returned
works = [dist.all_reduce(torch.full((256,), float(RANK + i)), async_op=True) for i in range(3)]
outs = []
for i in range(3):
    t = torch.full((256,), float(RANK + i))
    outs.append((t, dist.all_reduce(t, op=ReduceOp.AVG, async_op=True)))
for t, work in outs:
    assert work.wait() is True and work.is_completed() and work.wait() is True
for i, (t, _) in enumerate(outs):
    assert np.all(t.numpy() == np.mean([r + i for r in range(N)]))
for work in works:
    work.wait()

# what DistributedDataParallel does: its own requests on the group's communicator, in a Work
# whose on_done runs once, after they completed
buckets = [np.full(1000, RANK + 1.0), np.full(10, RANK + 2.0)]
done = []
work = dist.Work.from_requests([dist._comm().Iallreduce(MPI.IN_PLACE, b, op=MPI.SUM) for b in buckets],
                               on_done=lambda: done.append([b.copy() for b in buckets]), timeout=30)
while not work.is_completed():
    pass
assert work.wait() and work.wait(timeout=1) and len(done) == 1
assert np.all(done[0][0] == sum(r + 1.0 for r in range(N))) and np.all(done[0][1] == sum(r + 2.0 for r in range(N)))

# broadcast from every rank, contiguous and not; only the receivers' tensors count a write
for src in range(N):
    t = torch.from_numpy(data(RANK, (3, 4), np.float32, 200 + src))
    assert dist.broadcast(t, src=src) is None
    same(t, data(src, (3, 4), np.float32, 200 + src))
    assert t._version == (0 if RANK == src else 1)
    nc = torch.from_numpy(data(RANK, (4, 3), np.int64, 300 + src)).t()
    work = dist.broadcast(nc, src, async_op=True)
    work.wait()
    same(nc, data(src, (4, 3), np.int64, 300 + src).T)

# all_gather into a list (one of them non-contiguous), and into one tensor
for dtype in DTYPES:
    mine = data(RANK, (2, 3), dtype, 400)
    outs = [torch.zeros(2, 3, dtype=torch.from_numpy(mine).dtype) for _ in range(N)]
    outs[-1] = torch.zeros(3, 2, dtype=outs[0].dtype).t()
    assert dist.all_gather(outs, torch.from_numpy(mine.copy())) is None
    for r in range(N):
        same(outs[r], data(r, (2, 3), dtype, 400))
    whole = torch.zeros(N * 2, 3, dtype=outs[0].dtype)
    dist.all_gather_into_tensor(whole, torch.from_numpy(mine.copy()), async_op=True).wait()
    same(whole, np.concatenate([data(r, (2, 3), dtype, 400) for r in range(N)]))

# reduce_scatter from a list and from one tensor: rank i gets part i reduced over the ranks
for seed, (dtype, op) in enumerate(itertools.product([np.float32, np.float64, np.int64], OPS)):
    if op == ReduceOp.AVG and dtype == np.int64:
        continue
    parts = [data(RANK, (3,), dtype, 500 + 10 * seed + i) for i in range(N)]
    out = torch.zeros(3, dtype=torch.from_numpy(parts[0]).dtype)
    assert dist.reduce_scatter(out, [torch.from_numpy(p) for p in parts], op=op) is None
    same(out, reduced([data(r, (3,), dtype, 500 + 10 * seed + RANK) for r in range(N)], op))
    out = torch.zeros(3, dtype=out.dtype)
    dist.reduce_scatter_tensor(out, torch.from_numpy(np.concatenate(parts)), op=op)
    same(out, reduced([data(r, (3,), dtype, 500 + 10 * seed + RANK) for r in range(N)], op))

# reduce into each rank in turn: the others keep their tensor
for dst, (dtype, op) in itertools.product(range(N), [(np.float64, ReduceOp.SUM), (np.float32, ReduceOp.AVG),
                                                      (np.int64, ReduceOp.MAX), (np.int32, ReduceOp.PRODUCT)]):
    t = torch.from_numpy(data(RANK, (2, 2), dtype, 800 + dst))
    dist.reduce(t, dst, op=op, async_op=True).wait()
    same(t, reduced([data(r, (2, 2), dtype, 800 + dst) for r in range(N)], op) if RANK == dst
         else data(RANK, (2, 2), dtype, 800 + dst))

# picklable objects, of a size that differs by rank
objects = [None] * N
dist.all_gather_object(objects, {"rank": RANK, "payload": list(range(RANK * 100))})
assert objects == [{"rank": r, "payload": list(range(r * 100))} for r in range(N)]
for src in range(N):
    objects = [f"rank {RANK}", RANK, None] if RANK == src else [None, None, None]
    dist.broadcast_object_list(objects, src=src)
    assert objects == [f"rank {src}", src, None], objects

# send/recv around the ring, blocking and not; recv(src=None) says who sent
nxt, prv = (RANK + 1) % N, (RANK - 1) % N
for dtype in DTYPES:
    got = torch.from_numpy(np.zeros_like(data(0, (7,), dtype, 600)))
    if RANK % 2 == 0:
        dist.send(torch.from_numpy(data(RANK, (7,), dtype, 600)), nxt)
        sender = dist.recv(got, None)
    else:
        sender = dist.recv(got, src=prv)
        dist.send(torch.from_numpy(data(RANK, (7,), dtype, 600)), dst=nxt)
    assert sender == prv
    same(got, data(prv, (7,), dtype, 600))
got = torch.zeros(4, 5).t()  # received into a non-contiguous view
sending = torch.from_numpy(data(RANK, (5, 4), np.float32, 700))
works = [dist.irecv(got, src=prv, tag=3), dist.isend(sending, nxt, tag=3)]
for work in works:
    work.wait()
same(got, data(prv, (5, 4), np.float32, 700))

assert dist.barrier() is None
dist.barrier(async_op=True).wait()
assert dist.get_backend() == "mpi" and dist.group.WORLD.size() == N and dist.get_rank(dist.group.WORLD) == RANK
dist.destroy_process_group()
assert not dist.is_initialized()
dist.init_process_group()  # again: MPI stays initialized
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
if RANK == 0:
    print("collectives ok")
