"""Shared helpers for the jitgrad test-suite.

Real PyTorch is the oracle.  Every helper works on both jitgrad and torch
tensors (both expose ``.detach().numpy()``).

The suite is organised by the package's families (``ops/``, ``engine/``, ``autograd/``,
``tensor/``, ``nn/``, ``optim/``, ``serialization/``, ``examples/``).  Test modules import
the plain helpers below with ``from conftest import ...`` (``tests`` is on ``pythonpath``,
see ``[tool.pytest.ini_options]`` in pyproject.toml); the slow reference implementations
of backward rules are in ``naive.py``.  There is exactly one conftest.py: pytest imports
every conftest.py outside a package under the module name ``conftest``, so a second one
would make ``from conftest import`` ambiguous.
"""
import gc
import importlib
import os
import sys
import zlib

import numpy as np
import pytest

# Sanity mode for the test-suite itself: JITGRAD_TESTS_USE_TORCH=1 runs every
# test with real PyTorch standing in for jitgrad, which validates that the
# expectations encoded here really are PyTorch's behaviour.
if os.environ.get("JITGRAD_TESTS_USE_TORCH") == "1":  # pragma: no cover
    import torch as _torch
    import torch.autograd as _tautograd
    import torch.nn as _tnn
    import torch.nn.functional as _tF
    import torch.utils as _tutils
    import torch.utils.checkpoint as _tcheckpoint

    sys.modules["jitgrad"] = _torch
    # every jitgrad module a test imports by name: otherwise `import jitgrad.utils.x`
    # would load torch/utils a second time under jitgrad's name and break torch's imports
    sys.modules["jitgrad.utils"] = _tutils
    sys.modules["jitgrad.utils.checkpoint"] = _tcheckpoint
    sys.modules["jitgrad.autograd"] = _tautograd
    sys.modules["jitgrad.nn"] = _tnn
    sys.modules["jitgrad.nn.functional"] = _tF

USING_TORCH_AS_JITGRAD = os.environ.get("JITGRAD_TESTS_USE_TORCH") == "1"

import jitgrad  # noqa: E402  (after the swap above: real torch in JITGRAD_TESTS_USE_TORCH mode)

try:
    import torch as _torch
except ImportError:  # pragma: no cover - test modules that need torch skip themselves
    _torch = None

# The repository root (this file is tests/conftest.py), for subprocesses and paths.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The two libraries a comparison test runs with, as a list and as a parametrize mark.
LIB_MODULES = [jitgrad, _torch]
LIBS = pytest.mark.parametrize("T", LIB_MODULES, ids=["jitgrad", "torch"])

RTOL64 = 1e-10
ATOL64 = 1e-12
RTOL32 = 1e-5
ATOL32 = 1e-6


def to_np(t):
    """numpy copy of a jitgrad/torch tensor (or pass through numbers/arrays)."""
    if t is None:
        return None
    if hasattr(t, "detach"):
        return np.array(t.detach().numpy(), copy=True)
    return np.asarray(t)


def assert_close(actual, expected, rtol=RTOL64, atol=ATOL64, msg=""):
    """Compare two tensors/arrays: identical shape and close values."""
    a = to_np(actual)
    e = to_np(expected)
    assert a is not None, f"{msg}: got None, expected array of shape {e.shape}"
    assert e is not None, f"{msg}: expected None, got {a!r}"
    assert tuple(a.shape) == tuple(e.shape), f"{msg}: shape {a.shape} != expected {e.shape}"
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=msg)


def stable_seed(*parts):
    """Deterministic seed derived from a test id (independent of PYTHONHASHSEED)."""
    return zlib.crc32("|".join(map(str, parts)).encode()) & 0x7FFFFFFF


def gen_array(rng, shape, domain="any"):
    """Random float64 array avoiding non-differentiable points.

    any  : |x| in [0.3, 1.5], random sign (no zeros, ties have probability 0)
    pos  : x in [0.5, 2.0]
    unit : x in [-0.9, 0.9]
    """
    shape = tuple(shape)
    if domain == "any":
        mag = rng.uniform(0.3, 1.5, size=shape)
        sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
        return np.asarray(mag * sign, dtype=np.float64)
    if domain == "pos":
        return np.asarray(rng.uniform(0.5, 2.0, size=shape), dtype=np.float64)
    if domain == "unit":
        return np.asarray(rng.uniform(-0.9, 0.9, size=shape), dtype=np.float64)
    raise ValueError(domain)


def capture(fn, *args, **kwargs):
    """Run fn and return the exception it raised (or None)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return e
    return None


def err(e):
    """(type name, message) of an exception, or None."""
    return None if e is None else (type(e).__name__, str(e))


def err_of(f, *args, **kwargs):
    """(type name, message) of the exception f(*args, **kwargs) raises, or None."""
    return err(capture(f, *args, **kwargs))


def grad_fn_name(t):
    return None if t.grad_fn is None else type(t.grad_fn).__name__


@pytest.fixture
def rng(request):
    return np.random.default_rng(stable_seed(request.node.nodeid))


@pytest.fixture
def no_gc():
    """The cycle collector off for the test (after one collection): memory must be freed by refcounts."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# --- comparing a run of the same code with jitgrad and with torch (test_function, test_hooks)

def mk(T, data, dtype="float64", rg=False):
    return T.tensor(data, dtype=getattr(T, dtype), requires_grad=rg)


def tol(dtype):
    return dict(rtol=RTOL32, atol=ATOL32) if dtype == "float32" else {}


def same(j, t, msg="", dtype="float64"):
    """Recursively compare results computed with jitgrad (j) and torch (t)."""
    import torch
    if isinstance(t, (tuple, list)):
        assert isinstance(j, (tuple, list)), f"{msg}: got {type(j).__name__}, expected a sequence"
        assert len(j) == len(t), f"{msg}: length {len(j)} != {len(t)} (got {j!r}, expected {t!r})"
        for i, (a, b) in enumerate(zip(j, t)):
            same(a, b, f"{msg}[{i}]", dtype)
    elif isinstance(t, dict):
        assert isinstance(j, dict) and set(j) == set(t), f"{msg}: keys {sorted(j)} != {sorted(t)}"
        for k in t:
            same(j[k], t[k], f"{msg}[{k!r}]", dtype)
    elif isinstance(t, torch.Tensor):
        assert j is not None and hasattr(j, "detach"), f"{msg}: got {j!r}, expected a tensor"
        assert str(j.dtype).split(".")[-1] == str(t.dtype).split(".")[-1], f"{msg}: dtype {j.dtype} != {t.dtype}"
        assert_close(j, t, msg=msg, **tol(dtype))
    else:
        assert j == t, f"{msg}: {j!r} != {t!r}"


def both(run, dtype="float64"):
    """run(T) with both libraries; the results must agree.  Returns (jitgrad, torch) results."""
    import torch

    import jitgrad
    t = run(torch)
    j = run(jitgrad)
    same(j, t, "jitgrad vs torch", dtype)
    return j, t


# --- custom autograd Functions (autograd/test_function*.py)

def fn_module(T):
    """``T.autograd.function`` (imported: it need not be an attribute of the package)."""
    return importlib.import_module(T.__name__ + ".autograd.function")


def grad_desc(g):
    """A gradient as seen inside backward: None or ('tensor', values)."""
    return None if g is None else ("tensor", to_np(g).tolist())


def exp_square(T):
    class MyExp(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y

    class Square(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2 * x

    return MyExp, Square


# --- hooks (autograd/test_hooks_*.py)

def gdesc(g):
    """A gradient as seen by a hook: None, or (kind, dtype, shape, values, requires_grad)."""
    if g is None:
        return None
    return ("tensor", str(g.dtype).split(".")[-1], tuple(g.shape), to_np(g).tolist(), bool(g.requires_grad))


def gtuple(gs):
    """A tuple of gradients as seen by a node hook: its container type and each entry."""
    return (type(gs).__name__, [gdesc(g) for g in gs])


# --- nn / optim (nn/, optim/, ops/test_conv_pool.py, examples/)

def nn_(T):
    return importlib.import_module(T.__name__ + ".nn")


def F_(T):
    return importlib.import_module(T.__name__ + ".nn.functional")


def init_(T):
    return importlib.import_module(T.__name__ + ".nn.init")


def optim_(T):
    return importlib.import_module(T.__name__ + ".optim")


def dt(T, dtype):
    return getattr(T, dtype)


def ten(T, a, dtype="float64", rg=False):
    return T.tensor(np.asarray(a), dtype=getattr(T, dtype), requires_grad=rg)


def snap(t):
    """A detached copy (a tensor of the same library) of t, or None."""
    return None if t is None else t.detach().clone()


def set_param(T, p, a):
    with T.no_grad():
        p.copy_(T.tensor(np.asarray(a), dtype=p.dtype))


def mlp_arrays(seed=0, dtype=np.float64):
    r = np.random.default_rng(seed)
    return {
        "0.weight": (r.normal(size=(8, 4)) * 0.5).astype(dtype),
        "0.bias": (r.normal(size=(8,)) * 0.3).astype(dtype),
        "2.weight": (r.normal(size=(2, 8)) * 0.5).astype(dtype),
        "2.bias": (r.normal(size=(2,)) * 0.3).astype(dtype),
    }


def make_mlp(T, arrays=None, dtype="float64"):
    """nn.Sequential(Linear(4, 8), ReLU(), Linear(8, 2)) in dtype, weights from arrays."""
    nn = nn_(T)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    m = m.to(dt(T, dtype))
    if arrays is not None:
        set_param(T, m[0].weight, arrays["0.weight"])
        set_param(T, m[0].bias, arrays["0.bias"])
        set_param(T, m[2].weight, arrays["2.weight"])
        set_param(T, m[2].bias, arrays["2.bias"])
    return m


# --- tests/cuda: on a GPU, or on numba's CUDA simulator -------------------------------------
# CI exports NUMBA_ENABLE_CUDASIM=1 (it must be set before numba is imported). With neither
# a GPU nor the simulator there is no device to test: tests/cuda is skipped with the reason,
# except the tests marked no_gpu, which check what happens without one.
def pytest_collection_modifyitems(config, items):
    if jitgrad.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: set NUMBA_ENABLE_CUDASIM=1 to run these on the simulator")
    for item in items:
        if f"{os.sep}cuda{os.sep}" in str(item.fspath) and "no_gpu" not in item.keywords:
            item.add_marker(skip)

# Upstream suites vendored byte for byte (tests/third_party): never collected here; tests/libraries runs each
# through jitgrad's import shim in a subprocess. (A conftest.py of their own would shadow this one's module
# name `conftest`, which the test files import helpers from.)
collect_ignore = ["third_party"]
