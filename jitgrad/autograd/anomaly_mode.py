"""Anomaly mode: forward ops record their Python traceback; backward checks every node's
gradients for NaN and names the node, printing where it was created in the forward.

Outside anomaly mode this costs one list read per recorded op (graph/record.py, `_anomaly`).
In anomaly mode backward runs on the Python engine, which checks each node's outputs
(engine/executor.py, check_outputs).
"""
import warnings

import numpy as np

from jitgrad._core.modes import _anomaly, _check_nan

# torch computes 1/0, 0/0 and log(0) silently (inf, nan); numpy warns. jitgrad's ops are
# numpy calls, and their warnings are not torch's: a user's own warnings (anomaly mode's
# included) must come through alone, and a test suite run with `-W error` must not fail on
# them. Floating-point errors are ignored from import on, in numpy's state (not a warnings
# filter, which pytest and catch_warnings() reset). np.errstate around each op would keep
# numpy's setting for the user's own numpy code but cost microseconds per op. A thread
# started later begins with numpy's default state: its ops warn as numpy does.
np.seterr(all="ignore")


def is_anomaly_enabled():
    return _anomaly[0]


def is_anomaly_check_nan_enabled():
    return _check_nan[0]


class set_detect_anomaly:
    """set_detect_anomaly(mode, check_nan=True): switches anomaly mode now; as a context
    manager it restores the previous setting on exit."""

    def __init__(self, mode, check_nan=True):
        self.prev = (_anomaly[0], _check_nan[0])
        _anomaly[0] = bool(mode)
        _check_nan[0] = bool(check_nan)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _anomaly[0], _check_nan[0] = self.prev


class detect_anomaly:
    """Context manager (and decorator) enabling anomaly mode."""

    def __init__(self, check_nan=True):
        self.check_nan = check_nan
        warnings.warn("Anomaly Detection has been enabled. This mode will increase the runtime and should only be "
                      "enabled for debugging.", stacklevel=2)

    def __enter__(self):
        self.prev = (_anomaly[0], _check_nan[0])
        _anomaly[0] = True
        _check_nan[0] = self.check_nan

    def __exit__(self, *exc):
        _anomaly[0], _check_nan[0] = self.prev

    def __call__(self, fn):
        def wrapper(*args, **kwargs):
            with self.__class__(self.check_nan):
                return fn(*args, **kwargs)
        return wrapper
