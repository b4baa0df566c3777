"""Layer 4, backward: the generated compiled module, its driver, the CUDA device sweep's
driver (device.py), the Tensor-level executor and backward()/grad(). Imports everything
below it."""
