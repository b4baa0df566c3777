"""torch.accelerator: the current accelerator is CUDA when jitgrad can compute there, else
there is none (PyTorch's tutorials pick their device with it)."""
from jitgrad._core import device as _device
from jitgrad.gpu import driver as _driver


def is_available():
    return _driver.available()


def current_accelerator(check_available=False):
    return _device.device("cuda") if _driver.available() else None


def device_count():
    return _driver.device_count() if _driver.available() else 0
