"""benchmarks/distributed.py runs and reports every row, under mpiexec -n 2 and on one
rank (a smoke run: one repeat of one step; the times themselves are the benchmark's to
judge, never a test's)."""
import os
import sys

from conftest import ROOT
from mpijob import needs_mpi, run

SCRIPT = os.path.join(ROOT, "benchmarks", "distributed.py")
ROWS = ["(a)  step without DDP, 32 rows", "(a') the same, the ranks in lockstep", "(b)  all-reduce of the gradients, one flat buffer",
        "(b') all-reduce bucket by bucket, (c)'s 2 buckets of 1.02, 1.53 MB",
        "(b'') all-reduce bucket by bucket, (d)'s 3 buckets of 0.02, 1.00, 1.53 MB",
        "(c)  DDP step, default buckets", "(d)  DDP step, bucket_cap_mb=0.01",
        "(e)  DDP step, one all-reduce after backward", "(f)  DDP step as (c) under no_sync (no communication)"]


def report(args, ranks=None):
    rc, out, err = run([sys.executable, SCRIPT, "--repeats", 1, "--steps", 1, *args], ranks)
    assert rc == 0, f"stdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    return out


def table_rows(out):
    """The scaling table's N column."""
    return [int(ln.split()[0]) for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]


@needs_mpi
def test_two_ranks_report_the_rows_the_ratios_and_the_scaling_model():
    out = report([], ranks=2)
    for row in ROWS:
        assert out.count(row) == 1, out          # rank 0 alone prints
    assert "(c) / ((a)+(b)) = " in out and "target <= 1.15" in out and "(d) / (e) = " in out, out
    assert "not hidden: (c) - (f) = " in out and "(c) / ((a')+(b)) = " in out, out
    assert "ring model: latency" in out and "(measured)" in out, out
    assert table_rows(out) == [1, 2, 4, 8, 16, 32, 64], out


@needs_mpi
def test_one_rank_plans_from_a_given_bandwidth():
    out = report(["--bandwidth", 10, "--latency", 5])
    assert "(a)  step without DDP, 64 rows" in out and "is DDP's own cost" in out, out
    assert "latency 5.00 us per step, bandwidth 10.00 GB/s (given)" in out, out
    assert table_rows(out) == [1, 2, 4, 8, 16, 32, 64], out
