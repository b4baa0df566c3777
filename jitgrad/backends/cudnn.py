"""torch.backends.cudnn: jitgrad's CUDA kernels are its own (gpu/kernels/), not cuDNN's, so
the flags are kept for code that sets them (and reads them back) and select nothing."""
from contextlib import contextmanager

enabled = True
benchmark = False
benchmark_limit = 10
deterministic = False
allow_tf32 = True
fp32_precision = "none"
depthwise_kernel = "auto"

_FLAGS = ("enabled", "benchmark", "benchmark_limit", "deterministic", "allow_tf32", "fp32_precision",
          "depthwise_kernel")


def is_available():
    return False


def version():
    return None


def is_acceptable(tensor):
    """Whether cuDNN would take the tensor: never, as there is no cuDNN here."""
    return False


def set_flags(_enabled=None, _benchmark=None, _benchmark_limit=None, _deterministic=None, _allow_tf32=None,
              _fp32_precision="none", _depthwise_kernel=None):
    """Set the given flags (None leaves one as it is); returns the previous values, in order."""
    module = globals()
    old = tuple(module[name] for name in _FLAGS)
    for name, value in zip(_FLAGS, (_enabled, _benchmark, _benchmark_limit, _deterministic, _allow_tf32,
                                    _fp32_precision, _depthwise_kernel)):
        if value is not None:
            module[name] = value
    return old


@contextmanager
def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False, allow_tf32=True,
          fp32_precision="none", depthwise_kernel="auto"):
    """Set the flags for the block, as torch.backends.cudnn.flags, and restore them after,
    even when the block raises."""
    old = set_flags(enabled, benchmark, benchmark_limit, deterministic, allow_tf32, fp32_precision, depthwise_kernel)
    try:
        yield
    finally:
        set_flags(*old)
