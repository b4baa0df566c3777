"""The CUDA target's array layer: device memory as numpy-style strided arrays.

A CUDA Tensor's `_data` is a `DeviceArray` (gpu/array.py) where a CPU Tensor's is an
ndarray. DeviceArray speaks numpy's protocols (`__array_ufunc__`, `__array_function__`),
so the ops' numpy code runs unchanged on the device: each numpy function it reaches is a
`numba.cuda` kernel registered in gpu/kernels/. Anything without a kernel raises a
TypeError naming it, never a silent host round trip.

numba.cuda is imported only when a CUDA array is first made (gpu/driver.py): CPU users
never pay for it.
"""
