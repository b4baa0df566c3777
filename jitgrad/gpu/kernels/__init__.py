"""The device kernels. Importing this package (gpu/driver.require, at the first CUDA
allocation) defines them with numba.cuda and registers them in gpu/array.py's tables."""
import jitgrad.gpu.kernels.blas  # noqa: F401
import jitgrad.gpu.kernels.nn  # noqa: F401
from jitgrad.gpu.kernels import copy  # noqa: F401
