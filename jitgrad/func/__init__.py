"""torch.func on jitgrad: vmap (vmap.py) and its batching rules (_rules.py)."""
from jitgrad.func._batched import BatchedTensor, active_levels, batched_leaf_like, is_batched, physical  # noqa: F401
from jitgrad.func.vmap import vmap

__all__ = ["vmap"]
