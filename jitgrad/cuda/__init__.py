"""torch.cuda's API: one GPU through numba.cuda (gpu/driver.py).

Without a GPU (or without numba-cuda) `is_available()` is False and nothing here
imports more than numba.cuda's availability check. Under NUMBA_ENABLE_CUDASIM=1 the
simulator is the device (tests run the whole CUDA path on the CPU that way).
"""
from jitgrad._core import device as _device
from jitgrad.gpu import driver as _driver
from jitgrad.gpu.driver import OutOfMemoryError  # noqa: F401  (torch.cuda.OutOfMemoryError)
from jitgrad.graph import tensor as _tensor


def is_available():
    return _driver.available()


def device_count():
    return _driver.device_count()


def current_device():
    _driver.require()
    return 0


def set_device(device):
    """Only device 0 exists for jitgrad."""
    idx = device if isinstance(device, int) else getattr(device, "index", None) or 0
    if idx != 0:
        raise RuntimeError("CUDA error: invalid device ordinal")


def get_device_name(device=None):
    _driver.require()
    if _driver.simulated():
        return "numba.cuda simulator"
    return _driver.cuda().get_current_device().name.decode() if isinstance(
        _driver.cuda().get_current_device().name, bytes) else _driver.cuda().get_current_device().name


def synchronize(device=None):
    _driver.synchronize()


def is_initialized():
    return _driver._loaded


def init():
    _driver.require()


def manual_seed(seed):
    """Seeds the stream CUDA tensors draw from (on the host, then copied over); the CPU's is
    left as it is, as in torch."""
    _tensor.stream(_device.device("cuda")).manual_seed(seed)


manual_seed_all = manual_seed
