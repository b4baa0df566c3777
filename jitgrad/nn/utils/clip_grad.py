"""clip_grad_norm_ and clip_grad_value_: rescale or clamp the .grad of parameters in place."""
import math

from jitgrad._core.modes import no_grad
from jitgrad.graph.tensor import Tensor, tensor
from jitgrad.ops import functional as _F


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scales the gradients so that their joint norm is at most max_norm; returns that norm
    (before clipping) as a tensor."""
    grads = _grads(parameters)
    norm_type = float(norm_type)
    if not grads:
        return tensor(0.0)
    with no_grad():
        if norm_type == math.inf:
            norms = [_F.amax(_F.abs(g)) for g in grads]
            total = _F.amax(_F.stack(norms))
        else:
            norms = [_F.sum(_F.abs(g) ** norm_type) ** (1.0 / norm_type) for g in grads]
            total = _F.sum(_F.stack(norms) ** norm_type) ** (1.0 / norm_type)
        if error_if_nonfinite and not bool(_F.isfinite(total)):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                               "so it cannot be clipped. To disable this error and scale the gradients by the "
                               "non-finite norm anyway, set `error_if_nonfinite=False`")
        coef = _F.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    clip_value = float(clip_value)
    with no_grad():
        for g in _grads(parameters):
            g.clamp_(min=-clip_value, max=clip_value)
