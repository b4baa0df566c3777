"""Layer 2, the lowered graph: the op registry, the tape and its recording, grad_fn views,
hooks' registries and the Tensor. Imports only _core and kernels."""
