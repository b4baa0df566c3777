"""jitgrad.autograd: backward(), grad() and the graph API, as in torch.autograd."""
from jitgrad.autograd import anomaly_mode, forward_ad, function, graph
from jitgrad.autograd.anomaly_mode import detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from jitgrad.autograd.function import Function, FunctionCtx, once_differentiable
from jitgrad.engine.run import backward, grad
from jitgrad.graph.node import Node

__all__ = ["backward", "grad", "graph", "Node", "Function", "FunctionCtx", "function", "once_differentiable",
           "anomaly_mode", "forward_ad", "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled"]
