"""torch.utils.dlpack: to_dlpack / from_dlpack (graph/interop.py has the protocol)."""
from jitgrad.graph.interop import from_dlpack, to_dlpack  # noqa: F401
