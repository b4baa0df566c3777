"""torch.accelerator: the device-agnostic view of the one accelerator jitgrad knows, CUDA."""
from jitgrad import cuda as _cuda
from jitgrad._core.device import device as _device


def is_available():
    return _cuda.is_available()


def current_accelerator(check_available=False):
    """torch.device('cuda') where a CUDA device exists, else None (as torch on a CPU-only machine)."""
    return _device("cuda") if _cuda.is_available() else None


def device_count():
    return _cuda.device_count() if _cuda.is_available() else 0
