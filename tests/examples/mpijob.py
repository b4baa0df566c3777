"""Running a job under `mpiexec` from a pytest test (the digits job, the README loop, the
distributed benchmark), as tests/distributed/mpirun.py runs its rank scripts: MPI stays
out of the pytest process, and a job that outlives its time limit is killed with all its
ranks (they run in a session of their own), so a hang fails the test, not the suite."""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

# the launcher of the MPI mpi4py runs on: the mpich wheel's, beside this Python, else PATH's
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and MPIEXEC is not None
# CI installs the distributed extra and sets this: there the tests must run, not skip
if os.environ.get("JITGRAD_REQUIRE_MPI") == "1" and not HAVE_MPI:
    raise RuntimeError("JITGRAD_REQUIRE_MPI=1 but mpi4py or mpiexec is missing: pip install -e '.[distributed]'")
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason='mpi4py or mpiexec is missing: pip install -e ".[distributed]"')


def run(args, ranks=None, timeout=600, cwd=ROOT):
    """`mpiexec -n ranks *args` (ranks None: args alone, one plain process) with this
    checkout first on the path; (return code, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    cmd = list(map(str, args)) if ranks is None else [MPIEXEC, "-n", str(ranks), *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} still ran after {timeout} s (killed):\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err
