"""jitgrad.nn: modules, layers, losses and initialisers, as torch.nn."""
from . import functional, init  # noqa: F401
from .layers import (BCEWithLogitsLoss, CrossEntropyLoss, Dropout, Embedding, Flatten, GELU, LayerNorm,  # noqa: F401
                     Linear, ModuleList, MSELoss, NLLLoss, ReLU, Sequential, Sigmoid, Tanh)
from .module import Module  # noqa: F401
from .parameter import Parameter  # noqa: F401
from .conv import Conv2d, MaxPool2d  # noqa: F401,E402
