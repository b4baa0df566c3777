"""jitgrad.nn: modules, layers, losses and initialisers, as torch.nn."""
import importlib as _importlib

from jitgrad.nn import (  # noqa: F401
    functional,
    grad,  # noqa: F401  (torch.nn.grad)
    init,
    utils,  # noqa: F401  (torch.nn.utils)
)
from jitgrad.nn.activation import (  # noqa: F401,E402
    CELU,
    ELU,
    SELU,
    CosineSimilarity,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    Mish,
    PairwiseDistance,
    ReLU6,
    SiLU,
    Softplus,
    Softsign,
)
from jitgrad.nn.containers import ModuleDict, ParameterDict, ParameterList  # noqa: F401
from jitgrad.nn.conv import Conv2d, ConvTranspose2d, MaxPool2d  # noqa: F401,E402
from jitgrad.nn.layers import (  # noqa: F401
    GELU,
    GLU,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    Hardshrink,
    Identity,
    LayerNorm,
    Linear,
    LogSoftmax,
    ModuleList,
    MSELoss,
    NLLLoss,
    ReLU,
    RMSNorm,
    Sequential,
    Sigmoid,
    Softmax,
    Softmin,
    Softshrink,
    Tanh,
    Tanhshrink,
    Threshold,
    Unflatten,
)
from jitgrad.nn.loss_modules import BCELoss, HuberLoss, KLDivLoss, L1Loss, SmoothL1Loss  # noqa: F401
from jitgrad.nn.module import Module  # noqa: F401
from jitgrad.nn.normalization import BatchNorm1d, BatchNorm2d, GroupNorm  # noqa: F401
from jitgrad.nn.parameter import Parameter  # noqa: F401
from jitgrad.nn.pooling import AdaptiveAvgPool2d, AvgPool2d  # noqa: F401


def __getattr__(name):
    # torch.nn.parallel, imported on first use: it brings in jitgrad.distributed
    if name == "parallel":
        return _importlib.import_module("jitgrad.nn.parallel")
    if name == "DataParallel":
        return _importlib.import_module("jitgrad.nn.parallel.data_parallel").DataParallel
    raise AttributeError(f"module 'jitgrad.nn' has no attribute '{name}'")
