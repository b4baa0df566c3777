"""jitgrad.nn: modules, layers, losses and initialisers, as torch.nn."""
from jitgrad.nn import functional, init  # noqa: F401
from jitgrad.nn.layers import BCEWithLogitsLoss, CrossEntropyLoss, Dropout, Embedding, Flatten, GELU, LayerNorm, Linear, ModuleList, MSELoss, NLLLoss, ReLU, Sequential, Sigmoid, Tanh  # noqa: F401
from jitgrad.nn.module import Module  # noqa: F401
from jitgrad.nn.parameter import Parameter  # noqa: F401
from jitgrad.nn.conv import Conv2d, MaxPool2d  # noqa: F401,E402
