"""The device kernels. Importing this package (gpu/driver.require, at the first CUDA
allocation) defines them with numba.cuda and registers them in gpu/array.py's tables."""
from jitgrad.gpu.kernels import blas, copy, elementwise, functions, indexing, nn, optim, reduce  # noqa: F401
