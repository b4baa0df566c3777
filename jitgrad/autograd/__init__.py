"""jitgrad.autograd: backward(), grad() and the graph API, as in torch.autograd."""
from . import function, graph
from ._engine import backward, grad
from .function import Function, FunctionCtx, once_differentiable
from .graph import Node

__all__ = ["backward", "grad", "graph", "Node", "Function", "FunctionCtx", "function", "once_differentiable"]
