"""Devices: the CPU (numpy arrays), CUDA (gpu/array.py's DeviceArray, numba.cuda) and meta
(_core/meta.py's MetaArray: shape and dtype, no data).

Every factory and `.to()` / `.cuda()` resolves its device argument through `check`, so a
request for a device jitgrad cannot give raises PyTorch's error instead of silently
returning a CPU tensor. Whether a GPU is there is asked where the data is placed
(graph/tensor.py's `place`, through gpu/driver.py), not here: this layer knows no numba.
"""
import re

_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia", "xla",
          "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone")
_NOT_COMPILED = {"xpu": "XPU", "mtia": "MTIA"}  # a CPU-only torch asserts for these
_SPEC = re.compile(r"([a-zA-Z_]+)(?::(\d+))?")


def _parse(s):
    m = _SPEC.fullmatch(s)
    if m is None:
        raise RuntimeError(f"Invalid device string: '{s}'")
    if m.group(1) not in _TYPES:
        raise RuntimeError(f"Expected one of {', '.join(_TYPES)} device type at start of device string: {s}")
    return m.group(1), None if m.group(2) is None else int(m.group(2))


class device:
    """torch.device: a type and an optional index. Making one never fails for a known type,
    as in PyTorch; using an unavailable one does (see `check`)."""
    __slots__ = ("index", "type")

    def __init__(self, type, index=None):  # torch names the argument type
        if isinstance(type, device):
            type, index = type.type, type.index
        elif not isinstance(type, str):
            raise TypeError(f"device() received an invalid combination of arguments - got ({_tname(type)})")
        else:
            type, parsed = _parse(type)
            index = parsed if index is None else index
        self.type, self.index = type, index

    def __repr__(self):
        return f"device(type='{self.type}')" if self.index is None else f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        if isinstance(other, str):  # jitgrad's Tensor.device used to be the string "cpu"; keep that working
            other = device(other)
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __reduce__(self):
        return (device, (self.type, self.index))


CPU = device("cpu")
CUDA = device("cuda", 0)  # what a CUDA tensor's .device says: jitgrad uses one GPU, the first
META = device("meta")  # shape and dtype without data (_core/meta.py)


def _tname(x):
    return "NoneType" if x is None else type(x).__name__


_DEFAULT = [CPU]  # where a factory puts a tensor given no device (torch.set_default_device)


def set_default_device(dev):
    """torch.set_default_device: None restores the CPU. The device is checked now, and
    whether a GPU is there when a factory places data on it (as in PyTorch)."""
    _DEFAULT[0] = CPU if dev is None else check(dev, "set_default_device")


def get_default_device():
    return _DEFAULT[0]


def check(dev, fn):
    """Return the device `dev` names if jitgrad can compute there (cpu, or cuda with its index
    made explicit), else raise what PyTorch raises; None: the default device. fn: the
    calling function's name, for the type error."""
    if dev is None:
        return _DEFAULT[0]
    if isinstance(dev, str):
        dev = device(dev)
    elif isinstance(dev, int) and not isinstance(dev, bool):
        raise RuntimeError("Cannot access accelerator device when none is available.")  # noqa: TRY004  (torch's type)
    elif not isinstance(dev, device):
        if not isinstance(getattr(dev, "type", None), str):  # e.g. a torch.device
            raise TypeError(f"{fn}(): argument 'device' must be torch.device, not {_tname(dev)}")
        dev = device(str(dev))
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if dev.index is not None and dev.index < 0:
            raise RuntimeError("Device index must not be negative")
        return CUDA if dev.index in (None, 0) else dev
    if dev.type == "meta":
        return META
    if dev.type in _NOT_COMPILED:
        raise AssertionError(f"Torch not compiled with {_NOT_COMPILED[dev.type]} enabled")
    raise NotImplementedError(f"Could not run 'aten::empty.memory_format' with arguments from the '{dev.type}' "
                              "backend: jitgrad computes on the cpu and cuda only (and has meta tensors)")
