"""jitgrad.distributed: the collectives on 2 and 3 ranks against numpy, PyTorch's errors,
timeouts, the abort of a job whose rank fails, and what happens without mpi4py. The MPI
jobs run under mpiexec in subprocesses (mpirun.py); the scripts are in ranks/."""
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from mpirun import mpirun, needs_mpi

import jitgrad


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_and_op_matches_numpy(n):
    # 3 ranks on this 2-core machine: oversubscribed, and uneven to every algorithm
    rc, out, err, _ = mpirun("collectives.py", n)
    assert rc == 0 and "collectives ok" in out, err[-4000:]


@needs_mpi
def test_pytorch_errors_leave_the_group_usable():
    rc, out, err, _ = mpirun("errors.py", 2)
    assert rc == 0 and "errors ok" in out, err[-4000:]


@needs_mpi
def test_a_collective_a_rank_never_joins_times_out():
    rc, out, err, _ = mpirun("timeout.py", 2)
    assert rc == 0 and "timeout ok" in out, err[-4000:]


@needs_mpi
@pytest.mark.parametrize("n,when", [(2, "in-collective"), (3, "in-collective"), (2, "before-init")])
def test_an_unhandled_error_on_one_rank_ends_the_job(n, when):
    # the other ranks wait in an all_reduce whose timeout is 30 minutes, or in MPI's own
    # initialization, which has none: only the abort ends them
    rc, out, err, seconds = mpirun("abort.py", n, when, timeout=120)
    assert rc != 0, out
    assert "ZeroDivisionError: this rank fails on purpose" in err and "aborting the MPI job" in err, err[-4000:]
    assert "the failing rank was waited for" not in out
    assert seconds < 60


def _fresh(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_without_mpi4py_the_first_use_says_what_to_install():
    out = _fresh("""
import sys
sys.modules["mpi4py"] = sys.modules["mpi4py.MPI"] = None  # as if it were not installed
import jitgrad
dist = jitgrad.distributed
assert dist.is_available() and not dist.is_mpi_available() and not dist.is_initialized()
try:
    dist.init_process_group("mpi")
except RuntimeError as e:
    assert str(e).startswith("Distributed package doesn't have MPI built in"), e
    assert 'pip install "jitgrad[distributed]"' in str(e), e
    print("clear")
""")
    assert out.split() == ["clear"]


def test_importing_it_leaves_mpi_uninitialized():
    # mpi4py.MPI initializes MPI when imported: only init_process_group may do that
    out = _fresh("import sys; import jitgrad.distributed as d; d.is_mpi_available(); d.ReduceOp.SUM; "
                 "print('mpi4py.MPI' in sys.modules)")
    assert out.split() == ["False"]


def test_before_init_as_pytorch():
    # in-process, with no MPI: these are the same in PyTorch (JITGRAD_TESTS_USE_TORCH=1 checks them on it)
    dist = jitgrad.distributed
    assert dist.is_available() and not dist.is_initialized() and dist.group.WORLD is None
    message = r"^Default process group has not been initialized, please make sure to call init_process_group\.$"
    for fn, args in [(dist.get_rank, ()), (dist.get_world_size, ()), (dist.get_backend, ()), (dist.barrier, ()),
                     (dist.all_reduce, (jitgrad.ones(2),)), (dist.broadcast, (jitgrad.ones(2), 0)),
                     (dist.all_gather, ([jitgrad.ones(2)], jitgrad.ones(2))), (dist.send, (jitgrad.ones(2), 1))]:
        with pytest.raises(ValueError, match=message):
            fn(*args)
    with pytest.raises(AssertionError, match="Process group cannot be None"):
        dist.destroy_process_group()
    assert issubclass(dist.DistBackendError, dist.DistError) and issubclass(dist.DistError, RuntimeError)
    assert dist.default_pg_timeout.total_seconds() == 1800
    ops = dist.ReduceOp
    assert len({ops.SUM, ops.AVG, ops.PRODUCT, ops.MIN, ops.MAX}) == 5 and repr(ops.SUM) == "<RedOpType.SUM: 0>"
