"""The functional forms PyTorch keeps in torch.nn.functional."""
from ..ops.functional import log_softmax, relu, sigmoid, softmax, tanh  # noqa: F401
