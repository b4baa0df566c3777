"""torch.autograd.forward_ad: dual tensors and the dual level.

    with forward_ad.dual_level():
        x = forward_ad.make_dual(primal, tangent)
        y = f(x)
        jvp = forward_ad.unpack_dual(y).tangent

Each primitive computes its output's tangent as its forward runs (ops/_forward.py). As in
PyTorch there is one level at a time, and leaving it drops every tangent made in it.
"""
import collections

from jitgrad._core.forward import state as _state
from jitgrad._core.messages import size_str
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import _forward
from jitgrad.ops import shape as _shape

__all__ = ["UnpackedDualTensor", "dual_level", "enter_dual_level", "exit_dual_level", "make_dual", "unpack_dual"]

UnpackedDualTensor = collections.namedtuple("UnpackedDualTensor", ["primal", "tangent"])


def enter_dual_level():
    """Open the dual level (returns its index, 0). Only one may be open."""
    if _state.level >= 0:
        raise RuntimeError("Nested forward mode AD is not supported at the moment")
    _state.level = 0
    return _state.level


def exit_dual_level(*, level=None):
    """Close the dual level: every tangent made in it is dropped."""
    if level is None:
        level = _state.level
    if level != _state.level or level < 0:
        raise RuntimeError("Trying to exit a forward AD level that was not the last one that was created. "
                           "This is not supported.")
    _state.live = False
    _state.level = -1
    for ref in _state.holders:
        t = ref()
        if t is not None and t._x is not None:
            t._x.fw = None
    _state.holders.clear()
    _state.compact_at = 1024
    _state.by_tape.clear()


class dual_level:
    """Context manager of the dual level: `with dual_level(): ...`."""

    def __enter__(self):
        return enter_dual_level()

    def __exit__(self, *exc):
        exit_dual_level()


def _level(level):
    if level is None:
        level = _state.level
    if level < 0 or level != _state.level:
        raise RuntimeError("Trying to create a dual Tensor for forward AD but no level exists, make sure to "
                           "enter_dual_level() first.")
    return level


def make_dual(tensor, tangent, *, level=None):
    """A view of `tensor` whose tangent is `tangent` (kept as it is: no copy)."""
    _level(level)
    if not tensor.is_floating_point():
        raise ValueError(f"Expected primal to be floating point or complex, but got: {tensor.dtype}")
    if not tangent.is_floating_point():
        raise ValueError(f"Expected tangent to be floating point or complex, but got: {tangent.dtype}")
    if tuple(tensor.shape) != tuple(tangent.shape):
        raise RuntimeError("Trying to set a forward gradient that has a different size than that of the original "
                           f"Tensor, this is not supported. Tensor is of size {size_str(tensor.shape)} while the "
                           f"given forward gradient is of size {size_str(tangent.shape)}.")
    if _state.live and _forward.tangent(tangent) is not None:
        raise RuntimeError(f"Setting a forward grad that itself has a forward gradient at the same level"
                           f"{_state.level} is not supported.")
    with _forward._paused:
        dual = _shape.reshape(tensor, tuple(tensor.shape))
    _forward.set_tangent(dual, tangent)
    _state.live = True
    return dual


def unpack_dual(tensor, *, level=None):
    """(primal, tangent): the primal as a view without tangent; tangent None if it has none."""
    if level is None:
        level = _state.level
    if level < 0 or level != _state.level:
        return UnpackedDualTensor(tensor, None)
    # paused (inside a custom Function's forward or a JVP formula): tensors show no tangent
    tangent = _forward.tangent(tensor) if isinstance(tensor, Tensor) and _state.live else None
    with _forward._paused:
        primal = _shape.reshape(tensor, tuple(tensor.shape))
    return UnpackedDualTensor(primal, tangent)
