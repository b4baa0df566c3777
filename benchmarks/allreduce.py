#!/usr/bin/env python
"""MPI all-reduce on this machine, through jitgrad.distributed: latency and bandwidth.

    mpiexec -n 2 python benchmarks/allreduce.py [--quick] [--json out.json]

In-place float32 sums from 8 B to 64 MB, three ways, taking turns at each size:
  all_reduce  jitgrad.distributed.all_reduce(tensor): Iallreduce, then the poll that
              bounds the wait by the group's timeout (jitgrad/distributed/_wait.py)
  Work        Work.from_requests([comm.Iallreduce(MPI.IN_PLACE, array, op=MPI.SUM)]).wait():
              what DistributedDataParallel does with each gradient bucket
  MPI         comm.Allreduce(MPI.IN_PLACE, array): MPI's own blocking call, unbounded (the reference)
Each time is the best of several batches' mean per call (batches start after a barrier).
Bandwidth is bus bandwidth, as NCCL's tests count it: 2 (N-1)/N bytes over the time, the
bytes each rank sends and receives in a ring algorithm, so that it compares across N.
Rank 0 prints the table.
"""
import argparse
import json
import time

import numpy as np

import jitgrad
import jitgrad.distributed as dist

SIZES = [8, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def timed(fn, calls, batches, comm, MPI):
    best = float("inf")
    for _ in range(batches):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    # the slowest rank's time: a collective is done when it is done everywhere
    return comm.allreduce(best, op=MPI.MAX)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer calls and batches")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    from mpi4py import MPI  # here, not at the top: asv imports every module of benchmarks/ to find its benchmarks
    dist.init_process_group("mpi")
    comm = dist._comm()
    n, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for nbytes in SIZES:
        array = np.ones(nbytes // 4, np.float32)
        tensor = jitgrad.from_numpy(array)
        ways = {
            "all_reduce": lambda: dist.all_reduce(tensor),
            "Work": lambda: dist.Work.from_requests([comm.Iallreduce(MPI.IN_PLACE, array, op=MPI.SUM)]).wait(),
            "MPI": lambda: comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM),
        }
        calls = max(3, min(2000, int(5e7 / nbytes))) // (4 if args.quick else 1)
        times = {}
        for way, fn in ways.items():
            array.fill(1)
            fn()  # warm-up (and a check that it sums)
            assert array[0] == n, (way, array[0])
            times[way] = timed(fn, max(calls, 3), 2 if args.quick else 5, comm, MPI)
        rows.append({"bytes": nbytes, **{k: v * 1e6 for k, v in times.items()},
                     "busbw_GBs": 2 * (n - 1) / n * nbytes / times["all_reduce"] / 1e9})
    if rank == 0:
        print(f"MPI all-reduce, float32 in place, {n} ranks ({MPI.Get_library_version().splitlines()[0].strip()})")
        print(f"{'size':>8} {'all_reduce us':>14} {'Work us':>10} {'MPI us':>10} {'bus GB/s':>9}")
        for r in rows:
            size = f"{r['bytes'] >> 20} MB" if r["bytes"] >= 1 << 20 else (
                f"{r['bytes'] >> 10} KB" if r["bytes"] >= 1 << 10 else f"{r['bytes']} B")
            print(f"{size:>8} {r['all_reduce']:14.1f} {r['Work']:10.1f} {r['MPI']:10.1f} {r['busbw_GBs']:9.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
