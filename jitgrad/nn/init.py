"""Parameter initialisers (in place, without recording), as torch.nn.init."""
import math
import warnings

import numpy as np

from jitgrad._core import modes as _grad_mode
from jitgrad._core.capture import stop as _stop
from jitgrad._core.messages import scalar_name
from jitgrad._core.rng import contiguous, laid_out
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph import random as _random
from jitgrad.graph import tensor as _t


def _fans(t):
    shape = t._data.shape
    if len(shape) < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity, param=None):
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _assign(t, values):
    """t's data[...] = values (host values, or an array on either device), not recorded."""
    d = t._data
    if type(d) is DeviceArray:
        if not isinstance(values, DeviceArray) and np.ndim(values):
            values = DeviceArray.from_host(np.asarray(values, d.dtype))  # one upload, then a device copy
        d[...] = values
    else:
        t._array()[...] = values.get() if isinstance(values, DeviceArray) else values


def _fill(t, values):
    _stop("an nn.init fill (in place) in a compiled step")
    with _grad_mode.no_grad():
        _assign(t, values)
        t._bump()
    return t


def _floating(t, kernel):
    # torch draws no random integers here: filling an int tensor would truncate the draws
    if t._data.dtype.kind not in "fc":
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_name(t._data.dtype)}'")


def _stream(t, g, fn):
    _random._check_generator(g, fn)
    return _t.stream(t.device) if g is None else g


# torch's initialisers are tensor.uniform_ / normal_ under no_grad: the same draws, so a
# seeded model starts from torch's weights
def uniform_(t, a=0.0, b=1.0, generator=None):
    _floating(t, "check_uniform_bounds")
    d = t._data
    return _fill(t, laid_out(d, _stream(t, generator, "uniform_").uniform(d.size, d.dtype, float(a), float(b))))


def normal_(t, mean=0.0, std=1.0, generator=None):
    _floating(t, "normal_kernel_cpu")
    d = t._data
    return _fill(t, laid_out(d, _stream(t, generator, "normal_").normal(d.size, d.dtype, float(mean), float(std),
                                                                   contiguous(d))))


def _no_op_for_no_elements(t):
    """torch's kaiming initialisers leave a tensor with no elements as it is (with a warning)
    rather than divide by its zero fan."""
    if 0 in t._data.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
        return True
    return False


def constant_(t, val):
    return _fill(t, val)


def zeros_(t):
    return _fill(t, 0)


def ones_(t):
    return _fill(t, 1)


def kaiming_uniform_(t, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    if _no_op_for_no_elements(t):
        return t
    fan_in, fan_out = _fans(t)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan_in if mode == "fan_in" else fan_out)
    bound = math.sqrt(3.0) * std
    return uniform_(t, -bound, bound, generator)


def kaiming_normal_(t, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    if _no_op_for_no_elements(t):
        return t
    fan_in, fan_out = _fans(t)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan_in if mode == "fan_in" else fan_out)
    return normal_(t, 0.0, std, generator)


def xavier_uniform_(t, gain=1.0, generator=None):
    fan_in, fan_out = _fans(t)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    bound = math.sqrt(3.0) * std  # (torch's rounding of the bound, so the draws are its)
    return uniform_(t, -bound, bound, generator)


def xavier_normal_(t, gain=1.0, generator=None):
    fan_in, fan_out = _fans(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def default_layer_init_(weight, bias):
    """PyTorch's reset_parameters for Linear and Conv: kaiming_uniform_ with a=sqrt(5)
    (a bound of 1/sqrt(fan_in)) on the weight, and the bias within +-1/sqrt(fan_in)."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in = int(np.prod(weight.shape[1:]))
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        uniform_(bias, -bound, bound)
