"""jitgrad.autograd: backward(), grad() and the graph API, as in torch.autograd."""
from jitgrad.autograd import anomaly_mode, forward_ad, function, functional, graph
from jitgrad.autograd.anomaly_mode import detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from jitgrad.autograd.function import Function, FunctionCtx, once_differentiable
from jitgrad.autograd.gradcheck import gradcheck, gradgradcheck  # the functions shadow the module, as in torch
from jitgrad.engine.run import backward, grad
from jitgrad.engine.stats import engine_stats, reset_engine_stats  # jitgrad's own: which engine ran, and why
from jitgrad.graph.node import Node

__all__ = ["backward", "grad", "graph", "Node", "Function", "FunctionCtx", "function", "once_differentiable",
           "anomaly_mode", "forward_ad", "functional", "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "gradcheck", "gradgradcheck", "engine_stats", "reset_engine_stats"]
