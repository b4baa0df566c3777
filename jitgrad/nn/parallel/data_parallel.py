"""nn.DataParallel: torch's single-process data parallelism. With no accelerator it is a
wrapper that calls its module (torch does the same), with one device it moves the module
there and the inputs with each call; its state_dict keys carry the `module.` prefix, so
checkpoints saved from a wrapped model load into one."""
from jitgrad import cuda as _cuda
from jitgrad._core import device as _device
from jitgrad.graph.tensor import Tensor
from jitgrad.nn.module import Module


def _index(d):
    if isinstance(d, int):
        return d
    d = _device.device(d)
    return 0 if d.index is None else d.index


def _to(obj, dev):
    """Tensors inside obj (tuples, lists, dicts) moved to dev: torch's scatter onto one device."""
    if isinstance(obj, Tensor):
        return obj.to(dev)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to(o, dev) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, dev) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _to(v, dev)) for k, v in obj.items())
    return obj


class DataParallel(Module):
    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        if not _cuda.is_available():
            self.module = module
            self.device_ids = []
            return
        if device_ids is None:
            device_ids = list(range(_cuda.device_count()))
        if not device_ids:
            raise RuntimeError("no available devices were found")
        if output_device is None:
            output_device = device_ids[0]
        self.dim = dim
        self.module = module
        self.device_ids = [_index(d) for d in device_ids]
        self.output_device = _index(output_device)
        if len(self.device_ids) > 1:  # replicate / parallel_apply / gather across GPUs: not built
            raise NotImplementedError(f"jitgrad's DataParallel runs on one device; got device_ids={self.device_ids}. "
                                      "Use one device, or DistributedDataParallel with one process per device.")
        self.src_device_obj = _device.device("cuda", self.device_ids[0])
        self.module.to(self.src_device_obj)

    def forward(self, *inputs, **kwargs):
        if not self.device_ids:
            return self.module(*inputs, **kwargs)
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            if t.device != self.src_device_obj:
                raise RuntimeError(f"module must have its parameters and buffers on device {self.src_device_obj} "
                                   f"(device_ids[0]) but found one of them on device: {t.device}")
        return self.module(*_to(inputs, self.src_device_obj), **_to(kwargs, self.src_device_obj))
