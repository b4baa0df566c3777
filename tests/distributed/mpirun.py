"""Running a rank script of tests/distributed/ranks/ under `mpiexec -n N`, from a pytest test.

MPI is kept out of the pytest process (importing mpi4py.MPI initializes MPI for good, and
init_process_group changes sys.excepthook): each test starts a job and checks its exit
status and output. A job that outlives its time limit is killed with all its ranks (they
run in a session of their own), so a hang fails the test instead of the suite.
"""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, USING_TORCH_AS_JITGRAD

RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and MPIEXEC is not None
# CI installs the distributed extra and sets this, so that these tests cannot quietly skip there
if os.environ.get("JITGRAD_REQUIRE_MPI") == "1" and not HAVE_MPI:
    raise RuntimeError("JITGRAD_REQUIRE_MPI=1 but mpi4py or mpiexec is missing: pip install -e '.[distributed]'")

needs_mpi = pytest.mark.skipif(
    USING_TORCH_AS_JITGRAD or not HAVE_MPI,
    reason="about jitgrad's own MPI transport" if USING_TORCH_AS_JITGRAD else
    'mpi4py or mpiexec is missing: pip install -e ".[distributed]" (mpi4py and mpich)')


def mpirun(script, n=2, *args, timeout=120, env=None):
    """Run ranks/<script> on n ranks; (return code, stdout, stderr, seconds)."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    e.update(env or {})
    cmd = [MPIEXEC, "-n", str(n), sys.executable, os.path.join(RANKS, script), *map(str, args)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=ROOT,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"mpiexec -n {n} {script} still ran after {timeout} s (killed):\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err, time.perf_counter() - start
