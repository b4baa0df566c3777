"""What the jitgrad.compile tests share: how a compiled function's cache is inspected,
and the comparison of a compiled run with an eager one.

A compiled function keeps, per call signature, either a plan (`_Entry`: later calls
replay it) or `_Eager` (the recording broke: the signature runs eagerly). The tests
compare a compiled run against the same code run eagerly on a twin (the same model and
optimizer built twice), to rounding: rtol 1e-12 in float64, 1e-5 in float32.
"""
import inspect

import numpy as np

from jitgrad.compiler.api import _Eager, _Entry

RTOL = {"float64": 1e-12, "float32": 1e-5}
ATOL = {"float64": 1e-13, "float32": 1e-6}


def entries(c):
    """The cache entries of compiled function c, in the order they were made."""
    return list(c.cache.values())


def plans(c):
    return [e for e in entries(c) if type(e) is _Entry]


def breaks(c):
    """Every (reason, where) of every signature of c that broke."""
    return [b for e in entries(c) if type(e) is _Eager for b in e.breaks]


def assert_plan(c):
    """c replays: each of its signatures has a plan."""
    es = entries(c)
    assert es, "nothing was recorded"
    assert all(type(e) is _Entry for e in es), f"a signature broke: {breaks(c)}"


def as_np(x):
    if x is None:
        return None
    if hasattr(x, "detach"):
        return np.array(x.detach().numpy(), copy=True)
    return np.asarray(x)


def close(got, want, dtype="float64", msg=""):
    """got (compiled) equals want (eager) to the compile tolerance of `dtype` (float32's
    for float32 values), recursively over tuples, lists and dicts; Tensors and arrays
    must agree in dtype and shape too."""
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), f"{msg}: {got!r} != {want!r}"
        for k, (g, w) in enumerate(zip(got, want)):
            close(g, w, dtype, f"{msg}[{k}]")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{msg}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            close(got[k], want[k], dtype, f"{msg}[{k!r}]")
    elif want is None or isinstance(want, (bool, int, float, str)):
        assert got == want, f"{msg}: {got!r} != {want!r}"
    else:
        g, w = as_np(got), as_np(want)
        assert g is not None, f"{msg}: got None, expected {w!r}"
        assert g.shape == w.shape and g.dtype == w.dtype, f"{msg}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        if w.dtype == np.float32:  # a float32 value in a float64 step (a cast, an argument)
            dtype = "float32"
        np.testing.assert_allclose(g, w, rtol=RTOL[dtype], atol=ATOL[dtype], err_msg=msg)


def close_params(got, want, dtype="float64", msg="param"):
    """Two lists of parameters: values and .grads."""
    for k, (g, w) in enumerate(zip(got, want)):
        close(g, w, dtype, f"{msg} {k}")
        if w.grad is None:
            assert g.grad is None, f"{msg} {k}: .grad {g.grad!r}, eager has None"
        else:
            close(g.grad, w.grad, dtype, f"{msg} {k} .grad")


def line_of(fn, marker):
    """'file:line' of the line of fn's source that contains `marker`."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + k for k, text in enumerate(lines) if marker in text]
    assert len(hits) == 1, f"{marker!r} is on {len(hits)} lines of {fn.__name__}"
    return f"{inspect.getsourcefile(fn)}:{hits[0]}"
