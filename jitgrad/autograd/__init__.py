"""jitgrad.autograd: backward(), grad() and the graph API, as in torch.autograd."""
from . import graph
from ._engine import backward, grad
from .graph import Node

__all__ = ["backward", "grad", "graph", "Node"]
