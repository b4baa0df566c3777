"""torch.func on jitgrad: vmap (vmap.py) and its batching rules (_rules.py)."""
from jitgrad.func._batched import (  # noqa: F401  (what grad() inside vmap uses)
    BatchedTensor,
    active_levels,
    batched_leaf_like,
    grad_per_sample,
    is_batched,
    physical,
)
from jitgrad.func.vmap import vmap

__all__ = ["vmap"]
