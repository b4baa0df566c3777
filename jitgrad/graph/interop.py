"""Sharing memory with other libraries, without copies: DLPack (`Tensor.__dlpack__`,
`__dlpack_device__`, `jitgrad.from_dlpack`) for CPU and CUDA tensors, and
`__cuda_array_interface__` for CUDA ones (what cupy, numba and torch read).

A tensor made from another library's memory is a view of it: writes on either side show
on the other, and the producer's object (or its DLPack deleter) is held while the tensor's
array lives. Bound to Tensor here, as ops/ binds the op methods.
"""
import numpy as np

from jitgrad._core import dlpack
from jitgrad._core.dtype import from_numpy_dtype
from jitgrad.gpu import driver, foreign
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.tensor import Tensor, wrap


def _dlpack(self, stream=None, *, max_version=None, dl_device=None, copy=None):
    """A capsule over this tensor's memory: DLPack 1.0's when the consumer takes it
    (max_version >= (1, 0)), else the older kind. On CUDA the device is synchronised first
    (unless stream is -1), so a consumer on any stream sees every write made so far."""
    if self.requires_grad:
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
    if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
        raise BufferError(f"jitgrad cannot export a {self.device} tensor to DLPack device {tuple(dl_device)}")
    versioned = max_version is not None and tuple(max_version)[0] >= dlpack.VERSION[0]
    d = self._data
    if type(d) is DeviceArray:
        if copy:
            d = d.copy()
        if stream != -1:
            driver.synchronize()
        return dlpack.export(d.ptr, d.shape, d.estrides, d.dtype, dlpack.CUDA, d, versioned)
    d = self._array()
    if copy:
        d = d.copy()
    estrides = tuple(s // d.itemsize for s in d.strides)
    return dlpack.export(d.ctypes.data, d.shape, estrides, d.dtype, dlpack.CPU, d, versioned)


def _dlpack_device(self):
    return (dlpack.CUDA, 0) if type(self._data) is DeviceArray else (dlpack.CPU, 0)


def _cuda_array_interface(self):
    """The CUDA Array Interface (v3) of a CUDA tensor; CPU tensors have none (AttributeError,
    so hasattr() is False), as in torch. The device is synchronised first: the reader may
    use any stream."""
    d = self._data
    if type(d) is not DeviceArray:
        raise AttributeError(f"Can't get __cuda_array_interface__ on non-CUDA tensor type: {_type_name(d)} If CUDA "
                             "data is required use tensor.cuda() to copy tensor to device memory.")
    if self.requires_grad:
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad. If gradients aren't "
                           "required, use var.detach() to get Variable that doesn't require grad.")
    driver.synchronize()
    return {"shape": d.shape, "typestr": d.dtype.str, "data": (d.ptr if d.size else 0, False),
            "strides": None if d.is_c_contiguous() else d.strides, "version": 3}


def _type_name(d):
    # torch names the legacy tensor type: torch.FloatTensor, torch.LongTensor...
    return "torch." + {"float32": "Float", "float64": "Double", "int64": "Long", "int32": "Int",
                       "bool": "Bool"}.get(np.dtype(d.dtype).name, "") + "Tensor"


def from_dlpack(ext):
    """A tensor sharing the memory of ext: an object with __dlpack__ (a jitgrad, torch or
    numpy array, cupy...) or a DLPack capsule."""
    capsule = _capsule(ext) if hasattr(ext, "__dlpack__") else ext
    ptr, dev_type, shape, strides, dtype, read_only, release = dlpack.consume(capsule)
    from_numpy_dtype(dtype)  # raises torch's error for a dtype jitgrad tensors do not have
    if dev_type == dlpack.CPU:
        return wrap(dlpack.host_array(ptr, shape, strides, dtype, release, writeable=not read_only))
    if dev_type == dlpack.CUDA:
        if read_only:
            raise BufferError("jitgrad cannot share read-only CUDA memory (its CUDA arrays are writable)")
        return wrap(foreign.from_pointer(ptr, shape, strides, dtype, release))
    raise BufferError(f"jitgrad cannot use DLPack device type {dev_type} (only cpu and cuda)")


def _capsule(ext):
    dev_type, _ = ext.__dlpack_device__()
    # CUDA: stream 1 is the legacy default stream, the one jitgrad's kernels run on
    kw = {"stream": 1} if dev_type == dlpack.CUDA else {}
    try:
        return ext.__dlpack__(max_version=dlpack.VERSION, **kw)
    except TypeError:  # a producer from before DLPack 1.0 takes no max_version
        return ext.__dlpack__(**kw)


def to_dlpack(t):
    """torch.utils.dlpack.to_dlpack: the tensor's capsule."""
    return t.__dlpack__()


Tensor.__dlpack__ = _dlpack
Tensor.__dlpack_device__ = _dlpack_device
Tensor.__cuda_array_interface__ = property(_cuda_array_interface)
