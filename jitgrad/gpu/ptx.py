"""Every device kernel compiles for a real GPU: the PTX check, and the signatures it uses.

The simulator (NUMBA_ENABLE_CUDASIM=1, what CI runs) executes a kernel as plain Python,
so it accepts code the GPU compiler rejects (dicts, untyped lists, Python objects,
a variable that changes type). Without a GPU, numba-cuda can still type and compile a
kernel to PTX (libNVVM ships in the nvidia-cuda-nvcc-cu12 wheel). This module does that
for every kernel jitgrad defines:

* A kernel module declares, beside its kernels, the argument types each is launched
  with (one entry per dtype combination the launchers pass; ranks by representatives):

      PTX_SIGNATURES = {_copy: [(ptx.array(s), ptx.INT, ptx.index(r), ...) for ...]}

  keyed by the kernel object (so kernels generated in a loop declare theirs the same
  way). Device functions (`cuda.jit(device=True)`) need no entry: they compile as part
  of the kernels that call them.
* `check()` imports every module under jitgrad/gpu/ with `numba.cuda.jit` wrapped, so
  it sees each kernel made at import wherever it is kept; a kernel with no entry is an
  error, and every declared signature is compiled with `cuda.compile_ptx(..., cc=(8, 0))`.
  Kernels made after import (at first launch) escape it: make them at import.
* `recording_launches()` (simulator only) collects the argument types of every launch,
  and `undeclared()` lists those missing from PTX_SIGNATURES: tests run a workload under
  it, so the declared signatures are held against what the launchers really pass.

    python -m jitgrad.gpu.ptx          # NUMBA_ENABLE_CUDASIM must be unset (or 0)

tests/cuda/test_ptx.py runs it in a subprocess with the simulator off.
"""
import argparse
import contextlib
import importlib
import json
import pkgutil
import sys
import traceback

import numba
import numpy as np
from numba.core import config, sigutils, types
from numba.np.numpy_support import from_dtype

from jitgrad.gpu import driver

CC = (8, 0)                      # sm_80 (A100): its PTX also runs on newer GPUs (H100/H200: sm_90)
DTYPES = ("float32", "float64", "int64", "int32", "bool")   # every dtype a jitgrad tensor has
FLOATS = ("float32", "float64")
# shape/strides tuples: representatives (flat, and 0-d as (1,); NCHW). Any length types the
# same code, so undeclared() matches a launch's tuple of any nonzero length against them.
RANKS = (1, 4)
INT = types.int64                # a Python int argument (offset, size)


def scalar(dtype):
    """The type of a numpy scalar of dtype (a fill value, a cast constant)."""
    return from_dtype(np.dtype(dtype))


def array(dtype, ndim=1):
    """The type of a device buffer (DeviceArray.buf: 1-D, C-contiguous)."""
    return types.Array(scalar(dtype), ndim, "C")


def index(rank):
    """The type of a shape or strides tuple of `rank` Python ints."""
    return types.UniTuple(types.int64, rank)


def _normalized(sig):
    if isinstance(sig, str):
        return tuple(sigutils.normalize_signature(sig)[0])
    return tuple(sig)


def _declared(modules):
    """{kernel: [argument type tuples]} over the modules' PTX_SIGNATURES."""
    out = {}
    for mod in modules:
        for kernel, sigs in getattr(mod, "PTX_SIGNATURES", {}).items():
            out.setdefault(kernel, []).extend(_normalized(s) for s in sigs)
    return out


def _name(kernel, module=None):
    fn = getattr(kernel, "py_func", None) or getattr(kernel, "fn", kernel)
    return f"{module or getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', repr(fn))}"


# -- finding the kernels ----------------------------------------------------------------------

def _caller_module(depth):
    """The module whose code called cuda.jit: the first frame out with a real __name__
    (a kernel built by exec'd source has its factory's module)."""
    f = sys._getframe(depth)
    while f is not None:
        name = f.f_globals.get("__name__")
        if name and name != "builtins":
            return name
        f = f.f_back
    return ""


@contextlib.contextmanager
def _recording_jit(cuda, prefix):
    """Wrap cuda.jit: every kernel (not device function) it makes from code in a module
    named prefix... is appended, with that module's name, to the list yielded."""
    made = []
    real = cuda.jit

    def keep(obj, module):
        if module.startswith(prefix) and not getattr(obj, "targetoptions", {}).get("device", False):
            made.append((obj, module))
        return obj

    def jit(*args, **kwargs):
        module = _caller_module(2)
        out = real(*args, **kwargs)
        if callable(out) and not hasattr(out, "py_func"):   # jit(options...) -> decorator
            return lambda fn: keep(out(fn), _caller_module(2))
        return keep(out, module)

    cuda.jit = jit
    try:
        yield made
    finally:
        cuda.jit = real


def _import_all(package):
    """Import package and every module under it; (modules, {module name: traceback})."""
    mods, errors = [], {}
    root = importlib.import_module(package)
    mods.append(root)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        try:
            mods.append(importlib.import_module(info.name))
        except Exception:  # noqa: BLE001  (reported: a module that cannot import is a failure)
            errors[info.name] = traceback.format_exc()
    return mods, errors


# -- the check --------------------------------------------------------------------------------

def _probe(cuda):
    """Compile a trivial kernel: fails with a clear message when libNVVM is missing."""
    def one(a):
        a[0] = 1.0
    try:
        cuda.compile_ptx(one, (array("float32"),), cc=CC)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError("cannot compile PTX without a GPU here: libNVVM was not found or does not work "
                           f"({type(e).__name__}: {e}). It comes with numba-cuda's CUDA 12 wheels: "
                           "pip install -e '.[cuda]' (numba-cuda[cu12], nvidia-cuda-nvcc-cu12)") from e


@contextlib.contextmanager
def _device_functions_at_cc():
    """numba-cuda compiles a device function a kernel calls for the current device's
    compute capability, which needs a driver; without a GPU, report CC instead."""
    dispatcher = importlib.import_module("numba.cuda.dispatcher")
    real = dispatcher.get_current_device

    class _Device:
        compute_capability = CC

    dispatcher.get_current_device = _Device
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def check(packages=("jitgrad.gpu",)):
    """{"kernels": [names], "compiled": n, "missing": [names], "failed": [(name, sig, error)],
    "import_errors": {module: traceback}} for every kernel the packages make at import."""
    if config.ENABLE_CUDASIM:
        raise RuntimeError("the PTX check needs the real numba.cuda target: unset NUMBA_ENABLE_CUDASIM")
    cuda = driver.cuda()
    _probe(cuda)
    mods, errors = [], {}
    with _recording_jit(cuda, tuple(p.split(".")[0] for p in packages)) as made:
        for p in packages:
            m, e = _import_all(p)
            mods += m
            errors.update(e)
    declared = _declared(mods)
    report = {"kernels": [], "compiled": 0, "missing": [], "failed": [], "import_errors": errors}
    with _device_functions_at_cc():
        for kernel, module in made:
            name = _name(kernel, module)
            report["kernels"].append(name)
            if not declared.get(kernel):
                report["missing"].append(name)
                continue
            for sig in declared[kernel]:
                try:
                    cuda.compile_ptx(kernel.py_func, sig, cc=CC)
                    report["compiled"] += 1
                except Exception as e:  # noqa: BLE001  (every failure is reported, not just the first)
                    report["failed"].append((name, str(sig), f"{type(e).__name__}: {e}"))
    return report


def problems(report):
    """The report's failures as lines (empty when all is well)."""
    lines = [f"{m}: import failed\n{tb}" for m, tb in report["import_errors"].items()]
    lines += [f"{k}: no PTX_SIGNATURES entry (declare the argument types it is launched with)"
              for k in report["missing"]]
    lines += [f"{k}{sig}: {err}" for k, sig, err in report["failed"]]
    return lines


# -- what the launchers really pass (simulator) -------------------------------------------------

@contextlib.contextmanager
def recording_launches():
    """Under the simulator: yields a set that collects (kernel, argument types) for every
    kernel launch made inside the block."""
    if not config.ENABLE_CUDASIM:
        raise RuntimeError("recording_launches() works under the simulator (NUMBA_ENABLE_CUDASIM=1)")
    sim = importlib.import_module("numba.cuda.simulator.kernel")
    seen = set()
    real = sim.FakeCUDAKernel.__call__

    def call(self, *args):
        if not self._device and not sim._kernel_context:     # a launch, not a device-function call
            seen.add((self, tuple(numba.typeof(a) for a in args)))
        return real(self, *args)

    sim.FakeCUDAKernel.__call__ = call
    try:
        yield seen
    finally:
        sim.FakeCUDAKernel.__call__ = real


def _any_rank(sig):
    # RANKS are representatives: a shape/strides tuple of any (nonzero) length matches
    return tuple(types.UniTuple(types.int64, 1) if isinstance(t, types.UniTuple) and t.dtype == types.int64
                 else t for t in sig)


def undeclared(launches, packages=("jitgrad.gpu",)):
    """The recorded launches whose argument types no PTX_SIGNATURES entry declares (shape
    tuples of any rank matching), as lines."""
    mods = [m for name, m in list(sys.modules.items()) if m is not None and name.startswith(packages)]
    declared = {k: {_any_rank(s) for s in v} for k, v in _declared(mods).items()}
    return sorted(f"{_name(k)}{sig}" for k, sig in launches if _any_rank(sig) not in declared.get(k, ()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packages", nargs="*", default=["jitgrad.gpu"])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    report = check(tuple(args.packages))
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{len(report['kernels'])} kernels, {report['compiled']} signatures compiled to PTX for "
              f"sm_{CC[0]}{CC[1]}")
        for line in problems(report):
            print(line)
    return 1 if problems(report) else 0


if __name__ == "__main__":
    sys.exit(main())
