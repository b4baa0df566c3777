"""jitgrad.autograd: backward(), grad() and the graph API, as in torch.autograd."""
from . import anomaly_mode, function, graph
from ._engine import backward, grad
from .anomaly_mode import detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from .function import Function, FunctionCtx, once_differentiable
from .graph import Node

__all__ = ["backward", "grad", "graph", "Node", "Function", "FunctionCtx", "function", "once_differentiable",
           "anomaly_mode", "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled"]
