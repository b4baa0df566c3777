#!/usr/bin/env python
"""DistributedDataParallel over MPI: how much of the gradient all-reduce the backward hides.

    mpiexec -n 2 python benchmarks/distributed.py [--repeats 15] [--steps 10]
    mpiexec -n 1 python benchmarks/distributed.py      # the 1-rank baseline (no communication)

The model is side_by_side.py's MNIST MLP (784-512-512-10, float32, 669,706 parameters,
2.7 MB of gradients), SGD, cross-entropy, a global batch of 64: each of the N ranks steps
on 64 // N rows, one thread per rank. Rank 0 prints, per step (the median over the
repeats of --steps steps each, the slowest rank's):

  (a)  one SGD step on the rank's share of the batch, without DDP (all ranks at once, as
       under DDP, so that they compete for the cores and memory as they do there);
  (a') the same step followed by an 8-byte all-reduce: the ranks in lockstep, as a DDP
       step keeps them, so that each step waits for the slower rank (on a busy machine
       the ranks' step times scatter, and a step in lockstep costs their maximum);
  (b)  the all-reduce of all the gradients alone: one flat buffer, and bucket by bucket
       (the buckets of (c) and (d), read from their DDP: parameters in reverse order, a
       bucket closed once it holds its cap);
  (c)  the DDP step with the default buckets (bucket_cap_mb 25, the first bucket 1 MB as
       in PyTorch: 2 buckets for this model, the last two layers' and the first's);
  (d)  the DDP step with small buckets (--small-cap MB, 0.01 by default: a bucket per
       layer, 3, so that two of the all-reduces can overlap the backward);
  (e)  the DDP step with one all-reduce after the backward (one bucket of everything);
  (f)  a DDP step as (c)'s under no_sync() (another replica: its ranks drift apart): DDP's
       own cost without communication, so that (c) - (f) is the communication not hidden;

and the ratios (c)/((a)+(b)) and (d)/((a)+(b)) that issue 15 bounds by 1.15, and (d)/(e):
below 1 when bucketed overlap beats the single all-reduce after backward.

Then the scaling model, with the all-reduce latency and bandwidth measured here (MPI's
all-reduce of 8 B .. 4 MB buffers, fitted to the ring cost 2(N-1)/N * bytes / bandwidth
+ 2(N-1) * latency):

    step(N) = compute(B/N) + max(0, allreduce(P, N) - overlap(N))

compute(B/N) the measured forward+backward+update on B/N rows, P the gradient bytes, and
overlap(N) the part of the all-reduce the backward can hide: at most the all-reduce of
every bucket but the last (the last holds the first layer, whose gradients the backward
makes last), and at most the backward that follows the first bucket (the measured
backward times the share of the parameters outside that bucket). --bandwidth / --latency replace the measured values, to plan a cluster.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.insert(0, REPO_ROOT)     # the jitgrad of this checkout

import jitgrad  # noqa: E402
import jitgrad.distributed as dist  # noqa: E402
from jitgrad.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

SIZES = (784, 512, 512, 10)
GLOBAL_BATCH = 64
LR = 0.01


def make_model():
    jitgrad.manual_seed(0)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(jitgrad.nn.Linear(n_in, n_out))
        if i < len(SIZES) - 2:
            layers.append(jitgrad.nn.ReLU())
    return jitgrad.nn.Sequential(*layers)


def batch(rows, rank):
    rng = np.random.default_rng(rank)
    x = jitgrad.tensor(rng.standard_normal((rows, SIZES[0])).astype(np.float32))
    return x, jitgrad.tensor(rng.integers(0, SIZES[-1], rows))


def stepper(net, params, x, y):
    opt = jitgrad.optim.SGD(params, lr=LR)
    loss_fn = jitgrad.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
    return step


def timed(comm, fns, steps, repeats, warmup=3):
    """{name: seconds per call} of each fn in fns: the median over repeats of `steps` calls
    in a row, the slowest rank's. The fns take turns within each repeat, so that a change
    in the machine's load (2 shared cores here) reaches them all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    runs = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            runs[name].append((time.perf_counter() - t0) / steps)
    return {name: comm.allreduce(statistics.median(r), op=_mpi().MAX) for name, r in runs.items()}


def _mpi():
    from mpi4py import MPI
    return MPI


def allreduce(comm, nbytes_list):
    """A call that all-reduces (sum, blocking, in place) a float32 buffer of each size in turn."""
    bufs = [np.ones(max(1, n // 4), np.float32) for n in nbytes_list]
    MPI = _mpi()

    def run():
        for b in bufs:
            comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
    return run


def ring_fit(comm, repeats):
    """(latency s, bandwidth B/s) of MPI's all-reduce here, from buffers of 8 B .. 4 MB
    fitted to 2(N-1)/N * bytes / bandwidth + 2(N-1) * latency by least squares on the
    relative errors (so that the small buffers, which give the latency, count as much as
    the large ones, which give the bandwidth)."""
    n = comm.Get_size()
    sizes = [8, 1024, 64 * 1024, 1024 ** 2, 4 * 1024 ** 2]
    times = list(timed(comm, {s: allreduce(comm, [s]) for s in sizes}, 10, repeats).values())
    a = np.array([[2 * (n - 1) / n * s, 2 * (n - 1)] for s in sizes])
    t = np.array(times)
    (inv_bw, lat), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return max(lat, 0.0), 1.0 / inv_bw, list(zip(sizes, times))


def ring(nbytes, n, lat, bw):
    return 0.0 if n == 1 else 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


def ddp_step(rows, rank, cap_mb):
    """(a DDP training step with these buckets (None: DDP's default), its module, the
    bytes of each of its buckets, in the order they are reduced)."""
    model = make_model()
    x, y = batch(rows, rank)
    ddp = DDP(model) if cap_mb is None else DDP(model, bucket_cap_mb=cap_mb)
    sizes = [b.nbytes for b in ddp.reducer.buckets]
    return stepper(ddp, list(model.parameters()), x, y), ddp, sizes


def lockstep(step_fn, comm):
    token = np.zeros(1, np.float64)
    MPI = _mpi()

    def step():
        step_fn()
        comm.Allreduce(MPI.IN_PLACE, token, op=MPI.SUM)
    return step


def unsynced(ddp_step_fn, ddp):
    def step():
        with ddp.no_sync():
            ddp_step_fn()
    return step


def check_replicas_equal(comm, model, what):
    """A benchmark of a wrong DDP measures nothing: after training, every rank's parameters
    must still be rank 0's."""
    flat = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    ref = flat.copy()
    comm.Bcast(ref, root=0)
    if comm.allreduce(float(np.max(np.abs(flat - ref))), op=_mpi().MAX) != 0.0:
        raise RuntimeError(f"DDP ({what}): the ranks' parameters differ after training")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--steps", type=int, default=10, help="steps per timed run")
    p.add_argument("--small-cap", type=float, default=0.01, help="bucket_cap_mb of row (d)")
    p.add_argument("--bandwidth", type=float, default=None, help="all-reduce bandwidth for the model, GB/s")
    p.add_argument("--latency", type=float, default=None, help="all-reduce latency per ring step for the model, us")
    args = p.parse_args(argv)

    jitgrad.set_num_threads(1)
    dist.init_process_group("mpi")
    comm, rank, n = dist._comm(), dist.get_rank(), dist.get_world_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    rows = GLOBAL_BATCH // n
    model = make_model()
    params = list(model.parameters())
    total = sum(p.numel() * 4 for p in params)
    say(f"MNIST MLP {'-'.join(map(str, SIZES))} float32, {sum(p.numel() for p in params):,} parameters "
        f"({total / 2 ** 20:.2f} MB of gradients); {n} rank(s), global batch {GLOBAL_BATCH} = {n} x {rows}, "
        f"1 thread per rank; median of {args.repeats} runs of {args.steps} steps, slowest rank")

    s, r = args.steps, args.repeats
    x, y = batch(rows, rank)
    ddps = {"c": ddp_step(rows, rank, None), "d": ddp_step(rows, rank, args.small_cap),
            "e": ddp_step(rows, rank, 1e6)}
    default, small = ddps["c"][2], ddps["d"][2]
    t = timed(comm, {"a": stepper(model, params, x, y), "a'": lockstep(stepper(model, params, x, y), comm),
                     "b": allreduce(comm, [total]),
                     "b'": allreduce(comm, default), "b''": allreduce(comm, small),
                     **{k: step for k, (step, _, _) in ddps.items()}, "f": unsynced(*ddp_step(rows, rank, None)[:2])}, s, r)
    for k, (_, ddp, _) in ddps.items():
        check_replicas_equal(comm, ddp.module, k)
    a, a_lock, b_flat, b_default, b_small, c, d, e, f = (
        t[k] for k in ("a", "a'", "b", "b'", "b''", "c", "d", "e", "f"))
    def mb(sizes):
        return f"{len(sizes)} bucket{'s' if len(sizes) > 1 else ''} of " + \
            ", ".join(f"{n / 2 ** 20:.2f}" for n in sizes) + " MB"
    table = [
        (f"(a)  step without DDP, {rows} rows", a),
        ("(a') the same, the ranks in lockstep", a_lock),
        ("(b)  all-reduce of the gradients, one flat buffer", b_flat),
        (f"(b') all-reduce bucket by bucket, (c)'s {mb(default)}", b_default),
        (f"(b'') all-reduce bucket by bucket, (d)'s {mb(small)}", b_small),
        ("(c)  DDP step, default buckets", c),
        (f"(d)  DDP step, bucket_cap_mb={args.small_cap:g}", d),
        ("(e)  DDP step, one all-reduce after backward", e),
        ("(f)  DDP step as (c) under no_sync (no communication)", f),
    ]
    say("")
    for label, t in table:
        say(f"{label:<74} {t * 1e3:8.3f} ms")
    say("")
    if n == 1:
        say(f"one rank, nothing to communicate: (c) / (a) = {c / a:.3f} is DDP's own cost (buckets, hooks)")
    else:
        ratios(say, a, b_flat, c, d, e)
        say(f"not hidden: (c) - (f) = {(c - f) * 1e3:.3f} ms, (d) - (f) = {(d - f) * 1e3:.3f} ms; "
            f"DDP's own cost (f) - (a) = {(f - a) * 1e3:.3f} ms; lockstep (a') - (a) = {(a_lock - a) * 1e3:.3f} ms")
        say(f"against the step in lockstep: (c) / ((a')+(b)) = {c / (a_lock + b_flat):.3f}   "
            f"(d) / ((a')+(b)) = {d / (a_lock + b_flat):.3f}")

    if n == 1 and (args.bandwidth is None or args.latency is None):
        say("\nscaling model: run with 2 or more ranks to measure the all-reduce (or give --bandwidth and --latency)")
        return
    lat, bw, points = ring_fit(comm, r) if n > 1 else (None, None, [])
    lat = args.latency * 1e-6 if args.latency is not None else lat
    bw = args.bandwidth * 1e9 if args.bandwidth is not None else bw
    if points:
        say("\nall-reduce here (" + ", ".join(f"{sz} B: {t * 1e6:.1f} us" for sz, t in points) + ")")
    say(f"ring model: latency {lat * 1e6:.2f} us per step, bandwidth {bw / 1e9:.2f} GB/s"
        + (" (given)" if args.bandwidth is not None or args.latency is not None else " (measured)"))
    scaling_table(comm, model, small, lat, bw, s, r, say, measured={n: (c, d)})


def ratios(say, a, b_flat, c, d, e):
    base = a + b_flat
    say(f"(c) / ((a)+(b)) = {c / base:.3f}   (d) / ((a)+(b)) = {d / base:.3f}   target <= 1.15: "
        f"{'met' if min(c, d) <= 1.15 * base else 'NOT met'}")
    say(f"(d) / (e) = {d / e:.3f}: bucketed overlap {'beats' if d < e else 'does NOT beat'} "
        "one all-reduce after backward")
    say(f"hidden under the backward: (a)+(b) - (d) = {(base - d) * 1e3:.3f} ms of the {b_flat * 1e3:.3f} ms "
        "all-reduce")


def scaling_table(comm, model, small, lat, bw, steps, repeats, say, measured):
    """Predicted step time on N ranks with one bucket and with (d)'s buckets (bytes, in
    the order they are reduced), from the compute measured here at each B/N (one rank's
    forward+backward+update)."""
    total, last, first_bucket = sum(small), small[-1], small[0]
    say(f"\n{'N':>4} {'rows':>5} {'compute':>10} {'allreduce':>10} {'step, 1 bucket':>15} "
        f"{'step, small':>12} {'measured':>20}")
    rank, loss_fn = comm.Get_rank(), jitgrad.nn.CrossEntropyLoss()
    for n in (1, 2, 4, 8, 16, 32, 64):
        rows = GLOBAL_BATCH // n
        x, y = batch(rows, rank)
        t = timed(comm, {"step": stepper(model, list(model.parameters()), x, y),
                         "forward": lambda: loss_fn(model(x), y)}, steps, repeats)
        compute, bwd = t["step"], t["step"] - t["forward"]    # bwd: the backward and the update
        # the backward after the first bucket is ready, in proportion to the parameters it still covers
        overlap = min(ring(total - last, n, lat, bw), bwd * (1 - first_bucket / total)) if len(small) > 1 else 0.0
        one = compute + ring(total, n, lat, bw)
        bucketed = compute + max(0.0, ring(total, n, lat, bw) - overlap)
        seen = measured.get(n)
        seen = f"{seen[0] * 1e3:8.3f} / {seen[1] * 1e3:.3f}" if seen else ""
        say(f"{n:>4} {rows:>5} {compute * 1e3:9.3f}  {ring(total, n, lat, bw) * 1e3:9.3f}  {one * 1e3:14.3f}  "
            f"{bucketed * 1e3:11.3f}  {seen:>20}")
    say("(ms; compute is measured at each rows count here; 'measured' is rows (c) / (d) above)")


if __name__ == "__main__":
    main()
