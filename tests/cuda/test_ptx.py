"""Every device kernel jitgrad defines compiles to PTX for a real GPU (sm_80), at each
argument-type signature its module declares in PTX_SIGNATURES (jitgrad/gpu/ptx.py).

The simulator runs kernels as Python and accepts what the GPU compiler rejects, so the
check runs `python -m jitgrad.gpu.ptx` in a subprocess with the simulator off (libNVVM
comes from numba-cuda[cu12]'s wheels: no GPU needed). A missing libNVVM fails here, with
the install line, rather than skipping. Under the simulator, the launches a workload
really makes are held against the declared signatures.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT

from jitgrad.gpu import ptx
from jitgrad.gpu.array import DeviceArray

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _run_check(*packages, path=()):
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *path] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-m", "jitgrad.gpu.ptx", "--json", *packages], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        pytest.fail(f"the PTX check did not run (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def report():
    return _run_check()


@pytest.mark.no_gpu  # compiles for a GPU without one
def test_every_kernel_compiles_to_ptx(report):
    bad = ptx.problems(report)
    assert not bad, "\n".join(bad)


@pytest.mark.no_gpu  # compiles for a GPU without one
def test_the_check_found_the_kernels(report):
    # the walk really imported the kernel modules (an empty walk would pass vacuously)
    names = set(report["kernels"])
    assert {"jitgrad.gpu.kernels.copy._copy", "jitgrad.gpu.kernels.copy._fill"} <= names, names
    assert report["compiled"] >= 2 * len(ptx.DTYPES), report


FAKE = '''
from numba import cuda

from jitgrad.gpu import ptx


@cuda.jit(device=True)
def _twice(x):
    return 2 * x


@cuda.jit
def declared(a, n):
    i = cuda.grid(1)
    if i < n:
        a[i] = _twice(a[i])


@cuda.jit
def undeclared(a):
    a[0] = 1


@cuda.jit
def rejected(a):
    # fine in the simulator (plain Python), but the GPU target has no dict
    d = {}
    d[0] = a[0]
    a[0] = d[0]


def _factory(k):
    src = "def gen(a):\\n    a[0] = {}\\n".format(k)
    ns = {}
    exec(src, ns)
    return cuda.jit(ns["gen"])


GENERATED = [_factory(k) for k in range(2)]

PTX_SIGNATURES = {
    declared: [(ptx.array(d), ptx.INT) for d in ptx.DTYPES],
    rejected: [(ptx.array("float64"),)],
    GENERATED[0]: [(ptx.array("float32"),)],
}
'''


@pytest.mark.no_gpu  # compiles for a GPU without one
def test_the_check_catches_undeclared_and_rejected_kernels(tmp_path):
    pkg = tmp_path / "fakekernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(textwrap.dedent(FAKE))
    out = _run_check("fakekernels", path=[str(tmp_path)])
    assert out["import_errors"] == {}
    # the device function is no kernel; generated kernels are found wherever they are kept
    assert len(out["kernels"]) == 5, out["kernels"]
    assert sorted(out["missing"]) == ["fakekernels.mod.gen", "fakekernels.mod.undeclared"], out
    assert [f[0] for f in out["failed"]] == ["fakekernels.mod.rejected"], out
    assert out["compiled"] == len(ptx.DTYPES) + 1


@pytest.mark.skipif(not SIMULATED, reason="records launches in the simulator (CI); on a GPU the PTX check covers it")
def test_launches_match_the_declared_signatures():
    with ptx.recording_launches() as seen:
        for dt in ptx.DTYPES:
            a = DeviceArray.from_host(np.arange(6).reshape(2, 3).astype(dt))
            b = a.T.astype(np.float32)          # a strided copy with a cast
            b.fill(1)
            a[:, 1] = a[:, 0]                   # a copy into a view
            DeviceArray.from_host(np.asarray(2, dt)).astype(np.float64)   # 0-d
    assert {ptx._name(k) for k, _ in seen} == {"jitgrad.gpu.kernels.copy._copy", "jitgrad.gpu.kernels.copy._fill"}
    assert ptx.undeclared(seen) == []


@pytest.mark.skipif(not SIMULATED, reason="records launches in the simulator (CI)")
def test_an_undeclared_launch_is_reported():
    from jitgrad.gpu.kernels import copy
    a = DeviceArray.from_host(np.zeros(3, np.float32))
    with ptx.recording_launches() as seen:
        copy._fill[1, 1](a.buf, 0, (), (), 3, np.float32(1))     # an empty shape tuple: declared nowhere
    (line,) = ptx.undeclared(seen)
    assert line.startswith("jitgrad.gpu.kernels.copy._fill(") and "Tuple(())" in line, line
