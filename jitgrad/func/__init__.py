"""torch.func on jitgrad: vmap (vmap.py) and its batching rules (_rules.py); the autodiff
transforms (transforms.py) and functional_call (functional_call.py)."""
from jitgrad.func._batched import (  # noqa: F401  (what grad() inside vmap uses)
    BatchedTensor,
    active_levels,
    batched_leaf_like,
    grad_per_sample,
    is_batched,
    physical,
)
from jitgrad.func.functional_call import functional_call, stack_module_state
from jitgrad.func.transforms import grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp
from jitgrad.func.vmap import vmap

__all__ = ["vmap", "functional_call", "stack_module_state", "grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp", "vjp"]
