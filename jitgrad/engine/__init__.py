"""Layer 4, backward: the generated compiled module, its driver, the Tensor-level executor
and backward()/grad(). Imports everything below it."""
