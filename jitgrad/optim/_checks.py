"""torch's shape and dtype errors for an optimizer step, raised before anything changes.

A parameter's gradient and state can disagree with it: a state dict from another model,
`p.data` replaced after the state exists, a gradient assigned through `.data`. torch finds
out halfway through its update, from the first in-place op whose operands do not broadcast,
and leaves the parameters before it (and that one's state) updated. Here each optimizer
replays the shapes (and dtypes) of torch's ops for every parameter first, so a step either
raises torch's error having changed nothing, or runs. What passes may still differ from the
parameter in ways torch allows (a broadcastable gradient, a float64 buffer for a float32
parameter): the compiled kernel then does not take it (optim/_kernels.Batch.add), numpy does.
"""

from jitgrad._core.messages import c_name

# torch prints dtypes by their C++ names in some messages (lerp's)
torch_dtype_name = c_name


def broadcast(a, b):
    """torch's infer_size: the shape of an out-of-place `a op b`, or torch's error."""
    n = max(len(a), len(b))
    out = [0] * n
    for i in range(n - 1, -1, -1):
        da, db = i - n + len(a), i - n + len(b)
        sa = a[da] if da >= 0 else 1
        sb = b[db] if db >= 0 else 1
        if sa != sb and sa != 1 and sb != 1:
            raise RuntimeError(f"The size of tensor a ({sa}) must match the size of tensor b ({sb}) "
                               f"at non-singleton dimension {i}")
        out[i] = sa if sb == 1 else sb
    return tuple(out)


def inplace(out, other):
    """The shape of an in-place `out.op_(other)`: out's own, or torch's error."""
    shape = broadcast(out, other)
    if shape != tuple(out):
        raise RuntimeError(f"output with shape {list(out)} doesn't match the broadcast shape {list(shape)}")
    return shape


def lerp_dtype(self_dtype, end_dtype):
    """torch's lerp_ (Adam's first-moment update) takes no mixed dtypes."""
    if self_dtype != end_dtype:
        raise RuntimeError(f"expected dtype {torch_dtype_name(self_dtype)} for `end` but got dtype "
                           f"{torch_dtype_name(end_dtype)}")

