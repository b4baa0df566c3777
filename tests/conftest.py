"""Shared helpers for the jitgrad test-suite.

Real PyTorch is the oracle.  Every helper works on both jitgrad and torch
tensors (both expose ``.detach().numpy()``).
"""
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

    sys.modules["jitgrad"] = _torch
    sys.modules["jitgrad.autograd"] = _tautograd
    sys.modules["jitgrad.nn"] = _tnn
    sys.modules["jitgrad.nn.functional"] = _tF

USING_TORCH_AS_JITGRAD = os.environ.get("JITGRAD_TESTS_USE_TORCH") == "1"

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


def grad_fn_name(t):
    return None if t.grad_fn is None else type(t.grad_fn).__name__


@pytest.fixture
def rng(request):
    return np.random.default_rng(stable_seed(request.node.nodeid))


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
    import jitgrad
    import torch
    t = run(torch)
    j = run(jitgrad)
    same(j, t, "jitgrad vs torch", dtype)
    return j, t
