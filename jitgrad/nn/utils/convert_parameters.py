"""parameters_to_vector / vector_to_parameters: all parameters as one flat vector and back."""
from jitgrad._core.modes import no_grad
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import functional as _F


def parameters_to_vector(parameters):
    """One differentiable 1-D tensor of every parameter, flattened, in order."""
    return _F.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters):
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    offset = 0
    with no_grad():
        for p in parameters:
            n = p.numel()
            p.data = vec[offset:offset + n].reshape(p.shape).clone()
            offset += n
