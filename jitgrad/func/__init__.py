"""jitgrad.func: torch.func's function transforms."""
from jitgrad.func.functional_call import functional_call
from jitgrad.func.transforms import grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp

__all__ = ["functional_call", "grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp", "vjp"]
